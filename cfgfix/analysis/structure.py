"""The shared index of a module's structure: every call with its qualified name, and for
every node the statement, block, loops, `with` blocks and function around it.

Built once per module, lazily (only when a rule that needs it passed its prefilter), by
one walk. Rules query it (`calls_named("torch.cuda.empty_cache")`, `context(node)`)
instead of walking the tree again.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from cfgfix.analysis.names import LEAVES, ImportMap, child_nodes, dotted

Loop = (ast.For, ast.AsyncFor, ast.While)
Function = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Context:
    """Where a node sits. Tuples run outermost first; loops and withs stop at the
    enclosing function (a loop around a `def` does not run the function's body)."""

    stmt: ast.stmt  # the innermost statement holding the node (the node itself if a statement)
    block: tuple[ast.stmt, ...]  # the statement list that holds `stmt`
    loops: tuple[ast.stmt, ...]
    withs: tuple[ast.stmt, ...]
    function: ast.AST | None  # FunctionDef / AsyncFunctionDef / Lambda, or None at module level
    classdef: ast.ClassDef | None

    @property
    def sole_in_block(self) -> bool:
        return len(self.block) == 1


@dataclass(frozen=True)
class CallSite:
    node: ast.Call
    name: str | None  # qualified (`torch.cuda.empty_cache`), or dotted as written (`scaler.step`)
    method: str | None  # the attribute called (`step`), None for a plain name call
    receiver: str | None  # dotted receiver (`self.scaler`), None when not a name chain
    context: Context


@dataclass
class ModuleIndex:
    tree: ast.Module
    imports: ImportMap
    calls: list[CallSite] = field(default_factory=list)
    contexts: dict[int, Context] = field(default_factory=dict)  # id(stmt) -> its context
    functions: list[ast.AST] = field(default_factory=list)
    _by_name: dict[str, list[CallSite]] = field(default_factory=dict)
    _by_method: dict[str, list[CallSite]] = field(default_factory=dict)

    @classmethod
    def build(cls, tree: ast.Module, imports: ImportMap | None = None) -> "ModuleIndex":
        index = cls(tree, imports or ImportMap(tree))
        index._walk_block(tree.body, (), (), None, None)
        for site in index.calls:
            if site.name:
                index._by_name.setdefault(site.name, []).append(site)
            if site.method:
                index._by_method.setdefault(site.method, []).append(site)
        return index

    # -- queries -------------------------------------------------------------------------
    def calls_named(self, *names: str) -> list[CallSite]:
        return [site for name in names for site in self._by_name.get(name, ())]

    def calls_to_method(self, *methods: str) -> list[CallSite]:
        return [site for method in methods for site in self._by_method.get(method, ())]

    def context_of_stmt(self, stmt: ast.stmt) -> Context:
        return self.contexts[id(stmt)]

    def calls_within(self, node: ast.AST) -> list[CallSite]:
        """Calls lexically inside `node` (a statement, loop, function...)."""
        first, last = node.lineno, node.end_lineno or node.lineno
        inside = []
        for site in self.calls:
            call = site.node
            if first <= call.lineno <= last and _contains(node, call):
                inside.append(site)
        return inside

    # -- the walk ------------------------------------------------------------------------
    def _walk_block(self, body, loops, withs, function, classdef) -> None:
        block = tuple(body)
        for stmt in body:
            context = Context(stmt, block, loops, withs, function, classdef)
            self.contexts[id(stmt)] = context
            self._walk_stmt(stmt, context)

    def _walk_stmt(self, stmt: ast.stmt, context: Context) -> None:
        loops, withs, function, classdef = context.loops, context.withs, context.function, context.classdef
        if isinstance(stmt, Function):
            self.functions.append(stmt)
            for expr in [*stmt.decorator_list, *_defaults(stmt.args)]:
                self._walk_expr(expr, context)
            self._walk_block(stmt.body, (), (), stmt, classdef)
            return
        if isinstance(stmt, ast.ClassDef):
            for expr in [*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)]:
                self._walk_expr(expr, context)
            self._walk_block(stmt.body, (), (), None, stmt)
            return
        inner_loops = loops + (stmt,) if isinstance(stmt, Loop) else loops
        inner_withs = withs + (stmt,) if isinstance(stmt, (ast.With, ast.AsyncWith)) else withs
        for name in stmt._fields:  # ast.iter_fields without its generator
            value = getattr(stmt, name, None)
            if name in ("body", "orelse", "finalbody"):
                if isinstance(stmt, Loop) and name == "orelse":
                    self._walk_block(value, loops, withs, function, classdef)
                else:
                    self._walk_block(value, inner_loops, inner_withs, function, classdef)
            elif name == "handlers":
                for handler in value:
                    if handler.type is not None:
                        self._walk_expr(handler.type, context)
                    self._walk_block(handler.body, inner_loops, inner_withs, function, classdef)
            elif name == "cases":
                for case in value:
                    if case.guard is not None:
                        self._walk_expr(case.guard, context)
                    self._walk_block(case.body, inner_loops, inner_withs, function, classdef)
            elif name == "items":  # with items: their expressions run outside the block
                for item in value:
                    self._walk_expr(item.context_expr, context)
                    if item.optional_vars is not None:
                        self._walk_expr(item.optional_vars, context)
            elif isinstance(value, ast.AST):
                self._walk_expr(value, context)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self._walk_expr(item, context)

    def _walk_expr(self, node: ast.AST, context: Context) -> None:
        stack = [node]
        calls = self.calls
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Lambda):
                continue  # runs later, if ever
            if isinstance(current, ast.Call):
                func = current.func
                method = func.attr if isinstance(func, ast.Attribute) else None
                receiver = dotted(func.value) if isinstance(func, ast.Attribute) else None
                name = self.imports.qualify(func) or (dotted(func) if method else None)
                calls.append(CallSite(current, name, method, receiver, context))
            for child in child_nodes(current):
                if not isinstance(child, LEAVES):  # no call below a name, constant or operator
                    stack.append(child)


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _contains(outer: ast.AST, inner: ast.AST) -> bool:
    """Position test: `inner` starts inside `outer`'s span."""
    start = (outer.lineno, outer.col_offset)
    end = (outer.end_lineno, outer.end_col_offset)
    return start <= (inner.lineno, inner.col_offset) and (inner.end_lineno, inner.end_col_offset) <= end
