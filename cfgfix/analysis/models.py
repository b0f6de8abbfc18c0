"""What a name holds at a statement: models loaded by `from_pretrained`, and the casts and
moves applied to them.

One forward pass over each function body and the module body tracks names and `self.x`
attributes bound to a `from_pretrained` load, with the dtype the weights have at each point.
Rules (CFX101-CFX105) query the result instead of walking the tree again.

Precision over recall: whenever the flow is unclear (a loop that rebinds the name, the
model handed to a function we do not know, a `**kwargs` load) the name is dropped or its
dtype becomes unknown, and rules stay silent. Branches that bind different loads leave a
`Choice`: the set of values, each with the branch conditions it holds under
(`if args.q:` ... `if not args.q:` on the same name filters it). Rules see a choice only
through `ModelAnalysis.possible_calls`, and only those that speak when any branch that
reaches a call is wrong (CFX103, CFX104).

This module is the entry (`analyze_models`: which scopes to walk, in which order, and the
call-site rounds); the pass itself lives in the modules it imports, one concern each:

- `model_values.py`: what a name may hold (`ModelLoad`, `ModelState`, `Choice`, ...), how
  two paths' values merge, and a function summary instantiated at a call;
- `model_branches.py`: branch conditions as facts, and the env after `if`, loops, `try`;
- `model_loads.py`: reading a `from_pretrained` call (dtype, `device_map`, quantization);
- `model_wrappers.py`: calls that wrap a model and return it (PEFT, DDP, `prepare`);
- `model_functions.py`: `FunctionTable` (this module's functions and those it imports from
  the project) and `CallBindings` (what call sites pass);
- `model_attributes.py`: questions about classes and `self.x` attributes (base classes of
  the project, what may hold `self`);
- `model_walker.py`: the statement walker, and function summaries;
- `model_classes.py`: a class walked as one (`__init__` first, then each method).
"""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.model_attributes import _heirs, _moved_attributes
from cfgfix.analysis.model_classes import _analyze_class, _seeds_from
from cfgfix.analysis.model_functions import (
    _LOAD_CALL,
    CallBindings,
    FunctionTable,
    _any_between,
    _has_word,
    _line_starts,
    _method,
    _positional_params,
)
from cfgfix.analysis.model_loads import _MODEL_CLASS, MULTI_DEVICE_STRATEGIES, OFFLOAD_DEVICES, _Resolver
from cfgfix.analysis.model_values import (
    CAST_METHODS,
    MAX_OPTIONS,
    MOVE_METHODS,
    Choice,
    DeviceMap,
    ModelAnalysis,
    ModelCall,
    ModelLoad,
    ModelState,
    Option,
    ParamLoad,
    TupleState,
    _is_training_call,
)
from cfgfix.analysis.model_walker import _analyze_function, _Walker
from cfgfix.analysis.model_wrappers import _prepares, wrapper_kind
from cfgfix.analysis.names import ImportMap, dotted, iter_statements, walk
from cfgfix.analysis.project_callers import importers
from cfgfix.records import replace

# The names other modules imported from here before the split, still importable here.
__all__ = [
    "CAST_METHODS",
    "MAX_OPTIONS",
    "MOVE_METHODS",
    "MULTI_DEVICE_STRATEGIES",
    "OFFLOAD_DEVICES",
    "_MODEL_CLASS",
    "CallBindings",
    "Choice",
    "DeviceMap",
    "FunctionTable",
    "ModelAnalysis",
    "ModelCall",
    "ModelLoad",
    "ModelState",
    "Option",
    "ParamLoad",
    "TupleState",
    "_Resolver",
    "_Walker",
    "_is_training_call",
    "_prepares",
    "analyze_models",
    "wrapper_kind",
]


MAX_ROUNDS = 3  # call-site rounds: main() -> train(model) -> evaluate(model)


