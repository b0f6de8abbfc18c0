"""Classes and `self.x` attributes for the model analysis (models.py), as questions
over the tree: the project's own base classes of a class (in its module or another), the
attributes it casts or moves, whether `self.other` may refer to `self` or a tracked model
(so that a method called on it may change `self.model`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from cfgfix.analysis.names import dotted, walk_scope


def _project_bases(cls: ast.ClassDef, table, moved: set[str] | None, depth: int = 0) -> list:
    """(table, class) of each of the project's own classes `cls` builds on, nearest first:
    in its module or imported from another project module (`from trainers.base import
    BaseTrainer`). Libraries' classes are not followed, and another module is parsed only
    when its text names `self.<attr>` for an attribute in `moved` (when given)."""
    found = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            table._need(base.id)  # another module parsed in parts (module_parts.py): that block
        if isinstance(base, ast.Name) and base.id in table._classes:
            hit = (table, table._classes[base.id])
        elif isinstance(base, (ast.Name, ast.Attribute)) and table.project is not None and table.path is not None:
            where = _base_module(base, table)
            if where is None:
                continue  # a builtin or a library's class: no lookup
            if moved is not None:
                data = table.project.raw(where)
                if data is None or not any(b"self." + attr.encode("ascii", "replace") in data for attr in moved):
                    continue  # the base's module never mentions what this class moves: not parsed
            hit = table.lookup(base, None)
        else:
            continue
        if hit is None or not isinstance(hit[1], ast.ClassDef) or hit[1] is cls:
            continue
        found.append((hit[0], hit[1]))
        if depth < 3:
            found.extend(_project_bases(hit[1], hit[0], moved, depth + 1))
    return found


def _base_module(base: ast.expr, table):
    """The project file that an imported base class comes from (`from .base import
    BaseTrainer`, `import trainers.base as tb` then `tb.BaseTrainer`); None for libraries."""
    if isinstance(base, ast.Name):
        if base.id in table.imports.relative:
            level, module, _ = table.imports.relative[base.id]
            return table.project.resolve(table.path, module, level)
        module = table.imports.aliases.get(base.id, "").rpartition(".")[0]
    elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        if base.value.id in table.imports.relative:
            level, module, name = table.imports.relative[base.value.id]
            return table.project.resolve(table.path, f"{module}.{name}" if module else name, level)
        module = table.imports.aliases.get(base.value.id, "")
    else:
        return None
    return table.project.resolve(table.path, module, 0) if module else None


def _heirs(tree: ast.Module, functions, survey) -> list[ast.ClassDef]:
    """The module's classes that hold no load themselves but build on a project class that
    does (`class LoraTrainer(BaseTrainer)`): their methods may cast or move what the base
    loaded into `self.model`."""
    found = []
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.bases and node not in survey.load_scopes):
            continue
        moved = _moved_attributes(functions, node)
        if moved is not None and not moved:
            continue
        for table, base in _project_bases(node, functions, moved):
            base_text = table.text_of(base)
            if base_text is not None and moved is not None and not any(f"self.{attr}" in base_text for attr in moved):
                continue  # the base does not hold what this class moves
            if any(table.mentions_load(method) for method in base.body
                   if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))):
                found.append(node)
                break
    return found


_SELF_MOVE: list = []  # (the cast/move pattern, the model-like name pattern), compiled on first use


def _moved_attributes(table, cls: ast.ClassDef) -> set[str] | None:
    """The attributes named like a model that the class casts or moves (`self.model.to(`,
    `self.policy.half(`): only those can gain a finding from a base class's load, and a
    class with none has its bases looked up (another module parsed) not at all. None when
    the module's text is not known."""
    text = table.text_of(cls)
    if text is None:
        return None
    if not _SELF_MOVE:
        from cfgfix.analysis.project_modules import _MODEL_TARGET, SELF_MOVE

        _SELF_MOVE.extend(re.compile(p.pattern.decode("ascii")) for p in (SELF_MOVE, _MODEL_TARGET))
    moves, model_like = _SELF_MOVE
    return {m.group(1) for m in moves.finditer(text) if model_like.search(m.group(1))}


