"""A DeepSpeed config dict built in code, as the engine receives it.

`deepspeed.initialize(config=ds_config)` where `ds_config` is a dict literal, or the result of
a function of the script or of another project module (`from utils.ds_utils import
get_train_ds_config`, also through a package `__init__` that re-exports it) that returns one;
then every key the script assigns to it before the call, in order (the later assignment wins).

Values are read where they are literal: constants, the function's parameters bound to literal
arguments or left at their literal defaults, names bound once in the function or its module,
`a if c else b` whose test is known. Anything computed at run time (`args.per_device_train_
batch_size * world_size`) becomes `COMPUTED`, so the setting it decides is unknown, never the
value the dict was built with. A key whose value is a constant of the builder's module
(DeepSpeed-Chat's `"train_batch_size": GLOBAL_BATCH_SIZE`) is left out: the module states it
already (`config module`), and training/placeholders.py decides when it is a placeholder.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

COMPUTED = "<computed at run time>"


class _Env:
    def __init__(self, names: dict[str, ast.expr], fallback: _Env | None = None, bound: dict | None = None) -> None:
        self.names = names  # names bound once to an expression
        self.fallback = fallback
        self.bound = bound or {}  # parameters bound to evaluated values

    def lookup(self, name: str, depth: int):
        if name in self.bound:
            return self.bound[name]
        if name in self.names:
            return evaluate(self.names[name], self, depth + 1)
        if self.fallback is not None:
            return self.fallback.lookup(name, depth)
        return COMPUTED


def evaluate(node: ast.expr, env: _Env, depth: int = 0):
    """The JSON-like value of `node`, COMPUTED where it is not known before the run."""
    if depth > 20:
        return COMPUTED
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, (str, int, float, bool, type(None))) else COMPUTED
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values):
            if key is None:  # `**other`: keys unknown
                spread = evaluate(value, env, depth + 1)
                if isinstance(spread, dict):
                    out.update(spread)
                continue
            name = evaluate(key, env, depth + 1)
            if isinstance(name, str) and name != COMPUTED:
                out[name] = evaluate(value, env, depth + 1)
        return out
    if isinstance(node, (ast.List, ast.Tuple)):
        return [evaluate(item, env, depth + 1) for item in node.elts]
    if isinstance(node, ast.Name):
        return env.lookup(node.id, depth)
    if isinstance(node, ast.IfExp):
        test = evaluate(node.test, env, depth + 1)
        if test == COMPUTED or isinstance(test, (dict, list)):
            return COMPUTED
        return evaluate(node.body if test else node.orelse, env, depth + 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        value = evaluate(node.operand, env, depth + 1)
        if value == COMPUTED:
            return COMPUTED
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else COMPUTED
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.FloorDiv)):
        left, right = evaluate(node.left, env, depth + 1), evaluate(node.right, env, depth + 1)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right)):
            return COMPUTED
        if isinstance(node.op, ast.FloorDiv):
            return left // right if right else COMPUTED
        return {ast.Mult: left * right, ast.Add: left + right, ast.Sub: left - right}[type(node.op)]
    return COMPUTED


def _single_assignments(body) -> dict[str, ast.expr]:
    seen: dict[str, list[ast.expr]] = {}
    for node in body:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Assign):
                for target in inner.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            seen.setdefault(name.id, []).append(inner.value if target is name else ast.Constant(None))
            elif isinstance(inner, (ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr)):
                target = getattr(inner, "target", None)
                for name in ast.walk(target) if target is not None else ():
                    if isinstance(name, ast.Name):
                        seen.setdefault(name.id, []).extend([ast.Constant(None), ast.Constant(None)])
    return {name: values[0] for name, values in seen.items() if len(values) == 1}


def _module_env(tree: ast.Module) -> _Env:
    top = {}
    for name, value in _single_assignments(tree.body).items():
        top[name] = value
    return _Env(top)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _returned_dict(function: ast.FunctionDef, call: ast.Call, module_env: _Env, caller_env: _Env):
    """The dict `function` returns for `call`, or None when it does not return one literal."""
    returns = [node for node in ast.walk(function) if isinstance(node, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    params = function.args.posonlyargs + function.args.args
    defaults = dict(zip([p.arg for p in params][len(params) - len(function.args.defaults):], function.args.defaults))
    defaults.update({p.arg: d for p, d in zip(function.args.kwonlyargs, function.args.kw_defaults) if d is not None})
    bound: dict[str, object] = {}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords):
        return None
    for param, arg in zip(params, call.args):
        bound[param.arg] = evaluate(arg, caller_env)
    for kw in call.keywords:
        bound[kw.arg] = evaluate(kw.value, caller_env)
    for name, default in defaults.items():
        bound.setdefault(name, evaluate(default, module_env))
    for param in params + function.args.kwonlyargs:
        bound.setdefault(param.arg, COMPUTED)
    env = _Env(_single_assignments(function.body), module_env, bound)
    value = evaluate(returns[0].value, env)
    return value if isinstance(value, dict) else None


def builder_module(project, script: Path, tree: ast.Module, name: str, depth: int = 0):
    """(module path, parsed tree, function) that defines the function `name` the script calls:
    its own, or one imported from a project module (a package `__init__` re-exporting it from
    a submodule is followed)."""
    found = _function(tree, name)
    if found is not None:
        return script, tree, found
    if depth > 2:
        return None
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        alias = next((a for a in node.names if (a.asname or a.name) == name), None)
        if alias is None:
            continue
        module = node.module or ""
        if node.level:
            base = script.parent
            for _ in range(node.level - 1):
                base = base.parent
            bases = [base]
        else:
            bases = [script.parent, *list(script.parents)[1:4]]
        for base in bases:
            parts = [p for p in module.split(".") if p]
            candidate = base.joinpath(*parts).with_suffix(".py") if parts else base / "__init__.py"
            if not os.path.isfile(candidate):
                candidate = base.joinpath(*parts, "__init__.py")
            if os.path.isfile(candidate):
                parsed = project.script(candidate.resolve())
                if parsed is None:
                    return None
                return builder_module(project, candidate.resolve(), parsed[1], alias.name, depth + 1)
    return None


def built_dict(project, script: Path, tree: ast.Module, bound) -> tuple[dict, set[tuple[Path, str]]] | None:
    """The dict a `BoundConfig` (analysis/training_script.py) hands to DeepSpeed, less the
    keys whose value is a constant of the builder's module the script does not assign again
    (returned as (module, key)), or None when it cannot be read."""
    script_env = _module_env(tree)
    constants: set[tuple[Path, str]] = set()
    if bound.builder is None:
        data = evaluate(bound.node, script_env)
        if not isinstance(data, dict):
            return None
    else:
        func = bound.builder.func
        name = func.id if isinstance(func, ast.Name) else None
        found = builder_module(project, script, tree, name) if name else None
        if found is None:
            return None
        module_path, module_tree, function = found
        module_env = _module_env(module_tree)
        data = _returned_dict(function, bound.builder, module_env, script_env)
        if data is None:
            return None
        # a key whose value is one of the builder module's constants (`"train_batch_size":
        # GLOBAL_BATCH_SIZE`): that constant is already the module's stated setting (and a
        # placeholder when the script assigns the key again: training/placeholders.py), so the
        # key is left to it rather than read twice
        returned = next(n.value for n in ast.walk(function) if isinstance(n, ast.Return))
        if isinstance(returned, ast.Name):
            returned = _single_assignments(function.body).get(returned.id, returned)
        if isinstance(returned, ast.Dict):
            constants = {(module_path, key.value) for key, value in zip(returned.keys, returned.values)
                         if isinstance(key, ast.Constant) and isinstance(value, ast.Name)
                         and value.id in module_env.names and value.id not in _single_assignments(function.body)}
    for keys, value in bound.updates:
        if keys is None:
            return None  # `.update(other)`: every key may change
        target = data
        for key in keys[:-1]:
            child = target.get(key)
            if not isinstance(child, dict):
                child = target[key] = {}
            target = child
        target[keys[-1]] = evaluate(value, script_env)
        constants.discard(next(((p, k) for p, k in constants if k == keys[0]), None))
    for _, key in constants:
        data.pop(key, None)
    return data, constants
