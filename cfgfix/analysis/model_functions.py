"""The functions of the model analysis (models.py): `FunctionTable`, the functions and
classes a module defines or imports from the project's own modules (followed lazily,
parsed in parts), with text-based gates on what a function may load; and `CallBindings`,
what this module's call sites pass to them. What a function returns (its summary) is
computed by the walker (`model_walker.function_summary`)."""

from __future__ import annotations

import ast
import functools
import re

from cfgfix.analysis.model_loads import _LIBRARIES
from cfgfix.analysis.model_values import _KEEPING_METHODS, CAST_METHODS, MOVE_METHODS, ModelState
from cfgfix.analysis.names import ImportMap, child_nodes, dotted, iter_statements, single_assignments, walk, walk_scope
from cfgfix.analysis.process_tests import TOKENS as PROCESS_TOKENS
from cfgfix.documents.text import line_starts

_IMPORTS = (b"import",)  # what a package that re-exports a name holds (`from .loop import train`)
_LOAD_CALL = re.compile(r"from_pretrained\s*\(")


class CallBindings:
    """What this module's call sites pass to its own functions and classes: for each callee,
    the state of each model argument at each call."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[ast.AST, list[dict[str, ModelState | None]]]] = {}

    def record(self, callee: ast.AST, params: dict[str, ModelState | None]) -> None:
        self.calls.setdefault(id(callee), (callee, []))[1].append(params)

    def consistent(self) -> dict[ast.AST, dict[str, ModelState]]:
        """Callees whose every recorded call passes the same model load for a parameter
        (the dtype only where all calls agree)."""
        out = {}
        for callee, calls in self.calls.values():
            names = set().union(*(c.keys() for c in calls))
            params = {}
            for name in names:
                states = [c.get(name) for c in calls]
                if any(not isinstance(st, ModelState) for st in states):
                    continue
                loads = {id(st.load) for st in states}
                if len({st.load for st in states}) != 1 and len(loads) != 1:
                    continue
                dtypes = {st.dtype for st in states}
                first = states[0]
                params[name] = ModelState(first.load, first.dtype if len(dtypes) == 1 else None,
                                          first.cast_by if len(dtypes) == 1 else None)
            if params:
                out[callee] = params
        return out


class FunctionTable:
    """The functions a module defines or imports from the project, with summaries of what
    they return: a model load (`def build_model(): return X.from_pretrained(...)`), one of
    their parameters after wrapping (`return get_peft_model(model, cfg)`), or a tuple of
    those (`return model, tokenizer`). Summaries are computed when a call asks for them."""

    MAX_DEPTH = 3  # modules followed through imports of imports

    def __init__(self, tree: ast.Module, imports: ImportMap, project=None, path=None, depth: int = 0,
                 origin=None) -> None:
        self._tree = tree
        self.imports = imports
        self.project = project
        self.path = path
        self.depth = depth
        self.origin = origin  # the ParsedModule when this table is another module's
        # Another module parsed in parts (analysis/module_parts.py): a block is parsed when
        # its name is asked for (`_need`); `tree`, `defs` and `classes` read from outside
        # parse the whole module first.
        self._parts = origin if getattr(origin, "pending", None) is not None and not origin.whole else None
        self._defs: dict[str, ast.AST] = {}
        self._classes: dict[str, ast.ClassDef] = {}
        self._index()
        self.summaries: dict[int, object] = {}  # model_walker.function_summary's, per function
        self._tables: dict[str, FunctionTable | None] = {}
        self._tried: set[tuple[str, tuple[bytes, ...] | None]] = set()  # (module key, words) parses tried
        self.deps: set[str] = set()
        self.bindings = CallBindings()
        # Local names of another module's classes whose construction sites this module's walk
        # records (`trainer = CompleteOptimizedTrainer(model, tokenizer)`), for that module's
        # analysis: name -> id(call) -> (models passed, positional states, states by keyword).
        self.traced: frozenset[str] = frozenset()
        self.remote_bindings: dict[int, dict] = {}  # id(class) -> its `__init__` bound by other modules
        self.traced_calls: dict[str, dict[int, tuple[int, list, dict]]] = {}
        self._consts: dict | None = None
        self._process_tests: bool | None = None
        self._default_dtype: bool | None = None
        self._self_attributes: dict[tuple[int, int], set[str] | None] = {}
        self._mentions: dict[int, bool] = {}
        self._walk_words: dict[int, frozenset] = {}
        self._loader_callees: frozenset[str] | None = None
        self.text: str | None = None  # the module's source, when the caller has it
        self._line_starts: list[int] | None = None
        self._load_at: list[int] | None = None  # `_loads_at`
        # What a project module must mention to be worth parsing: a model load or wrapper,
        # or a training step (a step function, a returned loss).
        self.needs = (b"from_pretrained", b"get_peft_model", b"backward(", b"loss")
        # The project pins a peft whose LoRA adapters take the base layer's dtype
        # (model_wrappers.lora_takes_base_dtype): set from the file's versions, handed on
        # to the tables of the modules it follows.
        self.lora_in_base_dtype = False

    def _index(self) -> None:
        defs, classes = self._defs, self._classes
        defs.clear()
        classes.clear()
        for node in self._tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                classes[node.name] = node

    def _need(self, name: str) -> None:
        """Parse the blocks named `name` when the module is in parts (the whole module
        when that fails); the tables and the imports then include them. The imports of the
        parts agree with the whole module's on every name the parsed code uses
        (module_parts.py), so resolvers made before keep reading the same answers."""
        parts = self._parts
        if parts is not None and name in parts.pending:
            if not parts.need(name):
                parts.complete()
            self._refresh()

    def _complete(self) -> None:
        parts = self._parts
        if parts is not None:
            parts.complete()
            self._refresh()

    def _refresh(self) -> None:
        parts = self._parts
        self._tree = parts.tree
        if parts.whole or not parts.pending:
            self._parts = None
        self._index()
        # new objects: what resolvers made before hold agrees on the names they ask about
        self.imports = ImportMap(self._tree)
        self._consts = None

    @property
    def tree(self) -> ast.Module:
        """The module's tree (another module's parsed whole first, when in parts)."""
        self._complete()
        return self._tree

    @property
    def defs(self) -> dict[str, ast.AST]:
        self._complete()
        return self._defs

    @property
    def classes(self) -> dict[str, ast.ClassDef]:
        self._complete()
        return self._classes

    def walk_words(self, cls: ast.ClassDef | None) -> frozenset | None:
        """Words whose mention makes a statement matter to the model walker whatever it
        holds (`_Walker._inert`): `from_pretrained`, this module's functions and classes
        (those of blocks not parsed yet included), the names it binds like loaders, and the
        methods of `cls` that load. None without the module's text."""
        if (self.origin.text if self.origin is not None else self.text) is None:
            return None
        key = id(cls) if cls is not None else 0
        found = self._walk_words.get(key)
        if found is None:
            words = {"from_pretrained", *self._defs, *self._classes, *self.loader_callees}
            if self._parts is not None:
                words.update(self._parts.pending)
            if cls is not None:
                words.update(node.name for node in cls.body
                             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.mentions_load(node))
            found = self._walk_words[key] = frozenset(words)
        return found

    def mentions_process_tests(self) -> bool:
        """Whether the module's text holds a word of a single-process test (LOCAL_RANK,
        WORLD_SIZE, ...): asked by every walker, read once per module (a scan of a 200 kB
        trainer per walker was ~20 ms of a 5-file pre-commit run, issue 15)."""
        if self._process_tests is None:
            text = self.origin.text if self.origin is not None else self.text
            self._process_tests = text is None or any(token in text for token in PROCESS_TOKENS)
        return self._process_tests

    @property
    def consts(self) -> dict[str, ast.expr]:
        if self._consts is None:
            self._consts = single_assignments(self._tree.body)  # the same in parts (module_parts.py)
        return self._consts

    def loader_names(self, text: str | None) -> set[str]:
        """Names whose call may return a model: local functions and methods that load one,
        and every name imported from a project module (followed when called)."""
        names = set()
        if text is not None and _LOAD_CALL.search(text):
            loads = self._loads_at()
            # only where the text says `from_pretrained` (what `mentions_load` asks first):
            # a trainer module has thousands of statements and a few such lines
            found = iter_statements(self.tree.body) if loads is None else _statements_over(self.tree.body, loads)
            for node in found:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.mentions_load(node):
                    names.add(node.name)
        if self.project is not None and self.path is not None and self.depth < self.MAX_DEPTH and text is not None:
            # Imported functions whose result this module binds to a model-like name
            # (`model = build_model(cfg)`): the same test as the prefilter's.
            from cfgfix.analysis.project_modules import model_assignment_callees

            callees = model_assignment_callees(text.encode("utf-8", "surrogatepass"))
            for local in callees:
                if (local in self.imports.relative or "." in self.imports.aliases.get(local, "")) and self._resolves(local):
                    names.add(local)
        return names

    # -- looking a callee up ---------------------------------------------------------------
    def _resolves(self, local: str) -> bool:
        """Whether a name is imported from a project file (a path lookup, no parse)."""
        if local in self.imports.relative:
            level, module, _ = self.imports.relative[local]
            return self.project.resolve(self.path, module, level) is not None
        qualified = self.imports.aliases.get(local, "")
        module = qualified.rpartition(".")[0]
        return bool(module) and self.project.resolve(self.path, module, 0) is not None

    def is_project_module(self, local: str) -> bool:
        """Whether `local` (`import utils`, `import pkg.train as train`) names one of the
        project's modules (a path lookup, no parse)."""
        if self.project is None or self.path is None or self.depth >= self.MAX_DEPTH:
            return False
        qualified = self.imports.aliases.get(local)
        return bool(qualified) and self.project.resolve(self.path, qualified, 0) is not None

    def _imported(self, local: str, needs: tuple[bytes, ...] | None = None) -> tuple[FunctionTable, str] | None:
        """(the project module's table, the name in it) for a name imported from the
        project: `from models.build import build_model`, `from .utils import load`."""
        if self.project is None or self.path is None or self.depth >= self.MAX_DEPTH:
            return None
        if local in self.imports.relative:
            level, module, name = self.imports.relative[local]
            table = self._table(module, level, needs)
            if table is None and module == "":
                return None
            return (table, name) if table is not None else None
        qualified = self.imports.aliases.get(local)
        if not qualified or "." not in qualified:
            return None
        module, _, name = qualified.rpartition(".")
        table = self._table(module, 0, needs)
        return (table, name) if table is not None else None

    def _reexported(self, name: str, hops: int = 0):
        """(table, definition) of a name this module (a package's `__init__.py`) only
        imports from another project module and so re-exports (`from .loop import
        train_one_epoch`); None when it defines the name itself or the trail is lost."""
        self._need(name)
        if name in self._defs or name in self._classes or hops > 2:
            return None
        found = self._imported(name)
        if found is None:
            found = self._imported(name, _IMPORTS)
            return found[0]._reexported(found[1], hops + 1) if found is not None else None
        table, inner = found
        table._need(inner)
        node = table._defs.get(inner) or table._classes.get(inner)
        return (table, node) if node is not None else table._reexported(inner, hops + 1)

    def _table(self, module: str, level: int, needs: tuple[bytes, ...] | None = None) -> FunctionTable | None:
        """The table of a project module, parsed when its text holds one of `needs` (by
        default `self.needs`; a class lookup asks for the class's own `class Name`). A
        module that failed one test is tried again only with other words."""
        key = f"{level}:{module}"
        if key not in self._tables or self._tables[key] is None and needs is not None \
                and (key, needs) not in self._tried:
            from cfgfix.analysis.module_parts import parse_in_parts

            self._tables[key] = None
            self._tried.add((key, needs))
            target = self.project.resolve(self.path, module, level)
            # in parts: a 2,000-line utils.py is followed for one function (issue 15)
            parsed = parse_in_parts(self.project, target, needs or self.needs) if target is not None else None
            if parsed is not None:
                self.deps.add(str(target))
                table = parsed.notes.get("function-table")
                if table is None:
                    table = FunctionTable(parsed.tree, ImportMap(parsed.tree), self.project, target,
                                          self.depth + 1, parsed)
                    table.lora_in_base_dtype = self.lora_in_base_dtype
                    parsed.notes["function-table"] = table
                self._tables[key] = table
        return self._tables[key]

    def lookup(self, func: ast.expr, cls: ast.ClassDef | None):
        """(table, definition, is_method) for a call's target, or None when unknown."""
        if isinstance(func, ast.Name):
            self._need(func.id)
            node = self._defs.get(func.id) or self._classes.get(func.id)
            if node is not None:
                return self, node, False
            found = self._imported(func.id)
            if found is not None:
                table, name = found
                table._need(name)
                node = table._defs.get(name) or table._classes.get(name)
                if node is not None:
                    self.deps.update(table.deps)
                    return table, node, False
                hit = table._reexported(name)
                if hit is not None:
                    self.deps.update(table.deps)
                    return hit[0], hit[1], False
            else:  # a package that re-exports it: its `__init__.py` holds no load or loss
                found = self._imported(func.id, _IMPORTS)
                hit = found[0]._reexported(found[1]) if found is not None else None
                if hit is not None:
                    self.deps.update(found[0].deps)
                    return hit[0], hit[1], False
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in ("self", "cls") and cls is not None:
                method = _method(cls, func.attr)
                return (self, method, True) if method is not None else None
            found = self._imported(func.value.id)  # `import utils; utils.load_model()`
            if found is None and func.value.id in self.imports.aliases:
                qualified = self.imports.aliases[func.value.id]
                table = self._table(qualified, 0) if self.project is not None and self.path is not None else None
                if table is not None:
                    table._need(func.attr)
                    node = table._defs.get(func.attr)
                    if node is not None:
                        return table, node, False
                package = table or (self._table(qualified, 0, _IMPORTS) if self.project is not None
                                    and self.path is not None and self.depth < self.MAX_DEPTH else None)
                hit = package._reexported(func.attr) if package is not None else None
                if hit is not None and isinstance(hit[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.deps.update(package.deps)
                    return hit[0], hit[1], False
        return None

    @property
    def default_dtype_changed(self) -> bool:
        """`torch.set_default_dtype(...)` / `set_default_tensor_type(...)` in the module: a
        load without a dtype then materialises that dtype, not the library's default."""
        if self._default_dtype is None:
            text = self.origin.text if self.origin is not None else self.text
            self._default_dtype = (text is None or "set_default_" in text) and any(
                isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))
                and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id)
                in ("set_default_dtype", "set_default_tensor_type")
                for n in walk(self._tree)  # in parts: every block that says `set_default_` is parsed
            )
        return self._default_dtype

    def class_library(self, node: ast.expr) -> str | None:
        """"transformers" or "diffusers" for a model class the project defines on top of a
        library's base (`class ChatGLMForConditionalGeneration(ChatGLMPreTrainedModel)`,
        `ChatGLMPreTrainedModel(PreTrainedModel)`): its `from_pretrained` is the library's."""
        base = self.library_base(node, lambda name: "." in name and name.split(".")[0] in _LIBRARIES)
        return _LIBRARIES[base.split(".")[0]] if base is not None else None

    def class_lookup(self, node: ast.expr):
        """`lookup` for a base class: a project module that defines the class is parsed
        even when its text holds none of `self.needs` (`class BaseTrainer(Trainer):` in a
        module with no load or loss)."""
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        found = self.lookup(node, None)
        if found is not None or self.project is None or self.path is None or self.depth >= self.MAX_DEPTH:
            return found
        if isinstance(node, ast.Name) and node.id in self.imports.relative:
            level, module, name = self.imports.relative[node.id]
        elif isinstance(node, ast.Name):
            module, _, name = self.imports.aliases.get(node.id, "").rpartition(".")
            level = 0
        elif isinstance(node.value, ast.Name) and node.value.id in self.imports.aliases:
            module, name, level = self.imports.aliases[node.value.id], node.attr, 0
        else:
            return None
        if not module and level == 0 or not name.isidentifier():
            return None
        if self._table(module, level, (b"class " + name.encode("ascii", "replace"),)) is None:
            return None
        return self.lookup(node, None)

    def library_base(self, node: ast.expr, wanted, depth: int = 0) -> str | None:
        """The qualified name of a library class (`transformers.Trainer`) that a class the
        project defines builds on, directly or through the project's own classes
        (`class MyTrainer(BaseTrainer)`, `class BaseTrainer(Trainer)` in another module),
        when `wanted(name)` holds for it; None otherwise."""
        if depth > 4:
            return None
        found = self.class_lookup(node)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        table, cls, _ = found
        for base in cls.bases:
            qualified = table.imports.qualify(base) or ""
            if wanted(qualified):
                return qualified
            inner = table.library_base(base, wanted, depth + 1)
            if inner is not None:
                return inner
        return None

    def assigned_self_attributes(self, cls: ast.ClassDef, method: ast.AST, depth: int = 0) -> set[str] | None:
        """`self.x` keys a method may rebind, through the methods it calls; None: anything
        (it hands `self` to other code, or calls a method we cannot see). Memoised."""
        key = (id(cls), id(method))
        if key not in self._self_attributes:
            self._self_attributes[key] = set()  # recursion: nothing more while computed
            self._self_attributes[key] = self._assigned_self_attributes(cls, method, depth)
        return self._self_attributes[key]

    def may_build_model(self, func: ast.expr, cls: ast.ClassDef | None) -> bool:
        """Whether a callee given no model may still return one: a local function or method
        that loads or wraps one, or a project function the module binds to a model-like name
        (`model = build_model(cfg)`). Decided without parsing another module."""
        if isinstance(func, ast.Name):
            self._need(func.id)
            node = self._defs.get(func.id)
            if node is not None:
                return self.mentions_load(node)
            return func.id in self.loader_callees
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in ("self", "cls") and cls is not None:
                method = _method(cls, func.attr)
                return method is not None and self.mentions_load(method)
            return func.attr in self.loader_callees
        return False

    def bound_like_loader(self, func: ast.expr) -> bool:
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in self.loader_callees

    @property
    def loader_callees(self) -> frozenset[str]:
        if self._loader_callees is None:
            from cfgfix.analysis.project_modules import model_assignment_callees

            text = self.origin.text if self.origin is not None else self.text
            self._loader_callees = model_assignment_callees(text.encode("utf-8", "surrogatepass")) if text else frozenset()
        return self._loader_callees

    def mentions_load(self, func: ast.AST) -> bool:
        """The function's text names a load or a wrapper (a substring test on its lines when
        the module's text is known, else a walk)."""
        found = self._mentions.get(id(func))
        if found is None:
            loads = self._loads_at()
            if loads is not None:
                last = func.end_lineno or func.lineno
                found = _any_between(loads, func.lineno, last) and _mentions_load(func, self._load_lines(func))
            else:
                found = _mentions_load(func)
            self._mentions[id(func)] = found
        return found

    def _loads_at(self) -> list[int] | None:
        """The line of each `from_pretrained` in the module's text, in order (one scan of the
        module: asked of every function, the text of each was read before, issue 15)."""
        if self._load_at is None:
            text = self.origin.text if self.origin is not None else self.text
            if text is None:
                return None
            import bisect

            if self._line_starts is None:
                self._line_starts = _line_starts(text)
            starts, lines = self._line_starts, []
            pos = text.find("from_pretrained")
            while pos >= 0:
                lines.append(bisect.bisect_right(starts, pos))
                pos = text.find("from_pretrained", pos + 1)
            self._load_at = lines
        return self._load_at

    def _load_lines(self, func: ast.AST) -> list[int]:
        """The lines (decorators included) where the module's text says `from_pretrained`."""
        import bisect

        loads = self._loads_at()
        first = min([func.lineno] + [d.lineno for d in getattr(func, "decorator_list", ())])
        last = func.end_lineno or func.lineno
        return loads[bisect.bisect_left(loads, first):bisect.bisect_right(loads, last)]

    def text_of(self, node: ast.AST) -> str | None:
        text = self.origin.text if self.origin is not None else self.text
        if text is None:
            return None
        if self._line_starts is None:
            self._line_starts = _line_starts(text)
        starts = self._line_starts
        first, last = node.lineno - 1, (node.end_lineno or node.lineno)
        return text[starts[first]:starts[last] if last < len(starts) else len(text)]

    def _assigned_self_attributes(self, cls: ast.ClassDef, method: ast.AST, depth: int) -> set[str] | None:
        keys: set[str] = set()
        for node in walk_scope(method):
            if isinstance(node, (ast.Attribute,)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                name = dotted(node)
                if name and name.startswith("self."):
                    keys.add(".".join(name.split(".")[:2]))
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                    if func.attr in _KEEPING_METHODS or func.attr in MOVE_METHODS:
                        continue
                    callee = _method(cls, func.attr)
                    if callee is None or depth >= 3:
                        return None
                    inner = self.assigned_self_attributes(cls, callee, depth + 1)
                    if inner is None:
                        return None
                    keys |= inner
                elif any(isinstance(a, ast.Name) and a.id == "self" for a in node.args):
                    return None
        return keys


def _statements_over(body: list[ast.stmt], lines: list[int]):
    """`iter_statements(body)` less the statements (and all under them) whose lines hold
    none of `lines` (sorted)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        first = getattr(node, "lineno", None)
        if first is not None and not _any_between(lines, first, getattr(node, "end_lineno", None) or first):
            continue
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, name, None)
            if children:
                stack.extend(reversed(children))


def _mentions_load(func: ast.AST, lines: list[int] | None = None) -> bool:
    """The function loads a model somewhere (`from_pretrained`): only those can return one
    when no model is passed to them (a wrapper is followed when a model goes in). With
    `lines` (where the text says `from_pretrained`), the walk skips every subtree whose
    lines hold none: the attribute is written on one of them (f-strings, whose positions
    this Python may misreport, are always walked)."""
    if lines is None:
        return any(isinstance(n, ast.Attribute) and n.attr == "from_pretrained" for n in walk_scope(func))
    stack = [(func, False)]
    while stack:
        node, whole = stack.pop()
        if isinstance(node, ast.Attribute) and node.attr == "from_pretrained":
            return True
        whole = whole or isinstance(node, ast.JoinedStr)
        for child in child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue  # walk_scope: not into nested scopes
            first = getattr(child, "lineno", None)
            if whole or first is None or _any_between(lines, first, getattr(child, "end_lineno", None) or first):
                stack.append((child, whole))
    return False


@functools.lru_cache(maxsize=8)
def _line_starts(text: str) -> list[int]:
    """Where each line of `text` starts, as `ast` numbers lines (a CR alone ends a line
    too); memoised (read it, never change it): the survey and the function table of a
    module both ask, several times for a large one."""
    return line_starts(text)


def _method(cls: ast.ClassDef, name: str):
    """The class's own method `name` (an index built once per class: trainer classes have
    hundreds of methods and thousands of `self.x()` calls)."""
    index = cls.__dict__.get("_cfgfix_methods")
    if index is None:
        index = {}
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                index.setdefault(node.name, node)
        cls._cfgfix_methods = index  # type: ignore[attr-defined]
    return index.get(name)


def _positional_params(func, method: bool) -> list[str]:
    names = [a.arg for a in func.args.posonlyargs + func.args.args]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return names + [a.arg for a in func.args.kwonlyargs]


def _has_word(text: str, words, start: int, end: int) -> bool:
    """One of `words` in `text[start:end]` as a whole word (what `\b(?:a|b)\b` finds): a
    `str.find` per word, 20 times faster than that pattern, which no literal starts."""
    for word in words:
        at = text.find(word, start, end)
        while at >= 0:
            after = at + len(word)
            if (at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_")) and \
                    (after >= len(text) or not (text[after].isalnum() or text[after] == "_")):
                return True
            at = text.find(word, at + 1, end)
    return False


def _any_between(sorted_lines: list[int], first: int, last: int) -> bool:
    import bisect

    index = bisect.bisect_left(sorted_lines, first)
    return index < len(sorted_lines) and sorted_lines[index] <= last


# What a function may do with a model parameter and still leave its weights as they were:
# read these attributes (`model.parameters()`, `model.config`), or pass it to these builtins.
_READ_ATTRS = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules",
    "children", "named_children", "state_dict", "config", "dtype", "device", "num_parameters",
    "get_memory_footprint", "training", "name_or_path", "__class__",
})
_READ_BUILTINS = frozenset({"print", "len", "type", "isinstance", "str", "repr", "id", "hasattr"})
_WRITE_METHODS = frozenset(CAST_METHODS) | {"to", "cuda", "cpu", "type", "apply", "load_state_dict", "train", "eval"}


def _reads_only(func: ast.AST, name: str) -> bool:
    """`func` only reads its parameter `name`: every use is a read of an attribute in
    `_READ_ATTRS` or an argument of a builtin in `_READ_BUILTINS`, the name is never rebound,
    and the body changes nothing in place (no attribute or item stores, no in-place
    `x_()` methods, no casts or moves) -- `sum(p.numel() for p in model.parameters())`."""
    memo = getattr(func, "_cfgfix_reads_only", None)
    if memo is None:
        memo = func._cfgfix_reads_only = {}  # type: ignore[attr-defined]
    if name in memo:
        return memo[name]
    allowed: set[int] = set()
    ok = True
    for node in walk(func):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            ok = False
        elif isinstance(node, (ast.AugAssign, ast.Global, ast.Nonlocal)):
            ok = False
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr.endswith("_") and not node.func.attr.startswith("_")
                or node.func.attr in _WRITE_METHODS):
            ok = False
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name \
                and node.attr in _READ_ATTRS:
            allowed.add(id(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _READ_BUILTINS:
            allowed.update(id(a) for a in node.args if isinstance(a, ast.Name))
        if not ok:
            break
    if ok:
        for node in walk(func):
            if isinstance(node, ast.Name) and node.id == name and (
                    not isinstance(node.ctx, ast.Load) or id(node) not in allowed):
                ok = False
                break
    memo[name] = ok
    return ok


def _read_only_arguments(call: ast.Call, func: ast.AST) -> frozenset:
    """ids of the call's arguments that bind a parameter the plain function only reads."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset()
    args = func.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    named = {a.arg for a in [*args.args, *args.kwonlyargs]}
    keep = set()
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        if index < len(positional) and _reads_only(func, positional[index]):
            keep.add(id(arg))
    for keyword in call.keywords:
        if keyword.arg in named and _reads_only(func, keyword.arg):
            keep.add(id(keyword.value))
    return frozenset(keep)
