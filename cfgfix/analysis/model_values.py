"""What a name may hold in the model analysis (models.py), and how values meet.

The records: a load (`ModelLoad`, with its `DeviceMap`), a model at one point
(`ModelState`), a tuple of values (`TupleState`), the options branches leave (`Choice` of
`Option`s), a function's parameter while its summary is computed (`ParamLoad`), a cast or
move on a model (`ModelCall`) and the result of one module (`ModelAnalysis`). Then how two
paths' values merge into one (`_merge_values`, `_choice`) and how a function summary
becomes a value at one call (`instantiate`).
"""

from __future__ import annotations

import ast

from cfgfix.analysis.names import ImportMap
from cfgfix.core import LazyRegex
from cfgfix.records import dataclass, field, replace

CAST_METHODS = {"half": "float16", "bfloat16": "bfloat16", "float": "float32"}
MOVE_METHODS = {"to", "cuda"} | set(CAST_METHODS)
# Methods that neither rebind the model nor change its dtype or placement.
_KEEPING_METHODS = {
    "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
    "named_modules", "children", "named_children", "state_dict", "load_state_dict",
    "gradient_checkpointing_enable", "gradient_checkpointing_disable",
    "activation_checkpointing_enable", "enable_input_require_grads", "resize_token_embeddings",
    "tie_weights", "requires_grad_", "zero_grad", "forward", "generate", "save_pretrained",
    "push_to_hub", "print_trainable_parameters", "get_input_embeddings",
    "get_output_embeddings", "num_parameters", "register_forward_hook",
    "register_forward_pre_hook", "register_full_backward_hook", "get_memory_footprint",
    "enable_xformers_memory_efficient_attention", "set_attention_slice", "apply",
    "get_submodule", "get_parameter",
}
_RETURNS_SELF = {"train", "eval", "requires_grad_", "apply"}
_TRAINER = LazyRegex(r"(^|\.)\w*Trainer$")


@dataclass(frozen=True)
class DeviceMap:
    """A load's `device_map`: where it may place the weights."""

    kind: str  # "multi" (can span devices: hooks), "single", or "unknown"
    offload: bool  # some modules may live on the CPU or disk
    node: ast.expr


@dataclass(frozen=True)
class ModelLoad:
    """One `from_pretrained` (or loader) call and what it asks for."""

    call: ast.Call
    class_name: str
    dtype: str | None  # canonical dtype, "auto", None when not passed, "?" when unresolvable
    dtype_keyword: ast.keyword | None
    device_map: DeviceMap | None
    quantized: str | None  # "4bit", "8bit", "config" (a quantization config object) or None
    hidden_kwargs: bool  # `**kwargs` may pass anything
    pipeline: bool
    # Where the class comes from: "transformers" (also PEFT's AutoPeft* and modelscope's
    # wrappers, which load through transformers), "diffusers", or None (a local class, or a
    # loader with its own defaults such as auto_gptq): rules that depend on a library's
    # defaults stay silent for None.
    library: str | None = None
    quant_keywords: bool = False  # load_in_4bit/8bit or quantization_config passed at all
    # Set when the load lives in another module of the project (a `build_model()` imported
    # from `models/build.py`): its display path, and its SourceText for related spans.
    path: str | None = None
    source: object = field(default=None, compare=False, repr=False)
    # `trust_remote_code` passed and not literally False: the hub's own modeling code builds
    # the layers, often in a dtype of its choosing (ChatGLM-6B `params_dtype=torch.half`,
    # ChatGLM2/3 and GLM-4 `dtype=config.torch_dtype`, Qwen-1 picks bf16/fp16 itself), so
    # transformers' default dtype for a load without one says nothing about the weights.
    remote_code: bool = False
    # The load sits where only a single-process run goes: in a branch on the launcher's
    # environment (`if int(os.environ.get("LOCAL_RANK", -1)) == -1:`, the `else` of `if
    # ddp:` after `ddp = world_size != 1`; analysis/process_tests.py). A multi-process
    # launch never runs it.
    single_process: bool = field(default=False, compare=False)
    # One side of a conditional dtype (`torch_dtype=torch.bfloat16 if args.bf16 else None`):
    # the keyword also serves the other side, so a fix must not rewrite it.
    dtype_side: bool = False

    @property
    def line(self) -> int:
        return self.call.lineno

    @property
    def where(self) -> str:
        """`line 12`, or `models/build.py:12` for a load in another module."""
        return f"{self.path}:{self.call.lineno}" if self.path else f"line {self.call.lineno}"


