"""What a name holds at a statement: models loaded by `from_pretrained`, and the casts and
moves applied to them.

One forward pass over each function body and the module body tracks names and `self.x`
attributes bound to a `from_pretrained` load, with the dtype the weights have at each point.
Rules (CFX101-CFX105) query the result instead of walking the tree again.

Precision over recall: whenever the flow is unclear (branches that disagree, a loop that
rebinds the name, the model handed to a function we do not know, a `**kwargs` load) the
name is dropped or its dtype becomes unknown, and rules stay silent.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace

from cfgfix.analysis.names import DTYPE_ALIASES, ImportMap, dotted, iter_statements, single_assignments

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
    "enable_xformers_memory_efficient_attention", "set_attention_slice",
}
_RETURNS_SELF = {"train", "eval", "requires_grad_"}
# Builtins that look at an object without changing it.
_HARMLESS_CALLS = {"print", "len", "isinstance", "type", "id", "str", "repr", "hasattr", "getattr", "vars", "dir"}
_TRAINER = re.compile(r"(^|\.)\w*Trainer$")


@dataclass(frozen=True)
class DeviceMap:
    kind: str  # "multi" (can span devices: hooks), "single", or "unknown"
    offload: bool  # some modules may live on the CPU or disk
    node: ast.expr


@dataclass(frozen=True)
class ModelLoad:
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

    @property
    def line(self) -> int:
        return self.call.lineno


@dataclass(frozen=True)
class ModelState:
    load: ModelLoad
    dtype: str | None  # canonical dtype now, "default" (the version's default), None unknown
    cast_by: ast.Call | None = None  # the cast that set `dtype`; None: the load did


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

    @property
    def receiver(self) -> ast.expr:
        return self.call.func.value  # type: ignore[attr-defined]


@dataclass
class ModelAnalysis:
    imports: ImportMap
    tree: ast.Module | None = None
    loads: list[ModelLoad] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)

    @property
    def trains(self) -> bool:
        """The module calls `backward()`, builds a `*Trainer` or calls `deepspeed.initialize`
        (a full walk, so only rules that need it ask)."""
        if self.tree is None:
            return False
        return any(isinstance(n, ast.Call) and _is_training_call(n, self.imports) for n in ast.walk(self.tree))


_LOAD_CALL = re.compile(r"from_pretrained\s*\(")


def analyze_models(tree: ast.Module, text: str | None = None, imports: ImportMap | None = None) -> ModelAnalysis:
    imports = imports or ImportMap(tree)
    analysis = ModelAnalysis(imports=imports, tree=tree)
    survey = _Survey(tree, text)
    if not survey.load_scopes:
        return analysis  # most files: `from_pretrained` only in docstrings or for tokenizers
    module_consts = single_assignments(tree.body)
    resolver = _Resolver(imports, module_consts)
    _Walker(analysis, resolver, {}).block(tree.body, {})
    module_seeds = _seeds_from(tree.body, resolver, prefix="") if tree in survey.load_scopes else {}
    seeded = {key.split(".")[0] for key in module_seeds}
    classes = survey.classes
    if seeded:  # a module-level model may be used in any class
        classes = [n for n in iter_statements(tree.body) if isinstance(n, ast.ClassDef)]
    for node in classes:
        if node in survey.load_scopes or survey.uses(node, seeded):
            _analyze_class(node, analysis, resolver, module_seeds)
    for func, seeds in _functions_outside_classes(tree, module_seeds):
        if func in survey.load_scopes or survey.uses(func, seeded):
            _analyze_function(func, analysis, resolver, seeds)
    return analysis


class _Survey:
    """Which scopes (the module, classes, functions) may hold a model load, found from
    statement line ranges alone: walking statements is cheap, walking every expression of
    a 5,000-line modeling file is not. Scopes with no load and no mention of a
    module-level model are not analysed at all."""

    def __init__(self, tree: ast.Module, text: str | None) -> None:
        self.load_scopes: set[ast.AST] = set()
        self.classes: list[ast.ClassDef] = []
        if text is None:
            text = ast.unparse(tree)  # tests that pass only a tree
        lines = sorted({text.count("\n", 0, m.start()) + 1 for m in _LOAD_CALL.finditer(text)})
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

    def uses(self, scope: ast.AST, names: set[str]) -> bool:
        """Whether a scope mentions one of `names` (walked only when asked)."""
        if not names:
            return False
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(scope))


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


def _analyze_class(cls: ast.ClassDef, analysis, resolver, module_seeds) -> None:
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # `self.x` assigned once in the whole class from a load: other methods see that load,
    # with an unknown dtype (another method may have cast it in place).
    assigned: dict[str, list[tuple[ast.AST, ast.expr]]] = {}
    nested: dict[ast.AST, list[ast.AST]] = {}  # method -> functions defined inside it
    for method in methods:
        inner = nested[method] = []
        for node in ast.walk(method):  # one walk per method collects both
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
    # Each `self.x` bound once is evaluated once (not once per method that may see it): the
    # evaluation depends only on the value and the class's resolver.
    loaded: list[tuple[str, ast.AST, ModelState]] = []
    for key, places in assigned.items():
        if len(places) == 1 and places[0][1] is not None:
            state = _Walker(ModelAnalysis(analysis.imports), resolver, {}).expr(places[0][1], {})
            if state is not None:
                loaded.append((key, places[0][0], ModelState(state.load, dtype=None)))
    for method in methods:
        seeds = dict(module_seeds)
        for key, where, state in loaded:
            if where is not method:
                seeds[key] = state
        _analyze_function(method, analysis, resolver, seeds)
        for node in nested[method]:
            _analyze_function(node, analysis, resolver, seeds)


def _seeds_from(body: list[ast.stmt], resolver, prefix: str) -> dict[str, ModelState]:
    """Module-level names bound exactly once to a load, as functions see them."""
    seeds = {}
    for name, value in single_assignments(body).items():
        state = _Walker(ModelAnalysis(resolver.imports), resolver, {}).expr(value, {})
        if state is not None:
            seeds[prefix + name] = ModelState(state.load, dtype=None)
    return seeds


def _analyze_function(func, analysis, resolver, seeds) -> None:
    local = _Resolver(resolver.imports, {**resolver.consts, **single_assignments(func.body)})
    params = {a.arg for a in func.args.args + func.args.kwonlyargs + func.args.posonlyargs}
    env = {k: v for k, v in seeds.items() if k.split(".")[0] not in params or k.startswith("self.")}
    _Walker(analysis, local, {}).block(func.body, env)


class _Resolver:
    """Resolves dtype, device and quantization arguments, through names bound once."""

    def __init__(self, imports: ImportMap, consts: dict[str, ast.expr]) -> None:
        self.imports = imports
        self.consts = consts

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
        node = self.deref(node)
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

    def load(self, call: ast.Call) -> ModelLoad | None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "from_pretrained"):
            return None
        owner = self.imports.qualify(func.value)
        class_name = owner.split(".")[-1] if owner else ""
        if not _MODEL_CLASS.match(class_name):
            return None
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        hidden = any(k.arg is None for k in call.keywords)
        pipeline = bool(_PIPELINE.search(class_name))
        dtype_kw = next((k for k in call.keywords if k.arg in ("dtype", "torch_dtype")), None)
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
        quant_keywords = any(k in keywords for k in ("load_in_4bit", "load_in_8bit", "quantization_config"))
        return ModelLoad(
            call, class_name, dtype, dtype_kw, device_map, quantized, hidden, pipeline,
            _LIBRARIES.get(owner.split(".")[0]) if owner and "." in owner else None, quant_keywords,
        )


class _Walker:
    """One forward pass over a statement list, updating `env` (key -> ModelState)."""

    def __init__(self, analysis: ModelAnalysis, resolver: _Resolver, _unused) -> None:
        self.analysis = analysis
        self.resolver = resolver
        self.stmt: ast.stmt | None = None
        self.sole = False

    # -- statements ----------------------------------------------------------------------
    def block(self, body: list[ast.stmt], env: dict) -> dict:
        for stmt in body:
            self.stmt, self.sole = stmt, len(body) == 1
            env = self.statement(stmt, env)
        return env

    def statement(self, stmt: ast.stmt, env: dict) -> dict:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return env  # analysed as scopes of their own
        if isinstance(stmt, ast.Assign):
            state = self.expr(stmt.value, env)
            for target in stmt.targets:
                self.bind(target, state, env)
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
            return _merge(self.block(stmt.body, dict(env)), self.block(stmt.orelse, dict(env)))
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            if isinstance(stmt, ast.While):
                self.expr(stmt.test, env)
            else:
                self.expr(stmt.iter, env)
            # A later iteration may see what the body rebinds: forget those names first.
            loop_env = {k: v for k, v in env.items() if k not in _bound_in(stmt)}
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
            bound = _bound_in(stmt)
            safe = {k: v for k, v in env.items() if k not in bound}
            self.block(stmt.body, dict(safe))
            for handler in stmt.handlers:
                self.block(handler.body, dict(safe))
            self.block(stmt.orelse, dict(safe))
            return self.block(stmt.finalbody, dict(safe))
        if isinstance(stmt, ast.Match):
            self.expr(stmt.subject, env)
            bound = _bound_in(stmt)
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
        for child in ast.iter_child_nodes(stmt):  # Expr, Return, Raise, Assert, ...
            if isinstance(child, ast.expr):
                self.expr(child, env)
        return env

    def bind(self, target: ast.AST, state: ModelState | None, env: dict) -> None:
        key = dotted(target)
        if key is not None and (key.count(".") == 0 or (key.startswith("self.") and key.count(".") == 1)):
            _forget(env, key)
            if state is not None:
                env[key] = state
            return
        for node in ast.walk(target):  # tuples, subscripts, other attributes
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
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # The comprehension's targets shadow outer names (`[m.to(d) for m in models]`).
            targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            inner = {k: v for k, v in env.items() if k.split(".")[0] not in targets}
            before = dict(inner)
            for child in ast.iter_child_nodes(node):
                self.expr(child, inner)
            for key, state in before.items():  # what the comprehension changed is unclear after it
                if inner.get(key) is not state:
                    env.pop(key, None)
            return None
        if isinstance(node, ast.NamedExpr):
            state = self.expr(node.value, env)
            self.bind(node.target, state, env)
            return state
        for child in ast.iter_child_nodes(node):
            self.expr(child, env)
        return None

    def call(self, call: ast.Call, env: dict) -> ModelState | None:
        func = call.func
        load = self.resolver.load(call)
        if load is not None:
            self.args(call, env)
            if not any(known.call is call for known in self.analysis.loads):
                self.analysis.loads.append(load)
            return ModelState(load, load.dtype if load.dtype in DTYPE_ALIASES.values() else ("default" if load.dtype is None else None))
        if isinstance(func, ast.Attribute):
            receiver = self.expr(func.value, env)
            key = dotted(func.value)
            if receiver is not None:
                if func.attr in MOVE_METHODS:
                    self.args(call, env)
                    return self.move(call, func.attr, key if key in env else None, receiver, env)
                if func.attr in _KEEPING_METHODS:
                    self.args(call, env)
                    return receiver if func.attr in _RETURNS_SELF else None
                if key is not None:
                    _forget(env, key)  # an unknown method may cast or replace it
            elif key is not None and key.startswith("self.") and key.count(".") == 1:
                _forget(env, "self.")  # self.helper() may rebind any self.x
        else:
            self.expr(func, env)
        name = self.resolver.imports.qualify(func) or ""
        self.args(call, env, escape=name not in _HARMLESS_CALLS)
        return None

    def args(self, call: ast.Call, env: dict, escape: bool = True) -> None:
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            value = arg.value if isinstance(arg, ast.Starred) else arg
            key = dotted(value)
            if escape and key is not None:
                if key == "self":
                    _forget(env, "self.")
                elif key in env:
                    _forget(env, key)  # handed to code we cannot see: it may cast or wrap it
                    continue
            self.expr(value, env)

    def move(self, call, method, key, state: ModelState, env) -> ModelState:
        target, unknown, moves, dtype_arg = self.classify(call, method)
        if not any(c.call is call for c in self.analysis.calls):  # a scope seen twice
            self.analysis.calls.append(
                ModelCall(call, method, key, state, self.stmt, self.sole, target, unknown, moves, dtype_arg)
            )
        if target is not None:
            new = replace(state, dtype=target, cast_by=call)
        elif unknown:
            new = replace(state, dtype=None, cast_by=call)
        else:
            new = state
        if key is not None:  # Module.to() works in place: the name sees the new dtype too
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


def _forget(env: dict, key: str) -> None:
    """Drop `key` and everything under it (`self.` drops every attribute of self)."""
    prefix = key if key.endswith(".") else key + "."
    for name in [k for k in env if k == key or k.startswith(prefix)]:
        del env[name]


def _merge(a: dict, b: dict) -> dict:
    """Keep only what both paths agree on."""
    return {k: v for k, v in a.items() if k in b and b[k] == v}


def _bound_in(stmt: ast.stmt) -> set[str]:
    """Names and self attributes that a compound statement may rebind anywhere inside it."""
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            key = dotted(node)
            if key:
                names.add(key)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            key = dotted(node.func.value)  # an in-place cast inside a loop changes the dtype
            if key and node.func.attr in MOVE_METHODS | {"apply"}:
                names.add(key)
    return names
