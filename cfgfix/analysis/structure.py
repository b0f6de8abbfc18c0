"""The shared index of a module's structure: every call with its qualified name, and for
every node the statement, block, loops, `with` blocks and function around it.

Built once per module, lazily (only when a rule that needs it passed its prefilter), and
within a module function body by function body, as queries need them (`ModuleIndex`).
Rules query it (`calls_named("torch.cuda.empty_cache")`, `context_of_stmt(stmt)`) instead
of walking the tree again.
"""

from __future__ import annotations

import ast
import bisect
from collections import namedtuple

from cfgfix.analysis.call_text import CallText
from cfgfix.analysis.names import LEAVES, ImportMap, dotted

Loop = (ast.For, ast.AsyncFor, ast.While)
Function = (ast.FunctionDef, ast.AsyncFunctionDef)


# Context and CallSite are named tuples, not frozen dataclasses: one of each per statement
# and per call, and a frozen dataclass's __init__ (object.__setattr__ per field) cost 2.5
# against 0.5 us, ~5 ms on trl's GRPO trainer; defining the two dataclasses cost ~2 ms of
# import (issue 15). Both stay immutable and compare and hash by their fields. They are
# `collections.namedtuple`s: `typing.NamedTuple` would import `typing` (2.7 ms) for them.
class Context(namedtuple("Context", "stmt block loops withs function classdef")):
    """Where a node sits. Tuples run outermost first; loops and withs stop at the
    enclosing function (a loop around a `def` does not run the function's body).

    - stmt: the innermost statement holding the node (the node itself if a statement)
    - block: the statement list that holds `stmt` (a tuple)
    - loops, withs: the enclosing loop and `with` statements (tuples)
    - function: the FunctionDef / AsyncFunctionDef / Lambda, or None at module level
    - classdef: the enclosing ClassDef, or None
    """

    __slots__ = ()

    @property
    def sole_in_block(self) -> bool:
        return len(self.block) == 1


class CallSite(namedtuple("CallSite", "node name method receiver context")):
    """One call and where it sits.

    - node: the ast.Call
    - name: qualified (`torch.cuda.empty_cache`), or dotted as written (`scaler.step`)
    - method: the attribute called (`step`), None for a plain name call
    - receiver: the dotted receiver (`self.scaler`), None when not a name chain
    - context: its Context
    """

    __slots__ = ()


class _Part:
    """The calls, statement contexts and functions of one stretch of the walk, in its order:
    the module's own statements between two outermost function bodies, or one such body."""

    __slots__ = ("calls", "contexts", "functions", "by_name", "by_method")

    def __init__(self) -> None:
        self.calls: list[CallSite] = []
        self.contexts: dict[int, Context] = {}  # id(stmt) -> its context
        self.functions: list[ast.AST] = []
        self.by_name: dict[str, list[CallSite]] = {}
        self.by_method: dict[str, list[CallSite]] = {}

    def finish(self) -> None:
        for site in self.calls:
            if site.name:
                self.by_name.setdefault(site.name, []).append(site)
            if site.method:
                self.by_method.setdefault(site.method, []).append(site)


class _Body:
    """The body of an outermost function (one not inside another), walked when first needed."""

    __slots__ = ("function", "classdef", "part")

    def __init__(self, function: ast.AST, classdef: ast.ClassDef | None) -> None:
        self.function = function
        self.classdef = classdef
        self.part: _Part | None = None


