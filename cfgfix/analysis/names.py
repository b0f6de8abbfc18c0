"""What a name refers to: import aliases resolved to qualified names, and constants.

`import torch as th` makes `th.bfloat16` resolve to `torch.bfloat16`;
`from torch import bfloat16` makes `bfloat16` resolve to it too. Names that no import
binds resolve to themselves (`AutoModel` defined locally stays `AutoModel`).
"""

from __future__ import annotations

import ast
from ast import AST
from collections import deque

# Canonical dtype names, keyed by what `torch.<attr>` or a string may say.
DTYPE_ALIASES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


class ImportMap:
    def __init__(self, tree: ast.Module) -> None:
        aliases: dict[str, str] = {}
        # `from .build import build_model`: local name -> (level, module, imported name),
        # resolved to a project file by `analysis.project_modules` when a rule follows it.
        relative: dict[str, tuple[int, str, str]] = {}
        self.aliases, self.relative = aliases, relative
        # name -> its value when the whole file binds it once, by `name = value`; None
        # when it is bound more than once or otherwise (`a, name = ...`, `name += 1`).
        assigned: dict[str, ast.expr | None] = {}
        # One pass over the module's statements (shared, `module_statements`), dispatched on
        # the exact node type: the isinstance chain per statement was most of this (issue 15).
        for node in module_statements(tree):
            kind = type(node)
            if kind is ast.Assign:
                for target in node.targets:
                    if type(target) is ast.Name:  # the usual case
                        name = target.id
                        assigned[name] = None if name in assigned else node.value
                    else:  # `a, b = ...`, `self.x = ...`, `config[key] = ...`: no one value
                        for name in _target_names(target):
                            assigned[name] = None
            elif kind is ast.ImportFrom:
                if node.level:
                    for alias in node.names:
                        if alias.name != "*":
                            relative[alias.asname or alias.name] = (node.level, node.module or "", alias.name)
                elif node.module:
                    for alias in node.names:
                        if alias.name != "*":
                            aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif kind is ast.Import:
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:  # `import torch.nn` binds `torch`
                        root = alias.name.split(".")[0]
                        aliases.setdefault(root, root)
            elif (kind is ast.AnnAssign or kind is ast.AugAssign) and type(node.target) is ast.Name:
                assigned[node.target.id] = None
        # A local alias of an imported name, bound once in the whole file
        # (`autocast = torch.cuda.amp.autocast`): it names the same thing.
        for name, value in assigned.items():
            if value is None or name in aliases:
                continue
            target = dotted(value)
            # Two dots at least: an API path (`torch.utils.checkpoint.checkpoint`), not a value
            # such as `torch.float16` that a parameter of the same name may shadow.
            if target and target.count(".") >= 2 and target.split(".")[0] in aliases:
                aliases[name] = self.qualify(value)  # type: ignore[assignment]

    def qualify(self, node: ast.AST) -> str | None:
        """Dotted qualified name of a Name/Attribute chain, or None for anything else."""
        name = dotted(node)
        if name is None:
            return None
        root, dot, rest = name.partition(".")
        return self.aliases.get(root, root) + dot + rest

    def local_name_for(self, qualified: str) -> str | None:
        """How this module can spell a module such as `torch` (`th` after `import torch as th`)."""
        for local, target in self.aliases.items():
            if target == qualified:
                return local
        return None


def dotted(node: ast.AST) -> str | None:
    """`self.model` -> "self.model"; anything that is not a Name/Attribute chain -> None."""
    if isinstance(node, ast.Name):  # the two usual shapes first: the analyses ask for every name
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id + "." + node.attr
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _target_names(target: ast.expr) -> list[str]:
    """Every name in an assignment target that is not a plain name, as `walk` finds them:
    those it binds (`a, (b, *c)`), those it writes into (`self.x`, `config["fmt"]`) and those
    it reads (`d[k]`). `analysis/module_parts.py` counts the same names as assigned. An
    attribute chain (`self.x.y = ...`, most such targets) is read down to its root, not
    walked."""
    kind = type(target)
    while kind is ast.Attribute:
        target = target.value
        kind = type(target)
    if kind is ast.Name:
        return [target.id]
    return [node.id for node in walk(target) if type(node) is ast.Name]


