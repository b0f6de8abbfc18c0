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
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping

from cfgfix.analysis.keyword_dicts import spread_keywords
from cfgfix.analysis.names import (
    DTYPE_ALIASES,
    ImportMap,
    child_nodes,
    dotted,
    iter_statements,
    single_assignments,
    walk,
    walk_scope,
    walk_statements,
)
from cfgfix.analysis.process_tests import TOKENS as PROCESS_TOKENS
from cfgfix.analysis.process_tests import single_process_side
from cfgfix.core import LazyRegex
from cfgfix.documents.text import line_starts
from cfgfix.records import dataclass, field, replace

# Classes whose `from_pretrained` returns a model (transformers, diffusers, PEFT's Auto*).
_MODEL_CLASS = re.compile(
    r"^(?!Peft)(?:AutoModel\w*|AutoPeftModel\w*|\w+For[A-Z]\w*|\w*Model|UNet\w*|AutoencoderKL\w*|\w+Pipeline)$"
)
_PIPELINE = re.compile(r"Pipeline$")
_LIBRARIES = {"transformers": "transformers", "peft": "transformers", "modelscope": "transformers", "diffusers": "diffusers"}
MULTI_DEVICE_STRATEGIES = {"auto", "balanced", "balanced_low_0", "sequential"}
OFFLOAD_DEVICES = {"cpu", "disk"}

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
}
_RETURNS_SELF = {"train", "eval", "requires_grad_", "apply"}
# Builtins that look at an object without changing it.
_HARMLESS_CALLS = {"print", "len", "isinstance", "type", "id", "str", "repr", "hasattr", "getattr", "vars", "dir"}
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


_LOAD_CALL = re.compile(r"from_pretrained\s*\(")
MAX_ROUNDS = 3  # call-site rounds: main() -> train(model) -> evaluate(model)


def analyze_models(
    tree: ast.Module,
    text: str | None = None,
    imports: ImportMap | None = None,
    project=None,
    path=None,
    functions: FunctionTable | None = None,
) -> ModelAnalysis:
    """Model loads and the casts and moves applied to them, in one module. With `project`
    (an `analysis.project_modules.ProjectModules`) and the module's `path`, functions
    imported from the project's other modules are followed too (`analysis.deps` lists the
    files read)."""
    imports = imports or ImportMap(tree)
    analysis = ModelAnalysis(imports=imports, tree=tree)
    functions = functions or FunctionTable(tree, imports, project, path)
    if functions.text is None:
        functions.text = text
    survey = _Survey(tree, text, functions.loader_names(text))
    heirs = _heirs(tree, functions, survey)
    if not survey.load_scopes and not heirs:
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
    for func, seeds in _functions_outside_classes(tree, module_seeds):
        if func in survey.load_scopes or survey.uses(func, seeded):
            _analyze_function(func, analysis, resolver, seeds)
            done[id(func)] = {}
    # Functions and classes that receive a model from their call sites in this module:
    # `train(model, loader)`, `Trainer(model=model)`. Each round may bind the next callee.
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
            else:
                _analyze_function(node, analysis, resolver, module_seeds, params=params)
    analysis.deps = sorted(functions.deps)
    return analysis


# Calls that wrap a model and return it (or hold it): what each changes. "keep": dtype and
# placement unchanged (DDP, torch.compile); "adapters": PEFT injects adapter weights, which
# it keeps in float32 by default, so the model's dtype is no longer one value; "upcast":
# `prepare_model_for_kbit_training` casts the non-quantized weights to float32.
_FUNCTION_WRAPPERS = {
    "get_peft_model": "adapters",
    "PeftModel.from_pretrained": "adapters",
    "PeftModelForCausalLM.from_pretrained": "adapters",
    "PeftModelForSeq2SeqLM.from_pretrained": "adapters",
    "inject_adapter_in_model": "adapters",
    "prepare_model_for_kbit_training": "upcast",
    "prepare_model_for_int8_training": "upcast",
    "torch.compile": "keep",
    "DistributedDataParallel": "keep",
    "DataParallel": "keep",
    "FullyShardedDataParallel": "keep",
    "DDP": "keep",
    "FSDP": "keep",
}
# Methods of an accelerator (or a Fabric) that return what they are given.
_PREPARE_METHODS = {"prepare", "prepare_model", "unwrap_model", "setup", "setup_module"}
# Methods of a (PEFT) model that return the base model with its placement.
_BASE_MODEL_METHODS = {"merge_and_unload", "get_base_model", "unload"}
PARAM_DTYPE = "<param>"  # a parameter's dtype, untouched by the function


_WRAPPER_LAST = frozenset(k.rsplit(".", 1)[-1] for k in _FUNCTION_WRAPPERS) | {"initialize"}


