"""Which optimizer holds which module's parameters, in what dtype, where it is stepped.

The model analysis (models.py) follows `from_pretrained` loads through a scope. The
precision rules also need the optimizers: which module's own Parameters each one holds
(or a master copy of them), and the dtype of those Parameters when the optimizer is
stepped. This module walks the scopes that build an optimizer once per file, with the
model walker plus:

- every `.parameters()` / `.named_parameters()` on a tracked model (or a submodule of one:
  `model.lm_head.parameters()`) records the model's state there (`sources`);
- a half-precision cast of a module no load explains (`model = Net().half()`,
  `model.to(torch.float16)`) starts tracking that name, so plain `nn.Module`s count too;
- a float16 cast of a submodule (`model[0].half()`, `model.encoder.half()`) marks the
  model as holding float16 Parameters in that part (`HALF_PART`); a cast of a part to
  another dtype makes a float16 model's dtype unknown;
- `torch.compile(model)` and `DistributedDataParallel(model)` keep the same Parameters;
  `FullyShardedDataParallel(model)` without a `mixed_precision` policy keeps their dtype
  (its flat Parameters take the module's dtype);
- an optimizer construction is a value (`OptimizerValue`) bound like any other: it
  records the modules whose own Parameters reach it (`builds`), through names bound
  once, lists, `filter()`, `itertools.chain()`, param groups and comprehensions that pass
  the Parameters through unchanged; `[p.float() for p in ...]` holds new tensors (a
  master copy) and no module;
- `X.step(opt)` / `X.unscale_(opt)` on a bound optimizer records what the modules it holds
  are at that point (`steps`): an in-place cast after the optimizer was built counts,
  and a module name rebound to something else no longer speaks for the optimizer;
- `Trainer(model=..., args=...)` of transformers or trl records the model as it is there
  (`trainers`), also in a helper this module calls with its model;
- an accelerate engine's `prepare(...)` marks the optimizers it returns, and
  `optimizer.step()` on one is a step too (accelerate steps it through its GradScaler when
  it scales the loss); its `accumulate(model)`, `backward(loss)` and the like keep the model.

A trainer class is walked as one: `__init__` first (with the setup methods it always calls,
`self.model_init()`), then every other method, seeded with the `self.x` values that only
`__init__` or one of those (or only one other method) assigns.

Precision over recall, as in models.py: branches that disagree, loops that recast, a model
handed to code we cannot see make the dtype unknown, and rules stay silent.
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from cfgfix.analysis.model_loads import _Resolver
from cfgfix.analysis.model_values import ModelAnalysis, ModelLoad, ModelState, TupleState
from cfgfix.analysis.model_walker import _Walker
from cfgfix.analysis.model_wrappers import _prepares
from cfgfix.analysis.names import dotted, single_assignments, walk_scope
from cfgfix.analysis.optimizer_sites import LIBRARY_TRAINER, OPTIMIZER, PARAM_METHODS, optimizer_sites
from cfgfix.records import replace

HALF = ("float16", "bfloat16")
HALF_PART = "float16-part"  # some submodule holds float16 Parameters, the rest may not
_HALF_CAST_METHODS = {"half", "bfloat16", "to"}
_PART_CAST_METHODS = {"half", "bfloat16", "float", "double", "to", "type"}
STEP_METHODS = ("step", "unscale_")
# Accelerator methods that take a model or a loss without casting the model's weights.
_ACCELERATOR_KEEPS = {
    "accumulate", "backward", "clip_grad_norm_", "clip_grad_value_", "gather", "gather_for_metrics",
    "reduce", "pad_across_processes", "print", "log", "wait_for_everyone", "no_sync", "autocast",
    "save_state", "save_model", "save", "get_state_dict", "register_for_checkpointing", "trigger_sync_in_backward",
}
# Calls that return a module holding the very same Parameters.
# FSDP (1) flattens the module's Parameters into flat ones of the same dtype; its
# `mixed_precision` policy only changes the compute copies, but with one the user chose
# a precision plan, so only FSDP without it is followed as keeping the dtype.
FSDP_CLASSES = {
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
}


def keeps_dtype(name: str | None, call: ast.Call) -> bool:
    """FSDP wrapping without a `mixed_precision` policy (nor `**kwargs` that may hold one)."""
    return name in FSDP_CLASSES and not any(k.arg in ("mixed_precision", None) for k in call.keywords)


SAME_PARAMETERS = {
    "torch.compile",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
}
# Calls that pass an iterable of parameters through unchanged.
_PASS_THROUGH = {"list", "tuple", "filter", "itertools.chain", "chain", "itertools.chain.from_iterable"}


# The facts below are NamedTuples, not frozen dataclasses: immutable, equal and hashed by
# their fields as before, at a fraction of the cost to create the classes (six frozen
# dataclasses were ~3.5 ms of this module's ~4.5 ms import, paid by every run over a
# script that builds an optimizer; issue 15). No code iterates them or compares them
# with plain tuples.


class ParamSource(NamedTuple):
    """`model.parameters()` (or `named_parameters()`) on a tracked model."""

    call: ast.Call
    key: str  # the tracked name it was called on (`model`, `self.model`)
    state: ModelState  # what the name held there

    @property
    def dtype(self) -> str | None:
        return self.state.dtype


class OptimizerBuild(NamedTuple):
    """One optimizer construction (`torch.optim.AdamW(model.parameters(), ...)`)."""

    call: ast.Call
    name: str  # the qualified class name
    holds: tuple[str, ...]  # the modules whose own Parameters it holds (`model`, `self.model.head`)
    sources: tuple[ParamSource, ...]  # those of them tracked when their `.parameters()` ran
    master: bool  # it is given new tensors (a float32 master copy), not a module's Parameters


class OptimizerValue(NamedTuple):
    """What a name bound to an optimizer holds: the build, and the held modules whose
    names have been rebound since (they no longer tell what the optimizer holds)."""

    build: OptimizerBuild
    detached: frozenset = frozenset()
    prepared: ast.Call | None = None  # the `accelerator.prepare(...)` that wrapped it


class Held(NamedTuple):
    """One module an optimizer holds, as it is at a step."""

    key: str
    state: ModelState | None  # None: untracked (nothing made it half precision)
    attached: bool  # False: the name was rebound since the optimizer was built

    @property
    def float16_cast(self) -> ast.AST | None:
        """The cast (or float16 load) that makes Parameters of this module float16, when
        that is known for certain at this point."""
        if not self.attached or self.state is None:
            return None
        state = self.state
        made = state.cast_by or state.load.call
        if state.dtype == "float16":
            return made
        if state.dtype == HALF_PART and state.cast_by is not None:
            part = _path(state.cast_by.func.value)  # type: ignore[attr-defined]
            if part is not None and (_under(part, self.key) or _under(self.key, part)):
                return made
        return None


class Step(NamedTuple):
    """`scaler.step(optimizer)` / `scaler.unscale_(optimizer)` on a bound optimizer, or
    `optimizer.step()` on one an accelerator prepared (its GradScaler steps it, if any)."""

    call: ast.Call
    receiver: str | None  # `scaler`, `self.scaler`; the accelerator for a prepared optimizer
    optimizer: OptimizerBuild
    held: tuple[Held, ...]
    function: ast.AST | None
    cls: ast.ClassDef | None
    prepared: ast.Call | None = None  # the `accelerator.prepare(...)` of a prepared optimizer


class TrainerUse(NamedTuple):
    """`Trainer(model=..., args=...)` of transformers or trl: it builds the optimizer over the
    model's trainable parameters and steps it under the precision its arguments choose."""

    call: ast.Call
    name: str
    model: Held | None  # the model it trains, as it is there
    args: ast.expr | None  # the training arguments as written (`args=` or the second argument)
    function: ast.AST | None
    cls: ast.ClassDef | None


