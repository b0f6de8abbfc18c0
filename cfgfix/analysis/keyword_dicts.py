"""Keyword dicts built step by step and spread into a call:

    load_kwargs = dict(trust_remote_code=True)          # or {"trust_remote_code": True}
    load_kwargs["device_map"] = "auto"
    load_kwargs.update(torch_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(name, **load_kwargs)

`spread_keywords` answers which keywords such a `**name` passes at that call, as keyword
nodes the loader's analysis reads like written ones. A key set under an `if` becomes
`value if test else <earlier value>` (`None` where the key was absent before, which is what
an absent `device_map` or `quantization_config` means); an `if`/`else` pair that sets the
same key becomes one conditional expression. The dict is followed only when every use of
its name in the scope is understood: built once (a dict display or `dict(...)` with
keywords), filled by `name["key"] = value` (a constant key) or `name.update(...)` with
keywords or a dict display, read (`name["k"]`, `name.get`, `in`), or spread with `**`.
Anything else (passed to a function, aliased, popped, filled in a loop, a key computed at
run time) leaves the call's `**name` unknown, as before.
"""

from __future__ import annotations

import ast

from cfgfix.analysis.names import module_statements, walk_scope

# Keys whose absence means the same as `None` (so "set only under a test" is `x if test else None`).
NONE_WHEN_ABSENT = frozenset({"device_map", "quantization_config", "max_memory", "offload_folder"})

_READS = frozenset({"get", "keys", "items", "values", "copy", "__contains__", "__getitem__"})


