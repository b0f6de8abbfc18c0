"""Version guards: the library versions under which a piece of code can run, read from the
`if` tests around it.

Code that supports several releases tests the version and takes a different path on each:

    if is_torch_version(">=", "1.11.0"):
        out = checkpoint(block, x, use_reentrant=False)
    else:
        out = checkpoint(block, x)          # runs only on torch < 1.11

A rule whose fact holds only from some release on (a keyword that exists from torch 1.11)
asks whether the code can run on such a release at all. The idioms read, each for any
package name (`torch`, `transformers`, ...):

- `is_<pkg>_version(">=", "1.11.0")` (diffusers, accelerate and transformers helpers);
- `is_<pkg>_greater_or_equal("2.0")` (transformers) and the module constants
  `is_<pkg>_greater_or_equal_than_1_13` / `is_<pkg>_less_than_1_11`;
- comparisons of `<pkg>.__version__` (bare, or through `version.parse`, `Version`,
  `LooseVersion`, `.base_version`) with a version string (bare or parsed): either side;
- a name bound once at module level to one of these (`TORCH_GE_111 = is_torch_version(...)`)
  or to a parsed `__version__` (`TORCH_VERSION = version.parse(torch.__version__)`).

`not`, `and` (in the body, every part holds) and `or` (in the `else`, no part holds) combine
them; the `else` of a guard holds its negation, and so do the statements after an
`if <guard>:` whose body always leaves (`return`, `raise`). Other tests add nothing: a
branch under an unknown test is reached under whatever versions reach the `if`.
"""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.names import ImportMap, dotted, walk
from cfgfix.records import dataclass

# What a file must contain for the walk to be worth it.
TOKENS = ("__version__", "_version(", "greater_or_equal", "_than_", "_less_than")

_NEGATE = {">=": "<", "<": ">=", ">": "<=", "<=": ">"}
_FLIP = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}  # `"1.11" <= v` is `v >= "1.11"`
_OPS = {ast.GtE: ">=", ast.Gt: ">", ast.LtE: "<=", ast.Lt: "<"}
_HELPER = re.compile(r"is_(\w+?)_version$")
_GE_HELPER = re.compile(r"is_(\w+?)_greater_or_equal$")
_CONSTANT = re.compile(r"is_(\w+?)_(greater_or_equal_than|greater_than|less_than)_(\d+(?:_\d+)*)$")
_VERSION = re.compile(r"\d+(\.\d+)*")


@dataclass(frozen=True)
class Bound:
    """`package op version` holds wherever the guarded code runs (op: >=, >, <=, <)."""

    package: str
    op: str
    version: str

    def negated(self) -> Bound:
        return Bound(self.package, _NEGATE[self.op], self.version)


def _release(text: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in text.split("."))
    while len(parts) > 1 and parts[-1] == 0:
        parts = parts[:-1]
    return parts