class ParameterFlow:
    def __init__(self, analysis: ModelAnalysis) -> None:
        self.analysis = analysis  # the casts seen on the way (`calls`), for rules that look back
        self.sources: dict[int, ParamSource] = {}  # id(.parameters() call) ->
        self.builds: dict[int, OptimizerBuild] = {}  # id(optimizer call) ->
        self.steps: dict[int, Step] = {}  # id(step call) ->
        self.trainers: dict[int, TrainerUse] = {}  # id(Trainer call) ->
        self.consts: dict[int, dict] = {}  # id(scope) -> names bound once there


def parameter_flow(ctx) -> ParameterFlow:
    """Computed once per file (only when a rule that needs it asks) and kept in `ctx.notes`."""
    cached = ctx.notes.get("parameter-flow")
    if cached is None:
        cached = ctx.notes["parameter-flow"] = _run(ctx)
    return cached


def _run(ctx) -> ParameterFlow:
    imports = ctx.imports
    tree = ctx.document.tree
    flow = ParameterFlow(ModelAnalysis(imports, tree))
    sites = optimizer_sites(ctx)
    if not sites:
        return flow
    bindings = {}
    if any(LIBRARY_TRAINER.match(s.name) or _built_from_parameter(s) or s.context.classdef is not None for s in sites):
        # A trainer (or an optimizer) is often built in a helper the script calls with its
        # model (`create_trainer(model, ...)`, `train(unet, accelerator, loader)` building
        # `AdamW(unet.parameters())`): what this module's call sites pass, as the model
        # analysis bound it.
        ctx.models  # noqa: B018 - records the call-site bindings
        bindings = {id(node): params for node, params in ctx.functions.bindings.consistent().items()}
        bindings.update(ctx.functions.remote_bindings)  # classes built with a model by other modules
    functions = ctx.functions
    if functions.text is None:
        functions.text = ctx.source.text  # what tells which callees are bound like loaders
    module_consts = single_assignments(tree.body)
    classes: dict[int, ast.ClassDef] = {}
    scopes: dict[int, ast.AST] = {}
    for site in sites:
        scope = site.context.function or tree
        cls = site.context.classdef
        if cls is not None and scope in cls.body:
            classes.setdefault(id(cls), cls)
        elif not isinstance(scope, ast.Lambda):
            scopes.setdefault(id(scope), scope)

    def walk(scope, env: dict, cls=None) -> dict:
        consts = module_consts if scope is tree else {**module_consts, **single_assignments(scope.body)}
        flow.consts[id(scope)] = consts
        walker = _ParamWalker(flow, _Resolver(imports, consts, functions), scope, cls)
        return walker.block(scope.body, env)

    for scope in scopes.values():
        walk(scope, dict(bindings.get(id(scope), {})))
    for cls in classes.values():
        _walk_class(cls, walk, bindings.get(id(cls), {}))
    return flow


