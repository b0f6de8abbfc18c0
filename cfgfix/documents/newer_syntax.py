"""Python newer than the interpreter cfgfix runs on, read by the rules anyway.

A file written for Python 3.12 (PEP 701 f-strings such as `f"{s.split("#")[0]}"`, PEP 695
`type` aliases and `def f[T](...)`) is valid Python that `ast` on 3.11 rejects. When `ast`
fails, libcst's native parser (a declared dependency; it knows the grammar up to current
Python) decides whether the code is Python at all. If it is, the constructs this
interpreter cannot parse are *neutralised at equal length* so that `ast` parses the result
with every other node at its original line and column:

- an f-string `ast` rejects becomes a plain string literal of the same length (its prefix
  letters become spaces, its text blanks, its line breaks kept): the rules lose what is
  inside that one f-string (a message being formatted), nothing else;
- `type X = ...` becomes `_=0; X = ...` (the alias is an assignment to the rules);
- type parameter lists `def f[T: int](...)`, `class C[T]:` become spaces.

Only code that libcst rejects too is a syntax error (CFX901). libcst is imported only on
this path: its import costs ~1 s, a parse ~13k lines per CPU-second.
"""

from __future__ import annotations

import ast
import re
import warnings

import libcst
from libcst.metadata import MetadataWrapper, PositionProvider


class CannotLower(SyntaxError):
    """Valid newer Python that `neutralise` could not bring to this interpreter's grammar
    (documents/python.py reports it as NewerSyntaxError)."""


def neutralise(text: str, module=None) -> str | None:
    """`text` with the newer constructs this `ast` rejects replaced at equal length, or None
    when libcst does not accept it either (no current Python does)."""
    if module is None:
        try:
            module = libcst.parse_module(text)
        except Exception:  # libcst.ParserSyntaxError, or anything else its parser raises
            return None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]

    def offset(pos) -> int:
        return starts[pos.line - 1] + pos.column

    out = list(text)

    def blank(start: int, end: int) -> None:
        for i in range(start, end):
            if out[i] not in "\r\n":
                out[i] = " "

    collector = _Collector()
    wrapper.module.visit(collector)
    for node in collector.fstrings:
        where = positions[node]
        start, end = offset(where.start), offset(where.end)
        literal = text[start:end]
        if _parses(literal):
            continue  # an f-string this interpreter reads: keep it whole
        quote = node.start[len(node.prefix):]
        if "\n" in literal and len(quote) == 1:
            continue  # a one-quote f-string over several lines has no equal-length stand-in
        prefix_end = start + len(node.prefix)
        blank(start, prefix_end)  # `rf"` -> `  "`: a plain string where the f-string was
        blank(prefix_end + len(quote), end - len(quote))
    for node in collector.aliases:  # `type X = v` -> `_=0; X = v`
        where = positions[node]
        start = offset(where.start)
        if text.startswith("type", start):
            keyword_end = start + 4
            gap = offset(positions[node.name].start) - keyword_end
            out[start:keyword_end] = list("_=0;")
            out[keyword_end:keyword_end + gap] = [" "] * gap
    for node in collector.type_params:  # `[T: int]` -> spaces
        where = positions[node]
        blank(offset(where.start), offset(where.end))
    result = "".join(out)
    return result if len(result) == len(text) else None


def parse_newer(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast` of `text` through `neutralise`; raises SyntaxError (libcst's position) when no
    current Python accepts it, CannotLower when it is newer Python we could not bring
    down to this interpreter's grammar."""
    try:
        module = libcst.parse_module(text)
    except libcst.ParserSyntaxError as exc:
        message = re.sub(r"^(?:parser error: )?error at \d+:\d+: ", "", exc.message)
        if message.startswith("expected one of"):  # libcst lists every token it could take
            message = "invalid syntax"
        raise SyntaxError(message, (filename, exc.raw_line, exc.raw_column + 1, None)) from None
    except Exception as exc:
        raise SyntaxError(str(exc)) from None
    neutral = neutralise(text, module)
    if neutral is None:
        raise SyntaxError("invalid syntax")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(neutral, filename=filename)
    except SyntaxError as exc:
        raise CannotLower(exc.msg, (filename, exc.lineno, exc.offset, exc.text)) from None


def _parses(literal: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse("(" + literal + ")", mode="eval")
    except SyntaxError:
        return False
    return True


class _Collector(libcst.CSTVisitor):
    """The outermost f-strings, the `type` statements and the type parameter lists."""

    def __init__(self) -> None:
        super().__init__()
        self.fstrings: list = []
        self.aliases: list = []
        self.type_params: list = []
        self._depth = 0

    def visit_FormattedString(self, node) -> bool:
        if self._depth == 0:
            self.fstrings.append(node)
        self._depth += 1
        return True

    def leave_FormattedString(self, original_node) -> None:
        self._depth -= 1

    def visit_TypeAlias(self, node) -> bool:
        self.aliases.append(node)
        return True

    def visit_TypeParameters(self, node) -> bool:
        self.type_params.append(node)
        return False