def wrapper_kind(qualified: str | None) -> str | None:
    """How a call such as `get_peft_model(model, cfg)` or `DDP(model)` treats the model
    it is given (see `_FUNCTION_WRAPPERS`), or None for any other call."""
    if not qualified or qualified.rsplit(".", 1)[-1] not in _WRAPPER_LAST:
        return None
    for suffix, kind in _FUNCTION_WRAPPERS.items():
        if qualified == suffix or qualified.endswith("." + suffix):
            return kind
    if qualified.endswith("deepspeed.initialize"):
        return "keep"
    return None


def _prepares(receiver: str) -> bool:
    """`accelerator.prepare(...)`, `self.accelerator.prepare_model(...)`, `fabric.setup(...)`."""
    last = receiver.rsplit(".", 1)[-1].lower()
    return "accelerator" in last or "fabric" in last


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
        self._summaries: dict[int, object] = {}
        self._tables: dict[str, FunctionTable | None] = {}
        self._tried: set[tuple[str, tuple[bytes, ...] | None]] = set()  # (module key, words) parses tried
        self.deps: set[str] = set()
        self.bindings = CallBindings()
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

    def _imported(self, local: str) -> tuple[FunctionTable, str] | None:
        """(the project module's table, the name in it) for a name imported from the
        project: `from models.build import build_model`, `from .utils import load`."""
        if self.project is None or self.path is None or self.depth >= self.MAX_DEPTH:
            return None
        if local in self.imports.relative:
            level, module, name = self.imports.relative[local]
            table = self._table(module, level)
            if table is None and module == "":
                return None
            return (table, name) if table is not None else None
        qualified = self.imports.aliases.get(local)
        if not qualified or "." not in qualified:
            return None
        module, _, name = qualified.rpartition(".")
        table = self._table(module, 0)
        return (table, name) if table is not None else None

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

    # -- summaries -------------------------------------------------------------------------
    def summary(self, func: ast.AST, cls: ast.ClassDef | None = None):
        """What `func` returns, with its parameters as `ParamLoad`s; None when unknown."""
        key = id(func)
        if key in self._summaries:
            return self._summaries[key]
        self._summaries[key] = None  # recursion: unknown while being computed
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        params = _positional_params(func, method=cls is not None)
        env = {name: ModelState(ParamLoad(i, name), PARAM_DTYPE) for i, name in enumerate(params)}
        resolver = _Resolver(self.imports, _ScopeConsts(self.consts, func.body), self)
        walker = _Walker(ModelAnalysis(self.imports), resolver, {}, cls=cls, skip_inert=True)
        walker.returns = []
        walker.block(func.body, env)
        result = _merge_returns(walker.returns)
        self._summaries[key] = result
        return result

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


# -- branch conditions -------------------------------------------------------------------
def _facts(test: ast.expr) -> tuple[frozenset, frozenset]:
    """What holds in the body and in the `else` of `if test:`, as facts on names:
    truthiness (`if args.q:`, `if not flag:`) and equality with a constant
    (`if t == "qwen":`, `if cfg is None:`); `and`/`or` where each part gives a fact."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yes, no = _facts(test.operand)
        return no, yes
    if isinstance(test, ast.BoolOp):
        parts = [_facts(value) for value in test.values]
        if isinstance(test.op, ast.And):
            return frozenset().union(*(p[0] for p in parts)), frozenset()
        return frozenset(), frozenset().union(*(p[1] for p in parts))
    key = dotted(test)
    if key is not None:
        return frozenset({(key, "truthy", None, True)}), frozenset({(key, "truthy", None, False)})
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(right, ast.Constant) and dotted(left):
            key, value = dotted(left), right.value
        elif isinstance(left, ast.Constant) and dotted(right):
            key, value = dotted(right), left.value
        else:
            return frozenset(), frozenset()
        op = test.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            truth = True
        elif isinstance(op, (ast.NotEq, ast.IsNot)):
            truth = False
        else:
            return frozenset(), frozenset()
        return frozenset({(key, "eq", value, truth)}), frozenset({(key, "eq", value, not truth)})
    return frozenset(), frozenset()


def _same_key(a: str, b: str) -> bool:
    if a == b:
        return True
    return (a.startswith("*.") or b.startswith("*.")) and a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def _if_sides(node: ast.IfExp, depth: int = 0) -> list[tuple[ast.expr, frozenset]]:
    """Each value of `a if t else (b if u else c)` with the facts under which it is taken
    (a nested conditional in either side is split further, a few levels deep)."""
    yes, no = _facts(node.test)
    out = []
    for expr, when in ((node.body, yes), (node.orelse, no)):
        if isinstance(expr, ast.IfExp) and depth < 3:
            out.extend((inner, when | also) for inner, also in _if_sides(expr, depth + 1)
                       if not any(_contradicts(f, g) for f in when for g in also))
        else:
            out.append((expr, when))
    return out


def _contradicts(f: tuple, g: tuple) -> bool:
    """Two facts that cannot both hold (`flag` true and false, `t == "a"` and `t == "b"`)."""
    if not _same_key(f[0], g[0]):
        return False
    if f[1] == g[1] == "truthy":
        return f[3] != g[3]
    if f[1] == g[1] == "eq":
        if f[2] == g[2]:
            return f[3] != g[3]
        return f[3] and g[3]
    truthy, eq = (f, g) if f[1] == "truthy" else (g, f)
    return eq[3] and bool(eq[2]) != truthy[3]


def _assume(env: dict, facts: frozenset, depth: int) -> dict:
    """The env inside a branch (`depth` ifs deep) where `facts` hold: options of a Choice
    that need the opposite are dropped (`if flag: A else: B` ... `if not flag:` sees only
    B); what is left is as certain there as it was outside."""
    env = dict(env)
    if not facts:
        return env
    for key, value in list(env.items()):
        if isinstance(value, Choice):
            kept = [o for o in value.options if not any(_contradicts(f, g) for f in o.when for g in facts)]
            if len(kept) != len(value.options):
                narrowed = _choice(kept) if kept else None
                if narrowed is None:
                    del env[key]
                else:
                    env[key] = _stamp(narrowed, depth)
    return env


def _forget_facts(env: dict, key: str) -> None:
    """`key` was rebound: conditions on it no longer say which option holds."""
    prefix = key if key.endswith(".") else key + "."
    for name, value in list(env.items()):
        if isinstance(value, Choice) and any(f[0] == key or f[0].startswith(prefix) for o in value.options for f in o.when):
            env[name] = Choice(tuple(
                Option(o.state, frozenset(f for f in o.when if not (f[0] == key or f[0].startswith(prefix))))
                for o in value.options), value.depth)


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


_EXITS = {"sys.exit", "exit", "quit", "os._exit"}


def _ends(body: list[ast.stmt], imports: ImportMap) -> bool:
    """The block never falls through to the statement after it (`return`, `raise`,
    `continue`, `break`, `sys.exit()`, or an `if` whose branches all end)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return (imports.qualify(last.value.func) or "") in _EXITS
    if isinstance(last, ast.If):
        return _ends(last.body, imports) and _ends(last.orelse, imports)
    return False


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