def analyze_models(
    tree: ast.Module,
    text: str | None = None,
    imports: ImportMap | None = None,
    project=None,
    path=None,
    functions: FunctionTable | None = None,
    callers: bool = True,
) -> ModelAnalysis:
    """Model loads and the casts and moves applied to them, in one module. With `project`
    (an `analysis.project_modules.ProjectModules`) and the module's `path`, functions
    imported from the project's other modules are followed too (`analysis.deps` lists the
    files read). `callers`: also bind the `__init__` of this module's classes from the
    project modules that build them (False when this is such a module's analysis)."""
    imports = imports or ImportMap(tree)
    analysis = ModelAnalysis(imports=imports, tree=tree)
    functions = functions or FunctionTable(tree, imports, project, path)
    if functions.text is None:
        functions.text = text
    survey = _Survey(tree, text, functions.loader_names(text))
    heirs = _heirs(tree, functions, survey)
    # Classes built elsewhere with a model (`CompleteOptimizedTrainer(model, tokenizer)` in
    # train.py): what the project's other modules pass to their `__init__`.
    remote = _bound_elsewhere(tree, functions) if callers else {}
    functions.remote_bindings = {id(node): params for node, params in remote.items()}
    if not survey.load_scopes and not heirs and not remote:
        analysis.deps = sorted(functions.deps)
        return analysis  # most files: `from_pretrained` only in docstrings or for tokenizers
    module_consts = functions.consts
    resolver = _Resolver(imports, module_consts, functions)
    bindings = functions.bindings
    _Walker(analysis, resolver, {}, skip_inert=True).block(tree.body, {})
    module_seeds = _seeds_from(tree.body, resolver, prefix="") if tree in survey.load_scopes else {}
    seeded = {key.split(".")[0] for key in module_seeds}
    classes = survey.classes
    if seeded:  # a module-level model may be used in any class
        classes = [n for n in iter_statements(tree.body) if isinstance(n, ast.ClassDef)]
    done: dict[int, dict] = {}
    for node in classes:
        if node in survey.load_scopes or survey.uses(node, seeded):
            _analyze_class(node, analysis, resolver, module_seeds, survey=survey)
            done[id(node)] = {}
    for node in heirs:  # its model comes from a base class of the project
        if id(node) not in done:
            _analyze_class(node, analysis, resolver, module_seeds, survey=survey)
            done[id(node)] = {}
    for node, params in remote.items():
        _analyze_class(node, analysis, resolver, module_seeds, init_params=params, survey=survey)
        done[id(node)] = params
    for func, seeds in _functions_outside_classes(tree, module_seeds):
        if func in survey.load_scopes or survey.uses(func, seeded):
            _analyze_function(func, analysis, resolver, seeds)
            done[id(func)] = {}
    # Functions and classes that receive a model from their call sites in this module:
    # `train(model, loader)`, `Trainer(model=model)`. Each round may bind the next callee.
    # A method its class's other methods pass a model to (`self._export(model, out)`) is
    # walked in its class, with what those calls pass and the module's seeds only.
    owners: dict[int, ast.ClassDef] | None = None
    for _ in range(MAX_ROUNDS):
        pending = []
        for node, params in bindings.consistent().items():
            if done.get(id(node)) != params:
                done[id(node)] = params
                pending.append((node, params))
        if not pending:
            break
        for node, params in pending:
            if isinstance(node, ast.ClassDef):
                _analyze_class(node, analysis, resolver, module_seeds, init_params=params, survey=survey)
                continue
            if owners is None:
                owners = _method_owners(tree)
            owner = owners.get(id(node))
            _analyze_function(node, analysis, resolver, module_seeds, owner, params=params)
    analysis.deps = sorted(functions.deps)
    return analysis


class _Survey:
    """Which scopes (the module, classes, functions) may hold a model load, found from
    statement line ranges alone: walking statements is cheap, walking every expression of
    a 5,000-line modeling file is not. Scopes with no load and no mention of a
    module-level model are not analysed at all."""

    def __init__(self, tree: ast.Module, text: str | None, loaders: set[str] = frozenset()) -> None:
        self.load_scopes: set[ast.AST] = set()
        self.classes: list[ast.ClassDef] = []
        self._text: str | None = text  # the real lines (an unparsed tree has other line numbers)
        self._starts: list[int] | None = None
        if text is None:
            text = ast.unparse(tree)  # tests that pass only a tree
        import bisect

        # Loads, and calls of functions that may return a model (they count as loads), one
        # pattern each, literal first (one alternation starting with `\b` tried every
        # position of the text); `\b` before a name is checked by hand.
        patterns = [_LOAD_CALL] + [re.compile(re.escape(name) + r"\s*\(") for name in sorted(loaders)]
        starts = None
        found = set()
        for number, pattern in enumerate(patterns):
            for m in pattern.finditer(text):
                at = m.start()
                if number and at and (text[at - 1].isalnum() or text[at - 1] == "_"):
                    continue  # inside a longer name
                if starts is None:
                    starts = _line_starts(text)
                found.add(bisect.bisect_right(starts, at))
        lines = sorted(found)
        if not lines:
            return
        stack: list[tuple[ast.stmt, list[ast.AST]]] = [(stmt, [tree]) for stmt in tree.body]
        while stack:
            stmt, chain = stack.pop()
            first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
            if not _any_between(lines, first, last):
                continue
            inner = chain
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = chain + [stmt]
                if isinstance(stmt, ast.ClassDef):
                    self.classes.append(stmt)
            self.load_scopes.update(inner)
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(stmt, name, None) or ():
                    if isinstance(child, ast.stmt):
                        stack.append((child, inner))
                    else:  # except handlers and match cases hold statements
                        stack.extend((c, inner) for c in child.body)
        self._tree = tree

    def may_hold_model(self, method: ast.AST, module_seeds: dict, seeds: dict, local_names: set[str]) -> bool:
        """Whether walking a method can record anything: it holds a load (or a loader's
        call), names a module-level model, mentions an attribute that holds one, or names
        one of the module's own functions or classes (a call there is a call site whose
        arguments decide what that callee is analysed with, model or not). The same gate
        as for functions outside classes; most methods of a large trainer class pass none
        of it (two fifths of its model analysis, issue 15). Names are tested as words in
        the method's lines, so `getattr(self, "model")` and `self.model` alike keep it."""
        if method in self.load_scopes or self.uses(method, {key.split(".")[0] for key in module_seeds}):
            return True
        words = {key.split(".", 1)[1].split(".")[0] for key in seeds if key not in module_seeds and "." in key}
        words |= local_names
        return bool(words) and self._mentions(method, words)

    def _mentions(self, scope: ast.AST, words: set[str]) -> bool:
        if self._text is None:
            return True
        if self._starts is None:
            self._starts = _line_starts(self._text)
        first = self._starts[scope.lineno - 1]
        last = (scope.end_lineno or scope.lineno)
        end = self._starts[last] if last < len(self._starts) else len(self._text)
        return _has_word(self._text, words, first, end)

    def uses(self, scope: ast.AST, names: set[str]) -> bool:
        """Whether a scope mentions one of `names` (walked only when asked)."""
        if not names:
            return False
        return any(isinstance(n, ast.Name) and n.id in names for n in walk(scope))