class ModuleIndex:
    """Built with the module's text, the index walks the module's own statements and class
    bodies at once and each outermost function's body only when a query may find something
    there (issue 15: the whole walk was 10 of CFX303's 15 ms on trl's DPO trainer, whose
    evaluation loops sit in two of its 14 methods). `calls_named` / `calls_to_method` walk
    the bodies whose text calls the name (analysis/call_text.py), `context_of_stmt` /
    `context_of` the body holding the statement, `calls_within` the bodies overlapping the
    node; `calls`, `contexts` and `functions` walk everything. Every answer is the one the
    whole walk gives, in its order. Without the text, everything is walked at once."""

    def __init__(self, tree: ast.Module, imports: ImportMap, text: CallText | None = None) -> None:
        self.tree = tree
        self.imports = imports
        self._text = text
        self._deferring = text is not None  # False while a body is walked
        self._part = _Part()  # where the walk records now
        self._pieces: list[_Part | _Body] = [self._part]  # in walk order
        self._bodies: list[_Body] = []  # in walk order, which is line order
        self._body_lines: list[int] = []  # first line of each body
        self._known: dict[int, Context] = {}  # the contexts walked so far
        self._bodies_left = 0
        self._merges: dict[str, object] = {}  # `calls`, `contexts`, `functions` once all is walked
        self._outside: list[CallSite] | None = None

    @classmethod
    def build(cls, tree: ast.Module, imports: ImportMap | None = None, text: str | CallText | None = None,
              line_starts: list[int] | None = None) -> "ModuleIndex":
        if isinstance(text, str):
            text = CallText(text, line_starts)
        index = cls(tree, imports or ImportMap(tree), text)
        index._walk_block(tree.body, (), (), None, None)
        index._part.finish()
        return index

    # -- the whole walk ------------------------------------------------------------------
    @property
    def calls(self) -> list[CallSite]:
        return self._merged("calls")

    @property
    def contexts(self) -> dict[int, Context]:
        """id(stmt) -> its context."""
        return self._merged("contexts")

    @property
    def functions(self) -> list[ast.AST]:
        return self._merged("functions")

    def _merged(self, field: str):
        self._walk_all()
        if len(self._pieces) == 1:
            return getattr(self._pieces[0], field)
        merged = self._merges.get(field)
        if merged is None:
            if field == "contexts":
                merged = {}
                for part in self._parts():
                    merged.update(part.contexts)
            else:
                merged = [item for part in self._parts() for item in getattr(part, field)]
            self._merges[field] = merged
        return merged

    def _walk_all(self) -> None:
        if self._bodies_left:
            for body in self._bodies:
                self._walk_body(body)

    def _parts(self):
        """The walked parts, in walk order."""
        for piece in self._pieces:
            part = piece.part if isinstance(piece, _Body) else piece
            if part is not None:
                yield part

    # -- queries -------------------------------------------------------------------------
    def calls_named(self, *names: str) -> list[CallSite]:
        if self._bodies_left:
            # `torch.cuda.empty_cache()` ends in its last name; `ec()` after
            # `from torch.cuda import empty_cache as ec` is spelled by its alias.
            # A name without a dot is only ever a plain call (`evaluate(...)`, never
            # `super().evaluate(...)`: an attribute's qualified name has a dot).
            aliases = self.imports.aliases
            for name in names:
                plain = "." not in name
                self._walk_calling(name.rsplit(".", 1)[-1], plain)
                for local, target in aliases.items():
                    if target == name:
                        self._walk_calling(local, plain)
        return [site for name in names for part in self._parts() for site in part.by_name.get(name, ())]

    def calls_to_method(self, *methods: str) -> list[CallSite]:
        if self._bodies_left:
            for method in methods:
                self._walk_calling(method)
        return [site for method in methods for part in self._parts() for site in part.by_method.get(method, ())]

    def calls_to_method_on(self, receivers: str | tuple[str, ...], *methods: str) -> list[CallSite]:
        """`calls_to_method(*methods)` whose receiver is `receivers` (or one of them:
        `model.eval()`), walking only the bodies where the name before the `.` may be the
        receiver's: asking whether one name is a module walked trl's 500-line `__init__`
        for its `named_parameters()` on another receiver (issue 15)."""
        if isinstance(receivers, str):
            receivers = (receivers,)
        if self._bodies_left:
            for method in methods:
                for receiver in receivers:
                    for line in self._text.lines_calling_on(method, receiver):  # type: ignore[union-attr]
                        body = self._body_at(line)
                        if body is not None and body.part is None:
                            self._walk_body(body)
        return [site for method in methods for part in self._parts()
                for site in part.by_method.get(method, ()) if site.receiver in receivers]

    def context_of_stmt(self, stmt: ast.stmt) -> Context:
        context = self.context_of(stmt)
        if context is None:
            raise KeyError(id(stmt))
        return context

    def context_of(self, node: ast.AST) -> Context | None:
        """The context of a statement of this tree, None for anything else (`contexts.get`)."""
        context = self._known.get(id(node))
        if context is not None or not self._bodies_left or not isinstance(node, ast.stmt):
            return context
        body = self._body_at(node.lineno)
        if body is not None and body.part is None:
            context = _context_by_statements(body, node)  # what the walk would give, unwalked
            if context is None:
                self._walk_body(body)
                context = self._known.get(id(node))
        if context is None:  # not where its line says: a node of another tree, or a surprise
            self._walk_all()
            context = self._known.get(id(node))
        return context

    def calls_within(self, node: ast.AST) -> list[CallSite]:
        """Calls lexically inside `node` (a statement, loop, function...)."""
        first, last = node.lineno, node.end_lineno or node.lineno
        if self._bodies_left:
            at = max(bisect.bisect_right(self._body_lines, first) - 1, 0)
            for body in self._bodies[at:]:
                if body.function.lineno > last:
                    break
                if (body.function.end_lineno or body.function.lineno) >= first:
                    self._walk_body(body)
        inside = []
        for part in self._parts():
            for site in part.calls:
                call = site.node
                if first <= call.lineno <= last and _contains(node, call):
                    inside.append(site)
        return inside

    def calls_in_scope_of(self, stmt: ast.stmt) -> list[CallSite]:
        """A superset of the calls under `stmt`, in walk order: those of the outermost
        function around it, or, outside functions, of the module's own statements
        (everything, when the index was built without the text). Empty for a statement not
        in this tree. `LoopAnalysis` indexes loops one such scope at a time with it."""
        if self.context_of(stmt) is None:
            return []
        if len(self._pieces) == 1:
            return self._pieces[0].calls  # type: ignore[union-attr]
        body = self._body_at(stmt.lineno)
        if body is not None and body.function is not stmt:
            self._walk_body(body)
            if id(stmt) in body.part.contexts:  # type: ignore[union-attr]
                return body.part.calls  # type: ignore[union-attr]
        if self._outside is None:
            self._outside = [site for piece in self._pieces if isinstance(piece, _Part) for site in piece.calls]
        return self._outside

    # -- walking bodies on demand ----------------------------------------------------------
    def _walk_calling(self, name: str, plain: bool = False) -> None:
        """Walk every body whose text may call `name` (with `plain`, as `name(`, not `x.name(`)."""
        text = self._text
        lines = text.lines_calling_on(name, "") if plain else text.lines_calling(name)  # type: ignore[union-attr]
        for line in lines:
            body = self._body_at(line)
            if body is not None and body.part is None:
                self._walk_body(body)

    def _body_at(self, line: int) -> _Body | None:
        at = bisect.bisect_right(self._body_lines, line) - 1
        if at < 0:
            return None
        body = self._bodies[at]
        return body if line <= (body.function.end_lineno or body.function.lineno) else None

    def _walk_body(self, body: _Body) -> None:
        if body.part is not None:
            return
        outer, self._part = self._part, _Part()
        func = body.function
        self._deferring = False  # what is inside it (methods of a class in it too) is walked now
        self._walk_block(func.body, (), (), func, body.classdef)  # type: ignore[attr-defined]
        self._deferring = True
        body.part, self._part = self._part, outer
        body.part.finish()
        self._bodies_left -= 1

    # -- the walk ------------------------------------------------------------------------
    def _walk_block(self, body, loops, withs, function, classdef) -> None:
        block = tuple(body)
        for stmt in body:
            context = Context(stmt, block, loops, withs, function, classdef)
            self._part.contexts[id(stmt)] = self._known[id(stmt)] = context
            self._walk_stmt(stmt, context)

    def _walk_stmt(self, stmt: ast.stmt, context: Context) -> None:
        loops, withs, function, classdef = context.loops, context.withs, context.function, context.classdef
        if isinstance(stmt, Function):
            self._part.functions.append(stmt)
            self._walk_exprs([*stmt.decorator_list, *_defaults(stmt.args)], context)
            if self._deferring:  # an outermost function's body: walked when needed
                body = _Body(stmt, classdef)
                self._part.finish()
                self._part = _Part()
                self._pieces += [body, self._part]
                self._bodies.append(body)
                self._body_lines.append(stmt.lineno)
                self._bodies_left += 1
                return
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
        calls, fields, skip, AST = self._part.calls, _FIELDS, _SKIP, ast.AST
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