def _is_training_call(call: ast.Call, imports: ImportMap) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "backward":
        return True
    name = imports.qualify(func) or ""
    return bool(_TRAINER.search(name)) or name == "deepspeed.initialize"


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


def _analyze_class(cls: ast.ClassDef, analysis, resolver, module_seeds, init_params: dict | None = None,
                   survey: _Survey | None = None) -> None:
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # `self.x` assigned once in the whole class from a load: other methods see that load,
    # with an unknown dtype (another method may have cast it in place).
    assigned: dict[str, list[tuple[ast.AST, ast.expr]]] = {}
    nested: dict[int, list[ast.AST]] = {}  # method -> functions defined inside it
    for method in methods:
        inner = nested[id(method)] = []
        for node in walk_statements(method):  # one walk per method collects both (statements only)
            if node is not method and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner.append(node)
            targets = []
            if isinstance(node, ast.Assign):
                targets = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [(node.target, node.value)]
            for target, value in targets:
                key = dotted(target)
                if key and key.startswith("self.") and key.count(".") == 1:
                    assigned.setdefault(key, []).append((method, value))
    init = next((m for m in methods if m.name == "__init__"), None)
    # What the project's base classes leave in the `self.x` this class never binds.
    inherited = _inherited_states(cls, resolver, set(assigned), {m.name for m in methods}, init)
    # What `__init__` leaves in `self.x`, for attributes no other method rebinds: every other
    # method runs after it (`self.model = self.model.to(dtype)` in `__init__` included).
    after_init: dict[str, ModelState] = {}
    if init is not None:
        start = {**module_seeds, **inherited} if inherited and _calls_super_init(init) else module_seeds
        end = _analyze_function(init, analysis, resolver, start, cls, params=init_params)
        for key, state in end.items():
            if key.startswith("self.") and key.count(".") == 1 and isinstance(state, (ModelState, Choice)) \
                    and all(method is init for method, _ in assigned.get(key, [])):
                after_init[key] = _loosen(state)
        if start is not module_seeds:  # what this `__init__` did to them after `super().__init__()`
            inherited = {key: after_init.pop(key) for key in inherited if key in after_init}
    # Each attribute's values are evaluated once for the whole class, not once per method.
    attribute_states = {
        key: (_class_attribute_state(analysis, resolver, cls, key, [value for _, value in places])
              if all(value is not None for _, value in places) and _may_hold_load(places) else None)
        for key, places in assigned.items()
    }
    table = resolver.functions
    local_names = set(table.defs) | set(table.classes) if table is not None else set()
    for method in methods:
        if method is init:
            for node in nested[id(method)]:  # nested functions inside __init__
                _analyze_function(node, analysis, resolver, dict(module_seeds), cls)
            continue
        seeds = {**module_seeds, **inherited}
        for key, state in attribute_states.items():
            if key in after_init:
                seeds[key] = after_init[key]
            elif state is not None and all(place is not method for place, _ in assigned[key]):
                # Assigned only in other methods (`model_init()` loads it, one branch per
                # family): if every assignment is a load no rule can tell apart, this method
                # sees that load, with an unknown dtype (another method may have cast it).
                seeds[key] = state
        if survey is not None and not survey.may_hold_model(method, module_seeds, seeds, local_names):
            continue  # nothing it could record: no load, tracked value or call site of this module
        _analyze_function(method, analysis, resolver, seeds, cls)
        for node in nested[id(method)]:  # nested functions inside methods
            _analyze_function(node, analysis, resolver, seeds, cls)


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