def _build_items(value: ast.expr) -> list[tuple[str, ast.expr]] | None:
    """The initial keys of `{...}` / `dict(...)` (keys that are string constants only)."""
    if isinstance(value, ast.Dict):
        items = []
        for key, item in zip(value.keys, value.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None
            items.append((key.value, item))
        return items
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" and not value.args:
        if any(k.arg is None for k in value.keywords):
            return None
        return [(k.arg, k.value) for k in value.keywords]
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _own_statements(body: list[ast.stmt]):
    """The statements of a scope's own code, nested blocks included; nested functions and
    classes are other scopes, so neither they nor their bodies are visited."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            continue
        yield node
        for name in _BLOCKS:
            stack.extend(reversed(getattr(node, name, None) or ()))


class _Scope:
    """One function (or the module): how it builds and fills the dict `name` (only the name
    a call spreads is followed: a large `__init__` builds many dicts no call spreads)."""

    def __init__(self, scope: ast.AST, name: str) -> None:
        self.builds: dict[str, tuple[ast.stmt, list]] = {}  # name -> (its assignment, initial items)
        candidates = []
        for stmt in _own_statements(getattr(scope, "body", [])):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and stmt.targets[0].id == name:
                items = _build_items(stmt.value)
                if items is not None:
                    candidates.append((stmt.targets[0].id, stmt, items))
        nodes: list[ast.AST] = []
        if candidates:  # a scope that builds no dict costs no walk of its expressions
            nodes = list(walk_scope(scope))  # walked once, read three times
            bound: dict[str, int] = {}
            for node in nodes:
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    bound[node.id] = bound.get(node.id, 0) + 1
            for name, stmt, items in candidates:
                if bound.get(name) == 1:
                    self.builds[name] = (stmt, items)
        # name -> [(statement, key, value, conditions)] in source order; None: not followed
        self.fills: dict[str, list | None] = {name: [] for name in self.builds}
        if self.builds:
            self._walk(getattr(scope, "body", []), (), False)
            self._check_uses(nodes)

    def _walk(self, body: list[ast.stmt], conditions: tuple, looped: bool) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            self._fill(stmt, conditions, looped)
            if isinstance(stmt, ast.If):
                self._walk(stmt.body, conditions + ((stmt.test, True),), looped)
                self._walk(stmt.orelse, conditions + ((stmt.test, False),), looped)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                self._walk(stmt.body, conditions, True)
                self._walk(stmt.orelse, conditions, True)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                self._walk(stmt.body, conditions, looped)
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                self._walk(stmt.body, conditions, looped)  # the body normally completes
                for handler in stmt.handlers:
                    self._walk(handler.body, conditions, True)  # when it runs is unknown
                self._walk(stmt.orelse, conditions, looped)
                self._walk(stmt.finalbody, conditions, looped)
            elif isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    self._walk(case.body, conditions, True)

    def _fill(self, stmt: ast.stmt, conditions: tuple, looped: bool) -> None:
        target = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
            sub = stmt.targets[0]
            if isinstance(sub.value, ast.Name) and sub.value.id in self.fills:
                target = sub.value.id
                key = sub.slice
                pairs = [(key.value, stmt.value)] if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "update" and isinstance(func.value, ast.Name) \
                    and func.value.id in self.fills:
                target = func.value.id
                pairs = [(k.arg, k.value) for k in call.keywords if k.arg]
                if any(k.arg is None for k in call.keywords) or len(call.args) > 1:
                    pairs = None
                elif call.args:
                    items = _build_items(call.args[0])
                    pairs = None if items is None else items + pairs
        if target is None or self.fills[target] is None:
            return
        if pairs is None or looped:
            self.fills[target] = None
            return
        self.fills[target].extend((stmt, key, value, conditions) for key, value in pairs)

    def _check_uses(self, nodes: list[ast.AST]) -> None:
        """Forget a dict whose name is used in any way not understood (`nodes`: the scope's own)."""
        understood: set[int] = set()
        for name, (stmt, _) in self.builds.items():
            understood.add(id(stmt.targets[0]))
            for fill in self.fills.get(name) or ():
                target = fill[0].targets[0].value if isinstance(fill[0], ast.Assign) else fill[0].value.func.value
                understood.add(id(target))
        self.spread_calls: list[ast.Call] = []
        for node in nodes:
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg is None and isinstance(keyword.value, ast.Name):
                        understood.add(id(keyword.value))
                        if keyword.value.id in self.builds:
                            self.spread_calls.append(node)
            elif isinstance(node.value if isinstance(node, (ast.Subscript, ast.Attribute)) else None, ast.Name) and (
                    isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                    or isinstance(node, ast.Attribute) and node.attr in _READS):
                understood.add(id(node.value))  # a read: `kw["a"]`, `kw.get("a")`
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                for side in node.comparators:
                    if isinstance(side, ast.Name):
                        understood.add(id(side))
        for node in nodes:
            if isinstance(node, ast.Name) and node.id in self.fills and id(node) not in understood:
                self.fills[node.id] = None
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    if name in self.fills:
                        self.fills[name] = None


def _scope_of(tree: ast.Module, call: ast.Call, name: str) -> _Scope | None:
    """The scope (module or function) whose own code spreads a dict into `call`, analysed on
    first use and memoised on the tree. Only the functions around a spreading call are
    analysed: building every scope of a trainer module was a seventh of a pre-commit run's
    CPU (issue 15)."""
    memo = getattr(tree, "_cfgfix_keyword_dicts", None)
    if memo is None:
        # every function's span, from the module's statements (shared, memoised). Their
        # order differs from `ast.walk`'s, but the innermost function is found the same: a
        # tie on the body's first line is a function and one nested in it, and both orders
        # put the outer one first
        spans = [(node.body[0].lineno, node.end_lineno or node.lineno, node) for node in module_statements(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        memo = tree._cfgfix_keyword_dicts = (spans, {})  # type: ignore[attr-defined]
    spans, scopes = memo
    # the innermost function whose body holds the call; a call in a decorator or a default
    # belongs to the scope around the `def`, one in a lambda or class body to no scope's own
    # code (never found, as it never was)
    around = [node for start, end, node in spans if start <= call.lineno <= end]
    scope = max(around, key=lambda node: node.body[0].lineno) if around else tree
    found = scopes.get((id(scope), name))
    if found is None:
        found = scopes[(id(scope), name)] = _Scope(scope, name)
    return found if any(spread is call for spread in getattr(found, "spread_calls", ())) else None


def _condition(conditions: tuple) -> ast.expr:
    tests = [test if truth else ast.UnaryOp(op=ast.Not(), operand=test) for test, truth in conditions]
    return tests[0] if len(tests) == 1 else ast.BoolOp(op=ast.And(), values=tests)


def spread_keywords(tree: ast.Module, name: str, call: ast.Call) -> list[ast.keyword] | None:
    """The keywords `**name` passes at `call` when `name` is a dict its scope builds and
    fills in ways followed here; None otherwise."""
    found = _scope_of(tree, call, name) if isinstance(tree, ast.Module) else None
    if found is None or name not in found.builds:
        return None
    fills = found.fills.get(name)
    if fills is None:
        return None
    build, items = found.builds[name]
    values: dict[str, ast.expr | None] = {key: item for key, item in items}
    for stmt, key, item, conditions in fills:
        if stmt.lineno >= call.lineno or stmt.lineno < build.lineno:
            continue  # filled after the call (or before the dict exists)
        if not conditions:
            values[key] = item
            continue
        earlier = values.get(key)
        if earlier is None and key not in NONE_WHEN_ABSENT:
            # absent on some path, where the library's default applies: a value the analysis
            # does not resolve (an unbound name), so that path's setting stays unknown
            earlier = ast.copy_location(ast.Name(id="<absent>", ctx=ast.Load()), item)
        last_test, last_truth = conditions[-1]
        if len(conditions) == 1 and not last_truth and isinstance(earlier, ast.IfExp) \
                and getattr(earlier, "_cfgfix_branch_of", None) is last_test:
            # the `else` of the `if` whose body set the key: one conditional expression
            values[key] = ast.copy_location(ast.IfExp(test=last_test, body=earlier.body, orelse=item), item)
            continue
        orelse = earlier if earlier is not None else ast.copy_location(ast.Constant(value=None), item)
        if len(conditions) == 1 and not last_truth:
            made = ast.IfExp(test=last_test, body=orelse, orelse=item)
        else:
            made = ast.IfExp(test=_condition(conditions), body=item, orelse=orelse)
            if len(conditions) == 1:
                made._cfgfix_branch_of = last_test  # type: ignore[attr-defined]
        values[key] = ast.copy_location(made, item)
    keywords = []
    for key, item in values.items():
        if item is None:
            continue
        keyword = ast.keyword(arg=key, value=item)
        keywords.append(ast.copy_location(keyword, item))
    return keywords
