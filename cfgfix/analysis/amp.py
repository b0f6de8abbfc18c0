"""Autocast regions and gradient scalers, as the CFX2xx rules see them: every spelling of
autocast (`torch.autocast`, `torch.amp.autocast`, `torch.cuda.amp.autocast`, aliases, the
dtype each one defaults to), GradScaler constructions, the frameworks that scale the loss
themselves (accelerate, DeepSpeed, the HF Trainer, Lightning), and `Resolver`, what a name
holds in one scope. `AmpFacts` is computed once per file and kept in `ctx.notes`.

Moved here unchanged from `rules/amp.py`; the project-wide flow analysis is to replace
`Resolver`."""

from __future__ import annotations

import ast
import re
from typing import Iterator, NamedTuple

from cfgfix.analysis.names import DTYPE_ALIASES, dotted, gpu_branch, iter_statements, single_assignments
from cfgfix.analysis.optimizer_sites import OPTIMIZER  # noqa: F401 - CFX201 reads it here

# -------------------------------------------------------------------------- vocabulary

AUTOCAST_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
AUTOCAST_CUDA = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
_AUTOCAST_CPU = frozenset({"torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"})
AUTOCAST_NAMES = AUTOCAST_GENERIC | AUTOCAST_CUDA | _AUTOCAST_CPU