def _inherited_states(cls: ast.ClassDef, resolver, own: set[str], overridden: set[str], init) -> dict:
    """What `self.x` holds, for each attribute that the project's base classes of `cls`
    bind and `cls` never does but casts or moves (`_moved_attributes`): what a base's
    `__init__` leaves there when it runs (`cls`
    has no `__init__`, or calls `super().__init__()`), else the loads every base assignment
    makes, with an unknown dtype (as for a class's own attributes). A base method that
    `cls` (or a nearer base) overrides is not the one that runs: an attribute whose
    assignments call one is left unknown, and a base `__init__` that calls one is not used."""
    table = resolver.functions
    if table is None or not cls.bases:
        return {}
    moved = _moved_attributes(table, cls)
    if moved is not None and not moved:
        return {}  # nothing a base's load could tell about this class's casts and moves
    bases = _project_bases(cls, table, moved)
    if not bases:
        return {}
    states: dict = {}
    seen = set(own)  # a nearer class's binding hides the farther ones
    overridden = set(overridden)
    runs_init = init is None or _calls_super_init(init)
    for base_table, base in bases:
        methods = [n for n in base.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        base_init = next((m for m in methods if m.name == "__init__"), None)
        live = [m for m in methods if m.name not in overridden or m is base_init and runs_init]
        assigned: dict[str, list] = {}
        for method in live:
            for node in walk_statements(method):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else ()
                for target in targets:
                    key = dotted(target)
                    if key and key.startswith("self.") and key.count(".") == 1:
                        assigned.setdefault(key, []).append((method, node.value))
        fresh = [key for key in assigned if key not in seen and (moved is None or key[5:] in moved)]
        seen.update(assigned)
        if fresh:
            local = resolver if base_table is table else _Resolver(base_table.imports, base_table.consts, base_table)
            scratch = ModelAnalysis(imports=base_table.imports)  # findings belong to the base's own module
            after: dict = {}
            if runs_init and base_init is not None and base_init in live and not _calls_any(base_init, overridden):
                end = _analyze_function(base_init, scratch, local, {}, base)
                after = {key: _loosen(state) for key, state in end.items()
                         if key in assigned and isinstance(state, (ModelState, Choice))
                         and all(method is base_init for method, _ in assigned[key])}
            for key in fresh:
                places = assigned[key]
                if key in after:
                    states[key] = after[key]
                elif all(value is not None for _, value in places) and _may_hold_load(places) \
                        and not any(_calls_any(value, overridden) for _, value in places):
                    state = _class_attribute_state(scratch, local, base, key, [value for _, value in places])
                    if state is not None:
                        states[key] = state
        overridden.update(m.name for m in methods)
        runs_init = runs_init and (base_init is None or _calls_super_init(base_init))
    return states


def _calls_any(node: ast.AST, methods: set[str]) -> bool:
    """`self.name(...)` for a name in `methods` anywhere in `node`."""
    return bool(methods) and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in methods
        and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" for n in ast.walk(node))


def _seeds_from(body: list[ast.stmt], resolver, prefix: str) -> dict[str, ModelState]:
    """Module-level names bound exactly once to a load, as functions see them."""
    seeds = {}
    for name, value in single_assignments(body).items():
        state = _Walker(ModelAnalysis(resolver.imports), resolver, {}).expr(value, {})
        if isinstance(state, ModelState) and not isinstance(state.load, ParamLoad):
            seeds[prefix + name] = ModelState(state.load, dtype=None)
    return seeds


def _may_hold_load(places) -> bool:
    """Cheap test before any evaluation: every value is a call or a name (a load, a loader's
    result, a wrapper, a parameter), not a literal, a comprehension or arithmetic."""
    return all(isinstance(value, (ast.Call, ast.Name, ast.Attribute)) for _, value in places)


def _class_attribute_state(analysis, resolver, cls, key: str, values):
    """What `self.x` may hold in a method that does not assign it: the values of every
    assignment in the class (a `Choice` when they are different loads), dtype unknown.
    Assignments that rewrap the attribute itself (`self.model = get_peft_model(self.model,
    cfg)`, `self.model = self.model.eval()`) are evaluated on what the others hold."""
    def evaluate(value, env):
        state = _Walker(ModelAnalysis(analysis.imports), resolver, {}, cls=cls).expr(value, env)
        if isinstance(state, Choice) and all(isinstance(s, ModelState) for s in state.states) and state.states:
            return _loosen(_map_states(state, _unknown_dtype))
        if not isinstance(state, ModelState):
            return None
        return ModelState(state.load, None)

    own = [v for v in values if any(isinstance(n, ast.Attribute) and dotted(n) == key for n in ast.walk(v))]
    merged = None
    for value in [v for v in values if not any(v is o for o in own)] or ():
        state = evaluate(value, {})
        if state is None or any(isinstance(s.load, ParamLoad) for s in _states_of(state)):
            return None
        merged = state if merged is None else _merge_values(merged, state)
        if merged is None:
            return None
    if merged is None:
        return None
    base = merged
    for value in own:
        state = evaluate(value, {key: base})
        if state is None:
            return None
        merged = _merge_values(merged, state)
        if merged is None:
            return None
    return merged


def _states_of(value) -> list:
    return value.states if isinstance(value, Choice) else [value] if isinstance(value, ModelState) else []


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


class _ScopeConsts(Mapping):
    """`{**outer, **single_assignments(body)}`, computed on first use: most functions a class
    analysis walks never resolve a dtype or device argument (they hold no model), and the
    scope's assignments were a third of the model analysis of a large trainer class."""

    def __init__(self, outer, body: list[ast.stmt]) -> None:
        self._outer, self._body, self._merged = outer, body, None

    def _all(self) -> dict:
        if self._merged is None:
            self._merged = {**self._outer, **single_assignments(self._body)}
        return self._merged

    def __getitem__(self, key):
        return self._all()[key]

    def __contains__(self, key) -> bool:
        return key in self._all()

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class _Resolver:
    """Resolves dtype, device and quantization arguments, through names bound once."""

    def __init__(self, imports: ImportMap, consts: dict[str, ast.expr], functions: FunctionTable | None = None) -> None:
        self.imports = imports
        self.consts = consts
        self.functions = functions

    def default_dtype_changed(self) -> bool:
        return self.functions is not None and self.functions.default_dtype_changed

    def deref(self, node: ast.expr, depth: int = 0) -> ast.expr:
        while isinstance(node, ast.Name) and node.id in self.consts and depth < 5:
            node, depth = self.consts[node.id], depth + 1
        return node

    def dtype(self, node: ast.expr) -> str | None:
        """Canonical dtype, "auto", or None when the expression is not a known dtype."""
        node = self.deref(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value.removeprefix("torch.")
            return "auto" if value == "auto" else DTYPE_ALIASES.get(value)
        name = self.imports.qualify(node)
        if name and name.startswith("torch.") and name.count(".") == 1:
            return DTYPE_ALIASES.get(name.split(".")[1])
        return None

    def is_device(self, node: ast.expr) -> bool:
        name = dotted(node)
        if name and "device" in name.split(".")[-1].lower():
            return True  # `device`, `self.device`, `args.device`, whatever it was bound to
        if name and _RANK_NAME.fullmatch(name.split(".")[-1].lower()):
            return True  # `.to(rank)` in an `mp.spawn` worker, `.to(args.local_rank)`: a GPU index
        if isinstance(node, ast.Call) and self.imports.qualify(node.func) in ("int", "torch.cuda.current_device"):
            return True  # `.to(int(os.environ["LOCAL_RANK"]))`: an index, never a dtype
        node = self.deref(node)
        if isinstance(node, ast.IfExp):  # the GPU idiom: "cuda" if torch.cuda.is_available() else "cpu"
            return self.is_device(node.body) or self.is_device(node.orelse)
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and not isinstance(node.value, bool) or (
                isinstance(node.value, str) and self.dtype(node) is None
            )
        if isinstance(node, ast.JoinedStr):
            return True  # f"cuda:{rank}"
        if isinstance(node, ast.Call):
            return self.imports.qualify(node.func) == "torch.device"
        name = dotted(node)
        return bool(name) and "device" in name.split(".")[-1].lower()

    def device_map(self, node: ast.expr, offload_kwargs: bool) -> DeviceMap:
        value = self.deref(node)
        if isinstance(value, ast.Constant):
            if isinstance(value.value, str) and value.value in MULTI_DEVICE_STRATEGIES:
                return DeviceMap("multi", offload_kwargs, node)
            if isinstance(value.value, (str, int)) and not isinstance(value.value, bool):
                return DeviceMap("single", False, node)
        if isinstance(value, ast.Call) and self.imports.qualify(value.func) == "torch.device":
            return DeviceMap("single", False, node)
        if isinstance(value, ast.Dict) and None not in value.keys:
            if len(value.keys) == 1:
                return DeviceMap("single", False, node)
            places = [v.value for v in value.values if isinstance(v, ast.Constant)]
            if len(places) == len(value.values):
                offload = any(p in OFFLOAD_DEVICES for p in places)
                kind = "multi" if len(set(places)) > 1 else "single"
                return DeviceMap(kind, offload and kind == "multi", node)
        return DeviceMap("unknown", False, node)

    def plain_quant_keyword(self, name: str, value: ast.expr) -> bool:
        """True when a quantization keyword says "not quantized" through a literal, or a
        name bound once to one: `load_in_8bit=False` (or `None`), `quantization_config=None`.
        transformers reads those as no quantization; a value cfgfix cannot resolve
        (`load_in_8bit=args.int8`) is not plain."""
        value = self.deref(value)
        if not isinstance(value, ast.Constant):
            return False
        return value.value is None or (name != "quantization_config" and value.value is False)

    def quant_keywords(self, keywords: dict[str, ast.expr]) -> list[str]:
        """The quantization keywords a load passes that may quantize it (not plain ones)."""
        return [k for k in ("load_in_4bit", "load_in_8bit", "quantization_config")
                if k in keywords and not self.plain_quant_keyword(k, keywords[k])]

    def quantization(self, keywords: dict[str, ast.expr]) -> str | None:
        for bits in ("4bit", "8bit"):
            value = keywords.get(f"load_in_{bits}")
            if isinstance(value, ast.Constant) and value.value is True:
                return bits
        config = keywords.get("quantization_config")
        if config is None:
            return None
        config = self.deref(config)
        if isinstance(config, ast.Call) and (self.imports.qualify(config.func) or "").endswith("Config"):
            kw = {k.arg: k.value for k in config.keywords if k.arg}
            for bits in ("4bit", "8bit"):
                value = kw.get(f"load_in_{bits}")
                if isinstance(value, ast.Constant) and value.value is True:
                    return bits
            return "config"
        return None  # a variable that may hold None: unsure, stay silent

    def load_variants(self, call: ast.Call, load: ModelLoad) -> list[tuple[ModelLoad, frozenset]]:
        """The loads a call makes under a condition it is given, each with its facts:
        `load_in_8bit=flag` (8-bit when `flag`, plain when not), `quantization_config=bnb
        if args.q else None`, `device_map="auto" if multi_gpu else None`. Keywords on the
        same condition combine (`load_in_8bit=q, device_map="auto" if q else None`). An
        empty list when nothing is conditional."""
        if load.hidden_kwargs or load.pipeline:
            return []
        keywords = {k.arg: k.value for k in self.call_keywords(call) if k.arg}
        quant = self.quant_keywords(keywords)
        axes: list[list[tuple[dict, frozenset]]] = []
        if len(quant) == 1 and load.quantized is None:
            name = quant[0]
            value = self.deref(keywords[name])
            plain = {"quantized": None, "quant_keywords": False}
            if name != "quantization_config" and not isinstance(value, ast.Constant):
                yes, no = _facts(value)
                if yes or no:
                    axes.append([({"quantized": name[-4:]}, yes), (plain, no)])
            elif isinstance(value, ast.IfExp):
                yes, no = _facts(value.test)
                sides = []
                for expr, when in ((value.body, yes), (value.orelse, no)):
                    if isinstance(expr, ast.Constant) and expr.value is None:
                        sides.append((plain, when))
                    elif (bits := self.quantization({name: expr})) is not None:
                        sides.append(({"quantized": bits}, when))
                    elif expr is value.body and dotted(expr) is not None and dotted(expr) == dotted(value.test):
                        # `cfg if cfg else None`: where the test holds, a config is passed
                        sides.append(({"quantized": "config"}, when))
                if len(sides) == 2:
                    axes.append(sides)
        device_map = self.deref(keywords["device_map"]) if "device_map" in keywords else None
        if isinstance(device_map, ast.IfExp):
            offload = load.device_map.offload if load.device_map is not None else False
            axes.append([
                ({"device_map": None if isinstance(expr, ast.Constant) and expr.value is None
                  else self.device_map(expr, offload)}, when)
                for expr, when in _if_sides(device_map)
            ])
        if not axes:
            return []
        variants: list[tuple[dict, frozenset]] = [({}, frozenset())]
        for axis in axes:
            variants = [
                ({**changes, **more}, when | also)
                for changes, when in variants for more, also in axis
                if not any(_contradicts(f, g) for f in when for g in also)
            ]
        return [(replace(load, **changes), when) for changes, when in variants]

    def call_keywords(self, call: ast.Call) -> list[ast.keyword]:
        """The call's keywords, with each `**name` of a keyword dict the scope builds and
        fills (`kw = dict(...)`; `kw["device_map"] = "auto"`) replaced by what it holds at
        the call (analysis/keyword_dicts.py); a `**` that cannot be followed stays."""
        if all(k.arg is not None for k in call.keywords):
            return call.keywords
        # the parsed part of a module in parts: the scope of a call is the function around it
        tree = self.functions._tree if self.functions is not None else None
        out: list[ast.keyword] = []
        for keyword in call.keywords:
            spread = None
            if keyword.arg is None and isinstance(keyword.value, ast.Name) and tree is not None:
                spread = spread_keywords(tree, keyword.value.id, call)
            if spread is None:
                out.append(keyword)
            else:
                out.extend(k for k in spread if all(k.arg != w.arg for w in call.keywords))
        return out

    def load(self, call: ast.Call) -> ModelLoad | None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "from_pretrained"):
            return None
        owner = self.imports.qualify(func.value)
        class_name = owner.split(".")[-1] if owner else ""
        if not _MODEL_CLASS.match(class_name):
            return None
        call_keywords = self.call_keywords(call)
        keywords = {k.arg: k.value for k in call_keywords if k.arg}
        hidden = any(k.arg is None for k in call_keywords)
        pipeline = bool(_PIPELINE.search(class_name))
        dtype_kw = next((k for k in call_keywords if k.arg in ("dtype", "torch_dtype")), None)
        if dtype_kw is not None:
            dtype = self.dtype(dtype_kw.value) or "?"
        else:
            dtype = "?" if hidden else None
        if pipeline:  # a pipeline mixes components (a fp32 VAE passed in): its dtype is not one value
            dtype = "?"
        device_map = None
        if "device_map" in keywords:
            offload = any(k in keywords for k in ("max_memory", "offload_folder", "offload_state_dict"))
            device_map = self.device_map(keywords["device_map"], offload)
        elif hidden:
            device_map = DeviceMap("unknown", False, call)
        quantized = None if pipeline else self.quantization(keywords)
        quant_keywords = bool(self.quant_keywords(keywords))  # `load_in_8bit=False` does not quantize
        library = _LIBRARIES.get(owner.split(".")[0]) if owner and "." in owner else None
        if library is None and self.functions is not None:
            library = self.functions.class_library(func.value)  # the project's own model class
        origin = self.functions.origin if self.functions is not None else None
        remote = keywords.get("trust_remote_code")
        return ModelLoad(
            call, class_name, dtype, dtype_kw, device_map, quantized, hidden, pipeline,
            library, quant_keywords,
            origin.display if origin is not None else None, origin.source_text() if origin is not None else None,
            remote_code=remote is not None and not (isinstance(remote, ast.Constant) and not remote.value)
            and not _native_model_id(call),
        )


# Hub ids of families transformers implements itself: their checkpoints carry no `auto_map`,
# so `trust_remote_code=True` changes nothing and transformers' own loading rules hold.
_NATIVE_FAMILY = LazyRegex(
    r"(?i)(?:^|/)(?:qwen(?:1\.5|2|2\.5|3)|(?:meta-)?llama|mistral|mixtral|gemma|gpt2|t5|flan-t5|bert|roberta|opt-|bloom)")


def _native_model_id(call: ast.Call) -> bool:
    first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "pretrained_model_name_or_path"), None)
    return isinstance(first, ast.Constant) and isinstance(first.value, str) and bool(_NATIVE_FAMILY.search(first.value))