def _built_from_parameter(site) -> bool:
    """The call is made in a plain function with one of that function's parameters in
    its arguments (`AdamW(unet.parameters())` in `def train(unet, ...)`)."""
    function = site.context.function
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or site.context.classdef is not None:
        return False
    args = function.args
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    return any(isinstance(node, ast.Name) and node.id in params for node in ast.walk(site.node))


def _assigning_methods(methods: list) -> dict[str, set[int]]:
    """`self.x` -> the methods that bind it (`=`, tuple targets, `+=`, `del`; a `= None`
    placeholder does not count)."""
    owners: dict[str, set[int]] = {}
    for method in methods:
        nodes = list(walk_scope(method))
        placeholders = {
            id(t) for n in nodes
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is None
            for t in n.targets
        }
        for node in nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and id(node) not in placeholders:
                key = dotted(node)
                if key and key.startswith("self.") and key.count(".") == 1:
                    owners.setdefault(key, set()).add(id(method))
    return owners


def _walk_class(cls: ast.ClassDef, walk, init_params: dict) -> None:
    """`__init__` first, with the setup methods it always calls (`self.model_init()`, in
    order); then each other method, seeded with what those leave in the `self.x` only one of
    them assigns; then, once more, the methods that read a `self.x` that only one other
    method assigns (an optimizer built in `setup()`, stepped in `train_step()`), seeded with
    what that method leaves. `init_params`: what the class's constructions pass to the
    parameters of `__init__`, where they agree (`Trainer(model, tokenizer)`)."""
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    owners = _assigning_methods(methods)

    def only(env: dict, method) -> dict:
        return {
            k: v for k, v in env.items()
            if k.startswith("self.") and k.count(".") == 1 and owners.get(k) == {id(method)}
        }

    init = next((m for m in methods if m.name == "__init__"), None)
    seeds = only(walk(init, dict(init_params), cls), init) if init is not None else {}
    for method in _setup_methods(init, methods):
        seeds.update(only(walk(method, dict(seeds), cls), method))
    later: dict[int, dict] = {}
    for method in methods:
        if method is not init:
            later[id(method)] = only(walk(method, dict(seeds), cls), method)
    for method in methods:
        if method is init:
            continue
        extra = {}
        for other in methods:
            if other is not method and other is not init:
                extra.update(later.get(id(other), {}))
        used = {dotted(n) for n in ast.walk(method) if isinstance(n, ast.Attribute)}
        extra = {k: v for k, v in extra.items() if k in used and k not in seeds}
        if any(isinstance(v, OptimizerValue) for v in extra.values()):
            walk(method, {**seeds, **extra}, cls)


