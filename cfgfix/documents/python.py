"""Python documents: the stdlib `ast` tree over a decoded source.

Detection runs on `ast` (about ten times faster than a concrete syntax tree, and its
positions are exact); fixes are text edits at those positions, so nothing here needs a
CST. Code newer than the interpreter goes through libcst first (newer_syntax.py). A syntax
error becomes a CFX901 finding in the engine, never a traceback.
"""

from __future__ import annotations

import ast
import warnings

from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass


class NewerSyntaxError(SyntaxError):
    """Valid newer Python that could not be brought to this interpreter's grammar."""


@dataclass
class PythonDocument:
    """A Python file's text and syntax tree."""

    source: SourceText
    tree: ast.Module

    @classmethod
    def parse(cls, source: SourceText) -> "PythonDocument":
        return cls(source=source, tree=parse_python(source.text, source.path))


# Python's own nesting limits (tokenizer MAXLEVEL 200, MAXINDENT 100), the same in every
# version: code past them is no newer Python. libcst's native parser has no such limit and
# crashes the process (SIGSEGV, stack overflow) at a few thousand levels (found by
# tests/fuzz/harness.py), so such text never reaches it.
_NESTING_ERRORS = ("too many nested parentheses", "too many levels of indentation")
MAX_BRACKET_DEPTH = 200


def _too_deep(text: str, error: SyntaxError) -> bool:
    if (error.msg or "").startswith(_NESTING_ERRORS):
        return True
    if text.count("(") + text.count("[") + text.count("{") <= MAX_BRACKET_DEPTH:
        return False
    depth = deepest = 0
    for char in text:  # brackets in strings count too: erring towards not calling libcst
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest > MAX_BRACKET_DEPTH


def parse_python(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, and for Python newer than this interpreter (a PEP 701 f-string on 3.11)
    the same tree through documents/newer_syntax.py. Raises the interpreter's SyntaxError
    for code no current Python accepts, NewerSyntaxError for newer Python it cannot read."""
    with warnings.catch_warnings():  # invalid escape sequences etc. are not ours to report
        warnings.simplefilter("ignore")
        try:
            return ast.parse(text, filename=filename)
        except SyntaxError as error:
            original = error
    if _too_deep(text, original):
        raise original  # no Python accepts it, and libcst's native parser overflows its stack
    from cfgfix.documents.newer_syntax import CannotLower, parse_newer

    try:
        return parse_newer(text, filename)
    except CannotLower as exc:
        raise NewerSyntaxError(exc.msg, (filename, exc.lineno, exc.offset, exc.text)) from None
    except SyntaxError as exc:  # libcst rejects it too: no current Python accepts it
        if (original.msg or "").startswith("f-string") and exc.lineno and original.lineno and exc.lineno > original.lineno:
            raise exc from None  # the interpreter stumbled on a (valid) newer f-string above the real error
        raise original from None  # the interpreter's message is the familiar one
