"""Does a loaded model reach training? Follows the names a `from_pretrained` result is
bound to, through wrappers (`model = get_peft_model(model, cfg)`), through a function that
returns it (`model = load_model()`), into a training call: a `*Trainer(...)`,
`accelerator.prepare(...)`, `deepspeed.initialize(...)`; or sits in a function that calls
`backward()`. A model loaded only to merge adapters or to generate is not trained."""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.names import dotted
from cfgfix.analysis.structure import ModuleIndex

_TRAINER = re.compile(r"(^|\.)\w*Trainer$")


def _is_training_call(site) -> bool:
    return bool(
        (site.name and (_TRAINER.search(site.name) or site.name == "deepspeed.initialize"))
        or site.method == "prepare"
    )


def _argument_names(call: ast.Call) -> set[str]:
    names = set()
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        value = arg.value if isinstance(arg, ast.Starred) else arg
        for node in [value, *(value.elts if isinstance(value, (ast.Tuple, ast.List)) else ())]:
            name = dotted(node)
            if name:
                names.add(name)
    return names


def _targets(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    else:
        return set()
    names = set()
    for target in targets:
        for node in [target, *(target.elts if isinstance(target, ast.Tuple) else ())]:
            name = dotted(node)
            if name:
                names.add(name)
    return names


def model_is_trained(index: ModuleIndex, load_call: ast.Call) -> bool:
    site = next((s for s in index.calls if s.node is load_call), None)
    if site is None:
        return False
    return _trained_from(index, site.context, depth=0)


def _trained_from(index: ModuleIndex, context, depth: int) -> bool:
    scope = context.function or index.tree
    local = index.calls_within(scope) if context.function else [s for s in index.calls if s.context.function is None]
    if any(s.method == "backward" for s in local):
        return True
    derived = _targets(context.stmt)
    if any(_is_training_call(s) for s in local if s.context.stmt is context.stmt):
        return True  # `Trainer(model=AutoModel.from_pretrained(...))`
    for _ in range(3):  # wrappers: model = get_peft_model(model, ...), model = wrap(model)
        for s in local:
            if _argument_names(s.node) & derived:
                if _is_training_call(s):
                    return True
                derived |= _targets(s.context.stmt)
    returned = isinstance(context.stmt, ast.Return) or any(
        isinstance(s.context.stmt, ast.Return) and _argument_names(s.node) & derived for s in local
    ) or _returns_any(scope, derived)
    if returned and context.function is not None and depth < 2:
        for caller in index.calls_named(context.function.name):
            if _trained_from(index, caller.context, depth + 1):
                return True
    return False


def _returns_any(scope: ast.AST, names: set[str]) -> bool:
    for node in ast.walk(scope):
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(dotted(v) in names for v in values):
                return True
    return False