@dataclass(frozen=True)
class ModelState:
    """A tracked model at one point: its load and its dtype now."""

    load: ModelLoad
    dtype: str | None  # canonical dtype now, "default" (the version's default), None unknown
    cast_by: ast.Call | None = None  # the cast that set `dtype`; None: the load did
    # Under PEFT adapters (`get_peft_model`, `PeftModel.from_pretrained`): the base model's
    # own state, which `merge_and_unload()` / `unload()` give back (the merge writes the
    # adapters' delta into the base weights in their own dtype: peft's `merge` casts it back).
    base: ModelState | None = None


@dataclass(frozen=True)
class TupleState:
    """What a tuple holds, element by element: `model, tok = load_model(args)`,
    `model, opt = accelerator.prepare(model, opt)`."""

    items: tuple


@dataclass(frozen=True)
class Option:
    """One value a name may hold after branches: `state` None for a value the analysis does
    not track (another object, or what the name held before). `when`: the branch
    conditions it holds under, as facts `(key, test, value, truth)`: `("args.q", "truthy",
    None, True)` for `if args.q:`, `("t", "eq", "qwen", False)` for the `else` of
    `if t == "qwen":`. A key starting with `*.` came from another scope: only its last
    name is compared."""

    state: object
    when: frozenset = frozenset()


@dataclass(frozen=True)
class Choice:
    """What a name holds when branches bound different values (`if x: model = A(...,
    device_map="auto") else: model = B(...)`): each option with its conditions."""

    options: tuple
    # How many `if`s deep (in the function walked) the value became uncertain: a call
    # deeper than that runs under a test the analysis could not relate to the options
    # (`if self.device == "cpu": model.float()` after `quantization_config=... if int4`),
    # so it is not reported.
    depth: int = field(default=0, compare=False)

    @property
    def states(self) -> list:
        return [o.state for o in self.options if o.state is not None]


MAX_OPTIONS = 6  # more values than this and the name is forgotten


@dataclass(frozen=True)
class ParamLoad:
    """Stands for a function's parameter while its summary is computed (never reaches a
    rule): a function that returns `get_peft_model(model, cfg)` returns its parameter."""

    index: int
    name: str
    class_name: str = "<parameter>"
    library: str | None = None
    quant_keywords: bool = False
    dtype: str | None = None
    device_map: object = None
    path: str | None = None


@dataclass(frozen=True)
class ModelCall:
    """`.to()`, `.cuda()`, `.half()`, `.bfloat16()` or `.float()` on a tracked model."""

    call: ast.Call
    method: str
    key: str | None  # the receiver's name (`model`, `self.model`), None for a chain on the load
    state: ModelState  # what the receiver held just before the call
    stmt: ast.stmt
    sole_in_block: bool
    target_dtype: str | None  # the dtype it casts to, when known
    dtype_unknown: bool  # an argument that may be a dtype could not be resolved
    moves_device: bool | None  # True: a device move; False: dtype only; None: unclear
    dtype_arg: ast.AST | None  # the positional arg or keyword that carries the dtype
    # 0: the receiver holds this one load. n > 1: it holds one of n values (branches that
    # bound different loads, see `Choice`), `state` being one of them.
    alternatives: int = 0
    # The call runs under a test that reads where the model is (`if model.device.type !=
    # "cuda":`, `if not hasattr(model, "hf_device_map"):`): the code checks the placement
    # before it moves, so a dispatch that placed the model never reaches the move.
    device_guarded: bool = False
    # The call runs under a test that reads the model's dtype (`if self.model.dtype !=
    # torch.bfloat16:`): where the model already has that dtype the cast never runs.
    dtype_guarded: bool = False

    @property
    def receiver(self) -> ast.expr:
        return self.call.func.value  # type: ignore[attr-defined]


