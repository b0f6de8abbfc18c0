"""Which model ids a `from_pretrained` call may load, followed through the code that hands
them over: a literal, a name bound to one, a parameter of the function or constructor the
load sits in (every call of it, in this module and in the project modules that import it,
with the parameter's default where a call leaves it out), and a field of a config object
built from a project class without arguments (`ModelConfig().model_name`, a dataclass
default). CFX206 asks it so that a float32-stored checkpoint is known as one also when its
id travels through `BERTfinetuning(model_name, ...)` in another module.

The answer is every id the load may get, or None as soon as one path is unknown (an
argument read from the command line, a call that passes `*args`, a parameter nobody in the
project passes): a rule that stays silent on "every id is float32" must not guess."""

from __future__ import annotations

import ast
from pathlib import Path

from cfgfix.analysis.names import ImportMap

_MAX_DEPTH = 4  # hand-overs followed (parameter -> caller -> its parameter -> ...)
_MAX_IDS = 16


class _Module:
    """One module's tree, its imports and where each node sits (built once per module)."""

    def __init__(self, tree: ast.Module, path, text: str | None = None) -> None:
        self.tree = tree
        self.path = Path(path) if path is not None else None
        self.text = text
        self.imports = ImportMap(tree)
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or class, or module) whose body holds `node`."""
        current = self.parents.get(id(node))
        while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            current = self.parents.get(id(current))
        return current if current is not None else self.tree

    def class_of(self, function: ast.AST) -> ast.ClassDef | None:
        owner = self.parents.get(id(function))
        return owner if isinstance(owner, ast.ClassDef) else None


class ModelIds:
    """`ModelIds(tree, path, project).of(call)`: the ids, with the files read in `deps`."""

    def __init__(self, tree: ast.Module, path=None, project=None, text: str | None = None) -> None:
        self.project = project
        self.deps: set[str] = set()
        self._modules: dict[str, _Module] = {}
        self._here = _Module(tree, path, text)
        if path is not None:
            self._modules[str(Path(path).resolve())] = self._here

    def of(self, call: ast.Call) -> set[str] | None:
        node = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "pretrained_model_name_or_path"), None)
        if node is None:
            return None
        found = self._value(node, self._here, self._here.scope_of(call), 0, set())
        return found if found and len(found) <= _MAX_IDS else None

    # -- one expression in one scope -------------------------------------------------------
    def _value(self, node: ast.AST, module: _Module, scope: ast.AST, depth: int, seen: set) -> set[str] | None:
        if depth > _MAX_DEPTH:
            return None
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else None
        if isinstance(node, ast.IfExp):
            a = self._value(node.body, module, scope, depth, seen)
            b = self._value(node.orelse, module, scope, depth, seen) if a is not None else None
            return a | b if b is not None else None
        if isinstance(node, ast.Name):
            return self._name(node.id, module, scope, depth, seen)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self._field(node.value.id, node.attr, module, scope, depth, seen)
        return None

    def _name(self, name: str, module: _Module, scope: ast.AST, depth: int, seen: set) -> set[str] | None:
        key = (id(scope), name)
        if key in seen:
            return None
        seen = seen | {key}
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            values = _assigned(scope.body, name)
            if values is not None and values:
                return self._union(values, module, scope, depth, seen)
            if values is None:
                return None  # bound some other way (a loop target, `a, b = ...`, `+=`)
            if name in _parameters(scope):
                return self._parameter(name, module, scope, depth, seen)
        values = _assigned(module.tree.body, name)
        if not values:
            return None
        return self._union(values, module, module.tree, depth, seen)

    def _union(self, values, module, scope, depth, seen) -> set[str] | None:
        found: set[str] = set()
        for value in values:
            ids = self._value(value, module, scope, depth, seen)
            if ids is None:
                return None
            found |= ids
        return found

    def _field(self, owner: str, attr: str, module: _Module, scope: ast.AST, depth: int, seen: set) -> set[str] | None:
        """`config.model_name` where `config = ModelConfig()` (a project class built with no
        arguments): the class's own default for that field."""
        body = scope.body if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) else []
        values = _assigned(body, owner)
        if not values and scope is not module.tree:
            values = _assigned(module.tree.body, owner) if owner not in _parameters(scope) else None
        if not values or len(values) != 1:
            return None
        built = values[0]
        if not (isinstance(built, ast.Call) and isinstance(built.func, ast.Name) and not built.args and not built.keywords):
            return None  # arguments may set the field: unknown
        found = self._class(built.func.id, module)
        if found is None:
            return None
        cls, home = found
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in ("__init__", "__post_init__")
               for n in cls.body):
            return None  # its own constructor may set the field
        defaults = [n.value for n in cls.body if n.value is not None and (
            (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == attr)
            or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in n.targets)))]
        if len(defaults) != 1:
            return None
        return self._value(defaults[0], home, home.tree, depth + 1, seen)

    # -- a parameter: every call of its function ----------------------------------------------
    def _parameter(self, name: str, module: _Module, function: ast.AST, depth: int, seen: set) -> set[str] | None:
        cls = module.class_of(function)
        if cls is not None and function.name != "__init__":
            return None  # a method's callers go through objects: not followed
        callee = cls.name if cls is not None else function.name
        position, default = _position(function, name, method=cls is not None)
        if position is None:
            return None
        calls = list(self._calls(callee, module))
        if not calls:
            return None  # nobody in the project passes it: a library or the command line does
        found: set[str] = set()
        for call, caller_module in calls:
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                return None
            argument = next((k.value for k in call.keywords if k.arg == name), None)
            if argument is None and position < len(call.args):
                argument = call.args[position]
            if argument is None:
                if default is None:
                    return None
                ids = self._value(default, module, module.tree, depth + 1, seen)
            else:
                ids = self._value(argument, caller_module, caller_module.scope_of(call), depth + 1, seen)
            if ids is None:
                return None
            found |= ids
        return found

    def _calls(self, callee: str, module: _Module):
        """(call, module) for each call of `callee` by name in its own module and in the
        project modules that import it."""
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == callee:
                yield node, module
        if self.project is None or module.path is None:
            return
        from cfgfix.analysis.project_callers import importers

        pending, done = [(module.path, callee)], set()
        while pending:
            path, name = pending.pop()
            if (str(path), name) in done or len(done) > 8:
                continue
            done.add((str(path), name))
            for parsed, local in importers(self.project, path, name):
                other = self._module(parsed)
                if Path(parsed.path).name == "__init__.py":
                    pending.append((parsed.path, local))  # a package that re-exports it: its importers call it
                for node in ast.walk(other.tree):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == local:
                        yield node, other

    def _module(self, parsed) -> _Module:
        key = str(Path(parsed.path).resolve())
        found = self._modules.get(key)
        if found is None:
            found = self._modules[key] = _Module(parsed.tree, parsed.path)
            self.deps.add(str(parsed.path))
        return found

    def _class(self, name: str, module: _Module):
        """The project class `name` names in `module` (defined there or imported from a
        project module), with the module that defines it."""
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node, module
        if self.project is None or module.path is None:
            return None
        target, imported = None, name
        if name in module.imports.relative:
            level, dotted_module, imported = module.imports.relative[name]
            target = self.project.resolve(module.path, dotted_module, level)
        elif name in module.imports.aliases:
            dotted_module, _, imported = module.imports.aliases[name].rpartition(".")
            target = self.project.resolve(module.path, dotted_module, 0) if dotted_module else None
        if target is None:
            return None
        parsed = self.project.parse(Path(target))
        if parsed is None:
            return None
        home = self._module(parsed)
        for node in home.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == imported:
                return node, home
        return None