def _setup_methods(init, methods: list) -> list:
    """The methods of the class that `__init__` calls as statements of its own body, not
    under a condition or a loop (`self.model_init()`), in the order it calls them."""
    if init is None:
        return []
    by_name = {m.name: m for m in methods if m is not init}
    found = []
    for stmt in init.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
                and call.func.attr in by_name and by_name[call.func.attr] not in found):
            found.append(by_name[call.func.attr])
    return found


class _ParamWalker(_Walker):
    """The model walker, plus parameters, optimizers, steps and casts of plain modules."""

    def __init__(self, flow: ParameterFlow, resolver: _Resolver, scope: ast.AST, cls: ast.ClassDef | None) -> None:
        super().__init__(flow.analysis, resolver, {}, cls=cls)
        self.flow = flow
        self.scope = scope

    # -- statements ----------------------------------------------------------------------
    def bind(self, target: ast.AST, state, env: dict) -> None:
        """A held module's name rebound to anything but the same load (`model = DDP(model)`
        keeps it) no longer tells what the optimizer holds."""
        key = dotted(target)
        if key is not None:
            old = env.get(key)
            same = isinstance(old, ModelState) and isinstance(state, ModelState) and old.load is state.load
            for name, value in list(env.items()):
                if isinstance(value, OptimizerValue) and not same:
                    gone = {h for h in value.build.holds if _under(h, key)} - value.detached
                    if gone:
                        env[name] = value._replace(detached=value.detached | gone)
        super().bind(target, state, env)

    def escape(self, call: ast.Call, env: dict, method=None, keep: frozenset = frozenset()) -> None:
        """An optimizer handed to other code (a scheduler, `accelerator.prepare`) still holds
        the same Parameters."""
        passed = {dotted(a.value if isinstance(a, ast.Starred) else a) for a in [*call.args, *(k.value for k in call.keywords)]}
        kept = {k: v for k, v in env.items() if isinstance(v, OptimizerValue) and k in passed}
        super().escape(call, env, method, keep)
        if method is None:
            for key, value in kept.items():
                env.setdefault(key, value)

    # -- calls ---------------------------------------------------------------------------
    def call(self, call: ast.Call, env: dict):
        func = call.func
        if isinstance(func, ast.Attribute):
            if func.attr in STEP_METHODS and call.args:
                self._step(call, env, dotted(call.args[0]))
            elif func.attr == "step" and not call.args:
                self._step(call, env, dotted(func.value), prepared=True)
            elif func.attr in PARAM_METHODS:
                found = _tracked_prefix(dotted(func.value), env)
                if found is not None:
                    self.flow.sources[id(call)] = ParamSource(call, found[0], found[1])
        name = self.resolver.imports.qualify(func) or ""
        if LIBRARY_TRAINER.match(name):
            self._trainer(call, name, env)
        if OPTIMIZER.search(name):
            self.args(call, env, escape=False)
            return OptimizerValue(self._build(call, name))
        if (name in SAME_PARAMETERS or keeps_dtype(name, call)) and call.args:
            key = dotted(call.args[0])
            if key is not None and isinstance(env.get(key), ModelState):
                state = env[key]
                for arg in [*call.args[1:], *(k.value for k in call.keywords)]:
                    self.expr(arg, env)
                return state
        owner = dotted(func.value) if isinstance(func, ast.Attribute) else None
        if owner is not None and func.attr in ("prepare", "prepare_optimizer") and _prepares(owner):  # type: ignore[union-attr]
            return _mark_prepared(super().call(call, env), call)
        if owner is not None and func.attr in _ACCELERATOR_KEEPS and _prepares(owner):  # type: ignore[union-attr]
            self.args(call, env, escape=False)  # `accelerator.accumulate(model)` keeps the weights
            return None
        if owner is not None and owner.startswith("self.") and owner.count(".") == 1 \
                and not isinstance(env.get(owner), ModelState):
            # A method of one of the trainer's objects (its optimizer, scaler, scheduler, a
            # module nothing tracks): it cannot rebind the trainer's other attributes.
            self.args(call, env)
            if func.attr in _HALF_CAST_METHODS:  # type: ignore[union-attr]
                return self._untracked_cast(call, func, env)  # type: ignore[arg-type]
            if func.attr in _PART_CAST_METHODS:  # type: ignore[union-attr]
                _forget_key(env, owner)  # cast to another dtype: whatever it held is unknown
            return None
        if isinstance(env.get(dotted(func) or ""), ModelState) and isinstance(func, ast.Attribute):
            self.args(call, env)  # `self.model(batch)`: a forward pass keeps the dtype
            return None
        state = super().call(call, env)
        if state is None and isinstance(func, ast.Attribute):
            if _path(func.value) != _root(func.value):
                self._part_cast(call, func, env)
            elif func.attr in _HALF_CAST_METHODS:
                state = self._untracked_cast(call, func, env)
        return state

    def _build(self, call: ast.Call, name: str) -> OptimizerBuild:
        found = self.flow.builds.get(id(call))
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        params = call.args[0] if call.args else keywords.get("params")
        nodes = parameter_calls(params, self.resolver.consts) if params is not None else []
        holds = tuple(dict.fromkeys(k for k in (dotted(n.func.value) for n in nodes) if k))  # type: ignore[attr-defined]
        sources = tuple(dict.fromkeys(self.flow.sources[id(n)] for n in nodes if id(n) in self.flow.sources))
        build = OptimizerBuild(call, name, holds, sources, master=params is not None and not nodes)
        if found is None or build != found:
            self.flow.builds[id(call)] = build
        return build

    def _step(self, call: ast.Call, env: dict, key: str | None, prepared: bool = False) -> None:
        value = env.get(key) if key is not None else None
        if not isinstance(value, OptimizerValue) or (prepared and value.prepared is None):
            return
        held = []
        for module in value.build.holds:
            found = _tracked_prefix(module, env)
            state = found[1] if found is not None else None
            held.append(Held(module, state, module not in value.detached))
        via = value.prepared if prepared else None
        receiver = dotted((via or call).func.value)  # type: ignore[attr-defined]
        function = None if self.scope is self.flow.analysis.tree else self.scope
        self.flow.steps[id(call)] = Step(call, receiver, value.build, tuple(held), function, self.cls, via)

    def _trainer(self, call: ast.Call, name: str, env: dict) -> None:
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        node = keywords.get("model", call.args[0] if call.args else None)
        args = keywords.get("args", call.args[1] if len(call.args) > 1 else None)
        key = dotted(node) if node is not None else None
        found = _tracked_prefix(key, env) if key is not None else None
        model = Held(key, found[1], True) if found is not None and found[0] == key else None  # type: ignore[arg-type]
        function = None if self.scope is self.flow.analysis.tree else self.scope
        self.flow.trainers[id(call)] = TrainerUse(call, name, model, args, function, self.cls)

    def _untracked_cast(self, call: ast.Call, func: ast.Attribute, env: dict) -> ModelState | None:
        """`Net().half()`, `model.to(torch.bfloat16)` on a module no load explains."""
        key = dotted(func.value)
        if key is not None and key in env:
            return None  # tracked: the model walker has handled it
        target, unknown, _moves, _arg = self.classify(call, func.attr)
        if target not in HALF or unknown:
            return None
        state = ModelState(_module_load(call, target), dtype=target, cast_by=call)
        if key is not None and (key.count(".") == 0 or (key.startswith("self.") and key.count(".") == 1)):
            env[key] = state  # Module casts work in place
        return state

    def _part_cast(self, call: ast.Call, func: ast.Attribute, env: dict) -> None:
        """`model[0].half()`, `model.encoder.to(torch.float16)`: float16 Parameters in part
        of `model`; a part cast to anything else leaves a float16 model's dtype unknown."""
        if func.attr not in _PART_CAST_METHODS:
            return
        root = _root(func.value)
        if root is None or root == "self":
            return
        if func.attr in ("double", "type"):
            target, unknown = ("float64", False) if func.attr == "double" and not call.args else (None, True)
        else:
            target, unknown, _moves, _arg = self.classify(call, func.attr)
        if target is None and not unknown:
            return  # a device move
        state = env.get(root)
        if target == "float16" and not unknown:
            if isinstance(state, ModelState) and state.dtype != "float16":
                env[root] = replace(state, dtype=HALF_PART, cast_by=call)
            elif state is None:
                env[root] = ModelState(_module_load(call, HALF_PART), dtype=HALF_PART, cast_by=call)
        elif isinstance(state, ModelState) and state.dtype in ("float16", HALF_PART):
            env[root] = replace(state, dtype=None, cast_by=call)


