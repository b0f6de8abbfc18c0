import ast
from pathlib import Path

from cfgfix.analysis.word_lines import calls_on_lines, word_lines


def _callee_word(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _all_calls(tree: ast.AST) -> list[ast.Call]:
    """Every call not inside a lambda (the shared index's calls)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _check(text: str, words: set[str]) -> list[ast.Call]:
    tree = ast.parse(text)
    lines = word_lines(text, sorted(words))
    assert lines is not None
    subset = calls_on_lines(tree, lines)
    everything = _all_calls(tree)
    assert {id(c) for c in subset} <= {id(c) for c in everything}
    wanted = {id(c) for c in everything if _callee_word(c) in words}
    assert wanted <= {id(c) for c in subset}
    assert subset == sorted(subset, key=lambda c: (c.lineno, c.col_offset))
    return [c for c in subset if _callee_word(c) in words]


SAMPLE = '''
import torch
@torch.no_grad()
@wrap(
    checkpoint(block, x))
def f(a=checkpoint(b)):
    try:
        pass
    except checkpoint(E) as e:
        y = [checkpoint(z) for z in range(3)]
    match a:
        case {"k": v} if checkpoint(v):
            g = lambda: checkpoint(q)
    class C(checkpoint(Base), metaclass=checkpoint(M)):
        def m(self):
            return f"{checkpoint(s)}"
x = other(1)
save_checkpoint(x); checkpoint_x(x)
'''


def test_every_call_of_a_word_is_found_in_every_place_a_call_can_be():
    found = _check(SAMPLE, {"checkpoint"})
    assert [c.lineno for c in found] == [5, 6, 9, 10, 12, 14, 14, 16]  # not the lambda's


def test_words_are_whole_words_and_suffixes_match_word_ends():
    text = "save_checkpoint(x)\ncheckpointing(x)\nSeq2SeqTrainingArguments(a)\nTrainingArgumentsX(b)\n"
    assert word_lines(text, ["checkpoint"]) == []
    assert word_lines(text, [], suffixes=("TrainingArguments",)) == [3]


def test_identifiers_are_matched_in_the_form_python_reads_them():
    text = "# — a dash\nｃｈｅｃｋｐｏｉｎｔ(x)\n"
    assert ast.parse(text).body[0].value.func.id == "checkpoint"
    assert word_lines(text, ["checkpoint"]) == [2]
    assert word_lines("a = 1\rcheckpoint(x)\n", ["checkpoint"]) is None  # lines Python counts otherwise


def test_the_subset_holds_every_call_of_the_words_on_this_repository():
    root = Path(__file__).resolve().parents[1] / "cfgfix"
    for path in sorted(root.rglob("*.py"))[:80]:
        _check(path.read_text(encoding="utf-8"), {"append", "get", "isinstance", "finding", "dotted"})
