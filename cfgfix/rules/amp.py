"""CFX201, CFX202, CFX204, CFX207: mixed precision and gradient scaling (Python).

What the four rules share lives at the top: recognising autocast in all its spellings
(`torch.autocast`, `torch.amp.autocast`, `torch.cuda.amp.autocast`, aliases, the dtype each
one defaults to), recognising GradScaler constructions, and the frameworks that scale the
loss themselves (accelerate, DeepSpeed, the HF Trainer, Lightning). It is computed once per
file and kept in `ctx.notes`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from cfgfix.analysis.names import DTYPE_ALIASES, dotted, single_assignments
from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

# -------------------------------------------------------------------------- vocabulary

_AUTOCAST_GENERIC = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
AUTOCAST_CUDA = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
_AUTOCAST_CPU = frozenset({"torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"})
AUTOCAST_NAMES = _AUTOCAST_GENERIC | AUTOCAST_CUDA | _AUTOCAST_CPU

SCALER_CUDA = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
_SCALER_GENERIC = frozenset(
    {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler"}
)
SCALER_NAMES = SCALER_CUDA | _SCALER_GENERIC

# Positional parameters: the generic API takes the device first; the deprecated
# per-device classes start with `enabled` (torch/cuda/amp/autocast_mode.py).
_GENERIC_PARAMS = ("device_type", "dtype", "enabled", "cache_enabled")
_LEGACY_PARAMS = ("enabled", "dtype", "cache_enabled")
_SCALER_PARAMS_GENERIC = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
_SCALER_PARAMS_LEGACY = _SCALER_PARAMS_GENERIC[1:]

_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})

# Imported from these, something else owns the backward pass and its loss scaling:
# `accelerator.backward`, DeepSpeed / Lightning engines, apex `amp.scale_loss`, ...
_SCALING_FRAMEWORKS = (
    "accelerate", "deepspeed", "lightning", "pytorch_lightning", "lightning_fabric", "apex",
    "colossalai", "mmengine", "mmcv", "fairscale", "composer", "ignite", "megatron", "nemo",
)
# (trl's `SFTConfig` & co. are TrainingArguments.)
_HF_TRAINER = re.compile(r"^(transformers\.\w*(Trainer|TrainingArguments)|trl\.\w*(Trainer|Config))$")

_DEVICE_ONLY = frozenset({"cuda", "cpu", "train", "eval", "requires_grad_", "share_memory"})
_CASTS = {"half": "float16", "bfloat16": "bfloat16", "float": "float32", "double": "float64"}
_OPTIMIZER = re.compile(
    r"(^|\.)(Adam\w*|AdamW\w*|SGD\w*|RMSprop|Adagrad|Adadelta|Adamax|NAdam|RAdam|ASGD|Rprop|LBFGS|"
    r"Adafactor|Lion\w*|LAMB|Lamb|PagedAdam\w*|AdEMAMix\w*)$"
)
# Calls that see a module without changing its dtype (a model handed to anything else may
# be cast in place, e.g. PEFT's `prepare_model_for_kbit_training` up-casts to float32).
_HARMLESS = frozenset(
    {
        "print", "len", "isinstance", "type", "id", "str", "repr", "hasattr", "getattr", "vars",
        "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel", "torch.compile",
    }
)


# ------------------------------------------------------------------ resolving constants


class _Resolver:
    """Resolves dtype, device and boolean arguments through names bound once in the scope
    (or once at module level and never rebound or taken as a parameter in the function)."""

    def __init__(self, ctx, function: ast.AST | None, module_consts: dict[str, ast.expr]) -> None:
        self.imports = ctx.index.imports
        if function is None or isinstance(function, ast.Lambda):
            self.consts = module_consts
            return
        bound = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        args = function.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        outer = {k: v for k, v in module_consts.items() if k not in bound | params}
        local = {k: v for k, v in single_assignments(function.body).items() if k not in params}
        self.consts = {**outer, **local}

    def deref(self, node: ast.expr) -> ast.expr:
        for _ in range(5):
            if isinstance(node, ast.Name) and node.id in self.consts:
                node = self.consts[node.id]
            else:
                break
        return node

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

    def boolean(self, node: ast.expr) -> bool | None:
        node = self.deref(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        return None


def _resolver(ctx, function) -> _Resolver:
    cache = ctx.notes.setdefault("amp-resolvers", {})
    if "module" not in cache:
        cache["module"] = single_assignments(ctx.document.tree.body)
    key = id(function)
    if key not in cache:
        cache[key] = _Resolver(ctx, function, cache["module"])
    return cache[key]


def _bind(call: ast.Call, params: tuple[str, ...]) -> tuple[dict[str, ast.expr], bool]:
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


@dataclass(frozen=True)
class Autocast:
    """One autocast call and what it does, as far as the source says."""

    call: ast.Call
    api: str  # the qualified name called
    dtype: str | None  # "float16", "bfloat16", "float32"; None when it cannot be resolved
    defaulted: bool  # no dtype given: the API's default decided it
    enabled: bool | None  # None: decided at run time
    function: ast.AST | None


def autocast_of(ctx, call: ast.Call, api: str, function) -> Autocast:
    resolver = _resolver(ctx, function)
    generic = api in _AUTOCAST_GENERIC
    args, hidden = _bind(call, _GENERIC_PARAMS if generic else _LEGACY_PARAMS)
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
            device = resolver.string(args["device_type"]) if "device_type" in args else None
            # torch.get_autocast_dtype(device): float16 on CUDA, bfloat16 on CPU, unless the
            # program changed it (set_autocast_*dtype) or an outer region set another one.
            if device is not None and not ctx.notes.get("amp-sets-dtype"):
                dtype = {"cuda": "float16", "cpu": "bfloat16"}.get(device.split(":")[0])
    return Autocast(call, api, dtype, defaulted, enabled, function)


@dataclass(frozen=True)
class Scaler:
    """One GradScaler construction."""

    call: ast.Call
    api: str
    enabled: bool | None
    key: str | None  # the name or `self.x` it is bound to, when a plain assignment
    stmt: ast.stmt
    function: ast.AST | None


@dataclass
class AmpFacts:
    autocasts: list[Autocast]
    scalers: list[Scaler]
    framework: str | None  # a framework that scales the loss itself, imported here

    @classmethod
    def of(cls, ctx) -> AmpFacts:
        if "amp" not in ctx.notes:
            ctx.notes["amp-sets-dtype"] = "set_autocast_" in ctx.source.text
            autocasts = [
                autocast_of(ctx, site.node, site.name, site.context.function)
                for site in ctx.index.calls_named(*AUTOCAST_NAMES)
            ]
            scalers = []
            for site in ctx.index.calls_named(*SCALER_NAMES):
                resolver = _resolver(ctx, site.context.function)
                params = _SCALER_PARAMS_LEGACY if site.name in SCALER_CUDA else _SCALER_PARAMS_GENERIC
                args, hidden = _bind(site.node, params)
                enabled = resolver.boolean(args["enabled"]) if "enabled" in args else (None if hidden else True)
                stmt = site.context.stmt
                key = None
                if isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1:
                    key = dotted(stmt.targets[0])
                scalers.append(Scaler(site.node, site.name, enabled, key, stmt, site.context.function))
            ctx.notes["amp"] = cls(autocasts, scalers, _framework(ctx))
        return ctx.notes["amp"]


def _framework(ctx) -> str | None:
    for target in ctx.index.imports.aliases.values():
        root = target.split(".")[0]
        if root in _SCALING_FRAMEWORKS or _HF_TRAINER.match(target):
            return target
    return None


# --------------------------------------------------------------------- small AST helpers


def _statements(body: list[ast.stmt], guarded: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Statements of one scope in source order (not inside nested functions or classes),
    each with whether it runs only under a condition (if, loop, except, match)."""
    for stmt in body:
        yield stmt, guarded
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _statements(stmt.body, guarded)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            yield from _statements(stmt.body, guarded)
            for handler in stmt.handlers:
                yield from _statements(handler.body, True)
            yield from _statements(stmt.orelse, True)
            yield from _statements(stmt.finalbody, guarded)
        elif isinstance(stmt, ast.Match):
            for case in stmt.cases:
                yield from _statements(case.body, True)
        else:
            for name in ("body", "orelse"):
                yield from _statements(getattr(stmt, name, None) or [], True)


