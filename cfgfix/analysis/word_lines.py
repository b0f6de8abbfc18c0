"""The calls a rule can care about, found from the lines of the text that hold their names.

A rule that only ever looks at calls of a few names (`checkpoint`, `TrainingArguments`)
need not walk every expression of a 2,000-line trainer module to find them: the name of
a call's callee is a word of the text on a line the call spans, and so does every
statement around it. Finding the words in the text and walking only the statements that
span one of their lines (all the expressions of those statements, nested statements
only when they span one too) finds every such call. As in models.py `_Survey`: statements
are cheap to walk, expressions are not (CFX307 spent ~5 ms of a 5-file pre-commit run
walking all of sft_trainer.py's calls to find none; issue 15).
"""

from __future__ import annotations

import ast
import bisect

from cfgfix.analysis.names import LEAVES, child_nodes

_BLOCKS = frozenset(("body", "orelse", "finalbody", "handlers", "cases"))


def word_lines(text: str, words, suffixes=()) -> list[int] | None:
    """The sorted line numbers (1-based) where one of `words` stands as a whole word, or a
    word ends with one of `suffixes` (`Seq2SeqTrainingArguments`). None when the text's
    lines may not be the tree's (a lone carriage return). Python reads identifiers in NFKC
    form (`ｃｈｅｃｋｐｏｉｎｔ` is `checkpoint`): a text that is not in that form is searched
    in it (normalising takes ~3 ms on a 200 kB module with one mathematical letter, the
    test ~0.1 ms)."""
    if "\r" in text:
        return None
    if not text.isascii():
        import unicodedata

        if not unicodedata.is_normalized("NFKC", text):
            normal = unicodedata.normalize("NFKC", text)
            if normal.count("\n") != text.count("\n"):
                return None
            text = normal
    return _lines(text, words, suffixes)


def _lines(text: str, words, suffixes) -> list[int]:
    hits = []
    size = len(text)
    for word, whole in [(w, True) for w in words] + [(s, False) for s in suffixes]:
        at = text.find(word)
        while at >= 0:
            end = at + len(word)
            if (not whole or at == 0 or not _word_char(text[at - 1])) and (end == size or not _word_char(text[end])):
                hits.append(at)
            at = text.find(word, end)
    hits.sort()
    lines, line, counted = [], 1, 0
    for at in hits:
        line += text.count("\n", counted, at)
        counted = at
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"  # identifiers' letters and digits, any script


def calls_on_lines(tree: ast.Module, lines: list[int]) -> list[ast.Call]:
    """Every call (not inside a lambda, as the shared index counts them) of the statements
    that span one of `lines`, nested statements only when they span one too; in source
    order. A superset of the calls whose callee's name is on one of those lines."""
    calls: list[ast.Call] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.stmt):
            first = node.lineno
            for decorator in getattr(node, "decorator_list", ()):  # above the `def` line
                first = min(first, decorator.lineno)
            at = bisect.bisect_left(lines, first)
            if at == len(lines) or lines[at] > (node.end_lineno or node.lineno):
                continue
        for name in node._fields:
            value = getattr(node, name, None)
            if name in _BLOCKS and isinstance(value, list):
                todo.extend(value)  # statements, except handlers, match cases
            elif isinstance(value, ast.AST):
                _calls_in(value, calls)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        _calls_in(item, calls)
    calls.sort(key=lambda call: (call.lineno, call.col_offset))
    return calls


_SKIPPED = (ast.Lambda, *LEAVES)  # built once: the tuple display per node was a tenth of this


def _calls_in(node: ast.AST, calls: list[ast.Call]) -> None:
    stack = [node]
    pop, extend, append = stack.pop, stack.extend, calls.append
    while stack:
        node = pop()
        if isinstance(node, _SKIPPED):
            continue
        if type(node) is ast.Call:
            append(node)
        extend(child_nodes(node))