class VersionGuards:
    """The version bounds that hold where each node of a module runs (only nodes under a
    recognised guard are recorded)."""

    def __init__(self, tree: ast.Module, imports: ImportMap | None = None) -> None:
        self.imports = imports or ImportMap(tree)
        self._module_names = _module_bindings(tree)
        self._bounds: dict[int, tuple[Bound, ...]] = {}
        self._block(tree.body, ())

    # ------------------------------------------------------------------ queries

    def bounds(self, node: ast.AST) -> tuple[Bound, ...]:
        return self._bounds.get(id(node), ())

    def runs_only_below(self, node: ast.AST, package: str, version: str) -> bool:
        """True when every version under which `node` can run is older than `version`."""
        limit = _release(version)
        for bound in self.bounds(node):
            if bound.package != package:
                continue
            v = _release(bound.version)
            if (bound.op == "<" and v <= limit) or (bound.op == "<=" and v < limit):
                return True
        return False

    # ------------------------------------------------------------------ walk

    def _record(self, node: ast.AST, held: tuple[Bound, ...]) -> None:
        if not held:
            return
        for sub in walk(node):
            self._bounds[id(sub)] = held

    def _block(self, body: list[ast.stmt], held: tuple[Bound, ...]) -> None:
        for stmt in body:
            self._statement(stmt, held)
            if isinstance(stmt, ast.If) and not stmt.orelse and _leaves(stmt.body):
                # `if <guard>: return` -- what follows runs only where the guard is false
                held = held + tuple(self.when(stmt.test, False))

    def _statement(self, stmt: ast.stmt, held: tuple[Bound, ...]) -> None:
        if isinstance(stmt, ast.If):
            self._record(stmt.test, held)
            self._block(stmt.body, held + tuple(self.when(stmt.test, True)))
            self._block(stmt.orelse, held + tuple(self.when(stmt.test, False)))
            return
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # a definition under a guard is made (and so called) only under it
            self._record_header(stmt, held)
            self._block(stmt.body, held)
            return
        bodies = [getattr(stmt, field) for field in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, field, None), list)]
        handlers = getattr(stmt, "handlers", None) or []
        cases = getattr(stmt, "cases", None) or []
        if not bodies and not handlers and not cases:
            self._record(stmt, held)
            self._expressions(stmt, held)
            return
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.expr):
                self._record(child, held)
        for block in bodies:
            self._block(block, held)
        for handler in handlers:
            self._block(handler.body, held)
        for case in cases:
            self._block(case.body, held)

    def _record_header(self, stmt, held) -> None:
        for child in ast.iter_child_nodes(stmt):
            if not isinstance(child, ast.stmt):
                self._record(child, held)

    def _expressions(self, stmt: ast.stmt, held: tuple[Bound, ...]) -> None:
        """`a if <guard> else b` inside a statement: each side under its bound."""
        for node in walk(stmt):
            if isinstance(node, ast.IfExp):
                inner = self._bounds.get(id(node), held)
                for side, truth in ((node.body, True), (node.orelse, False)):
                    extra = tuple(self.when(node.test, truth))
                    if extra:
                        self._record(side, inner + extra)

    # ------------------------------------------------------------------ tests

    def when(self, test: ast.expr, truth: bool) -> list[Bound]:
        """Bounds that hold when `test` evaluates to `truth`."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.when(test.operand, not truth)
        if isinstance(test, ast.BoolOp):
            # `a and b` true: both hold; `a or b` false: neither holds. Otherwise nothing sure.
            if isinstance(test.op, ast.And) == truth:
                return [b for value in test.values for b in self.when(value, truth)]
            return []
        bound = self._bound(test)
        if bound is None:
            return []
        return [bound if truth else bound.negated()]

    def _bound(self, test: ast.expr) -> Bound | None:
        if isinstance(test, ast.Name) and test.id in self._module_names:
            value = self._module_names[test.id]
            return self._bound(value) if not _is_version_of(value, self.imports) else None
        if isinstance(test, ast.Call):
            return self._helper_call(test)
        name = dotted(test)
        if name:
            match = _CONSTANT.match(name.rsplit(".", 1)[-1])
            if match:
                package, kind, digits = match.groups()
                op = {"greater_or_equal_than": ">=", "greater_than": ">", "less_than": "<"}[kind]
                return Bound(package, op, digits.replace("_", "."))
            return None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
            op = _OPS[type(test.ops[0])]
            left, right = test.left, test.comparators[0]
            package = self._version_of(left)
            version = _version_literal(right)
            if package is None:
                package, version, op = self._version_of(right), _version_literal(left), _FLIP[op]
            if package and version:
                return Bound(package, op, version)
        return None

    def _helper_call(self, call: ast.Call) -> Bound | None:
        name = dotted(call.func)
        if not name:
            return None
        short = name.rsplit(".", 1)[-1]
        strings = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        match = _HELPER.match(short)
        if match and len(strings) == 2 and strings[0] in _NEGATE and _VERSION.fullmatch(strings[1]):
            return Bound(match.group(1), strings[0], strings[1])
        match = _GE_HELPER.match(short)
        if match and len(strings) == 1 and _VERSION.fullmatch(strings[0]):
            return Bound(match.group(1), ">=", strings[0])
        return None

    def _version_of(self, node: ast.expr) -> str | None:
        """The package whose installed version `node` is (`torch.__version__`, parsed or not)."""
        if isinstance(node, ast.Name) and node.id in self._module_names:
            node = self._module_names[node.id]
        return _is_version_of(node, self.imports)


def _is_version_of(node: ast.expr, imports: ImportMap) -> str | None:
    for sub in walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "__version__":
            qualified = imports.qualify(sub.value)
            if qualified:
                return qualified.split(".")[0]
    return None


def _version_literal(node: ast.expr) -> str | None:
    """`"1.11.0"`, `version.parse("1.11")`, `Version("2.0")` -> the version string."""
    if isinstance(node, ast.Call) and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _VERSION.fullmatch(node.value):
        return node.value
    return None


def _module_bindings(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level names bound exactly once by a plain assignment."""
    seen: dict[str, ast.expr | None] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            seen[name] = None if name in seen else stmt.value
    return {k: v for k, v in seen.items() if v is not None}


def _leaves(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def version_guards(ctx) -> VersionGuards | None:
    """The module's guards, built once per file; None when its text has no guard idiom."""
    if "version-guards" not in ctx.notes:
        text = ctx.source.text
        ctx.notes["version-guards"] = (
            VersionGuards(ctx.document.tree, getattr(ctx, "imports", None)) if any(token in text for token in TOKENS) else None
        )
    return ctx.notes["version-guards"]
