"""Text edits on Python source at `ast` positions: drop a call, a statement, an argument;
add a keyword. Every fix of the Python rules is built from these, so they are careful about
commas, blank blocks and line endings, and return None when they cannot be sure."""

from __future__ import annotations

import ast

from cfgfix.core import Edit
from cfgfix.documents.text import SourceText


def node_range(src: SourceText, node: ast.AST) -> tuple[int, int]:
    span = src.span_of_node(node)
    return span.start, span.end


def replace_node(src: SourceText, node: ast.AST, text: str) -> Edit:
    start, end = node_range(src, node)
    return Edit(src.path, start, end, text)


def drop_method_call(src: SourceText, call: ast.Call) -> Edit:
    """`recv.to(x)` -> `recv`: delete from the dot before the method name to the end of
    the call, so a comment between the receiver and the dot stays where it is."""
    func = call.func
    attr_end = node_range(src, func)[1]
    attr_start = attr_end - len(func.attr)  # type: ignore[attr-defined]
    dot = src.text.rfind(".", 0, attr_start)
    receiver_end = node_range(src, func.value)[1]  # type: ignore[attr-defined]
    start = dot if dot >= receiver_end else receiver_end
    spaces = start
    while spaces > receiver_end and src.text[spaces - 1] in " \t":
        spaces -= 1
    if spaces == receiver_end or src.text[spaces - 1] not in "\r\n":
        start = spaces  # `x .to(...)`: spaces before the dot go too, indentation stays
    return Edit(src.path, start, node_range(src, call)[1], "")


def delete_statement(src: SourceText, stmt: ast.stmt, sole_in_block: bool) -> Edit | None:
    """Remove a whole statement; `pass` keeps a block that would become empty valid.
    None when the statement shares its lines with other code (`a(); model.to(x)`)."""
    start, end = node_range(src, stmt)
    line_start = src.line_starts[stmt.lineno - 1]
    before = src.text[line_start:start]
    end_line = stmt.end_lineno or stmt.lineno
    line_end = src.line_starts[end_line] if end_line < len(src.line_starts) else len(src.text)
    after = src.text[end:line_end].rstrip("\r\n").strip()
    if before.strip() or (after and not after.startswith("#")):
        return None
    if sole_in_block:
        return Edit(src.path, start, end, "pass")
    return Edit(src.path, line_start, line_end, "")


def remove_argument(src: SourceText, call: ast.Call, arg: ast.AST) -> Edit:
    """Remove one argument of a call with the comma that separates it."""
    items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    index = next(i for i, item in enumerate(items) if item is arg)
    start, end = node_range(src, arg)
    if index > 0:
        start = node_range(src, items[index - 1])[1]
    elif index + 1 < len(items):
        end = node_range(src, items[index + 1])[0]
    return Edit(src.path, start, end, "")


def add_keyword(src: SourceText, call: ast.Call, text: str) -> Edit | None:
    """Append `text` (`dtype=torch.bfloat16`) as the last argument of a call."""
    items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    if items:
        end = node_range(src, items[-1])[1]
        return Edit(src.path, end, end, f", {text}")
    func_end = node_range(src, call.func)[1]
    paren = src.text.find("(", func_end)
    if paren < 0:
        return None
    return Edit(src.path, paren + 1, paren + 1, text)


def insert_import(src: SourceText, tree: ast.Module, line_text: str, before_line: int) -> Edit:
    """Insert an import line after the last top-level import above `before_line` (else after
    the module docstring, else at the top)."""
    anchor = None
    for index, stmt in enumerate(tree.body):
        if stmt.lineno >= before_line:
            break
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            anchor = stmt
        elif index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            anchor = stmt  # module docstring
    newline = src.newline
    if anchor is None:
        return Edit(src.path, 0, 0, line_text + newline)
    end_line = anchor.end_lineno or anchor.lineno
    offset = src.line_starts[end_line] if end_line < len(src.line_starts) else len(src.text)
    prefix = "" if src.text[:offset].endswith(("\n", "\r")) else newline
    return Edit(src.path, offset, offset, prefix + line_text + newline)


def import_name(src: SourceText, tree: ast.Module, module: str, name: str, before_line: int) -> Edit:
    """Make `name` importable from `module`: extend an existing top-level
    `from module import ...` above `before_line`, else add `from module import name`."""
    for stmt in tree.body:
        if stmt.lineno >= before_line:
            break
        if isinstance(stmt, ast.ImportFrom) and stmt.module == module and not stmt.level:
            last = stmt.names[-1]
            if last.name != "*" and hasattr(last, "end_col_offset"):
                end = src.offset_from_utf8(last.end_lineno, last.end_col_offset)
                return Edit(src.path, end, end, f", {name}")
    return insert_import(src, tree, f"from {module} import {name}", before_line)