def gpu_branch(node: ast.If | ast.IfExp, imports: "ImportMap"):
    """The side of `if torch.cuda.is_available():` (or of `x if torch.cuda.is_available()
    else y`; the `else` of `not ...`) that a GPU run takes; None for any other test."""
    test, body = node.test, node.body
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, body = test.operand, node.orelse
    if isinstance(test, ast.Call) and not test.args and not test.keywords \
            and imports.qualify(test.func) == "torch.cuda.is_available":
        return body
    return None


def single_assignments(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names assigned exactly once in a scope (not in nested functions), to their value.
    Memoised on the block's first statement: several rules ask about the same scopes."""
    if not body:
        return {}
    cached = getattr(body[0], "_cfgfix_single_assignments", None)
    if cached is None:
        cached = _single_assignments(body)
        body[0]._cfgfix_single_assignments = cached  # type: ignore[attr-defined]
    return cached


def _single_assignments(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names assigned exactly once in a scope (not in nested functions), to their value.

    Used to resolve `dtype = torch.bfloat16 ... from_pretrained(..., torch_dtype=dtype)`:
    a name bound once can be trusted; a name bound twice (or in a loop target, `with ...
    as`, `for`, augmented assignment) cannot.
    """
    counts: dict[str, int] = {}
    values: dict[str, ast.expr] = {}

    def bump(name: str, value: ast.expr | None) -> None:
        counts[name] = counts.get(name, 0) + 1
        if value is not None:
            values[name] = value

    def visit(stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, _NESTED_SCOPES):
                # another scope: its assignments bind its own names, except under `global`
                # or `nonlocal` (found from statements alone, no expression walked)
                for inner in iter_statements(stmt.body):
                    if isinstance(inner, (ast.Global, ast.Nonlocal)):
                        for name in inner.names:
                            bump(name, None)
                            bump(name, None)
                continue
            for node in _walk_scope_branches(stmt):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            bump(target.id, node.value)
                        else:
                            for sub in walk(target):
                                if isinstance(sub, ast.Name):
                                    bump(sub.id, None)
                                    bump(sub.id, None)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    bump(node.target.id, node.value)
                elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr, ast.comprehension)):
                    target = getattr(node, "target", None) or getattr(node, "optional_vars", None)
                    for sub in ast.walk(target) if target is not None else ():
                        if isinstance(sub, ast.Name):
                            bump(sub.id, None)
                            bump(sub.id, None)
                elif isinstance(node, (ast.Global, ast.Nonlocal)):
                    for name in node.names:
                        bump(name, None)
                        bump(name, None)

    visit(body)
    once = {name: values[name] for name, count in counts.items() if count == 1 and name in values}
    for name, value in _precision_tied(body, once).items():
        once.setdefault(name, value)
    return once


def _precision_tied(body: list[ast.stmt], once: dict[str, ast.expr]) -> dict[str, ast.expr]:
    """diffusers' idiom, where the accelerator's precision is a literal:

        accelerator = Accelerator(mixed_precision="fp16")
        weight_dtype = torch.float32
        if accelerator.mixed_precision == "fp16":
            weight_dtype = torch.float16
        elif accelerator.mixed_precision == "bf16":
            weight_dtype = torch.bfloat16

    `weight_dtype` is the value of the branch the literal takes (else the first binding),
    when these are all its bindings in the scope and each branch binds it alone."""
    precision = {}
    for name, value in once.items():
        if (isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute))
                and (getattr(value.func, "id", None) or getattr(value.func, "attr", "")) == "Accelerator"):
            kw = next((k.value for k in value.keywords if k.arg == "mixed_precision"), None)
            if isinstance(kw, ast.Constant) and isinstance(kw.value, str):
                precision[name] = kw.value
    if not precision:
        return {}
    found: dict[str, ast.expr] = {}
    for index, stmt in enumerate(body[:-1]):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, chosen, chain = stmt.targets[0].id, stmt.value, body[index + 1]
        if name in once or not isinstance(chain, ast.If):
            continue
        bindings, taken = 1, False
        while isinstance(chain, ast.If):
            test, branch = chain.test, chain.body
            ok = (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
                  and isinstance(test.left, ast.Attribute) and test.left.attr == "mixed_precision"
                  and isinstance(test.left.value, ast.Name) and test.left.value.id in precision
                  and isinstance(test.comparators[0], ast.Constant)
                  and len(branch) == 1 and isinstance(branch[0], ast.Assign) and len(branch[0].targets) == 1
                  and isinstance(branch[0].targets[0], ast.Name) and branch[0].targets[0].id == name)
            if not ok:
                bindings = -1
                break
            bindings += 1
            if not taken and test.comparators[0].value == precision[test.left.value.id]:
                chosen, taken = branch[0].value, True
            rest = chain.orelse
            if not rest:
                chain = None
            elif len(rest) == 1 and isinstance(rest[0], ast.If):
                chain = rest[0]  # elif
            else:
                bindings = -1  # an `else:` with other statements: not the idiom
                break
        if bindings > 1 and _bindings(body, name) == bindings:
            found[name] = chosen
    return found


def _bindings(body: list[ast.stmt], name: str) -> int:
    """How many times `name` is bound in this scope (not in nested functions)."""
    count = 0
    for stmt in body:
        if isinstance(stmt, _NESTED_SCOPES):
            continue
        for node in _walk_scope_branches(stmt):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr)):
                targets = [getattr(node, "target", None) or getattr(node, "optional_vars", None)]
            else:
                targets = []
            for target in targets:
                if target is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    count += 1
    return count


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` as a list, in the same order. The analyses visit every
    node of a scope several times; the stdlib's two nested generators per node were a fifth
    of a pre-commit run's CPU (issue 15)."""
    children = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, AST):
            children.append(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, AST):
                    children.append(item)
    return children


def walk(node: ast.AST):
    """`ast.walk`: every node under `node`, breadth first, in the same order."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        todo.extend(child_nodes(node))
        yield node


_STATEMENT_FIELDS = frozenset(("body", "orelse", "finalbody", "handlers", "cases"))


def walk_statements(node: ast.AST):
    """The statements under `node` (nested functions and classes included, with the except
    handlers and match cases that hold some), in the order `ast.walk(node)` yields them,
    without visiting a single expression: statements only ever sit under statements."""
    todo = deque([node])
    while todo:
        node = todo.popleft()
        for name in node._fields:
            if name in _STATEMENT_FIELDS:
                todo.extend(getattr(node, name, None) or ())
        yield node


_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def walk_scope(node: ast.AST):
    """ast.walk that does not descend into nested functions, lambdas or classes."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in child_nodes(current):
            if not isinstance(child, _NESTED_SCOPES):
                stack.append(child)


# Nodes with no statement or expression under them: a walk that looks for assignments or
# calls need not visit them (names, constants and operators are most of a tree's nodes).
LEAVES = (ast.Name, ast.Constant, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def _walk_scope_branches(node: ast.AST):
    """`walk_scope` without the leaves (`LEAVES`), in the same order otherwise."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for child in child_nodes(current):
            if not isinstance(child, _NESTED_SCOPES) and not isinstance(child, LEAVES):
                stack.append(child)


_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
# Per node type, its statement-holding fields (in `_BLOCK_FIELDS` order), filled by
# `block_fields` as types are met: a walk reads `BLOCKS_OF.get(type(node))` first, so a
# simple statement (most of a module) costs one dict lookup.
BLOCKS_OF: dict[type, tuple[str, ...]] = {}


def block_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that hold statements, handlers or match cases, in
    `_BLOCK_FIELDS` order (`()` for a simple statement)."""
    fields = BLOCKS_OF.get(kind)
    if fields is None:
        fields = BLOCKS_OF[kind] = tuple(name for name in _BLOCK_FIELDS if name in kind._fields)
    return fields


def iter_statements(body: list[ast.stmt]):
    """Every statement, nested ones included, without visiting expressions: imports and
    definitions are statements, and skipping expressions makes this ~10x cheaper than
    `ast.walk` on large modules. (In a stack's order: a block's `orelse`, `finalbody` and
    `handlers` come before its `body`.)"""
    stack = list(reversed(body))
    pop, extend, blocks_of = stack.pop, stack.extend, BLOCKS_OF
    while stack:
        node = pop()
        yield node
        kind = type(node)
        fields = blocks_of.get(kind)
        if fields is None:
            fields = block_fields(kind)
        for name in fields:
            children = getattr(node, name, None)
            if children:
                extend(reversed(children))


def module_statements(tree: ast.AST) -> list[ast.stmt]:
    """`list(iter_statements(tree.body))`, memoised on the tree: the import map and several
    analyses each read every statement of the module once."""
    cached = tree.__dict__.get("_cfgfix_statements")
    if cached is None:
        cached = tree._cfgfix_statements = list(iter_statements(tree.body))  # type: ignore[attr-defined]
    return cached