def _assignments(stmt: ast.stmt) -> list[tuple[ast.AST, ast.expr | None]]:
    if isinstance(stmt, ast.Assign):
        return [(target, stmt.value) for target in stmt.targets]
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [(stmt.target, stmt.value)]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [(stmt.target, None)]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [(item.optional_vars, None) for item in stmt.items if item.optional_vars is not None]
    return []


def _names(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _has_call(node: ast.AST | None) -> bool:
    return node is not None and any(isinstance(n, ast.Call) for n in ast.walk(node))


def _is_method_call(node: ast.AST, method: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method


def _before(a: ast.AST, b: ast.AST) -> bool:
    return (a.lineno, a.col_offset) < (b.lineno, b.col_offset)


def _short(src, node: ast.AST, limit: int = 70) -> str:
    text = " ".join(src.node_text(node).split())
    return text if len(text) <= limit else text[: limit - 5] + "...)"


def _scope_body(ctx, function) -> list[ast.stmt]:
    return ctx.document.tree.body if function is None else function.body


# ============================================================================ CFX201


@register
class Fp16AutocastWithoutGradScaler(Rule):
    """## What it does
    Flags float16 autocast around a forward pass whose loss is `backward()`-ed with no
    GradScaler: `torch.autocast("cuda", dtype=torch.float16)`, `torch.autocast("cuda")` and
    `torch.amp.autocast("cuda")` (float16 is the CUDA default), and `torch.cuda.amp.autocast()`
    (float16 unless told otherwise), under any import alias.

    ## Why is this bad?
    "Mixed precision" is two pieces, and autocast is only the first. Autocast runs the
    forward ops in float16 (the weights stay float32), and the backward pass of those ops
    produces float16 gradients. float16's smallest normal value is 6.1e-05: smaller gradients
    lose their precision and then flush to zero, and the updates of those parameters are
    silently lost.
    A GradScaler multiplies the loss before `backward()` so the gradients stay representable,
    and divides them again before the optimizer step. bfloat16 has float32's exponent range
    and needs no scaler.

    cfgfix stays silent where something else scales the loss for you: accelerate
    (`Accelerator(mixed_precision="fp16")` with `accelerator.backward`), the HF `Trainer`
    (`TrainingArguments(fp16=True)`), DeepSpeed engines (`model_engine.backward`),
    Lightning (`precision="16-mixed"`), apex; and wherever a scaler appears in the file at
    all. It also stays silent for `enabled=False`, for regions under `torch.no_grad()`, for a
    dtype it cannot resolve (`dtype=args.dtype`), for a device type it cannot resolve
    without an explicit dtype, when the loss leaves the function before `backward()`, and in
    files that never build or step an optimizer (gradients for attribution, not training).
    An `enabled=args.fp16` switch is flagged: whenever it is on, nothing scales the loss.

    ## Example
    ```python
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    or, on GPUs with bfloat16 (Ampere and newer), `dtype=torch.bfloat16` and no scaler.

    ## Fix safety
    No automatic fix. The natural one, switching to bfloat16 autocast, is only right on
    GPUs that support bfloat16 (on others `torch.autocast` raises "Current CUDA Device does
    not support bfloat16"), and cfgfix has no target-GPU setting to check that against yet;
    adding a GradScaler means restructuring the backward and optimizer calls, which is a
    change to review by hand.

    ## References
    - facts A5: PyTorch `docs/source/amp.md`, "Gradient Scaling": "Gradient values with
      small magnitudes may not be representable in `float16`. These values will flush to
      zero ("underflow"), so the update for the corresponding parameters will be lost."
    - `torch.finfo(torch.float16).tiny == 6.1e-05`; `torch.finfo(torch.bfloat16).tiny == 1.18e-38`.
    """

    code = "CFX201"
    name = "fp16-autocast-without-grad-scaler"
    severity = Severity.ERROR
    fix_availability = "none"
    triggers = ((b".backward(",), (b"autocast",))
    # Any scaler in the file (GradScaler, a NativeScaler wrapper, `loss_scaler`, `self.scaler`)
    # means the loss may be scaled: the rule cannot match, so the file is not parsed for it.
    trigger_check = staticmethod(lambda data: b"caler" not in data)

    VALID = [
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = criterion(model(x), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            why="the textbook loop: the loss is scaled",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="bfloat16 needs no scaler",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.autocast(device_type='cpu'):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="CPU autocast defaults to bfloat16",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=args.dtype):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="a dtype from a variable that cannot be resolved",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.autocast(device_type=device.type):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="no dtype and a device type only known at run time",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.cuda.amp.autocast(enabled=False):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="`enabled=False` is not autocast",
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = criterion(model(x), y)\n"
            "    accelerator.backward(loss)\n"
            "    optimizer.step()\n",
            why="accelerate scales the loss in `accelerator.backward`",
        ),
        Example(
            "import torch\n"
            "import deepspeed\n"
            "engine, optimizer, _, _ = deepspeed.initialize(model=model, config='ds.json')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = criterion(engine(x), y)\n"
            "    engine.backward(loss)\n"
            "    engine.step()\n",
            why="a DeepSpeed engine owns the backward pass and its loss scaling",
        ),
        Example(
            "import torch\n"
            "from transformers import Trainer, TrainingArguments\n"
            "class MyTrainer(Trainer):\n"
            "    def training_step(self, model, inputs):\n"
            "        with torch.cuda.amp.autocast():\n"
            "            loss = self.compute_loss(model, inputs)\n"
            "        loss.backward()\n"
            "        self.optimizer.step()\n"
            "        return loss.detach()\n"
            "args = TrainingArguments('out', fp16=True)\n",
            why="the HF Trainer (fp16=True) brings its own scaler",
        ),
        Example(
            "import torch\n"
            "import lightning as L\n"
            "class Model(L.LightningModule):\n"
            "    def training_step(self, batch, idx):\n"
            "        with torch.autocast('cuda', dtype=torch.float16):\n"
            "            loss = self.net(batch).mean()\n"
            "        self.manual_backward(loss)\n"
            "        self.optimizers().step()\n"
            "trainer = L.Trainer(precision='16-mixed')\n",
            why="Lightning scales the loss for `precision='16-mixed'`",
        ),
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    with torch.no_grad(), torch.cuda.amp.autocast():\n"
            "        target = teacher(x)\n"
            "    loss = criterion(student(x), target)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="a no-grad autocast region: no gradient flows through it",
        ),
        Example(
            "import torch\n"
            "def forward(model, x):\n"
            "    with torch.autocast('cuda'):\n"
            "        return model(x)\n"
            "def train(model, x):\n"
            "    loss = forward(model, x).mean()\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="the loss leaves the function: the scaler may live in the caller",
        ),
        Example(
            "import torch\n"
            "from timm.utils import NativeScaler\n"
            "loss_scaler = NativeScaler()\n"
            "with torch.cuda.amp.autocast():\n"
            "    loss = criterion(model(x), y)\n"
            "loss_scaler(loss, optimizer)\n"
            "optimizer.step()\n",
            why="a scaler wrapper (timm's NativeScaler) calls backward itself",
        ),
        Example(
            "import torch\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    logits = model(x)\n"
            "loss = criterion(model(x).float(), y)\n"
            "loss.backward()\n"
            "optimizer.step()\n",
            why="the backward-ed loss does not come from the autocast region",
        ),
        Example(
            "import torch\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    with torch.autocast('cuda'):\n"
            "        loss = model(x).mean()\n"
            "loss.backward()\n"
            "optimizer.step()\n",
            why="without a dtype, a nested region inherits the enclosing bfloat16",
        ),
        Example(
            "import torch\n"
            "def attribution(model, x):\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        score = model(x).max()\n"
            "        score.backward()\n"
            "    return x.grad * x\n",
            why="gradients for attribution, not training: no optimizer in the file",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "for x, y in loader:\n"
            "    optimizer.zero_grad()\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="explicit float16, plain backward",
            line=4,
        ),
        Example(
            "from torch.cuda.amp import autocast as ac\n"
            "def train_step(model, batch, optimizer):\n"
            "    with ac():\n"
            "        outputs = model(**batch)\n"
            "    loss = outputs.loss / 4\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="`torch.cuda.amp.autocast()` under an alias defaults to float16; the loss derives from the outputs",
            line=3,
        ),
        Example(
            "import torch as th\n"
            "for x, y in loader:\n"
            "    with th.amp.autocast(device_type='cuda'):\n"
            "        out = model(x)\n"
            "        loss = criterion(out, y)\n"
            "        loss.backward()\n"
            "    opt.step()\n",
            why="`torch.amp.autocast` on CUDA without a dtype is float16; backward inside the region",
            line=3,
        ),
        Example(
            "import torch\n"
            "DTYPE = torch.float16\n"
            "amp_ctx = torch.autocast('cuda', dtype=DTYPE)\n"
            "for x, y in loader:\n"
            "    with amp_ctx:\n"
            "        loss = model(x, labels=y).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="the region and its dtype come from names bound once",
            line=3,
        ),
        Example(
            "import torch\n"
            "def train(model, loader, optimizer, args):\n"
            "    for batch in loader:\n"
            "        with torch.cuda.amp.autocast(enabled=args.fp16):\n"
            "            loss = model(**batch).loss\n"
            "        loss.backward()\n"
            "        optimizer.step()\n",
            why="an `--fp16` switch that turns on autocast but never a scaler",
            line=4,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        facts = AmpFacts.of(ctx)
        if facts.framework is not None or facts.scalers or not _steps_an_optimizer(ctx):
            return
        src = ctx.source
        for region in facts.autocasts:
            if region.dtype != "float16" or region.enabled is False:
                continue
            for with_stmt in self._regions(ctx, region):
                backward = self._unscaled_backward(ctx, with_stmt, region.function)
                if backward is None:
                    continue
                how = ""
                if region.defaulted:
                    how = (" (the default of `torch.cuda.amp.autocast()`)" if region.api in AUTOCAST_CUDA
                           else " (the CUDA default when no dtype is given)")
                when = " when enabled" if region.enabled is None else ""
                yield self.finding(
                    src.span_of_node(region.call),
                    f"`{_short(src, region.call)}` runs the forward in float16{how}{when}, and "
                    f"`{_short(src, backward.func.value, 40)}.backward()` on line {backward.lineno} "
                    "backpropagates it with no loss scaling: gradients below float16's range "
                    "(smallest normal 6.1e-05) flush to zero and those updates are silently lost. "
                    "Autocast only picks the dtype of the forward ops; their float16 gradients are "
                    "protected only by scaling the loss. Use `torch.amp.GradScaler(\"cuda\")` "
                    "(`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`), "
                    "or bfloat16 autocast on GPUs that support it.",
                    related=[Related(src.span_of_node(backward), "backward without a GradScaler")],
                )
                break

    @staticmethod
    def _regions(ctx, region: Autocast) -> list[ast.stmt]:
        """`with` statements the call opens: directly, or through a name bound once."""
        for site in ctx.index.calls_named(region.api):
            if site.node is region.call:
                stmt = site.context.stmt
                break
        else:  # pragma: no cover - the call came from the index
            return []
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            if not any(item.context_expr is region.call for item in stmt.items):
                return []
            if region.defaulted and region.api in _AUTOCAST_GENERIC and _inside_autocast(ctx, stmt):
                return []  # without a dtype it inherits the enclosing region's dtype
            return [stmt]
        if not (isinstance(stmt, ast.Assign) and stmt.value is region.call and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return []
        name = stmt.targets[0].id
        if name not in single_assignments(_scope_body(ctx, region.function)):
            return []
        return [
            s for s, _ in _statements(_scope_body(ctx, region.function))
            if isinstance(s, (ast.With, ast.AsyncWith))
            and any(isinstance(i.context_expr, ast.Name) and i.context_expr.id == name for i in s.items)
        ]

    @staticmethod
    def _unscaled_backward(ctx, with_stmt: ast.stmt, function) -> ast.Call | None:
        # No gradient flows out of a no-grad region.
        context = ctx.index.context_of_stmt(with_stmt)
        resolver = _resolver(ctx, function)
        for outer in (*context.withs, with_stmt):
            for item in outer.items:
                expr = item.context_expr
                name = ctx.index.imports.qualify(expr.func) if isinstance(expr, ast.Call) else None
                if name in _NO_GRAD or (name == "torch.set_grad_enabled" and expr.args
                                        and resolver.boolean(expr.args[0]) is False):
                    return None
        # Names bound in the region from a computation (the forward), then everything
        # computed from them afterwards, in source order; a rebinding from elsewhere kills.
        tainted: set[str] = set()
        for stmt, _ in _statements(with_stmt.body):
            for target, value in _assignments(stmt):
                if _has_call(value) or _names(value) & tainted:
                    tainted |= _names(target)
        if not tainted:
            return None
        for stmt, _ in _statements(_scope_body(ctx, function)):
            if not _before(with_stmt, stmt) or _within(stmt, with_stmt):
                continue
            for target, value in _assignments(stmt):
                uses = _names(value) & tainted
                if isinstance(stmt, ast.AugAssign):
                    uses |= _names(target) & tainted
                if uses:
                    tainted |= _names(target)
                else:
                    tainted -= _names(target)
        for site in ctx.index.calls_to_method("backward"):
            call = site.node
            if site.context.function is not function or not _before(with_stmt, call):
                continue
            receiver = call.func.value
            if _is_method_call(receiver, "scale"):
                continue  # `scaler.scale(loss).backward()`
            if _names(receiver) & tainted:
                return call
        return None


def _steps_an_optimizer(ctx) -> bool:
    """Training, not a gradient-attribution script: an optimizer is built or stepped here."""
    for site in ctx.index.calls_to_method("step"):
        if site.receiver and "opt" in site.receiver.split(".")[-1].lower():
            return True
    return any(site.name and _OPTIMIZER.search(site.name) and "optim" in site.name for site in ctx.index.calls)


def _inside_autocast(ctx, stmt: ast.stmt) -> bool:
    imports = ctx.index.imports
    return any(
        isinstance(item.context_expr, ast.Call) and imports.qualify(item.context_expr.func) in AUTOCAST_NAMES
        for outer in ctx.index.context_of_stmt(stmt).withs
        for item in outer.items
    )


def _within(inner: ast.AST, outer: ast.AST) -> bool:
    return (outer.lineno, outer.col_offset) <= (inner.lineno, inner.col_offset) and (
        inner.end_lineno, inner.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


# ============================================================================ CFX202

# float16 may be in play somewhere in the file: a scaler there may be needed after all.
_FP16_TEXT = re.compile(rb"(?<![bB])float16|\.half\(|torch\.half\b|(?<![bB])fp16|\bFP16")
_SCALER_METHODS = frozenset(
    {"scale", "step", "update", "unscale_", "state_dict", "load_state_dict", "get_scale", "is_enabled"}
)


@register
class GradScalerWithBf16(Rule):
    """## What it does
    Flags a GradScaler whose loss is only ever computed under bfloat16 autocast: every
    autocast region of the file is `dtype=torch.bfloat16` (or CPU autocast, bfloat16 by
    default), and nothing in the file runs float16.

    ## Why is this bad?
    Loss scaling exists for float16, whose narrow exponent range makes small gradients
    underflow. bfloat16 has float32's exponent range (smallest normal 1.18e-38, the same as
    float32), so its gradients do not underflow and there is nothing to protect. The scaler
    then only multiplies the loss, unscales every gradient and checks them for inf/NaN on
    each step. accelerate, for one, creates a GradScaler only for `mixed_precision="fp16"`,
    never for bf16. It is not known to be harmful: it is noise, and it suggests the run is
    float16 when it is not.

    cfgfix stays silent when any autocast region is float16 or has a dtype it cannot
    resolve, when the file mentions float16 / `.half()` / fp16 anywhere, when the scaler is
    disabled or its `enabled` is decided at run time, and when the scaler is handed to other
    code (a `train_one_epoch(..., scaler)` in another module may run float16).

    ## Example
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).loss
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    Unsafe: besides scaling, `scaler.step` skips the optimizer step when a gradient is inf
    or NaN; without it such a step is applied. The fix removes the construction,
    `scaler.update()` and `scaler.unscale_(...)`, turns `scaler.scale(loss).backward()` into
    `loss.backward()` and `scaler.step(optimizer)` into `optimizer.step()`. It is offered
    only when those are the scaler's only uses (a scaler saved in a checkpoint is left to
    you).

    ## References
    - facts A5: PyTorch `amp.md`: bfloat16 CPU AMP "only uses `torch.autocast`";
      accelerate `accelerator.py` creates its GradScaler only for `mixed_precision == "fp16"`.
    - `torch.finfo(torch.bfloat16).tiny == 1.18e-38 == torch.finfo(torch.float32).tiny`.
    """

    code = "CFX202"
    name = "grad-scaler-with-bf16"
    severity = Severity.INFO
    fix_availability = "unsafe"
    triggers = ((b"GradScaler",), (b"autocast",), (b"bfloat16",))
    trigger_check = staticmethod(lambda data: _FP16_TEXT.search(data) is None)

    VALID = [
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="float16 autocast needs the scaler",
        ),
        Example(
            "import torch\n"
            "dtype = torch.bfloat16 if args.bf16 else torch.float16\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=dtype):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="a dtype chosen at run time may be float16",
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda', enabled=args.mixed_precision == 'fp16')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="the scaler is enabled only for some runs",
        ),
        Example(
            "import torch\n"
            "from engine import train_one_epoch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    evaluate(model)\n"
            "train_one_epoch(model, loader, optimizer, scaler)\n",
            why="the scaler is handed to code in another module",
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).loss\n"
            "with torch.autocast('cuda'):\n"
            "    loss2 = model(y).loss\n"
            "scaler.scale(loss + loss2).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="another region runs the CUDA default, float16",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = criterion(model(x), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.unscale_(optimizer)\n"
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n"
            "    optimizer.zero_grad()\n",
            why="the textbook fp16 loop, kept after switching to bf16",
            line=2,
            fixed="import torch\n"
            "for x, y in loader:\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = criterion(model(x), y)\n"
            "    loss.backward()\n"
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "    optimizer.step()\n"
            "    optimizer.zero_grad()\n",
        ),
        Example(
            "from torch import autocast, bfloat16\n"
            "from torch.amp import GradScaler\n"
            "class Loop:\n"
            "    def __init__(self):\n"
            "        self.scaler = GradScaler()\n"
            "    def step(self, batch):\n"
            "        with autocast(device_type='cuda', dtype=bfloat16):\n"
            "            loss = self.model(batch).mean()\n"
            "        self.scaler.scale(loss / 2).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n",
            why="imported names, a scaler on `self`, a loss expression",
            line=5,
            fixed="from torch import autocast, bfloat16\n"
            "from torch.amp import GradScaler\n"
            "class Loop:\n"
            "    def __init__(self):\n"
            "        pass\n"
            "    def step(self, batch):\n"
            "        with autocast(device_type='cuda', dtype=bfloat16):\n"
            "            loss = self.model(batch).mean()\n"
            "        (loss / 2).backward()\n"
            "        self.optimizer.step()\n",
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n"
            "torch.save({'model': model.state_dict(), 'scaler': scaler.state_dict()}, 'ckpt.pt')\n",
            why="saved in a checkpoint: reported, but removing it is left to the user",
            line=2,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        facts = AmpFacts.of(ctx)
        regions = [a for a in facts.autocasts if a.enabled is not False]
        if not regions or any(a.dtype != "bfloat16" for a in regions):
            return
        src = ctx.source
        for scaler in facts.scalers:
            if scaler.enabled is not True or scaler.key is None:
                continue
            uses = _scaler_uses(ctx, scaler)
            if uses is None or not any(method == "scale" for method, _ in uses):
                continue
            fix = self._fix(ctx, scaler, uses)
            yield self.finding(
                src.span_of_node(scaler.call),
                f"`{scaler.key} = {_short(src, scaler.call, 50)}` scales a loss that is only computed "
                f"under bfloat16 autocast (line {regions[0].call.lineno}): bfloat16 has float32's "
                "exponent range (smallest normal 1.18e-38), so its gradients do not underflow and "
                "need no loss scaling. The scaler only multiplies, unscales and checks every step; "
                "call `loss.backward()` and `optimizer.step()` directly.",
                fix=fix,
                related=[Related(src.span_of_node(regions[0].call), "bfloat16 autocast")],
            )

    @staticmethod
    def _fix(ctx, scaler: Scaler, uses) -> Fix | None:
        src = ctx.source
        edits = []
        construction = python_edits.delete_statement(
            src, scaler.stmt, ctx.index.context_of_stmt(scaler.stmt).sole_in_block
        )
        if construction is None:
            return None
        edits.append(construction)
        for method, call in uses:
            stmt = _expression_statement(ctx, call)
            if method == "scale":
                parent = _parent_of(ctx, call)
                backward = isinstance(parent, ast.Attribute) and parent.attr == "backward"
                if not backward or len(call.args) != 1 or call.keywords:
                    return None
                loss = call.args[0]
                text = src.node_text(loss)
                if not isinstance(loss, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                    text = f"({text})"
                edits.append(python_edits.replace_node(src, call, text))
            elif method == "step" and stmt is not None and len(call.args) == 1 and not call.keywords:
                optimizer = call.args[0]
                if not isinstance(optimizer, (ast.Name, ast.Attribute)):
                    return None
                edits.append(python_edits.replace_node(src, call, f"{src.node_text(optimizer)}.step()"))
            elif method in ("update", "unscale_") and stmt is not None:
                edit = python_edits.delete_statement(src, stmt, ctx.index.context_of_stmt(stmt).sole_in_block)
                if edit is None:
                    return None
                edits.append(edit)
            else:
                return None
        return Fix(tuple(edits), f"Remove the GradScaler `{scaler.key}`", Applicability.UNSAFE)


def _parents(ctx) -> dict[int, ast.AST]:
    if "amp-parents" not in ctx.notes:
        parents = {}
        for node in ast.walk(ctx.document.tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        ctx.notes["amp-parents"] = parents
    return ctx.notes["amp-parents"]


def _parent_of(ctx, node: ast.AST) -> ast.AST | None:
    return _parents(ctx).get(id(node))


def _expression_statement(ctx, call: ast.Call) -> ast.Expr | None:
    parent = _parent_of(ctx, call)
    return parent if isinstance(parent, ast.Expr) and ctx.index.contexts.get(id(parent)) else None


def _scaler_uses(ctx, scaler: Scaler) -> list[tuple[str, ast.Call]] | None:
    """The method calls made on the scaler's name, or None when the name is used any other
    way (passed on, rebound, returned): then cfgfix cannot see everything it does."""
    key = scaler.key
    uses = []
    for node in ast.walk(ctx.document.tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or dotted(node) != key:
            continue
        if node is scaler.stmt.targets[0]:
            continue
        parent = _parent_of(ctx, node)
        grand = _parent_of(ctx, parent) if parent is not None else None
        if (isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in _SCALER_METHODS
                and isinstance(grand, ast.Call) and grand.func is parent):
            uses.append((parent.attr, grand))
        else:
            return None
    return uses


# ============================================================================ CFX204


@dataclass
class _Fp16Model:
    cast: ast.AST  # the `.half()`, `.to(torch.float16)` or float16 load
    key: str


@dataclass
class _Optimizer:
    built: ast.Call
    attached: str | None  # the name of the module whose parameters it holds, while bound
    model: _Fp16Model | None  # set while those parameters are known to be float16


@register
class GradScalerWithFp16Params(Rule):
    """## What it does
    Flags `scaler.step(optimizer)` / `scaler.unscale_(optimizer)` where the optimizer trains
    float16 parameters: a model made float16 (`model.half()`, `model.to(torch.float16)`,
    `from_pretrained(..., torch_dtype=torch.float16)`) whose `.parameters()` the optimizer
    was built from, with an enabled GradScaler.

    ## Why is this bad?
    It crashes at the first step: `ValueError: Attempting to unscale FP16 gradients.` A
    GradScaler unscales gradients in place and refuses float16 ones (`scaler.step` calls
    `unscale_` itself). Loss scaling is designed for float32 weights under float16
    autocast, where the weights and their gradients stay float32; PyTorch's autocast docs
    also say not to call `.half()` on a model that is autocast.

    cfgfix stays silent when the cast happens only under a condition, when the model is
    handed to other code between the cast and the optimizer (PEFT's
    `prepare_model_for_kbit_training` and `get_peft_model` create or up-cast float32
    parameters), when the optimizer gets something other than the model's own parameters
    (an fp32 master copy), when the same code freezes or replaces parameters
    (`requires_grad`, `.data =`: frozen float16 parameters get no gradient and raise
    nothing), and when the scaler is disabled or decided at run time.

    ## Example
    ```python
    model = Net().cuda().half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    ...
    scaler.step(optimizer)
    ```

    ## Use instead
    ```python
    model = Net().cuda()  # float32 weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    No automatic fix: keeping the weights in float32 doubles their memory, and dropping the
    scaler leaves pure float16 training, which has its own problems (CFX203). The choice is
    yours.

    ## References
    - facts A5, D1: `torch/amp/grad_scaler.py` L274-275 raises
      `ValueError("Attempting to unscale FP16 gradients.")`; reproduced on CPU.
    - `torch/amp/autocast_mode.py`: "You should not call ``half()`` or ``bfloat16()`` on your
      model(s) or inputs when using autocasting."
    """

    code = "CFX204"
    name = "grad-scaler-with-fp16-params"
    severity = Severity.ERROR
    fix_availability = "none"
    triggers = ((b"GradScaler",), (b"half", b"float16"), (b".step(", b"unscale_("), (b"parameters(",))

    VALID = [
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    loss = model(x).mean()\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="float32 weights under float16 autocast: what the scaler is for",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "if args.half:\n"
            "    model.half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="the cast happens only under a condition",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "from peft import get_peft_model\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "model = get_peft_model(model, lora_config)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="PEFT adapters are float32 (the base weights are frozen)",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "master = [p.detach().float().requires_grad_() for p in model.parameters()]\n"
            "optimizer = torch.optim.AdamW(master, lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="the optimizer trains a float32 master copy",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda', enabled=args.amp)\n"
            "scaler.step(optimizer)\n",
            why="the scaler is enabled only for some runs",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "model.float()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="cast back to float32 before training",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "for p in model.parameters():\n"
            "    p.requires_grad = False\n"
            "model.head.float().requires_grad_(True)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="frozen float16 parameters get no gradient; the trained head is float32",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
            "for x, y in loader:\n"
            "    with torch.cuda.amp.autocast():\n"
            "        loss = criterion(model(x), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            why="`.half()` on the model plus the textbook AMP loop",
            line=9,
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "def train(args):\n"
            "    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float16)\n"
            "    model.gradient_checkpointing_enable()\n"
            "    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for batch in loader:\n"
            "        scaler.scale(model(**batch).loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            why="a float16 load trained in full; `unscale_` is the first call that raises",
            line=10,
        ),
        Example(
            "import torch\n"
            "model = Net()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model.to('cuda', dtype=torch.half)\n"
            "scaler = torch.amp.GradScaler()\n"
            "scaler.step(optimizer)\n",
            why="the in-place cast after the optimizer still makes its parameters float16",
            line=6,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        facts = AmpFacts.of(ctx)
        scopes = {id(s.function): s.function for s in facts.scalers if s.enabled is True and s.key}
        for function in scopes.values():
            if not _changes_trainable_params(_scope_body(ctx, function)):
                yield from self._scope(ctx, function, facts)

    def _scope(self, ctx, function, facts: AmpFacts) -> Iterator[Finding]:
        """One pass over a scope's statements in source order. Casts to float16 count only
        when unconditional; anything that may undo them (a cast back, the model handed to
        other code, a rebinding) counts wherever it is."""
        src = ctx.source
        resolver = _resolver(ctx, function)
        scaler_calls = {id(s.call): s for s in facts.scalers}
        fp16: dict[str, _Fp16Model] = {}  # key -> how the module it names became float16
        optimizers: dict[str, _Optimizer] = {}
        scalers: dict[str, Scaler] = {}
        reported: set[str] = set()

        def cast(key: str, dtype: str | None, node: ast.AST, guarded: bool) -> None:
            if dtype is None:
                return  # a device move
            if dtype == "float16":
                if not guarded:
                    fp16[key] = _Fp16Model(node, key)
                    for opt in optimizers.values():
                        if opt.attached == key:
                            opt.model = fp16[key]
            else:
                forget(key)

        def forget(key: str) -> None:
            fp16.pop(key, None)
            for opt in optimizers.values():
                if opt.attached == key:
                    opt.model = None

        def unbind(key: str) -> None:
            fp16.pop(key, None)
            optimizers.pop(key, None)
            scalers.pop(key, None)
            for opt in optimizers.values():
                if opt.attached == key:
                    opt.attached = None  # the optimizer keeps the old module's parameters

        for stmt, guarded in _statements(_scope_body(ctx, function)):
            for call in _calls_in(stmt):
                func = call.func
                receiver = dotted(func.value) if isinstance(func, ast.Attribute) else None
                if receiver is not None:
                    method = func.attr
                    if method in _CASTS or method in ("to", "type", "apply"):
                        dtype = "?" if method == "apply" else _cast_dtype(call, resolver)
                        # Module casts work in place: the name (and an optimizer holding its
                        # parameters) sees the new dtype, whatever the statement binds.
                        cast(receiver, dtype, call, guarded)
                        for key in [k for k in fp16 if receiver.startswith(k + ".")]:
                            if dtype not in (None, "float16"):
                                forget(key)  # a sub-module cast back to float32
                    if (method in ("step", "unscale_") and receiver in scalers and call.args
                            and receiver not in reported):
                        opt = optimizers.get(dotted(call.args[0]) or "")
                        if opt is not None and opt.model is not None:
                            reported.add(receiver)
                            yield self._finding(src, call, opt.model, opt.built, scalers[receiver])
                if (ctx.index.imports.qualify(func) or "") not in _HARMLESS:
                    for arg in [*call.args, *(k.value for k in call.keywords)]:
                        key = dotted(arg.value if isinstance(arg, ast.Starred) else arg)
                        if key is not None and (key in fp16 or any(o.attached == key for o in optimizers.values())):
                            forget(key)  # handed to code that may cast it or wrap its parameters
            for target, value in _assignments(stmt):
                key = dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if key is None:
                    for node in ast.walk(target):
                        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                            unbind(dotted(node) or "")
                    continue
                unbind(key)
                if value is None or isinstance(stmt, ast.AugAssign):
                    continue
                if isinstance(value, ast.Call) and id(value) in scaler_calls:
                    if scaler_calls[id(value)].enabled is True:
                        scalers[key] = scaler_calls[id(value)]
                    continue
                model = _fp16_value(ctx, value, resolver)
                if model is not None:
                    if not guarded:
                        fp16[key] = _Fp16Model(model, key)
                    continue
                model_key = _optimized_model(ctx, value)
                if model_key is not None and not guarded:
                    optimizers[key] = _Optimizer(value, model_key, fp16.get(model_key))

    def _finding(self, src, call: ast.Call, model: _Fp16Model, built: ast.Call, scaler: Scaler) -> Finding:
        return self.finding(
            src.span_of_node(call),
            f"`{_short(src, call)}` raises `ValueError: Attempting to unscale FP16 gradients.`: the "
            f"optimizer (line {built.lineno}) trains the parameters of `{model.key}`, which are float16 "
            f"(`{_short(src, model.cast, 60)}`, line {model.cast.lineno}). A GradScaler is for float32 "
            "weights under float16 autocast; keep the weights in float32 and autocast the forward, "
            "or train without the scaler.",
            related=[
                Related(src.span_of_node(model.cast), "the parameters become float16 here"),
                Related(src.span_of_node(scaler.call), "the GradScaler"),
            ],
        )


def _changes_trainable_params(body: list[ast.stmt]) -> bool:
    """Freezing or replacing parameters (`p.requires_grad = False`, `requires_grad_()`,
    `p.data = p.data.float()`): frozen float16 parameters get no gradient and raise
    nothing, and the trained ones may be float32. cfgfix cannot follow which is which."""
    for stmt, _ in _statements(body):
        for target, _value in _assignments(stmt):
            if isinstance(target, ast.Attribute) and target.attr in ("requires_grad", "data"):
                return True
        if any(isinstance(c.func, ast.Attribute) and c.func.attr == "requires_grad_" for c in _calls_in(stmt)):
            return True
    return False


def _calls_in(stmt: ast.stmt) -> list[ast.Call]:
    """Calls of one statement's own expressions (not its nested blocks), innermost first."""
    roots = [v for name, v in ast.iter_fields(stmt) if name not in ("body", "orelse", "finalbody", "handlers", "cases")]
    stack = []
    for value in roots:
        stack.extend(value if isinstance(value, list) else [value])
    seen = []
    while stack:
        node = stack.pop()
        if not isinstance(node, ast.AST) or isinstance(node, (ast.Lambda, ast.stmt)):
            continue
        if isinstance(node, ast.Call):
            seen.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return sorted(seen, key=lambda c: (c.end_lineno, c.end_col_offset))


def _is_expr_stmt(stmt: ast.stmt, call: ast.Call) -> bool:
    return isinstance(stmt, ast.Expr) and stmt.value is call


def _cast_dtype(call: ast.Call, resolver: _Resolver) -> str | None:
    """The dtype a method call casts to: a dtype, "?" when it may cast to an unknown one,
    None when it keeps the dtype (a device move)."""
    method = call.func.attr  # type: ignore[attr-defined]
    if method in _CASTS:
        return _CASTS[method] if not call.args and not call.keywords else "?"
    if method == "type":
        return "?"
    if method != "to":
        return None
    found = None
    for arg in [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", None))]:
        dtype = resolver.dtype(arg)
        if dtype is not None and dtype != "default":
            found = dtype
        elif not _looks_like_device(arg, resolver):
            return "?"
    return found


def _looks_like_device(node: ast.expr, resolver: _Resolver) -> bool:
    node = resolver.deref(node)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, int)) and not isinstance(node.value, bool)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Call):
        return resolver.imports.qualify(node.func) == "torch.device"
    name = dotted(node)
    return bool(name) and "device" in name.split(".")[-1].lower() or name in ("rank", "local_rank")


def _fp16_value(ctx, value: ast.expr, resolver: _Resolver) -> ast.AST | None:
    """The call that makes `value` a float16 module: the outermost cast of a method chain
    (`Net().cuda().half()`, `.half().to(device)`), or a float16 `from_pretrained` load."""
    node = value
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method = node.func.attr
        if method in _CASTS or method in ("to", "type"):
            dtype = _cast_dtype(node, resolver)
            if dtype == "float16":
                return node
            if dtype is not None:
                return None  # another dtype, or one cfgfix cannot tell
        elif method == "from_pretrained":
            keywords = {k.arg: k.value for k in node.keywords}
            if None in keywords or any(k in keywords for k in ("load_in_4bit", "load_in_8bit", "quantization_config")):
                return None
            dtype = keywords.get("dtype", keywords.get("torch_dtype"))
            return node if dtype is not None and resolver.dtype(dtype, strings=True) == "float16" else None
        elif method not in _DEVICE_ONLY:
            return None
        node = node.func.value
    return None


def _optimized_model(ctx, value: ast.expr) -> str | None:
    """`torch.optim.AdamW(model.parameters(), ...)` -> "model": the one model whose own
    parameters the optimizer trains (filters and comprehensions allowed, nothing else)."""
    if not isinstance(value, ast.Call):
        return None
    name = ctx.index.imports.qualify(value.func) or ""
    if not _OPTIMIZER.search(name):
        return None
    params = value.args[0] if value.args else next((k.value for k in value.keywords if k.arg == "params"), None)
    if params is None:
        return None
    model = None
    for node in ast.walk(params):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("parameters", "named_parameters") and not node.args:
            key = dotted(func.value)
            if key is None or (model is not None and key != model):
                return None
            model = key
        elif not (isinstance(func, ast.Name) and func.id in ("filter", "list", "tuple")):
            return None
    return model


# ============================================================================ CFX207


@register
class DeprecatedCudaAmpApi(Rule):
    """## What it does
    Flags `torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)` (also as
    decorators, under aliases, and imported with `from torch.cuda.amp import autocast,
    GradScaler`) in a project whose torch is known to be 2.4 or newer.

    ## Why is this bad?
    Since torch 2.4 both are deprecated and emit a `FutureWarning` on every construction:
    "`torch.cuda.amp.autocast(args...)` is deprecated. Please use
    `torch.amp.autocast('cuda', args...)` instead." They are thin subclasses of the
    device-generic `torch.amp` classes, which are the supported spelling.

    cfgfix reports this only when the project's torch (its pin, else the installed one) is
    known to be at least 2.4. Below 2.4 the old API is not deprecated; when the version is
    unknown or the pin straddles 2.4 (`torch>=2.0`) the finding would be wrong for some of
    the admitted versions, and its fix could even break an older torch, so cfgfix stays
    silent. (The issue reports date the warning to 2.4; `torch.amp.GradScaler` may exist
    from 2.3, which is unverified, so 2.4 gates both.)

    ## Example
    ```python
    scaler = torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast(dtype=torch.float16):
        loss = model(x).loss
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.amp.autocast("cuda", dtype=torch.float16):
        loss = model(x).loss
    ```

    ## Fix safety
    Safe: the old classes only forward to the new ones with `"cuda"`. Two details keep it
    exact. `torch.cuda.amp.autocast`'s positional parameters are `(enabled, dtype,
    cache_enabled)`, unlike `torch.amp.autocast("cuda", dtype, enabled, ...)`, so the fix
    writes positional arguments as keywords. And the old class pins `dtype=torch.float16`
    when none is given, while the new one takes the current autocast dtype (float16 unless
    an enclosing region or `torch.set_autocast_dtype` changed it), so the fix writes
    `dtype=torch.float16` explicitly. With `from torch.cuda.amp import ...` the import and
    every call are rewritten together, and no fix is offered when that import brings other
    names or the imported name is used other than by calling it. `isinstance(x,
    torch.cuda.amp.GradScaler)` elsewhere would stop matching the new object: the fix is
    withheld when the file refers to the old class without calling it.

    `torch.cuda.amp.custom_fwd` / `custom_bwd` (deprecated the same way, now
    `torch.amp.custom_fwd(device_type="cuda")`) and `torch.cpu.amp.*` are not covered yet.

    ## References
    - facts A5: `torch/cuda/amp/autocast_mode.py` L13-17 and `grad_scaler.py` L18-22 (torch
      2.13), the `@deprecated(..., category=FutureWarning)` messages; deprecation first
      reported with torch 2.4.0 (mit-han-lab/efficientvit#127, WenjieDu/PyPOTS#520).
    """

    code = "CFX207"
    name = "deprecated-cuda-amp-api"
    severity = Severity.INFO
    fix_availability = "sometimes"
    triggers = ((b"cuda.amp", b"cuda import amp"), (b"autocast", b"GradScaler"))

    _PIN = {"requirements.txt": "torch==2.4.1\n"}

    VALID = [
        Example(
            "import torch\n"
            "with torch.cuda.amp.autocast():\n"
            "    loss = model(x).loss\n",
            why="torch 2.3 does not deprecate it",
            files={"requirements.txt": "torch==2.3.1\n"},
        ),
        Example(
            "import torch\n"
            "scaler = torch.cuda.amp.GradScaler()\n",
            why="no torch pin and none installed: the version is unknown",
        ),
        Example(
            "import torch\n"
            "scaler = torch.cuda.amp.GradScaler()\n",
            why="a pin that admits versions before 2.4",
            files={"requirements.txt": "torch>=2.0\n"},
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.amp.autocast('cuda', dtype=torch.float16):\n"
            "    loss = model(x).loss\n",
            why="already the current API",
            files=_PIN,
        ),
        Example(
            "import torch\n"
            "with torch.cpu.amp.autocast():\n"
            "    out = model(x)\n",
            why="`torch.cpu.amp` is not this rule's",
            files=_PIN,
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "with torch.no_grad(), torch.cuda.amp.autocast(dtype=weight_dtype):\n"
            "    latents = vae.encode(pixels).latent_dist.sample()\n",
            why="the sdxl story: an explicit dtype is kept",
            line=2,
            files=_PIN,
            fixed="import torch\n"
            "with torch.no_grad(), torch.amp.autocast(\"cuda\", dtype=weight_dtype):\n"
            "    latents = vae.encode(pixels).latent_dist.sample()\n",
        ),
        Example(
            "import torch as th\n"
            "scaler = th.cuda.amp.GradScaler(2.0**10, enabled=True)\n",
            why="an alias; GradScaler's positional arguments line up after the device",
            line=2,
            files={"requirements.txt": "torch>=2.4,<3\n"},
            fixed="import torch as th\n"
            "scaler = th.amp.GradScaler(\"cuda\", 2.0**10, enabled=True)\n",
        ),
        Example(
            "import torch\n"
            "with torch.cuda.amp.autocast(True):\n"
            "    loss = model(x).loss\n",
            why="a positional `enabled` becomes a keyword; the float16 default is written out",
            line=2,
            files=_PIN,
            fixed="import torch\n"
            "with torch.amp.autocast(\"cuda\", enabled=True, dtype=torch.float16):\n"
            "    loss = model(x).loss\n",
        ),
        Example(
            "import torch\n"
            "class Block(torch.nn.Module):\n"
            "    @torch.cuda.amp.autocast(enabled=False)\n"
            "    def forward(self, x):\n"
            "        return self.proj(x.float())\n",
            why="the decorator form; a disabled region needs no dtype",
            line=3,
            files=_PIN,
            fixed="import torch\n"
            "class Block(torch.nn.Module):\n"
            "    @torch.amp.autocast(\"cuda\", enabled=False)\n"
            "    def forward(self, x):\n"
            "        return self.proj(x.float())\n",
        ),
        Example(
            "from torch.cuda.amp import autocast\n"
            "def step(model, x):\n"
            "    with autocast():\n"
            "        return model(x)\n",
            why="`from torch.cuda.amp import`: the import and the call change together",
            line=3,
            files=_PIN,
            fixed="from torch.amp import autocast\n"
            "import torch\n"
            "def step(model, x):\n"
            "    with autocast(\"cuda\", dtype=torch.float16):\n"
            "        return model(x)\n",
        ),
        Example(
            "from torch.cuda.amp import autocast, custom_fwd\n"
            "with autocast():\n"
            "    out = model(x)\n",
            why="the import also brings a name that `torch.amp` spells differently: no fix",
            line=2,
            files=_PIN,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        torch_version = ctx.versions.get("torch")
        if torch_version.at_least("2.4") is not True:
            return
        sites = ctx.index.calls_named(*AUTOCAST_CUDA, *SCALER_CUDA)
        if not sites:
            return
        src = ctx.source
        # Calls through `from torch.cuda.amp import ...` share one all-or-nothing fix.
        group_fix = _ImportRewrite(ctx).edits()
        if _refers_without_call(ctx, SCALER_CUDA) or _refers_without_call(ctx, AUTOCAST_CUDA):
            group_fix = None
        where = {"": "", "installed": " (installed)"}.get(torch_version.source, f" in {torch_version.source}")
        pinned = f"torch{torch_version.specifier}{where}"
        for site in sites:
            call = site.node
            scaler = site.name in SCALER_CUDA
            new_name = "GradScaler" if scaler else "autocast"
            old_text = site.name.replace(".autocast_mode.", ".").replace(".grad_scaler.", ".")
            if isinstance(call.func, ast.Name):
                edits = group_fix
            else:
                func_text = _attribute_func(ctx, call.func, new_name)
                edits = _call_edits(ctx, call, scaler, func_text, site.context.function)
                if _refers_without_call(ctx, SCALER_CUDA if scaler else AUTOCAST_CUDA):
                    edits = None  # `isinstance(x, torch.cuda.amp.GradScaler)` would stop matching
            yield self.finding(
                src.span_of_node(call),
                f"`{old_text}(...)` is deprecated since torch 2.4 and warns (FutureWarning) every "
                f"time it is built; this project uses {pinned}. Use "
                f"`torch.amp.{new_name}(\"cuda\", ...)`: the old class only forwards to it.",
                fix=Fix(tuple(edits), f"Use `torch.amp.{new_name}(\"cuda\", ...)`") if edits else None,
            )


def _torch_name(ctx) -> tuple[str, list]:
    """How to spell `torch` here, and the edit that imports it when nothing binds it."""
    local = ctx.index.imports.local_name_for("torch")
    if local is not None:
        return local, []
    tree = ctx.document.tree
    last_line = len(ctx.source.line_starts) + 1
    return "torch", [python_edits.insert_import(ctx.source, tree, "import torch", last_line)]


def _attribute_func(ctx, func: ast.expr, new_name: str) -> tuple[str, list] | None:
    """`torch.cuda.amp.autocast` -> `torch.amp.autocast` (keeping `th` for `import torch as
    th`); `amp.autocast` after `from torch.cuda import amp` -> `torch.amp.autocast`."""
    root = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return None
    if ctx.index.imports.aliases.get(root.id) == "torch":
        return f"{root.id}.amp.{new_name}", []
    torch, edits = _torch_name(ctx)
    return f"{torch}.amp.{new_name}", edits


def _call_edits(ctx, call: ast.Call, scaler: bool, func_text: tuple[str, list] | None, function=None) -> list | None:
    """Edits that turn one old-API call into the new one, or None when that is not exact."""
    if func_text is None:
        return None
    src = ctx.source
    text, edits = func_text
    edits = list(edits)
    if any(isinstance(a, ast.Starred) for a in call.args) and not scaler:
        return None  # positional arguments that cannot be named
    items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    func_end = python_edits.node_range(src, call.func)[1]
    paren = src.text.find("(", func_end)
    if paren < 0:
        return None
    extra = ""
    if not scaler:
        args, hidden = _bind(call, _LEGACY_PARAMS)
        if len(call.args) > len(_LEGACY_PARAMS):
            return None
        enabled = _resolver(ctx, function).boolean(args["enabled"]) if "enabled" in args else True
        if "dtype" not in args and enabled is not False:
            if hidden:
                return None  # `**kwargs` may or may not carry a dtype
            torch, more = _torch_name(ctx)
            edits.extend(more)
            extra = f"dtype={torch}.float16"
    if src.node_text(call.func) != text:
        edits.append(python_edits.replace_node(src, call.func, text))
    # Insertions by offset, so two at one point keep their order: `("cuda", enabled=True`.
    inserts: dict[int, str] = {paren + 1: '"cuda"' + (", " if items else "")}
    if not scaler:
        for param, arg in zip(_LEGACY_PARAMS, call.args):
            start = python_edits.node_range(src, arg)[0]
            inserts[start] = inserts.get(start, "") + f"{param}="
    if extra:
        end = python_edits.node_range(src, items[-1])[1] if items else paren + 1
        inserts[end] = inserts.get(end, "") + f", {extra}"
    edits.extend(Edit(src.path, offset, offset, content) for offset, content in sorted(inserts.items()))
    return edits


def _function_of(ctx, call: ast.Call):
    if "amp-call-functions" not in ctx.notes:
        ctx.notes["amp-call-functions"] = {id(site.node): site.context.function for site in ctx.index.calls}
    return ctx.notes["amp-call-functions"].get(id(call))


def _refers_without_call(ctx, names: frozenset[str]) -> bool:
    """The file names the old class other than by calling it (`isinstance(s, GradScaler)`)."""
    key = ("amp-refers", names)
    if key in ctx.notes:
        return ctx.notes[key]
    ctx.notes[key] = result = _scan_references(ctx, names)
    return result


def _scan_references(ctx, names: frozenset[str]) -> bool:
    called = {id(site.node.func) for site in ctx.index.calls_named(*names)}
    imports = ctx.index.imports
    for node in ast.walk(ctx.document.tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in called:
            if isinstance(node, ast.Attribute) and isinstance(_parent_of(ctx, node), ast.Attribute):
                continue  # part of a longer chain
            if imports.qualify(node) in names and isinstance(getattr(node, "ctx", None), ast.Load):
                return True
    return False


class _ImportRewrite:
    """`from torch.cuda.amp import autocast, GradScaler` -> `from torch.amp import ...`, with
    every call of those names rewritten: all of it in one fix, or nothing."""

    _FROM = re.compile(r"from\s+torch\.cuda\.amp(?=\s+import\b)")

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def edits(self) -> list | None:
        ctx, src = self.ctx, self.ctx.source
        statements = [
            node for node in ast.walk(ctx.document.tree)
            if isinstance(node, ast.ImportFrom) and node.module == "torch.cuda.amp" and not node.level
        ]
        if not statements:
            return None
        edits = []
        locals_: dict[str, str] = {}
        for stmt in statements:
            for alias in stmt.names:
                if alias.name not in ("autocast", "GradScaler"):
                    return None  # custom_fwd & co. are spelled differently in torch.amp
                locals_[alias.asname or alias.name] = alias.name
            start, end = python_edits.node_range(src, stmt)
            match = self._FROM.match(src.text, start, end)
            if match is None:
                return None
            edits.append(Edit(src.path, match.start(), match.end(), "from torch.amp"))
        # Each local name is bound by these imports only, and only ever called.
        binders = 0
        for node in ast.walk(ctx.document.tree):
            if isinstance(node, ast.Name) and node.id in locals_:
                if not isinstance(node.ctx, ast.Load):
                    return None
                parent = _parent_of(ctx, node)
                if not (isinstance(parent, ast.Call) and parent.func is node):
                    return None
                scaler = locals_[node.id] == "GradScaler"
                more = _call_edits(ctx, parent, scaler, (node.id, []), _function_of(ctx, parent))
                if more is None:
                    return None
                edits.extend(more)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in locals_:
                return None
            elif isinstance(node, ast.alias) and (node.asname or node.name).split(".")[0] in locals_:
                binders += 1
            elif isinstance(node, ast.arg) and node.arg in locals_:
                return None
        if binders != sum(len(s.names) for s in statements):
            return None
        return edits
