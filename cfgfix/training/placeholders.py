"""Constants of a config module that are placeholders, not settings: `GLOBAL_BATCH_SIZE = 32`
read only as the value of a key in the dict a builder function returns
(`get_train_ds_config()` in DeepSpeed-Chat's `utils/ds_utils.py`: `"train_batch_size":
GLOBAL_BATCH_SIZE`), where every call of that builder in the project is assigned to a name
whose key is assigned again afterwards (`ds_config['train_batch_size'] = ...`) before the
dict is used. The later assignment wins; the constant states nothing about the run.

Read at the project stage, for the config modules a launched script imports; the calls
looked at are those of the launched script and the project modules it imports (what this
launch runs: another entry point's use of the builder is another launch's business).
Only files whose text names the builder are parsed."""

from __future__ import annotations

import ast
from pathlib import Path


def placeholder_constants(tree: ast.Module, module: Path, files: list[Path]) -> set[str]:
    """Names of `tree`'s module-level constants that are such placeholders, for a launch
    that runs `files` (its script and the project modules it imports)."""
    uses = _constant_uses(tree)
    if not uses or not files:
        return set()
    callers: dict[tuple[str, str], bool | None] = {}  # (builder, key) -> every call overrides it
    found = set()
    for name, places in uses.items():
        if not places or any(place is None for place in places):
            continue  # read somewhere other than a builder's dict entry
        verdicts = []
        for builder, key in places:
            if (builder, key) not in callers:
                callers[(builder, key)] = _every_call_overrides(builder, key, tree, module, files)
            verdicts.append(callers[(builder, key)])
        # a builder this launch never calls states nothing for it; one it calls must override
        if True in verdicts and False not in verdicts:
            found.add(name)
    return found


def _constant_uses(tree: ast.Module) -> dict[str, list[tuple[str, str] | None]]:
    """For each upper-case module-level name: where it is read, as (builder function, dict key)
    when the read is a dict entry's value inside a top-level function, else None."""
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name) and t.id.isupper()}
    uses: dict[str, list] = {name: [] for name in names}
    placed: set[int] = set()
    for function in tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=False):
                    if isinstance(value, ast.Name) and value.id in uses and isinstance(key, ast.Constant) \
                            and isinstance(key.value, str):
                        uses[value.id].append((function.name, key.value))
                        placed.add(id(value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in uses and id(node) not in placed:
            uses[node.id].append(None)
    return uses


def _every_call_overrides(builder: str, key: str, tree: ast.Module, module: Path, files: list[Path]) -> bool | None:
    """Every call of `builder` in `files` is `x = builder(...)` followed, in the same
    function, by `x[key] = ...`; None when nothing calls it."""
    calls = 0
    for path in dict.fromkeys([module, *files]):
        if Path(path).resolve() == Path(module).resolve():
            other = tree
        else:
            try:
                data = Path(path).read_bytes()
            except OSError:
                continue
            if builder.encode() not in data:
                continue
            try:
                other = ast.parse(data)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
        for scope in [other, *(n for n in ast.walk(other) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            body = list(_statements(scope.body))
            for index, stmt in enumerate(body):
                for call in (n for n in _own_nodes(stmt) if isinstance(n, ast.Call) and _called(n) == builder):
                    calls += 1
                    if not (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
                            and isinstance(stmt.targets[0], ast.Name)):
                        return False  # the dict is used as built (passed on, returned)
                    target = stmt.targets[0].id
                    if not any(_sets_key(later, target, key) for later in body[index + 1:]):
                        return False
    return True if calls else None


def _statements(body):
    """Statements of a scope's own blocks, in order (nested defs and classes not entered)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, field, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _statements(handler.body)


def _own_nodes(stmt: ast.stmt):
    """The nodes of a statement's own expressions, not of the blocks nested in it."""
    for field, value in ast.iter_fields(stmt):
        if field in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST):
                yield from ast.walk(item)


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _sets_key(stmt: ast.stmt, name: str, key: str) -> bool:
    if not isinstance(stmt, ast.Assign):
        return False
    return any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
               and isinstance(t.slice, ast.Constant) and t.slice.value == key for t in stmt.targets)
