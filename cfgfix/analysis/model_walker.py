"""The statement walker of the model analysis (models.py): one forward pass over a
statement list, updating the env (key -> value) through assignments, branches, loops,
`try`, calls (loads, casts and moves recorded on the `ModelAnalysis`; wrappers; the
project's own functions with their summaries and call sites). `function_summary` walks a
function with its parameters as `ParamLoad`s to find what it returns."""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.model_attributes import _may_hold_tracked
from cfgfix.analysis.model_branches import (
    _assume,
    _bound_in,
    _ends,
    _facts,
    _forget,
    _forget_facts,
    _join,
    _merge,
    _restamp,
    dtype_tested,
    placement_tested,
)
from cfgfix.analysis.model_functions import _method, _positional_params, _read_only_arguments
from cfgfix.analysis.model_loads import _Resolver, _ScopeConsts
from cfgfix.analysis.model_values import (
    _KEEPING_METHODS,
    _NO_VALUE,
    _RETURNS_SELF,
    CAST_METHODS,
    MOVE_METHODS,
    PARAM_DTYPE,
    Choice,
    ModelAnalysis,
    ModelCall,
    ModelState,
    Option,
    ParamLoad,
    TupleState,
    _choice,
    _map_states,
    _merge_returns,
    _stamp,
    _unknown_dtype,
    instantiate,
    with_adapters,
    with_base_dtype_adapters,
    without_adapters,
)
from cfgfix.analysis.model_wrappers import (
    _BASE_MODEL_METHODS,
    _PREPARE_METHODS,
    _UNLOADS,
    _prepares,
    keeps_base_dtype,
    wrapper_kind,
)
from cfgfix.analysis.module_replacement import keeps_wrapped_dtype, new_module_class
from cfgfix.analysis.names import DTYPE_ALIASES, child_nodes, dotted, walk
from cfgfix.analysis.process_tests import single_process_side
from cfgfix.records import replace

# Builtins that look at an object without changing it.
_HARMLESS_CALLS = {"print", "len", "isinstance", "type", "id", "str", "repr", "hasattr", "getattr", "vars", "dir"}


def function_summary(table, func: ast.AST, cls: ast.ClassDef | None = None):
    """What `func` (of `table`, a `FunctionTable`) returns, with its parameters as
    `ParamLoad`s; None when unknown. Memoised on the table."""
    key = id(func)
    summaries = table.summaries
    if key in summaries:
        return summaries[key]
    summaries[key] = None  # recursion: unknown while being computed
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = _positional_params(func, method=cls is not None)
    env = {name: ModelState(ParamLoad(i, name), PARAM_DTYPE) for i, name in enumerate(params)}
    resolver = _Resolver(table.imports, _ScopeConsts(table.consts, func.body), table)
    walker = _Walker(ModelAnalysis(table.imports), resolver, {}, cls=cls, skip_inert=True)
    walker.returns = []
    walker.block(func.body, env)
    result = _merge_returns(walker.returns)
    summaries[key] = result
    return result


def _analyze_function(func, analysis, resolver, seeds, cls: ast.ClassDef | None = None,
                      params: dict | None = None) -> dict:
    """Walk one function body from `seeds` (names of the enclosing scopes, shadowed by the
    function's parameters) and `params` (what its call sites pass); returns what the names
    hold at its end."""
    local = _Resolver(resolver.imports, _ScopeConsts(resolver.consts, func.body), resolver.functions)
    names = {a.arg for a in func.args.args + func.args.kwonlyargs + func.args.posonlyargs}
    env = {k: v for k, v in seeds.items() if k.split(".")[0] not in names or k.startswith("self.")}
    env.update(params or {})
    return _Walker(analysis, local, {}, cls=cls, skip_inert=True).block(func.body, env)


# Statements with no statement inside: the walker's gate (`_Walker._inert`) may skip them.
_SIMPLE_STATEMENTS = frozenset({
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Delete, ast.Pass, ast.Raise, ast.Assert,
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Break, ast.Continue,
})
_WORD = re.compile(r"\w+")