def _calls_super_init(init) -> bool:
    """`super().__init__(...)` in the body of `init` (not in a nested function)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"
               and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
               and n.func.value.func.id == "super" for n in walk_scope(init))


def _calls_any(node: ast.AST, methods: set[str]) -> bool:
    """`self.name(...)` for a name in `methods` anywhere in `node`."""
    return bool(methods) and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in methods
        and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" for n in ast.walk(node))


def _may_hold_load(places) -> bool:
    """Cheap test before any evaluation: every value is a call or a name (a load, a loader's
    result, a wrapper, a parameter), not a literal, a comprehension or arithmetic."""
    return all(isinstance(value, (ast.Call, ast.Name, ast.Attribute)) for _, value in places)


def _may_hold_tracked(cls: ast.ClassDef | None, key: str, env: dict, table) -> bool:
    """Whether the untracked `self.other` (`key`) may refer to `self` or to a value the walk
    tracks, so that a method called on it may rebind or cast `self.model`. It may not only
    when the class (or a base class of this module) assigns `key`, is not given it another
    way (a property or method of that name, a `for`/`with` target), and no assigned value
    mentions, as a whole object, `self` (`Handler(self)`), a tracked key or a part of one
    (`EMA(self.model)`, `partial(self.model.half)`), a function (a lambda may touch
    anything), or a local name that the same method binds to or from a tracked key
    (`self.model = model; self.ema = EMA(model)`). Using a tracked value's attributes keeps
    the object apart (`AdamW(self.model.parameters())`). Assumed: a base class from another
    module does not also assign `key` with such a value."""
    if cls is None:
        return True
    tracked = [k for k in env if k.startswith("self.")]
    if not tracked:
        return False
    attr = key.split(".", 1)[1]
    found = False
    for owner in _same_module_classes(cls, table.classes if table is not None else {}):
        for node in owner.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
                return True  # a property or method: anything may come back
        for method in owner.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            aliases = _tracked_aliases(method, tracked)
            for node in ast.walk(method):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if not any(dotted(t) == key for target in targets for t in ast.walk(target)):
                        continue
                    found = True
                    if node.value is None or _whole_objects(node.value, tracked, aliases):
                        return True
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.withitem, ast.AugAssign)):
                    target = node.optional_vars if isinstance(node, ast.withitem) else node.target
                    if target is not None and any(dotted(t) == key for t in ast.walk(target)):
                        return True
    return not found


def _same_module_classes(cls: ast.ClassDef, module: Mapping, depth: int = 0) -> list[ast.ClassDef]:
    """The class and the base classes it names that its module defines (found by name)."""
    found = [cls]
    for base in cls.bases:
        if depth < 4 and isinstance(base, ast.Name) and isinstance(module.get(base.id), ast.ClassDef) \
                and module[base.id] is not cls:
            found.extend(c for c in _same_module_classes(module[base.id], module, depth + 1) if c not in found)
    return found


def _whole_objects(value: ast.AST, tracked: list[str], aliases: set[str]) -> bool:
    """`value` mentions `self`, a tracked key (or part of one), an alias of one, or a function."""
    parts = set()
    for node in ast.walk(value):
        if isinstance(node, (ast.Lambda, ast.NamedExpr)):
            return True
        if isinstance(node, ast.Attribute):
            parts.add(id(node.value))
        elif isinstance(node, ast.Call):
            parts.add(id(node.func))
    for node in ast.walk(value):
        if not isinstance(node, (ast.Name, ast.Attribute)) or id(node) in parts:
            continue
        name = dotted(node)
        if name is None:
            continue
        if name == "self" or name in aliases or _is_tracked(node, tracked):
            return True
    return False


def _is_tracked(node: ast.AST, tracked: list[str]) -> bool:
    name = dotted(node)
    return name is not None and any(name == k or name.startswith(k + ".") for k in tracked)


def _whole_names(value: ast.AST) -> set[str]:
    """Local names `value` uses as whole objects, not as a load's arguments (a checkpoint
    name given to `from_pretrained` is not the model it returns)."""
    skip = set()
    for node in ast.walk(value):
        if isinstance(node, ast.Attribute):
            skip.add(id(node.value))
        elif isinstance(node, ast.Call):
            skip.add(id(node.func))
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("from_pretrained", "from_config"):
                skip.update(id(n) for arg in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(arg))
    return {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and n.id != "self" and id(n) not in skip}


def _tracked_aliases(method: ast.AST, tracked: list[str]) -> set[str]:
    """Local names `method` binds to or from a tracked key, whole (`self.model = model`,
    `model = self.model`, `self.model = wrap(model)`)."""
    names: set[str] = set()
    for node in ast.walk(method):
        if not isinstance(node, ast.Assign):
            continue
        targets = [t for target in node.targets for t in ast.walk(target) if isinstance(t, (ast.Name, ast.Attribute))]
        if any(_is_tracked(t, tracked) for t in targets):
            names.update(_whole_names(node.value))
        if _whole_objects(node.value, tracked, set()):
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
