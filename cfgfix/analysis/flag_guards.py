"""The command-line flags a statement's branch needs off or on: a load in the `else` of
`if training_args.use_deepspeed:` (or the body of `if not args.deepspeed:`) runs only
when that flag is unset or false, one in the body of `if args.model_parallel:` only when
it is set. The project stage drops the launches that turn a needed-off flag on
(`--use_deepspeed true`, `--deepspeed ds.json`), and those that surely leave a needed-on
flag off when its default is off (not passed, or `--model_parallel false`).

Only tests on an attribute of a name that holds the parsed flags count (the caller says
which names: training/references.py finds them); `or` in an `if` whose `else` holds the
statement, `and` in one whose body holds it, and `not` are followed, and an earlier `if`
of the same block whose one side returns (`if args.deepspeed: return load(...)`) counts
as the other side for what follows it. Anything else (a
comparison, a call, a flag read through another name) says nothing."""

from __future__ import annotations

import ast


def falsy_flags(tree: ast.Module, node: ast.AST, namespaces: set[str]) -> list[tuple[str, str]]:
    """(name, attribute) of each flag (`training_args.use_deepspeed`) that must be false for
    the `if` branches around `node` to be taken, outermost first; empty when none is known."""
    return [flag for flag, on in flag_needs(tree, node, namespaces) if not on]


def flag_needs(tree: ast.Module, node: ast.AST, namespaces: set[str]) -> list[tuple[tuple[str, str], bool]]:
    """((name, attribute), on) for each flag the `if` branches around `node` need on (the
    body of `if args.model_parallel:`) or off (its `else`), outermost first."""
    found: list[tuple[tuple[str, str], bool]] = []
    for test, truth in _branches(tree.body, node):
        for need in _needs(test, truth, namespaces):
            if need not in found:
                found.append(need)
    return found


def _branches(body: list[ast.stmt], node: ast.AST) -> list[tuple[ast.expr, bool]]:
    """(test, whether its body is taken) of each `if` around `node`, outermost first."""
    line = getattr(node, "lineno", None)
    if line is None:
        return []
    out: list[tuple[ast.expr, bool]] = []
    stmts = body
    while True:
        index = next((i for i, s in enumerate(stmts) if s.lineno <= line <= (s.end_lineno or s.lineno) and _holds(s, node)),
                     None)
        if index is None:
            return out
        holder = stmts[index]
        for earlier in stmts[:index]:  # `if args.deepspeed: return load(...)` before it: the test was false
            if isinstance(earlier, ast.If) and _ends(earlier.body) != _ends(earlier.orelse):
                out.append((earlier.test, not _ends(earlier.body)))
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


def _ends(body: list[ast.stmt]) -> bool:
    """The block leaves the function (or the program) at its end: `return`, `raise`,
    `sys.exit(...)`."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    return (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and ast.unparse(last.value.func) in ("sys.exit", "exit", "quit", "os._exit"))


def _holds(stmt: ast.stmt, node: ast.AST) -> bool:
    line = node.lineno
    if not (stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)):
        return False
    return any(n is node for n in ast.walk(stmt))


def _needs(test: ast.expr, truth: bool, namespaces: set[str]) -> list[tuple[tuple[str, str], bool]]:
    """The flags that must be on or off when `test` evaluates to `truth`."""
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name) and test.value.id in namespaces:
        return [((test.value.id, test.attr), truth)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _needs(test.operand, not truth, namespaces)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and not truth:
        return [need for value in test.values for need in _needs(value, False, namespaces)]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and truth:
        return [need for value in test.values for need in _needs(value, True, namespaces)]
    return []
