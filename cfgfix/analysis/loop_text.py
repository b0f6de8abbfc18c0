"""Loops found by text alone, before any parse: is a word on a line inside a `for`/`while`
body (the CFX301-CFX303 prefilters), and the span of a loop's header line."""

from __future__ import annotations

import ast
import re

LOOP_WORDS = (b"for ", b"while ")


def header_span(src, loop: ast.stmt):
    """From `for`/`while` to the end of its iterable or test."""
    end_node = loop.iter if isinstance(loop, (ast.For, ast.AsyncFor)) else loop.test  # type: ignore[attr-defined]
    start = src.span_of_node(loop).start
    return src.span(start, src.span_of_node(end_node).end)


LOOP_HEAD = (b"for ", b"for(", b"while ", b"while(", b"async for ")
_BLOCK_HEAD = (b"if ", b"if(", b"elif ", b"else", b"try", b"except", b"finally", b"with ", b"async with", b"match ", b"case ", b"@")


def in_loop_text(data: bytes, start: int, line: bytes, skip_function: re.Pattern | None = None) -> bool:
    """Walk up by indentation to the enclosing block headers: a `for`/`while` before the
    `def`/`class` (and, with `skip_function`, a `def` whose line it does not match)."""
    stripped = line.lstrip(b" \t")
    in_loop = stripped.startswith(LOOP_HEAD)
    indent = len(line) - len(stripped)
    pos, budget = start, 3000
    while pos > 0 and budget:
        budget -= 1
        prev_start = data.rfind(b"\n", 0, pos - 1) + 1
        text = data[prev_start:pos - 1]
        pos = prev_start
        head = text.lstrip(b" \t")
        if not head or head.startswith(b"#") or len(text) - len(head) >= indent:
            continue
        if head.startswith((b"def ", b"async def ", b"class ")):
            return in_loop and not (skip_function is not None and skip_function.match(head))
        if head.startswith(LOOP_HEAD):
            if skip_function is None:
                return True
            in_loop = True
            indent = len(text) - len(head)
        elif head.startswith(_BLOCK_HEAD):
            indent = len(text) - len(head)
        # anything else at a smaller indent continues a header over several lines
    return in_loop or budget == 0
