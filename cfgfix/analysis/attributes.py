"""What `self.x` holds across a class's methods, and where a name's value was built.

Trainer classes build the scaler in `__init__` and step it in `train_step`, set
`self.use_amp = True` once and read it in another method. A rule that sees only one
function loses those values; this index answers "which expression was assigned to
`self.scaler`" for the whole class, and `origin()` follows a name or `self.x` back to the
single expression that built it.

Only certain answers are given: an attribute assigned once (ignoring `= None`
placeholders) in the whole class, a name bound once in its scope or at module level.
"""

from __future__ import annotations

import ast

from cfgfix.analysis.names import dotted, single_assignments, walk_scope
from cfgfix.records import dataclass

NOTE = "cfgfix.analysis.attributes"


@dataclass(frozen=True)
class Assignment:
    value: ast.expr
    stmt: ast.stmt
    method: ast.AST


class ClassAttributes:
    """`self.x` -> every expression a method of the class assigns to it."""

    def __init__(self, cls: ast.ClassDef) -> None:
        self.cls = cls
        self.assigned: dict[str, list[Assignment]] = {}
        self.opaque: set[str] = set()  # rebound by tuple unpacking, augmented assignment, `del`
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in walk_scope(method):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        key = _self_key(target)
                        if key is not None:
                            self.assigned.setdefault(key, []).append(Assignment(node.value, node, method))
                        else:
                            for sub in ast.walk(target):
                                sub_key = _self_key(sub)
                                if sub_key is not None:
                                    self.opaque.add(sub_key)
                elif isinstance(node, (ast.AugAssign, ast.Delete)):
                    for target in node.targets if isinstance(node, ast.Delete) else [node.target]:
                        key = _self_key(target)
                        if key is not None:
                            self.opaque.add(key)

    def single(self, key: str) -> Assignment | None:
        """The one value `self.x` is given (a `self.x = None` placeholder does not count)."""
        if key in self.opaque:
            return None
        values = [a for a in self.assigned.get(key, ()) if not _is_none(a.value)]
        return values[0] if len(values) == 1 else None


def _self_key(node: ast.AST) -> str | None:
    key = dotted(node) if isinstance(node, ast.Attribute) else None
    if key is not None and key.startswith("self.") and key.count(".") == 1:
        return key
    return None


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


class ValueIndex:
    """Per module: the attributes of each class, and `origin()` for names and `self.x`."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._classes: dict[int, ClassAttributes] = {}
        self._scopes: dict[int, tuple[dict, set]] = {}

    @classmethod
    def of(cls, ctx) -> ValueIndex:
        index = ctx.notes.get(NOTE)
        if index is None:
            index = ctx.notes[NOTE] = cls(ctx.document.tree)
        return index

    def attributes(self, cls: ast.ClassDef) -> ClassAttributes:
        found = self._classes.get(id(cls))
        if found is None:
            found = self._classes[id(cls)] = ClassAttributes(cls)
        return found

    def origin(self, node: ast.expr, function: ast.AST | None, cls: ast.ClassDef | None, depth: int = 0) -> ast.expr:
        """The expression that built `node`'s value, followed through names bound once in
        the function (or at module level, when the function does not rebind them) and
        `self.x` assigned once in the class; `node` itself when nothing certain is known."""
        if depth > 5:
            return node
        key = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if key is None:
            return node
        value = None
        if key.startswith("self.") and key.count(".") == 1 and cls is not None:
            assignment = self.attributes(cls).single(key)
            value = assignment.value if assignment is not None else None
            function = assignment.method if assignment is not None else function
        elif "." not in key:
            value = self._name_value(key, function)
        if value is None or value is node:
            return node
        return self.origin(value, function, cls, depth + 1)

    def _name_value(self, name: str, function: ast.AST | None) -> ast.expr | None:
        if function is not None and not isinstance(function, ast.Lambda):
            args = function.args  # type: ignore[attr-defined]
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
            if name in params:
                return None
            local, stored = self._scope(function)
            if name in local:
                return local[name]
            if name in stored:
                return None  # bound more than once in the function
        return self._scope(self.tree)[0].get(name)

    def _scope(self, scope: ast.AST) -> tuple[dict, set]:
        """The names a scope binds once (to their values) and every name it stores,
        computed once per scope: a helper's callers ask for each call site's receiver."""
        found = self._scopes.get(id(scope))
        if found is None:
            stored = set() if isinstance(scope, ast.Module) else {
                n.id for n in walk_scope(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            found = self._scopes[id(scope)] = (single_assignments(scope.body), stored)  # type: ignore[attr-defined]
        return found


def call_site_origin(values: ValueIndex, index, node: ast.expr, function: ast.AST | None,
                     cls: ast.ClassDef | None, depth: int = 0) -> ast.expr:
    """`values.origin(node, ...)`, and for a parameter of a plain function of the module, the
    expression every call of that function in the module passes for it (followed the same
    way in each caller), when they all pass the same one: `train(unet, accelerator, loader)`
    called once with `accelerator = Accelerator(mixed_precision="fp16")`. `index` is the
    module index (`structure.ModuleIndex`)."""
    built = values.origin(node, function, cls)
    if not isinstance(built, ast.Name) or cls is not None or depth > 2 \
            or not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return built
    args = function.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    if built.id not in positional and built.id not in {a.arg for a in args.kwonlyargs}:
        return built
    calls = [s for s in index.calls_named(function.name) if isinstance(s.node.func, ast.Name)]
    found = None
    for site in calls:
        call = site.node
        passed = next((k.value for k in call.keywords if k.arg == built.id), None)
        if passed is None and built.id in positional:
            at = positional.index(built.id)
            if any(isinstance(a, ast.Starred) for a in call.args[:at + 1]):
                return built
            passed = call.args[at] if at < len(call.args) else None
        if passed is None:
            return built
        origin = call_site_origin(values, index, passed, site.context.function, site.context.classdef, depth + 1)
        if found is not None and origin is not found:
            return built
        found = origin
    return found if found is not None else built