@dataclass
class ModelAnalysis:
    """The loads of one module and the casts and moves applied to them."""

    imports: ImportMap
    tree: ast.Module | None = None
    loads: list[ModelLoad] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    # Calls on a name that holds one of several values (a `Choice`): one record per tracked
    # value, each with `alternatives` set. Only rules that speak when any branch reaching the
    # call is wrong read these.
    possible_calls: list[ModelCall] = field(default_factory=list)
    deps: list[str] = field(default_factory=list)  # other project files the analysis read

    @property
    def trains(self) -> bool:
        """The module calls `backward()`, builds a `*Trainer` or calls `deepspeed.initialize`
        (a full walk, so only rules that need it ask)."""
        if self.tree is None:
            return False
        return any(isinstance(n, ast.Call) and _is_training_call(n, self.imports) for n in ast.walk(self.tree))
PARAM_DTYPE = "<param>"  # a parameter's dtype, untouched by the function


_NO_VALUE = object()  # `return` / `return None`


def _merge_returns(returns: list):
    """One value for a function's `return`s, each with the branch conditions it is under
    (`if args.multi_gpu: return A` ... `return B`: A when `multi_gpu`, B when not)."""
    values = [(value, path) for value, path in returns if value is not _NO_VALUE]
    if not values or any(value is None for value, _ in values):
        return None
    first, when = values[0]
    for other, path in values[1:]:
        merged = _merge_values(first, other, when, path)
        if merged is None:
            return None
        first, when = merged, frozenset()
    return _loosen(first)


def _merge_values(a, b, when_a: frozenset = frozenset(), when_b: frozenset = frozenset()):
    """One value for two paths: equal, the same load with the dtype they agree on, loads no
    rule can tell apart, or else a `Choice` of both (`when_a`/`when_b`: the conditions of
    each path). None when they cannot be one value (a tuple and a model)."""
    if a == b:
        return a
    if isinstance(a, TupleState) and isinstance(b, TupleState) and len(a.items) == len(b.items):
        return TupleState(tuple(_merge_values(x, y, when_a, when_b) for x, y in zip(a.items, b.items)))
    if not all(v is None or isinstance(v, (ModelState, Choice)) for v in (a, b)):
        return None  # a tuple and a model, or values of subclasses' own kinds (optimizers)
    return _choice([*_options(a, when_a), *_options(b, when_b)])


def _merge_states(a: ModelState, b: ModelState) -> ModelState | None:
    """The same load with the dtype both agree on, or two loads no rule can tell apart."""
    if a.load == b.load:
        same = a.dtype == b.dtype
        return ModelState(a.load, a.dtype if same else None, a.cast_by if same and a.cast_by == b.cast_by else None)
    if getattr(a.load, "call", None) is getattr(b.load, "call", False) and a.load.dtype != b.load.dtype:
        return None  # one load per side of `torch_dtype=X if c else Y`: a later `if c:` tells them apart
    if _alike(a.load, b.load):
        # Two loads, one per branch (`if "qwen" in name: ... else: ...`), that agree on all a
        # rule asks of a load: the first stands for both; the dtype only where both agree.
        same = a.dtype == b.dtype and a.cast_by is None and b.cast_by is None
        return ModelState(a.load, a.dtype if same else None, None)
    return None


def _options(value, when: frozenset = frozenset()) -> list[Option]:
    if isinstance(value, Choice):
        return [Option(o.state, o.when | when) for o in value.options]
    return [Option(value, when)]


def _choice(options: list[Option]):
    """The value for a set of options: one state when they merge into one (equal, the same
    load, loads no rule tells apart: their conditions are then what they share), a
    `Choice` otherwise, None when nothing in it is tracked or it grew too large."""
    kept: list[Option] = []
    for option in options:
        for i, other in enumerate(kept):
            if other.state == option.state:
                kept[i] = Option(other.state, other.when & option.when)
                break
            if isinstance(other.state, ModelState) and isinstance(option.state, ModelState):
                merged = _merge_states(other.state, option.state)
                if merged is not None:
                    kept[i] = Option(merged, other.when & option.when)
                    break
        else:
            kept.append(option)
    if len(kept) > MAX_OPTIONS or all(o.state is None for o in kept):
        return None
    if len(kept) == 1:
        return kept[0].state
    return Choice(tuple(kept))