# Statements with no statement inside: the walker's gate (`_Walker._inert`) may skip them.
_SIMPLE_STATEMENTS = frozenset({
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Delete, ast.Pass, ast.Raise, ast.Assert,
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Break, ast.Continue,
})
_WORD = re.compile(r"\w+")


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
        text = self.resolver.functions.text_of(stmt)
        if text is None:
            return False
        mentioned = set(_WORD.findall(text))
        if not words.isdisjoint(mentioned):
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
            self.path, self.single_process = saved | yes, saved_single or single[0]
            body = self.block(stmt.body, _assume(env, yes, self.depth))
            self.path, self.single_process = saved | no, saved_single or single[1]
            orelse = self.block(stmt.orelse, _assume(env, no, self.depth))
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
            after = self.block(stmt.body, dict(loop_env))
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
            # and the load it replaces are both possible. A handler starts from `safe`.
            bound = _bound_in(stmt) if env else ()
            safe = {k: v for k, v in env.items() if k not in bound}
            imports = self.resolver.imports
            paths = []
            completed = self.block(stmt.body, dict(safe))
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
            if variants:  # `load_in_8bit=flag`, `device_map="auto" if multi else None`
                return _stamp(_choice([Option(ModelState(variant, dtype), when) for variant, when in variants]),
                              self.depth)
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
                    return _map_states(receiver, _unknown_dtype)
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
                    return ModelState(receiver.load, None)
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
        kind = wrapper_kind(name)
        if kind is not None:
            return self.wrap(call, env, kind, name)
        if isinstance(func, ast.Name) and self.resolver.functions is not None:
            return self.local_call(call, env)
        self.args(call, env, escape=name not in _HARMLESS_CALLS)
        return None

    def wrap(self, call: ast.Call, env: dict, kind: str, name: str):
        """A wrapper keeps the model it is given: the same load, with what the wrapper
        changes (PEFT's float32 adapters make the dtype unknown)."""
        positional, named = self.args(call, env, escape=False)
        model_arg = named["model"] if "model" in named else (positional[0] if positional else None)
        node = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        if not isinstance(model_arg, (ModelState, Choice)):
            self.escape(call, env)
            return None
        state = model_arg if kind == "keep" else _map_states(model_arg, _unknown_dtype)
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
                self.escape(call, env, method)
            elif isinstance(func, ast.Attribute) and (dotted(func.value) == "self" or func.attr != "__init__" and (
                    isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super")):
                _forget(env, "self.")  # an inherited method we cannot see (`self.reload()`, `super().reload()`)
                self.escape(call, env)
            elif (self.resolver.imports.qualify(func) or "") not in _HARMLESS_CALLS:
                self.escape(call, env)
            return None
        owner, node, is_method = found
        if owner is table and not is_method:
            self._record(table, node, positional, named)
        keep = _read_only_arguments(call, node) if not is_method else frozenset()
        self.escape(call, env, node if is_method else None, keep=keep)
        if isinstance(node, ast.ClassDef):
            return None
        summary = owner.summary(node, self.cls if is_method else None)
        return _stamp(instantiate(summary, positional, named, foreign=owner is not table), self.depth)

    @staticmethod
    def _record(table, node, positional: list, named: dict) -> None:
        target = _method(node, "__init__") if isinstance(node, ast.ClassDef) else node
        if target is not None:
            params = _positional_params(target, method=isinstance(node, ast.ClassDef))
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
        if not record:
            pass
        elif alternatives:
            if not any(c.call is call and c.state.load == state.load for c in self.analysis.possible_calls):
                self.analysis.possible_calls.append(ModelCall(
                    call, method, key, state, self.stmt, self.sole, target, unknown, moves, dtype_arg, alternatives))
        elif not any(c.call is call for c in self.analysis.calls):  # a scope seen twice
            self.analysis.calls.append(
                ModelCall(call, method, key, state, self.stmt, self.sole, target, unknown, moves, dtype_arg)
            )
        if target is not None:
            new = replace(state, dtype=target, cast_by=call)
        elif unknown:
            new = replace(state, dtype=None, cast_by=call)
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


# Names that hold a GPU index (a process's rank, `mp.spawn`'s first argument), never a dtype.
_RANK_NAME = LazyRegex(r"(local_|global_)?rank(_id)?|gpu(_id|_index|_idx)?|local_gpu|device_idx|cuda_id")


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


def _forget(env: dict, key: str) -> None:
    """Drop `key` and everything under it (`self.` drops every attribute of self), and
    the branch conditions that name them."""
    prefix = key if key.endswith(".") else key + "."
    for name in [k for k in env if k == key or k.startswith(prefix)]:
        del env[name]
    _forget_facts(env, key)


def _merge(a: dict, b: dict) -> dict:
    """What both paths bind: the same state, the same load whose dtype differs by path
    (`if args.bf16: model = model.to(torch.bfloat16)` keeps the `device_map` placement
    either way; the dtype becomes unknown), or a `Choice` of their values."""
    merged = {}
    for key, value in a.items():
        if key in b:
            joined = _merge_values(value, b[key])
            if joined is not None:
                merged[key] = joined
    return merged


def _restamp(env: dict, before: dict, depth: int) -> dict:
    """Choices an `if` made or changed became uncertain at the `if` itself."""
    for key, value in env.items():
        if isinstance(value, (Choice, TupleState)) and before.get(key) is not value:
            env[key] = _stamp(value, depth)
    return env


def _join(a: dict, b: dict, when_a: frozenset, when_b: frozenset) -> dict:
    """After `if`/`else`: every name either branch holds. A name only one branch binds
    becomes a Choice with an untracked option (what it held before, or another object):
    a branch that binds a dispatched model still reaches what follows."""
    merged = {}
    for key in [*a, *(k for k in b if k not in a)]:
        joined = _merge_values(a.get(key), b.get(key), when_a, when_b)
        if joined is not None:
            merged[key] = joined
    return merged


def _bound_in(stmt: ast.stmt) -> set[str]:
    """Names and self attributes that a compound statement may rebind anywhere inside it."""
    names: set[str] = set()
    for node in walk(stmt):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            key = dotted(node)
            if key:
                names.add(key)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            key = dotted(node.func.value)  # an in-place cast inside a loop changes the dtype
            if key and node.func.attr in MOVE_METHODS | {"apply"}:
                names.add(key)
    return names
