"""The command-line flags a statement's branch needs to be off: a load in the `else` of
`if training_args.use_deepspeed:` (or the body of `if not args.deepspeed:`) runs only
when that flag is unset or false. The project stage drops the launches that pass the flag
on (`--use_deepspeed true`, `--deepspeed ds.json`): they never reach the statement.

Only tests on an attribute of a name that holds the parsed flags count (the caller says
which names: training/references.py finds them); `or` in an `if` whose `else` holds the
statement, `and` in one whose body holds it, and `not` are followed. Anything else (a
comparison, a call, a flag read through another name) says nothing."""

from __future__ import annotations

import ast


def falsy_flags(tree: ast.Module, node: ast.AST, namespaces: set[str]) -> list[tuple[str, str]]:
    """(name, attribute) of each flag (`training_args.use_deepspeed`) that must be false for
    the `if` branches around `node` to be taken, outermost first; empty when none is known."""
    found: list[tuple[str, str]] = []
    for test, truth in _branches(tree.body, node):
        for flag in _falsy_when(test, truth, namespaces):
            if flag not in found:
                found.append(flag)
    return found


def _branches(body: list[ast.stmt], node: ast.AST) -> list[tuple[ast.expr, bool]]:
    """(test, whether its body is taken) of each `if` around `node`, outermost first."""
    line = getattr(node, "lineno", None)
    if line is None:
        return []
    out: list[tuple[ast.expr, bool]] = []
    stmts = body
    while True:
        holder = next((s for s in stmts if s.lineno <= line <= (s.end_lineno or s.lineno) and _holds(s, node)), None)
        if holder is None:
            return out
        if isinstance(holder, ast.If):
            if any(_holds(s, node) for s in holder.body):
                out.append((holder.test, True))
                stmts = holder.body
            elif any(_holds(s, node) for s in holder.orelse):
                out.append((holder.test, False))
                stmts = holder.orelse
            else:
                return out  # in the test itself
            continue
        inner = [s for name in ("body", "orelse", "finalbody") for s in getattr(holder, name, None) or ()
                 if isinstance(s, ast.stmt)]
        inner += [s for h in getattr(holder, "handlers", None) or () for s in h.body]
        inner += [s for c in getattr(holder, "cases", None) or () for s in c.body]
        if not inner:
            return out
        stmts = inner


def _holds(stmt: ast.stmt, node: ast.AST) -> bool:
    line = node.lineno
    if not (stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)):
        return False
    return any(n is node for n in ast.walk(stmt))


def _falsy_when(test: ast.expr, truth: bool, namespaces: set[str]) -> list[tuple[str, str]]:
    """The flags that must be false when `test` evaluates to `truth`."""
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id in namespaces:
        return [] if truth else [(test.value.id, test.attr)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _falsy_when(test.operand, not truth, namespaces)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and not truth:
        return [flag for value in test.values for flag in _falsy_when(value, False, namespaces)]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and truth:
        return [flag for value in test.values for flag in _falsy_when(value, True, namespaces)]
    return []