def _replaces_part(stmt: ast.stmt) -> bool:
    """`setattr(x, name, Module(...))` or `x.attr = Module(...)` (`x` not `self`): a
    statement that may replace a part of a model whatever names it mentions."""
    if isinstance(stmt, ast.Expr):
        call = stmt.value
        return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "setattr" \
            and len(call.args) == 3 and new_module_class(call.args[2]) is not None
    return isinstance(stmt, ast.Assign) and new_module_class(stmt.value) is not None and any(
        isinstance(t, (ast.Attribute, ast.Subscript)) and not (dotted(t) or "").startswith("self.")
        for t in stmt.targets)


class _Walker:
    """One forward pass over a statement list, updating `env` (key -> ModelState)."""

    def __init__(self, analysis: ModelAnalysis, resolver: _Resolver, _unused, cls: ast.ClassDef | None = None,
                 skip_inert: bool = False) -> None:
        self.analysis = analysis
        self.resolver = resolver
        self.stmt: ast.stmt | None = None
        self.sole = False
        self.cls = cls  # the class whose method is walked: `self.load_model()` is followed
        self.returns: list | None = None  # (value, path) collected when a function summary is computed
        # The branch conditions that hold at the current statement (for returns): those of
        # the enclosing `if`s, and the negation of an earlier `if` whose body returned.
        self.path: frozenset = frozenset()
        self.depth = 0  # `if`s (and `except` handlers) entered in the function walked
        self.device_tests: frozenset = frozenset()  # keys whose placement an enclosing `if` tests
        self.dtype_tests: frozenset = frozenset()  # keys whose dtype an enclosing `if` tests
        # The targets of the enclosing loops over a tracked model's modules, to their
        # iterable (`for name, module in model.named_modules():`): a part of it is replaced.
        self.loop_targets: dict[str, ast.expr] = {}
        # Only a single-process run reaches the current statement (a branch on LOCAL_RANK /
        # WORLD_SIZE); tests are read only in modules that name those variables.
        self.single_process = False
        functions = resolver.functions
        self.process_tests = functions is None or functions.mentions_process_tests()
        # The words that make a simple statement matter (`_inert`); None: walk every one
        # (a subclass that does more per statement, or no text to read the words from).
        self.words = functions.walk_words(cls) if skip_inert and functions is not None else None

    # -- statements ----------------------------------------------------------------------
    def block(self, body: list[ast.stmt], env: dict) -> dict:
        words = self.words
        for stmt in body:
            if words is not None and type(stmt) in _SIMPLE_STATEMENTS and self._inert(stmt, env, words):
                continue
            self.stmt, self.sole = stmt, len(body) == 1
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)) \
                    or type(stmt).__name__ == "TryStar":
                saved = self.path, self.single_process  # what a `continue`/handler path implies does not hold after it
                env = self.statement(stmt, env)
                self.path, self.single_process = saved
            else:
                env = self.statement(stmt, env)
        return env

    def _inert(self, stmt: ast.stmt, env: dict, words: frozenset) -> bool:
        """A simple statement whose walk can change nothing: its words name no load, no
        function or class of this module (a call there records a call site, and may be
        followed), no loader (`model = build_model()` is followed into another module), no
        method of the class that loads, nothing `env` holds or conditions on (by the names
        in its key: `self` and `model` for `self.model`, as `foo(self)` and `self.method()`
        may rebind it). What a statement does is then nothing: an
        expression evaluates to no state, binds or forgets no key (a key or a prefix of it
        is in its words), escapes no tracked argument, records no load, cast or call site,
        parses no module. A `return` matters while a summary collects them. Words are read
        from the statement's lines (comments and strings included: more walked, never
        less). Most statements of a large trainer's `__init__` hold no such word."""
        if self.returns is not None and isinstance(stmt, ast.Return):
            return False
        if env and _replaces_part(stmt):
            return False  # `setattr(parent, name, LoRALinear(...))`: `parent` may be a model's part
        text = self.resolver.functions.text_of(stmt)
        if text is None:
            return False
        mentioned = set(_WORD.findall(text))
        if not words.isdisjoint(mentioned) or not mentioned.isdisjoint(self.loop_targets):
            return False
        for key, value in env.items():
            if not mentioned.isdisjoint(key.split(".")):
                return False
            if isinstance(value, Choice):
                for option in value.options:
                    for fact in option.when:
                        if not mentioned.isdisjoint(fact[0].split(".")):
                            return False
        return True

    def statement(self, stmt: ast.stmt, env: dict) -> dict:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return env  # analysed as scopes of their own
        if isinstance(stmt, ast.Assign):
            state = self.expr(stmt.value, env)
            for target in stmt.targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and new_module_class(stmt.value) is not None:
                    self.replace_part(target.value, stmt.value, env)  # `block.q_proj = LoRALinear(...)`
                self.bind(target, state, env)
            return env
        if isinstance(stmt, ast.Return):
            state = self.expr(stmt.value, env)
            if self.returns is not None:
                empty = stmt.value is None or isinstance(stmt.value, ast.Constant) and stmt.value.value is None
                self.returns.append((_NO_VALUE if empty else state, self.path))
            return env
        if isinstance(stmt, ast.AnnAssign):
            state = self.expr(stmt.value, env) if stmt.value else None
            self.bind(stmt.target, state if stmt.value else None, env)
            return env
        if isinstance(stmt, ast.AugAssign):
            self.expr(stmt.value, env)
            self.bind(stmt.target, None, env)
            return env
        if isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                self.bind(target, None, env)
            return env
        if isinstance(stmt, ast.If):
            self.expr(stmt.test, env)
            # The test's facts narrow the choices `env` holds, go with the returns a summary
            # collects, and condition what the branches bind (`_join`): read only then (most
            # `if`s of a large method have none of those).
            facts = None
            if self.returns is not None or any(isinstance(value, Choice) for value in env.values()):
                facts = _facts(stmt.test)
            yes, no = facts or (frozenset(), frozenset())
            saved, saved_single = self.path, self.single_process
            single = (self.single_process_side(stmt.test, True), self.single_process_side(stmt.test, False))
            self.depth += 1
            saved_tests = self.device_tests, self.dtype_tests
            self.device_tests = saved_tests[0] | placement_tested(stmt.test)
            self.dtype_tests = saved_tests[1] | dtype_tested(stmt.test)
            self.path, self.single_process = saved | yes, saved_single or single[0]
            body = self.block(stmt.body, _assume(env, yes, self.depth))
            self.path, self.single_process = saved | no, saved_single or single[1]
            orelse = self.block(stmt.orelse, _assume(env, no, self.depth))
            self.device_tests, self.dtype_tests = saved_tests
            self.depth -= 1
            imports = self.resolver.imports
            body_ends, orelse_ends = _ends(stmt.body, imports), _ends(stmt.orelse, imports)
            if body_ends != orelse_ends:  # only one branch reaches what follows, under its conditions
                self.path = saved | (no if body_ends else yes)
                self.single_process = saved_single or single[1 if body_ends else 0]
                return _restamp(orelse if body_ends else body, env, self.depth)
            self.path, self.single_process = saved, saved_single
            if facts is None and (body or orelse):
                yes, no = _facts(stmt.test)
            return _restamp(_join(body, orelse, yes, no), env, self.depth)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            if isinstance(stmt, ast.While):
                self.expr(stmt.test, env)
            else:
                self.expr(stmt.iter, env)
            # A later iteration may see what the body rebinds: forget those names first.
            bound = _bound_in(stmt) if env else ()  # nothing to forget in an empty env
            loop_env = {k: v for k, v in env.items() if k not in bound}
            for key in bound:
                _forget_facts(loop_env, key)
            saved_targets = self.loop_targets
            if not isinstance(stmt, ast.While) and self.models_under(stmt.iter, env):
                self.loop_targets = {**saved_targets, **{n.id: stmt.iter for n in walk(stmt.target)
                                                         if isinstance(n, ast.Name)}}
            after = self.block(stmt.body, dict(loop_env))
            self.loop_targets = saved_targets
            merged = _merge(loop_env, after)
            return _merge(merged, self.block(stmt.orelse, dict(merged)))
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                self.expr(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, env)
            return self.block(stmt.body, env)
        if isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            # What follows sees the body (and `else`) completed, or a handler that does
            # not re-raise having run after part of the body: a fallback load in `except`
            # and the load it replaces are both possible. The body starts from what holds
            # before the `try` (`try: model.half() ...` casts the load); a handler starts
            # from `safe`, without what the body may have rebound or cast.
            bound = _bound_in(stmt) if env else ()
            safe = {k: v for k, v in env.items() if k not in bound}
            imports = self.resolver.imports
            paths = []
            completed = self.block(stmt.body, dict(env))
            if not _ends(stmt.body, imports):
                completed = self.block(stmt.orelse, completed)
                if not _ends(stmt.orelse, imports):
                    paths.append(completed)
            self.depth += 1
            for handler in stmt.handlers:
                after = self.block(handler.body, dict(safe))
                if not _ends(handler.body, imports):
                    paths.append(after)
            self.depth -= 1
            joined = dict(safe)
            if paths:
                joined = paths[0]
                for other in paths[1:]:
                    joined = _join(joined, other, frozenset(), frozenset())
                joined = _restamp(joined, safe, self.depth)
            return self.block(stmt.finalbody, joined)
        if isinstance(stmt, ast.Match):
            self.expr(stmt.subject, env)
            bound = _bound_in(stmt) if env else ()
            safe = {k: v for k, v in env.items() if k not in bound}
            for case in stmt.cases:
                self.block(case.body, dict(safe))
            return safe
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:  # `from mylib import model` rebinds `model`
                _forget(env, (alias.asname or alias.name).split(".")[0])
            return env
        if isinstance(stmt, (ast.Global, ast.Nonlocal)):
            for name in stmt.names:
                env.pop(name, None)
            return env
        for child in child_nodes(stmt):  # Expr, Return, Raise, Assert, ...
            if isinstance(child, ast.expr):
                self.expr(child, env)
        return env

    def single_process_side(self, test: ast.expr, truth: bool) -> bool:
        if not self.process_tests:
            return False
        resolver = self.resolver
        return single_process_side(test, truth, resolver.deref, resolver.imports.qualify)

    def bind(self, target: ast.AST, state, env: dict) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(state, TupleState) \
                and len(target.elts) == len(state.items) and not any(isinstance(e, ast.Starred) for e in target.elts):
            for element, item in zip(target.elts, state.items):
                self.bind(element, item, env)
            return
        if isinstance(state, TupleState):
            state = None
        key = dotted(target)
        if key is not None and (key.count(".") == 0 or (key.startswith("self.") and key.count(".") == 1)):
            _forget(env, key)
            if state is not None:
                env[key] = state
            return
        for node in ast.walk(target):  # tuples, subscripts, other attributes (`args.q = True`)
            name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name is not None and isinstance(getattr(node, "ctx", None), ast.Store):
                _forget(env, name)

    # -- expressions -----------------------------------------------------------------------
    def expr(self, node: ast.AST | None, env: dict) -> ModelState | None:
        if node is None:
            return None
        if isinstance(node, ast.Call):
            return self.call(node, env)
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = dotted(node)
            if key is not None and key in env:
                return env[key]
            if isinstance(node, ast.Attribute):
                self.expr(node.value, env)
            return None
        if isinstance(node, (ast.Lambda,)):
            return None  # runs later, if ever
        if isinstance(node, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.elts):
            items = tuple(self.expr(e, env) for e in node.elts)
            return TupleState(items) if any(items) else None
        if isinstance(node, ast.Subscript):
            value = self.expr(node.value, env)
            self.expr(node.slice, env)
            index = node.slice
            if isinstance(value, TupleState) and isinstance(index, ast.Constant) and isinstance(index.value, int) \
                    and -len(value.items) <= index.value < len(value.items):
                return value.items[index.value]
            return None
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # The comprehension's targets shadow outer names (`[m.to(d) for m in models]`).
            targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            inner = {k: v for k, v in env.items() if k.split(".")[0] not in targets}
            before = dict(inner)
            for child in child_nodes(node):
                self.expr(child, inner)
            for key, state in before.items():  # what the comprehension changed is unclear after it
                if inner.get(key) is not state:
                    env.pop(key, None)
            return None
        if isinstance(node, ast.NamedExpr):
            state = self.expr(node.value, env)
            self.bind(node.target, state, env)
            return state
        for child in child_nodes(node):
            self.expr(child, env)
        return None

    def call(self, call: ast.Call, env: dict):
        func = call.func
        load = self.resolver.load(call)
        if load is not None:
            if self.single_process:
                load = replace(load, single_process=True)
            self.args(call, env)
            if not any(known.call is call for known in self.analysis.loads):
                self.analysis.loads.append(load)
            # no dtype: the version's default, unless torch's default or the model's own code decides
            default = "default" if not (load.remote_code or self.resolver.default_dtype_changed()) else None
            dtype = load.dtype if load.dtype in DTYPE_ALIASES.values() else (default if load.dtype is None else None)
            variants = self.resolver.load_variants(call, load)
            if variants:  # `load_in_8bit=flag`, `device_map="auto" if multi else None`, a dtype per side
                return _stamp(_choice([
                    Option(ModelState(variant, variant.dtype if variant.dtype in DTYPE_ALIASES.values()
                                      else default if variant.dtype is None else None), when)
                    for variant, when in variants]), self.depth)
            return ModelState(load, dtype)
        if isinstance(func, ast.Attribute):
            receiver = self.expr(func.value, env)
            key = dotted(func.value)
            if isinstance(receiver, Choice):
                if func.attr in MOVE_METHODS:
                    self.args(call, env)
                    return self.move_choice(call, func.attr, key if key in env else None, receiver, env)
                if func.attr in _KEEPING_METHODS:
                    self.args(call, env)
                    return receiver if func.attr in _RETURNS_SELF else None
                if func.attr in _BASE_MODEL_METHODS:
                    self.args(call, env)
                    return _map_states(receiver, without_adapters if func.attr in _UNLOADS else _unknown_dtype)
                if key is not None:
                    _forget(env, key)
            elif isinstance(receiver, ModelState):
                if func.attr in MOVE_METHODS:
                    self.args(call, env)
                    return self.move(call, func.attr, key if key in env else None, receiver, env)
                if func.attr in _KEEPING_METHODS:
                    self.args(call, env)
                    return receiver if func.attr in _RETURNS_SELF else None
                if func.attr in _BASE_MODEL_METHODS:
                    self.args(call, env)
                    return without_adapters(receiver) if func.attr in _UNLOADS else ModelState(receiver.load, None)
                if key is not None:
                    _forget(env, key)  # an unknown method may cast or replace it
            elif func.attr in _PREPARE_METHODS and key is not None and _prepares(key):
                positional, named = self.args(call, env, escape=False)
                states = positional + list(named.values())
                if len(states) == 1:
                    return states[0]
                return TupleState(tuple(states)) if any(states) else None
            elif key == "self" and self.cls is not None and self.resolver.functions is not None:
                return self.local_call(call, env)
            elif key is not None and key.startswith("self.") and key.count(".") == 1:
                # A method of another object (`self.criterion.cuda()`, `self.logger.info()`)
                # cannot rebind `self.model`, nor cast it, unless that object may hold it.
                if _may_hold_tracked(self.cls, key, env, self.resolver.functions):
                    _forget(env, "self.")
            elif key is not None and self.resolver.functions is not None and key in self.resolver.imports.aliases \
                    and "." not in key and wrapper_kind(self.resolver.imports.qualify(func)) is None \
                    and self.resolver.functions.is_project_module(key):
                # `utils.load_model(...)` of a project module: local_call parses it only
                # when the call passes a model or binds a loader's result (issue 15)
                return self.local_call(call, env)
        else:
            self.expr(func, env)
        name = self.resolver.imports.qualify(func) or ""
        if name == "setattr" and len(call.args) == 3 and new_module_class(call.args[2]) is not None:
            self.args(call, env, escape=False)
            self.replace_part(call.args[0], call.args[2], env)  # `setattr(parent, name, LoRALinear(...))`
            return None
        kind = wrapper_kind(name)
        if kind is not None:
            return self.wrap(call, env, kind, name)
        if isinstance(func, ast.Name) and self.resolver.functions is not None:
            return self.local_call(call, env)
        self.args(call, env, escape=name not in _HARMLESS_CALLS)
        return None

    def models_under(self, node: ast.expr, env: dict, depth: int = 0) -> list[str]:
        """The tracked keys whose modules `node` may be: the model itself, `model.encoder`,
        `model.get_submodule(path)`, a name bound once to one of those, the target of a loop
        over its `named_modules()`."""
        if depth > 3:
            return []
        keys = []
        for part in walk(self.resolver.deref(node)):
            key = dotted(part) if isinstance(part, (ast.Name, ast.Attribute)) else None
            if key is None:
                continue
            if isinstance(env.get(key), (ModelState, Choice)):
                keys.append(key)
            elif isinstance(part, ast.Name) and part.id in self.loop_targets:
                keys.extend(self.models_under(self.loop_targets[part.id], env, depth + 1))
            elif isinstance(part, ast.Name) and part is not node and part.id in self.resolver.consts:
                keys.extend(self.models_under(part, env, depth + 1))
        return keys

    def replace_part(self, holder: ast.expr, value: ast.expr, env: dict) -> None:
        """A submodule of the models `holder` may belong to replaced by `value`: their dtype
        is unknown unless the new module's class gives its Parameters the dtype of the layer
        it wraps (module_replacement.py)."""
        keys = self.models_under(holder, env)
        if not keys or keeps_wrapped_dtype(self.resolver.functions, new_module_class(value)):
            return
        for key in keys:
            env[key] = _map_states(env[key], _unknown_dtype)

    def wrap(self, call: ast.Call, env: dict, kind: str, name: str):
        """A wrapper keeps the model it is given: the same load, with what the wrapper
        changes (PEFT's float32 adapters make the dtype unknown)."""
        positional, named = self.args(call, env, escape=False)
        model_arg = named["model"] if "model" in named else (positional[0] if positional else None)
        node = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        if not isinstance(model_arg, (ModelState, Choice)):
            self.escape(call, env)
            return None
        change = with_adapters if kind == "adapters" else _unknown_dtype
        functions = self.resolver.functions
        if kind == "adapters" and name.endswith("get_peft_model") and keeps_base_dtype(
                call, self.resolver, functions is not None and functions.lora_in_base_dtype):
            change = with_base_dtype_adapters  # peft 0.7-0.11, or `autocast_adapter_dtype=False`
        state = model_arg if kind == "keep" else _map_states(model_arg, change)
        key = dotted(node) if node is not None else None
        if kind != "keep" and key is not None and key in env:
            env[key] = state  # adapters are injected in place: the old name sees them too
        if name.endswith("deepspeed.initialize"):
            return TupleState((state, None, None, None))
        return state

    def local_call(self, call: ast.Call, env: dict):
        """A call of the project's own function, method or class: what its call sites pass
        is recorded (for its own analysis), and what it returns comes from its summary.
        Nothing is looked up (no module parsed) unless a model goes in or the callee is
        known to build one."""
        table = self.resolver.functions
        func = call.func
        positional, named = self.args(call, env, escape=False)
        passes_model = any(isinstance(s, (ModelState, TupleState, Choice)) for s in [*positional, *named.values()])
        if isinstance(func, ast.Name) and func.id in table.traced:
            # a statement may be evaluated again with less known (module-level names as seeds)
            known = table.traced_calls.setdefault(func.id, {})
            models = sum(isinstance(s, ModelState) for s in [*positional, *named.values()])
            if id(call) not in known or models >= known[id(call)][0]:
                known[id(call)] = (models, positional, named)
        method = _method(self.cls, func.attr) if (
            self.cls is not None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")) else None
        # Another module is parsed only for a callee bound like a loader (`model =
        # build_model(cfg)`, `model = add_lora(model, cfg)`); this module's own are free.
        if isinstance(func, ast.Name):
            table._need(func.id)
        local = isinstance(func, ast.Name) and (func.id in table._defs or func.id in table._classes) or method is not None
        wanted = table.may_build_model(func, self.cls) or passes_model and (local or table.bound_like_loader(func))
        found = table.lookup(func, self.cls) if wanted else None
        if found is None and isinstance(func, ast.Name) and (func.id in table._defs or func.id in table._classes):
            found = (table, table._defs.get(func.id) or table._classes[func.id], False)  # local: no parse
            if not passes_model:  # a call site that passes no model: its callee binds nothing
                self._record(table, found[1], positional, named)
                self.escape(call, env)
                return None
        if found is None:
            if method is not None:
                if self.returns is None:  # it binds nothing then
                    self._record(table, method, positional, named, method=True)
                self.escape(call, env, method)
            elif isinstance(func, ast.Attribute) and (dotted(func.value) == "self" or func.attr != "__init__" and (
                    isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super")):
                _forget(env, "self.")  # an inherited method we cannot see (`self.reload()`, `super().reload()`)
                self.escape(call, env)
            elif (self.resolver.imports.qualify(func) or "") not in _HARMLESS_CALLS:
                self.escape(call, env)
            return None
        owner, node, is_method = found
        # A method of this class too (`self._export(model, out)`), from the walks of its
        # callers only: a summary's walk passes parameters, not models.
        if owner is table and (not is_method or self.returns is None):
            self._record(table, node, positional, named, method=is_method)
        keep = _read_only_arguments(call, node) if not is_method else frozenset()
        self.escape(call, env, node if is_method else None, keep=keep)
        if isinstance(node, ast.ClassDef):
            return None
        summary = function_summary(owner, node, self.cls if is_method else None)
        return _stamp(instantiate(summary, positional, named, foreign=owner is not table), self.depth)

    @staticmethod
    def _record(table, node, positional: list, named: dict, method: bool = False) -> None:
        target = _method(node, "__init__") if isinstance(node, ast.ClassDef) else node
        if target is not None:
            params = _positional_params(target, method=method or isinstance(node, ast.ClassDef))
            bound = {name: positional[i] for i, name in enumerate(params) if i < len(positional)}
            bound.update({k: v for k, v in named.items() if k in params})
            table.bindings.record(node, bound)

    def escape(self, call: ast.Call, env: dict, method=None, keep: frozenset = frozenset()) -> None:
        """A model handed to a function may be cast there, in place: its dtype becomes
        unknown, but it is still the same load (a callee cannot rebind the caller's name,
        and a cast or a move keeps `device_map` and quantization). A method of this class
        forgets the `self.x` it (or what it calls) may rebind; one we cannot see, all."""
        if method is not None and self.cls is not None:
            keys = self.resolver.functions.assigned_self_attributes(self.cls, method)
            if keys is None:
                _forget(env, "self.")
            else:
                for key in keys:
                    _forget(env, key)
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if id(arg) in keep:
                continue  # bound to a parameter the callee only reads (`print_model_size(model)`)
            value = arg.value if isinstance(arg, ast.Starred) else arg
            key = dotted(value)
            if key == "self":
                _forget(env, "self.")
            elif key is not None and key in env:
                state = env[key]
                _forget(env, key)
                if isinstance(state, (ModelState, Choice)):
                    env[key] = _map_states(state, _unknown_dtype)

    def args(self, call: ast.Call, env: dict, escape: bool = True) -> tuple[list, dict]:
        """Evaluate the arguments once; returns their states (positional, by keyword)."""
        positional: list = []
        named: dict = {}
        for arg in call.args:
            value = arg.value if isinstance(arg, ast.Starred) else arg
            state = self.expr(value, env)
            positional.append(None if isinstance(arg, ast.Starred) else state)
        for keyword in call.keywords:
            state = self.expr(keyword.value, env)
            if keyword.arg:
                named[keyword.arg] = state
        if escape:
            self.escape(call, env)
        return positional, named

    def move_choice(self, call, method, key, choice: Choice, env) -> Choice:
        """A cast or move on a name that holds one of several values: one possible call
        per tracked value, and the choice with each value cast."""
        # A call under a test entered after the value became uncertain may be correlated
        # with the options in ways the analysis cannot see: recorded only when it is not.
        count = len(choice.options) if self.depth <= choice.depth else 0
        options = [
            Option(self.move(call, method, key, o.state, None, alternatives=count, record=bool(count)), o.when)
            if isinstance(o.state, ModelState) else o
            for o in choice.options
        ]
        new = Choice(tuple(options), choice.depth)
        if key is not None:
            env[key] = new
        return new

    def move(self, call, method, key, state: ModelState, env, alternatives: int = 0, record: bool = True) -> ModelState:
        target, unknown, moves, dtype_arg = self.classify(call, method)
        receiver = dotted(call.func.value)
        guarded, dtype_guarded = receiver in self.device_tests, receiver in self.dtype_tests
        if not record:
            pass
        elif alternatives:
            if not any(c.call is call and c.state.load == state.load for c in self.analysis.possible_calls):
                self.analysis.possible_calls.append(ModelCall(
                    call, method, key, state, self.stmt, self.sole, target, unknown, moves, dtype_arg, alternatives,
                    guarded, dtype_guarded))
        elif not any(c.call is call for c in self.analysis.calls):  # a scope seen twice
            self.analysis.calls.append(
                ModelCall(call, method, key, state, self.stmt, self.sole, target, unknown, moves, dtype_arg,
                          device_guarded=guarded, dtype_guarded=dtype_guarded)
            )
        if target is not None:  # a cast of a PEFT model casts its base too
            base = replace(state.base, dtype=target, cast_by=call) if state.base is not None else None
            new = replace(state, dtype=target, cast_by=call, base=base)
        elif unknown:
            new = replace(state, dtype=None, cast_by=call, base=None)
        else:
            new = state
        if key is not None and env is not None:  # Module.to() works in place: the name sees the new dtype too
            env[key] = new
        return new

    def classify(self, call: ast.Call, method: str):
        """(target dtype, unknown dtype?, moves device?, the dtype argument node)."""
        if method in CAST_METHODS:
            return CAST_METHODS[method], False, False, None
        if method == "cuda":
            return None, False, True, None
        target, unknown, device, dtype_arg = None, False, False, None
        for arg in call.args:
            dtype = self.resolver.dtype(arg)
            if dtype in DTYPE_ALIASES.values():
                target, dtype_arg = dtype, arg
            elif self.resolver.is_device(arg):
                device = True
            else:
                unknown = True
        for keyword in call.keywords:
            if keyword.arg == "dtype":
                dtype = self.resolver.dtype(keyword.value)
                if dtype in DTYPE_ALIASES.values():
                    target, dtype_arg = dtype, keyword
                else:
                    unknown = True
            elif keyword.arg == "device":
                device = True
            elif keyword.arg is None:
                unknown = True
        moves = True if device else (None if unknown else False)
        return target, unknown, moves, dtype_arg