def _map_states(value, change):
    """`change` applied to every model state a value may hold (a Choice's options too)."""
    if isinstance(value, ModelState):
        return change(value)
    if isinstance(value, Choice):
        return Choice(tuple(Option(change(o.state) if isinstance(o.state, ModelState) else o.state, o.when)
                            for o in value.options), value.depth)
    return value


def _stamp(value, depth: int):
    """A value that became uncertain here, `depth` ifs deep."""
    if isinstance(value, Choice):
        return replace(value, depth=depth)
    if isinstance(value, TupleState):
        return TupleState(tuple(_stamp(item, depth) for item in value.items))
    return value


def _unknown_dtype(state: ModelState) -> ModelState:
    return ModelState(state.load, None)


def with_adapters(state: ModelState) -> ModelState:
    """A model PEFT injected adapters into: its dtype is no longer one value (float32
    adapters by default); the base's state is kept for `merge_and_unload()`."""
    return ModelState(state.load, None, None, state.base or state)


def with_base_dtype_adapters(state: ModelState) -> ModelState:
    """A model PEFT injected adapters into that take the base layers' dtype (peft 0.7-0.11,
    `autocast_adapter_dtype=False`): every weight keeps the model's dtype."""
    return ModelState(state.load, state.dtype, state.cast_by, state.base or state)


def without_adapters(state: ModelState) -> ModelState:
    """What `merge_and_unload()` / `unload()` return: the base model as it was under the
    adapters, or the load with an unknown dtype when that is not known."""
    return state.base or ModelState(state.load, None)


def _loosen(value):
    """A value leaving its scope (a return, a class attribute seen by other methods): its
    conditions name variables of that scope, so only their last names are compared."""
    if isinstance(value, Choice):
        return Choice(tuple(
            Option(o.state, frozenset(("*." + f[0].rsplit(".", 1)[-1],) + f[1:] for f in o.when))
            for o in value.options))  # depth 0: uncertain from the start of the other scope
    if isinstance(value, TupleState):
        return TupleState(tuple(_loosen(item) for item in value.items))
    return value


def _alike(a, b) -> bool:
    """Loads that no rule can tell apart: same library, placement, quantization."""
    if isinstance(a, ParamLoad) or isinstance(b, ParamLoad):
        return False
    def placement(load):
        return None if load.device_map is None else (load.device_map.kind, load.device_map.offload)
    return (a.library, a.quantized, a.quant_keywords, a.pipeline, a.hidden_kwargs, placement(a), a.path) == (
        b.library, b.quantized, b.quant_keywords, b.pipeline, b.hidden_kwargs, placement(b), b.path)


def instantiate(summary, positional: list, named: dict, foreign: bool):
    """A summary's value at one call: its `ParamLoad`s replaced by the arguments' states.
    `foreign`: the summary comes from another module, whose cast nodes cannot be shown."""
    if summary is None:
        return None
    if isinstance(summary, TupleState):
        return TupleState(tuple(instantiate(item, positional, named, foreign) for item in summary.items))
    if isinstance(summary, Choice):  # a loader whose branches return different loads
        return _choice([
            Option(instantiate(o.state, positional, named, foreign), o.when)
            for o in summary.options
        ])
    if not isinstance(summary, ModelState):
        return None
    load = summary.load
    if isinstance(load, ParamLoad):
        arg = named.get(load.name)
        if arg is None and load.index < len(positional):
            arg = positional[load.index]
        if not isinstance(arg, (ModelState, Choice)):
            return None
        if summary.dtype == PARAM_DTYPE:
            return arg
        if foreign and summary.cast_by is not None:
            return _map_states(arg, _unknown_dtype)
        return _map_states(arg, lambda state: ModelState(state.load, summary.dtype, summary.cast_by))
    if foreign and summary.cast_by is not None:
        return ModelState(load, None, None)
    return summary


def _is_training_call(call: ast.Call, imports: ImportMap) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "backward":
        return True
    name = imports.qualify(func) or ""
    return bool(_TRAINER.search(name)) or name == "deepspeed.initialize"
