"""The shared index of a module's structure: every call with its qualified name, and for
every node the statement, block, loops, `with` blocks and function around it.

Built once per module, lazily (only when a rule that needs it passed its prefilter), by
one walk. Rules query it (`calls_named("torch.cuda.empty_cache")`, `context(node)`)
instead of walking the tree again.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from cfgfix.analysis.names import LEAVES, ImportMap, dotted

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
            self._walk_exprs([*stmt.decorator_list, *_defaults(stmt.args)], context)
            self._walk_block(stmt.body, (), (), stmt, classdef)
            return
        if isinstance(stmt, ast.ClassDef):
            self._walk_exprs([*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)], context)
            self._walk_block(stmt.body, (), (), None, stmt)
            return
        inner_loops = loops + (stmt,) if isinstance(stmt, Loop) else loops
        inner_withs = withs + (stmt,) if isinstance(stmt, (ast.With, ast.AsyncWith)) else withs
        roots: list = []  # expressions before the next block, walked together (same order)
        for name in _FIELDS[stmt.__class__]:
            value = getattr(stmt, name, None)
            if name in _BLOCKS:
                if roots:
                    self._walk_exprs(roots, context)
                    roots = []
                if name == "handlers":
                    for handler in value:
                        if handler.type is not None:
                            self._walk_exprs([handler.type], context)
                        self._walk_block(handler.body, inner_loops, inner_withs, function, classdef)
                elif name == "cases":
                    for case in value:
                        if case.guard is not None:
                            self._walk_exprs([case.guard], context)
                        self._walk_block(case.body, inner_loops, inner_withs, function, classdef)
                elif isinstance(stmt, Loop) and name == "orelse":
                    self._walk_block(value, loops, withs, function, classdef)
                else:
                    self._walk_block(value, inner_loops, inner_withs, function, classdef)
            elif name == "items":  # with items: their expressions run outside the block
                for item in value:
                    roots.append(item.context_expr)
                    if item.optional_vars is not None:
                        roots.append(item.optional_vars)
            elif isinstance(value, list):
                roots.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                roots.append(value)
        if roots:
            self._walk_exprs(roots, context)

    def _walk_exprs(self, roots: list, context: Context) -> None:
        """Record every call under `roots`, each root's calls before the next root's, in the
        order of the original `child_nodes` walk (depth first, last child popped first).
        Fields that never hold a call (names, operators, `ctx`) are skipped by a per-class
        table rather than tested node by node: the walk was 10 of 15 ms of CFX303 on five
        trl trainer files (issue 15); with the table the same calls cost a third of that."""
        stack = [root for root in reversed(roots) if not _SKIP[root.__class__]]
        calls, fields, skip, AST = self.calls, _FIELDS, _SKIP, ast.AST
        imports = self.imports
        while stack:
            current = stack.pop()
            if current.__class__ is ast.Call:
                func = current.func
                if isinstance(func, ast.Attribute):
                    method, receiver = func.attr, dotted(func.value)
                    name = imports.qualify(func) or dotted(func)
                else:
                    method = receiver = None
                    name = imports.qualify(func)
                calls.append(CallSite(current, name, method, receiver, context))
            for field_name in fields[current.__class__]:
                value = getattr(current, field_name, None)
                if value.__class__ is list:
                    for item in value:
                        if not skip[item.__class__] and isinstance(item, AST):
                            stack.append(item)
                elif not skip[value.__class__] and isinstance(value, AST):
                    stack.append(value)


class _Fields(dict):
    """class -> the fields that may hold a node with a call under it, in `_fields` order:
    not identifiers, numbers, `ctx`, operators, nor a constant's value."""

    def __missing__(self, cls):
        fields = tuple(
            name for name in getattr(cls, "_fields", ())
            if name not in _NO_CALL_FIELDS and not (cls is ast.Constant and name == "value")
        )
        self[cls] = fields
        return fields


class _Skip(dict):
    """class -> True when nothing under a node of it is recorded: a leaf (`LEAVES`), a
    lambda (its body runs later, if ever), or not a node at all."""

    def __missing__(self, cls):
        skip = not issubclass(cls, ast.AST) or issubclass(cls, (*LEAVES, ast.Lambda))
        self[cls] = skip
        return skip


_NO_CALL_FIELDS = frozenset({
    "ctx", "op", "ops", "id", "attr", "arg", "name", "module", "level", "type_comment", "kind",
    "conversion", "is_async", "simple", "asname", "tag",
})
_BLOCKS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})
_FIELDS = _Fields()
_SKIP = _Skip()


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _contains(outer: ast.AST, inner: ast.AST) -> bool:
    """Position test: `inner` starts inside `outer`'s span."""
    start = (outer.lineno, outer.col_offset)
    end = (outer.end_lineno, outer.end_col_offset)
    return start <= (inner.lineno, inner.col_offset) and (inner.end_lineno, inner.end_col_offset) <= end