def _context_by_statements(body: _Body, node: ast.stmt) -> Context | None:
    """The context the walk gives `node` inside an unwalked body, found by going down the
    statements whose lines hold it (no expression visited): CFX302 asks where two
    accumulations of trl's GRPO trainer sit, inside its 940-line `__init__` (issue 15).
    None where the lines do not lead to `node`."""
    line = node.lineno
    block: list = body.function.body  # type: ignore[attr-defined]
    loops: tuple = ()
    withs: tuple = ()
    function: ast.AST | None = body.function
    classdef = body.classdef
    while True:
        holder = None
        for stmt in block:
            if stmt is node:
                return Context(node, tuple(block), loops, withs, function, classdef)
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                holder = stmt
        if holder is None:
            return None
        if isinstance(holder, Function):
            block, loops, withs, function = holder.body, (), (), holder
            continue
        if isinstance(holder, ast.ClassDef):
            block, loops, withs, function, classdef = holder.body, (), (), None, holder
            continue
        inner_loops = loops + (holder,) if isinstance(holder, Loop) else loops
        inner_withs = withs + (holder,) if isinstance(holder, (ast.With, ast.AsyncWith)) else withs
        blocks = []
        for name in ("body", "orelse", "finalbody"):
            if isinstance(holder, Loop) and name == "orelse":
                blocks.append((getattr(holder, name), loops, withs))
            else:
                blocks.append((getattr(holder, name, None) or [], inner_loops, inner_withs))
        for child in getattr(holder, "handlers", None) or getattr(holder, "cases", None) or ():
            blocks.append((child.body, inner_loops, inner_withs))
        for candidate, candidate_loops, candidate_withs in blocks:
            if candidate and candidate[0].lineno <= line <= (candidate[-1].end_lineno or candidate[-1].lineno):
                block, loops, withs = candidate, candidate_loops, candidate_withs
                break
        else:
            return None


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _contains(outer: ast.AST, inner: ast.AST) -> bool:
    """Position test: `inner` starts inside `outer`'s span."""
    start = (outer.lineno, outer.col_offset)
    end = (outer.end_lineno, outer.end_col_offset)
    return start <= (inner.lineno, inner.col_offset) and (inner.end_lineno, inner.end_col_offset) <= end