def _assigned(body: list[ast.stmt], name: str) -> list[ast.expr] | None:
    """The values `name = value` binds in a block (nested blocks included, nested defs not);
    None when it is also bound some other way."""
    values: list[ast.expr] = []
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    values.append(node.value)
                elif any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                    return None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            if node.value is not None:
                values.append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr,
                               ast.Import, ast.ImportFrom)):
            targets = [node.target] if isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr)) else \
                [i.optional_vars for i in node.items if i.optional_vars is not None] \
                if isinstance(node, (ast.With, ast.AsyncWith)) else []
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return None
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    (a.asname or a.name.split(".")[0]) == name for a in node.names):
                return None
        stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
        if isinstance(node, ast.Try):
            stack.extend(s for handler in node.handlers for s in handler.body)
    return values


def _parameters(function: ast.AST) -> set[str]:
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}


def _position(function: ast.AST, name: str, method: bool) -> tuple[int | None, ast.expr | None]:
    """The parameter's position among the arguments a call passes (`self` left out for a
    constructor) and its default; (None, None) for a keyword-only parameter without one."""
    args = function.args
    positional = [*args.posonlyargs, *args.args][1 if method else 0:]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults):], args.defaults,
                        strict=False)) if args.defaults else {}
    for index, arg in enumerate(positional):
        if arg.arg == name:
            return index, defaults.get(name)
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=False):
        if arg.arg == name:
            return 10_000, default  # keyword-only: never positional
    return None, None