def _method_owners(tree: ast.Module) -> dict[int, ast.ClassDef]:
    """id(method) -> its class, for every class of the module."""
    return {id(node): cls for cls in iter_statements(tree.body) if isinstance(cls, ast.ClassDef)
            for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _functions_outside_classes(tree: ast.Module, seeds: dict):
    """Every function not defined directly in a class body (methods are handled per class)."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, seeds
        for name in ("body", "orelse", "finalbody"):
            stack.extend(getattr(node, name, None) or ())
        for holder in getattr(node, "handlers", None) or getattr(node, "cases", None) or ():
            stack.extend(holder.body)


def _bound_elsewhere(tree: ast.Module, functions: FunctionTable) -> dict[ast.ClassDef, dict]:
    """For each top-level class of the module that casts or moves a model-like `self.x`
    (`self.model.to(...)`) and that the module itself never builds: the `__init__`
    parameters every construction in the project's other modules passes the same model
    load to (`trainer = CompleteOptimizedTrainer(model, tokenizer)` in train.py). The loads
    keep their module; a cast made there leaves the dtype unknown here (it cannot be shown).
    The modules read become the file's dependencies."""
    if functions.project is None or functions.path is None or functions.depth or functions.text is None:
        return {}
    candidates = {}
    for cls in tree.body:
        init = _method(cls, "__init__") if isinstance(cls, ast.ClassDef) else None
        if init is None or f"{cls.name}(" in functions.text:
            continue
        moved = _moved_attributes(functions, cls)
        params = _positional_params(init, method=True)
        # `self.model = model` in `__init__` for a model-like attribute the class moves
        if moved and any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in params
                         and any(dotted(t) in {f"self.{a}" for a in moved} for t in n.targets)
                         for n in init.body):
            candidates[cls.name] = (cls, params)
    if not candidates:
        return {}
    bindings = CallBindings()
    modules: dict[str, tuple] = {}  # each importing module is analysed once, for every class it builds
    for name in candidates:
        for parsed, local in importers(functions.project, functions.path, name):
            modules.setdefault(str(parsed.path), (parsed, {}))[1][local] = name
    for parsed, locals_ in modules.values():
        other = FunctionTable(parsed.tree, ImportMap(parsed.tree), functions.project, parsed.path, 1, parsed)
        other.traced = frozenset(locals_)
        analyze_models(parsed.tree, parsed.text, other.imports, functions=other, callers=False)
        functions.deps.add(str(parsed.path))
        functions.deps.update(other.deps)
        for local, name in locals_.items():
            cls, params = candidates[name]
            for _, positional, named in other.traced_calls.get(local, {}).values():
                bound = {p: positional[i] for i, p in enumerate(params) if i < len(positional)}
                bound.update({k: v for k, v in named.items() if k in params})
                bindings.record(cls, {k: _from_module(v, parsed) for k, v in bound.items()})
    return {cls: bound for cls, bound in bindings.consistent().items()}


def _from_module(state, parsed):
    """A model state seen in another module, as this module's analysis shows it."""
    if not isinstance(state, ModelState) or isinstance(state.load, ParamLoad):
        return None
    load = state.load
    if load.path is None:
        load = replace(load, path=parsed.display, source=parsed.source_text())
    return ModelState(load, state.dtype if state.cast_by is None else None)