def _mark_prepared(value, call: ast.Call):
    """What `accelerator.prepare(...)` returns, its optimizers marked as prepared by it."""
    if isinstance(value, OptimizerValue):
        return value._replace(prepared=call)
    if isinstance(value, TupleState):
        return TupleState(tuple(_mark_prepared(item, call) for item in value.items))
    return value


def _forget_key(env: dict, key: str) -> None:
    for name in [k for k in env if k == key or k.startswith(key + ".")]:
        del env[name]


def _module_load(call: ast.Call, dtype: str) -> ModelLoad:
    """Stands for a plain `nn.Module` made half precision by `call` (no load explains it)."""
    return ModelLoad(
        call=call, class_name="", dtype=dtype, dtype_keyword=None, device_map=None,
        quantized=None, hidden_kwargs=False, pipeline=False,
    )


def _tracked_prefix(key: str | None, env: dict) -> tuple[str, ModelState] | None:
    if not key:
        return None
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix == "self":
            return None
        if isinstance(env.get(prefix), ModelState):
            return prefix, env[prefix]
    return None


def _path(node: ast.AST) -> str | None:
    """`model.encoder` -> "model.encoder", `model[0]` -> "model.[0]", `self.m.layers[3]`
    -> "self.m.layers.[3]": a module path with constant indexes; None otherwise."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append(f"[{node.slice.value!r}]")
            node = node.value
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _root(node: ast.AST) -> str | None:
    """The name a module path starts from: `model` for `model.encoder`, `self.model` for
    `self.model.layers[0]`."""
    path = _path(node)
    if path is None:
        return None
    parts = path.split(".")
    return ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 else parts[0]


def _under(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer + ".")


def parameter_calls(node: ast.AST, consts: dict, depth: int = 0, seen: frozenset = frozenset()) -> list[ast.Call]:
    """The `.parameters()` calls whose Parameters themselves reach the optimizer."""
    if depth > 6:
        return []
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in PARAM_METHODS:
            return [node]
        name = dotted(func) or ""
        if name in _PASS_THROUGH:
            args = node.args[1:] if name == "filter" else node.args
            return [c for a in args for c in parameter_calls(a, consts, depth + 1, seen)]
        return []
    if isinstance(node, ast.Name):
        if node.id in consts and node.id not in seen:
            return parameter_calls(consts[node.id], consts, depth + 1, seen | {node.id})
        return []
    if isinstance(node, ast.Starred):
        return parameter_calls(node.value, consts, depth + 1, seen)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [c for e in node.elts for c in parameter_calls(e, consts, depth + 1, seen)]
    if isinstance(node, ast.Dict):  # a param group
        return [
            c for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and k.value == "params"
            for c in parameter_calls(v, consts, depth + 1, seen)
        ]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [c for side in (node.left, node.right) for c in parameter_calls(side, consts, depth + 1, seen)]
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        elt = node.elt
        if isinstance(elt, ast.Dict):  # [{"params": p, ...} for p in ...]
            elt = next(
                (v for k, v in zip(elt.keys, elt.values) if isinstance(k, ast.Constant) and k.value == "params"), None
            )
        if isinstance(elt, (ast.List, ast.Tuple)) and len(elt.elts) == 1:
            elt = elt.elts[0]
        if not (isinstance(elt, ast.Name) and elt.id in targets):
            return []  # `p.float()`, `p.clone()`: new tensors, not the model's Parameters
        return [c for g in node.generators for c in parameter_calls(g.iter, consts, depth + 1, seen)]
    return []


def edits_parameters(nodes: list[ast.AST]) -> bool:
    """Freezing or replacing parameters (`p.requires_grad = False`, `requires_grad_()`,
    `p.data = p.data.float()`) anywhere in `nodes`: frozen float16 parameters get no
    gradient and raise nothing, and the trained ones may be float32."""
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr in ("requires_grad", "data") for t in targets):
                    return True
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_":
                return True
    return False