SCALER_CUDA = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
_SCALER_GENERIC = frozenset(
    {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler"}
)
SCALER_NAMES = SCALER_CUDA | _SCALER_GENERIC

# Positional parameters: the generic API takes the device first; the deprecated
# per-device classes start with `enabled` (torch/cuda/amp/autocast_mode.py).
_GENERIC_PARAMS = ("device_type", "dtype", "enabled", "cache_enabled")
LEGACY_PARAMS = ("enabled", "dtype", "cache_enabled")
_SCALER_PARAMS_GENERIC = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
_SCALER_PARAMS_LEGACY = _SCALER_PARAMS_GENERIC[1:]

# Imported from these, something else owns the backward pass and its loss scaling:
# `accelerator.backward`, DeepSpeed / Lightning engines, apex `amp.scale_loss`, ...
_SCALING_FRAMEWORKS = (
    "accelerate", "deepspeed", "lightning", "pytorch_lightning", "lightning_fabric", "apex",
    "colossalai", "mmengine", "mmcv", "fairscale", "composer", "ignite", "megatron", "nemo",
)
# The HF / TRL trainers scale the loss of the backward pass they run (`training_step`).
# Their arguments (`TrainingArguments`, trl's `SFTConfig` & co.) scale nothing by
# themselves: scripts subclass them only to parse their own options
# (`HfArgumentParser`) and train in their own loop.
_HF_TRAINER = re.compile(r"^(transformers|trl)\.(\w+\.)*\w*Trainer$")


# ------------------------------------------------------------------ resolving constants


class Resolver:
    """Resolves dtype, device and boolean arguments in one scope, through the shared value
    index: names bound once (in the function, or at module level and not rebound there) and
    `self.x` assigned once in the class (`self.use_amp = True` in `__init__`)."""

    def __init__(self, ctx, function: ast.AST | None, module_consts: dict[str, ast.expr] | None = None) -> None:
        from cfgfix.analysis.attributes import ValueIndex

        self.ctx = ctx
        self.imports = ctx.index.imports
        self.values = ValueIndex.of(ctx)
        self.function = None if isinstance(function, ast.Lambda) else function
        self.cls = None
        if self.function is not None:
            context = ctx.index.contexts.get(id(self.function))
            self.cls = context.classdef if context is not None else None

    def deref(self, node: ast.expr) -> ast.expr:
        return self.values.origin(node, self.function, self.cls)

    def dtype(self, node: ast.expr, strings: bool = False) -> str | None:
        """"float16", "bfloat16", "float32", "float64", "default" (an explicit None), or None.
        `strings`: also "float16" / "torch.float16" (what `from_pretrained` accepts)."""
        node = self.deref(node)
        if isinstance(node, ast.Constant) and node.value is None:
            return "default"
        if strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            return DTYPE_ALIASES.get(node.value.removeprefix("torch."))
        name = self.imports.qualify(node)
        if name and name.startswith("torch.") and name.count(".") == 1:
            attr = name.split(".")[1]
            return DTYPE_ALIASES.get(attr) or {"float64": "float64", "double": "float64"}.get(attr)
        return None

    def string(self, node: ast.expr) -> str | None:
        node = self.deref(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    def device_type(self, node: ast.expr, depth: int = 0) -> str | None:
        """A device string; for `"cuda" if torch.cuda.is_available() else "cpu"` the side a
        GPU run takes (as the model analysis reads that idiom): training runs are GPU runs.
        A parameter of the function takes what every call of it in this module passes (its
        default where a call passes nothing): `train_step(model, batch, "cuda")`."""
        node = self.deref(node)
        if isinstance(node, ast.IfExp):
            side = gpu_branch(node, self.imports)
            if side is None:
                return None
            node = side
        if isinstance(node, ast.Name) and depth < 3:
            return self._parameter_device(node.id, depth)
        return self.string(node)

    def _parameter_device(self, name: str, depth: int) -> str | None:
        function = self.function
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        args = function.args
        positional = [a.arg for a in [*args.posonlyargs, *args.args]]
        if name not in positional and name not in {a.arg for a in args.kwonlyargs}:
            return None
        default = _default_of(args, name)
        method = self.cls is not None and positional[:1] in (["self"], ["cls"])
        found = set()
        calls = self.ctx.index.calls_to_method_on(("self", "cls"), function.name) if method \
            else [s for s in self.ctx.index.calls_named(function.name) if isinstance(s.node.func, ast.Name)]
        for site in calls:
            passed, hidden = bind(site.node, tuple(positional[1:] if method else positional))
            if hidden:
                return None
            arg = passed.get(name, default)
            if arg is None:
                return None
            value = scope_resolver(self.ctx, site.context.function).device_type(arg, depth + 1)
            if value is None:
                return None
            found.add(value)
        return found.pop() if len(found) == 1 else None

    def boolean(self, node: ast.expr) -> bool | None:
        node = self.deref(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        return None


def _default_of(args: ast.arguments, name: str) -> ast.expr | None:
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    return defaults.get(name)


def scope_resolver(ctx, function) -> Resolver:
    cache = ctx.notes.setdefault("amp-resolvers", {})
    if "module" not in cache:
        cache["module"] = single_assignments(ctx.document.tree.body)
    key = id(function)
    if key not in cache:
        cache[key] = Resolver(ctx, function, cache["module"])
    return cache[key]


def bind(call: ast.Call, params: tuple[str, ...]) -> tuple[dict[str, ast.expr], bool]:
    """Arguments by parameter name, and whether `*args` / `**kwargs` hide some."""
    bound: dict[str, ast.expr] = {}
    hidden = False
    for name, arg in zip(params, call.args):
        if isinstance(arg, ast.Starred):
            hidden = True
            break
        bound[name] = arg
    if len(call.args) > len(params) or any(isinstance(a, ast.Starred) for a in call.args):
        hidden = True
    for keyword in call.keywords:
        if keyword.arg is None:
            hidden = True
        else:
            bound[keyword.arg] = keyword.value
    return bound, hidden


# -------------------------------------------------------------------------- autocast

# NamedTuples, not frozen dataclasses: immutable, equal and hashed by their fields as
# before, at a fraction of the cost to create the classes (~1.5 ms of this module's
# ~2.2 ms import, paid by every run that loads a CFX2xx rule; issue 15).


class Autocast(NamedTuple):
    """One autocast call and what it does, as far as the source says."""

    call: ast.Call
    api: str  # the qualified name called
    dtype: str | None  # "float16", "bfloat16", "float32"; None when it cannot be resolved
    defaulted: bool  # no dtype given: the API's default decided it
    enabled: bool | None  # None: decided at run time
    function: ast.AST | None


def autocast_of(ctx, call: ast.Call, api: str, function) -> Autocast:
    resolver = scope_resolver(ctx, function)
    generic = api in AUTOCAST_GENERIC
    args, hidden = bind(call, _GENERIC_PARAMS if generic else LEGACY_PARAMS)
    enabled = resolver.boolean(args["enabled"]) if "enabled" in args else (None if hidden else True)
    dtype, defaulted = None, False
    explicit = resolver.dtype(args["dtype"]) if "dtype" in args else None
    if "dtype" in args and explicit != "default":
        dtype = explicit
    elif not hidden:
        defaulted = True
        if api in AUTOCAST_CUDA:
            dtype = "float16"  # `dtype: torch.dtype = torch.float16` in the signature
        elif api in _AUTOCAST_CPU:
            dtype = "bfloat16"
        else:
            device = resolver.device_type(args["device_type"]) if "device_type" in args else None
            # torch.get_autocast_dtype(device): float16 on CUDA, bfloat16 on CPU, unless the
            # program changed it (set_autocast_*dtype) or an outer region set another one.
            if device is not None and not ctx.notes.get("amp-sets-dtype"):
                dtype = {"cuda": "float16", "cpu": "bfloat16"}.get(device.split(":")[0])
    return Autocast(call, api, dtype, defaulted, enabled, function)


class Scaler(NamedTuple):
    """One GradScaler construction."""

    call: ast.Call
    api: str
    enabled: bool | None
    key: str | None  # the name or `self.x` it is bound to, when a plain assignment
    stmt: ast.stmt
    function: ast.AST | None


class AmpFacts:
    def __init__(self, autocasts: list[Autocast], scalers: list[Scaler], framework: str | None) -> None:
        self.autocasts = autocasts
        self.scalers = scalers
        self.framework = framework  # a framework that scales the loss itself, imported here

    @classmethod
    def of(cls, ctx) -> AmpFacts:
        if "amp" not in ctx.notes:
            ctx.notes["amp-sets-dtype"] = "set_autocast_" in ctx.source.text
            autocasts = [
                autocast_of(ctx, site.node, site.name, site.context.function)
                for site in ctx.index.calls_named(*AUTOCAST_NAMES)
            ]
            # `autocast = torch.cuda.amp.autocast if args.amp else contextlib.suppress`, then
            # `with autocast():`: an autocast wherever the condition holds (`enabled=args.amp`)
            for alias, api in conditional_aliases(ctx):
                for site in ctx.index.calls_named(alias):
                    if isinstance(site.node.func, ast.Name):
                        region = autocast_of(ctx, site.node, api, site.context.function)
                        autocasts.append(region._replace(enabled=None if region.enabled is not False else False))
            scalers = []
            for site in ctx.index.calls_named(*SCALER_NAMES):
                resolver = scope_resolver(ctx, site.context.function)
                params = _SCALER_PARAMS_LEGACY if site.name in SCALER_CUDA else _SCALER_PARAMS_GENERIC
                args, hidden = bind(site.node, params)
                enabled = resolver.boolean(args["enabled"]) if "enabled" in args else (None if hidden else True)
                stmt = site.context.stmt
                key = None
                if isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1:
                    key = dotted(stmt.targets[0])
                scalers.append(Scaler(site.node, site.name, enabled, key, stmt, site.context.function))
            ctx.notes["amp"] = cls(autocasts, scalers, _framework(ctx))
        return ctx.notes["amp"]


# Context managers that do nothing: the "off" side of a conditional autocast alias.
_NO_OP_CONTEXTS = frozenset({"contextlib.nullcontext", "contextlib.suppress", "nullcontext", "suppress"})
_ALIAS_LINE = re.compile(r"^[ \t]*(\w+)[ \t]*=(?=.*\bautocast\b)(?=.*\b(?:if|or)\b)", re.MULTILINE)


def conditional_aliases(ctx) -> list[tuple[str, str]]:
    """(local name, autocast API) for a name bound to an autocast API on one side of a
    condition and a no-op context manager on the other: `autocast = torch.cuda.amp.autocast
    if args.amp else contextlib.suppress`, `ctx = (use_amp and torch.autocast) or
    nullcontext`. Found from the lines that say so (most files have none)."""
    text = ctx.source.text
    if "autocast" not in text:
        return []
    lines = {text.count("\n", 0, m.start()) + 1: m.group(1) for m in _ALIAS_LINE.finditer(text)}
    if not lines:
        return []
    imports = ctx.imports
    found = []
    for stmt in iter_statements(ctx.document.tree.body):
        if stmt.lineno not in lines or not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 \
                or not isinstance(stmt.targets[0], ast.Name):
            continue
        arms = _arms(stmt.value)
        apis = [imports.qualify(arm) for arm in arms]
        autocast = [api for api in apis if api in AUTOCAST_NAMES]
        if len(autocast) == 1 and len(arms) == 2 and all(
                api in AUTOCAST_NAMES or api in _NO_OP_CONTEXTS for api in apis):
            found.append((stmt.targets[0].id, autocast[0]))
    return found


def _arms(node: ast.expr) -> list[ast.expr]:
    """The values a conditional expression may take: `A if c else B`, `(c and A) or B`."""
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
        first = node.values[0]
        if isinstance(first, ast.BoolOp) and isinstance(first.op, ast.And) and len(first.values) == 2:
            return [first.values[1], node.values[1]]
    return [node]


def _framework(ctx) -> str | None:
    for target in ctx.index.imports.aliases.values():
        root = target.split(".")[0]
        if root in _SCALING_FRAMEWORKS or _HF_TRAINER.match(target):
            return target
    for site in ctx.index.calls:  # `import transformers` ... `transformers.Trainer(...)`
        if site.name and _HF_TRAINER.match(site.name):
            return site.name
    # A class of this file built on an HF Trainer through the project's own classes
    # (`class MyTrainer(BaseTrainer)`, `BaseTrainer(Trainer)` in another module).
    for node in ast.walk(ctx.document.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, (ast.Name, ast.Attribute)):
                    found = ctx.functions.library_base(base, _HF_TRAINER.match)
                    if found is not None:
                        return found
    return None


# --------------------------------------------------------------------- small AST helpers


def guarded_statements(body: list[ast.stmt], guarded: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Statements of one scope in source order (not inside nested functions or classes),
    each with whether it runs only under a condition (if, loop, except, match)."""
    for stmt in body:
        yield stmt, guarded
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from guarded_statements(stmt.body, guarded)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            yield from guarded_statements(stmt.body, guarded)
            for handler in stmt.handlers:
                yield from guarded_statements(handler.body, True)
            yield from guarded_statements(stmt.orelse, True)
            yield from guarded_statements(stmt.finalbody, guarded)
        elif isinstance(stmt, ast.Match):
            for case in stmt.cases:
                yield from guarded_statements(case.body, True)
        else:
            for name in ("body", "orelse"):
                yield from guarded_statements(getattr(stmt, name, None) or [], True)


def assignments(stmt: ast.stmt) -> list[tuple[ast.AST, ast.expr | None]]:
    if isinstance(stmt, ast.Assign):
        return [(target, stmt.value) for target in stmt.targets]
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [(stmt.target, stmt.value)]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [(stmt.target, None)]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [(item.optional_vars, None) for item in stmt.items if item.optional_vars is not None]
    return []


def short(src, node: ast.AST, limit: int = 70) -> str:
    text = " ".join(src.node_text(node).split())
    return text if len(text) <= limit else text[: limit - 5] + "...)"


def scope_body(ctx, function) -> list[ast.stmt]:
    return ctx.document.tree.body if function is None else function.body


def exclusive_arms(ctx, function, a: ast.stmt, b: ast.stmt) -> bool:
    """`a` and `b` (statements of `function`'s scope) sit in arms that never both run:
    `if ...: with autocast(): loss = f(x)` / `else: loss = f(x)`."""
    from cfgfix.analysis.arms import ArmPaths

    cache = ctx.notes.setdefault("amp-arms", {})
    key = id(function)
    if key not in cache:
        cache[key] = ArmPaths(scope_body(ctx, function))
    return cache[key].exclusive(a, b)


def _parents(ctx) -> dict[int, ast.AST]:
    if "amp-parents" not in ctx.notes:
        parents = {}
        for node in ast.walk(ctx.document.tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        ctx.notes["amp-parents"] = parents
    return ctx.notes["amp-parents"]


def parent_of(ctx, node: ast.AST) -> ast.AST | None:
    return _parents(ctx).get(id(node))
