"""CFX201 fp16-autocast-without-grad-scaler."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from cfgfix.analysis.amp import (
    AUTOCAST_CUDA,
    AUTOCAST_GENERIC,
    AUTOCAST_NAMES,
    OPTIMIZER,
    AmpFacts,
    Autocast,
    assignments,
    exclusive_arms,
    guarded_statements,
    scope_body,
    scope_resolver,
    short,
)
from cfgfix.analysis.names import dotted, single_assignments
from cfgfix.core import Finding, Related, Severity
from cfgfix.rules.base import Conditioned, Example, Rule, register
from cfgfix.rules.launch_flags import flag_qualifiers

_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})


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


_SCALER_USE = re.compile(rb"caler\w*\s*[(.\[]|caler\w*\s*=")


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
    (`TrainingArguments(fp16=True)`; a `Trainer` imported, built, or subclassed through the
    project's own classes — `TrainingArguments` alone, subclassed to parse a script's own
    options, scales nothing), DeepSpeed engines (`model_engine.backward`),
    Lightning (`precision="16-mixed"`), apex; and wherever a scaler appears in the file at
    all. It also stays silent for `enabled=False`, for regions under `torch.no_grad()`, for a
    dtype it cannot resolve (`dtype=args.dtype`), for a device type it cannot resolve
    without an explicit dtype, when the loss leaves the function before `backward()`, and in
    files that never build or step an optimizer (gradients for attribution, not training).
    An unscaled `loss.backward()` in the `else` of `if args.deepspeed:` (a DeepSpeed engine's
    `backward` on the other side) is reported only when some launch of the script leaves
    `--deepspeed` off, or no launch in the project runs it.
    An `enabled=args.fp16` switch is flagged: whenever it is on, nothing scales the loss, and
    so is a region on one side of an `if` whose `else` runs the forward without autocast,
    and a conditional alias (`autocast = torch.cuda.amp.autocast if args.amp else
    contextlib.suppress`, then `with autocast():`).
    `device_type="cuda" if torch.cuda.is_available() else "cpu"` is CUDA: the training runs
    take that side.

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
    condition = "launch-flags"  # the launches that reach the unscaled backward (rules/launch_flags.py)
    # A scaler used in the file (GradScaler, a NativeScaler wrapper, `loss_scaler(...)`,
    # `self.scaler.scale(...)`) means the loss may be scaled: the rule cannot match, so the
    # file is not parsed for it. A name that is only imported (`from torch.cuda.amp import
    # autocast, GradScaler`) and never called does not scale anything.
    trigger_check = staticmethod(lambda data: _SCALER_USE.search(data) is None)

    _DS_BRANCH = (
        "import argparse\nimport torch\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--deepspeed', action='store_true')\n"
        "args = parser.parse_args()\noptimizer = torch.optim.AdamW(model.parameters())\n"
        "for batch in loader:\n"
        "    with torch.autocast('cuda', dtype=torch.float16):\n"
        "        loss = model(batch)\n"
        "    if args.deepspeed:\n"
        "        engine.backward(loss)\n"
        "        engine.step()\n"
        "    else:\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )

    VALID = [
        Example(_DS_BRANCH, "the unscaled backward is the `else` of `if args.deepspeed:`, and every launch passes "
                "--deepspeed (the engine scales the loss)",
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"}),
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
            "from trainers import BaseTrainer\n"
            "class MyTrainer(BaseTrainer):\n"
            "    def training_step(self, model, inputs):\n"
            "        with torch.autocast('cuda'):\n"
            "            loss = self.compute_loss(model, inputs)\n"
            "        loss.backward()\n"
            "        self.optimizer.step()\n"
            "        return loss.detach()\n",
            files={"trainers.py": "from transformers import Trainer\nclass BaseTrainer(Trainer):\n"
                   "    def compute_loss(self, model, inputs, return_outputs=False):\n"
                   "        return model(**inputs).loss\n"},
            why="an HF Trainer subclass through the project's own base class",
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
        Example(_DS_BRANCH, "a launch that leaves --deepspeed off reaches the unscaled backward", line=8,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"
                                   "python train.py\n"}),
        Example(_DS_BRANCH, "no launch in the project: the script may run either way", line=8),
        Example(
            "import torch\n"
            "from dataclasses import dataclass\n"
            "from transformers import HfArgumentParser, TrainingArguments as HfArgs\n"
            "@dataclass\n"
            "class TrainingArguments(HfArgs):\n"
            "    auto_cast: bool = True\n"
            "def train():\n"
            "    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
            "    optimizer = torch.optim.Adam(model.parameters())\n"
            "    for batch in loader:\n"
            "        if args.auto_cast:\n"
            "            device_type = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "            with torch.autocast(device_type=device_type):\n"
            "                loss = model(**batch)[0]\n"
            "        else:\n"
            "            loss = model(**batch)[0]\n"
            "        loss.backward()\n"
            "        optimizer.step()\n",
            why="`TrainingArguments` subclassed only to parse the script's options: no Trainer runs this "
                "loop; the `else` without autocast does not hide the region",
            line=13,
        ),
        Example(
            "import torch\n"
            "from torch.cuda.amp import autocast, GradScaler\n"
            "class Trainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.model, self.optimizer = model, optimizer\n"
            "        self.use_amp = True\n"
            "    def train_epoch(self, loader):\n"
            "        for batch in loader:\n"
            "            with autocast(enabled=self.use_amp):\n"
            "                loss = self.model(batch).mean()\n"
            "            loss.backward()\n"
            "            self.optimizer.step()\n",
            why="a trainer class: `enabled` set once in `__init__`, GradScaler imported but never built",
            line=9,
        ),
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
                finding = self.finding(
                    src.span_of_node(region.call),
                    f"`{short(src, region.call)}` runs the forward in float16{how}{when}, and "
                    f"`{short(src, backward.func.value, 40)}.backward()` on line {backward.lineno} "
                    "backpropagates it with no loss scaling: gradients below float16's range "
                    "(smallest normal 6.1e-05) flush to zero and those updates are silently lost. "
                    "Autocast only picks the dtype of the forward ops; their float16 gradients are "
                    "protected only by scaling the loss. Use `torch.amp.GradScaler(\"cuda\")` "
                    "(`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`), "
                    "or bfloat16 autocast on GPUs that support it.",
                    related=[Related(src.span_of_node(backward), "backward without a GradScaler")],
                )
                # the unscaled backward in the `else` of `if args.deepspeed:` runs only on the
                # launches that leave --deepspeed off (project.py `condition_holds`)
                qualifiers = flag_qualifiers(ctx, backward)
                yield Conditioned(finding, self.condition + qualifiers) if qualifiers else finding
                break

    @staticmethod
    def _regions(ctx, region: Autocast) -> list[ast.stmt]:
        """`with` statements the call opens: directly, or through a name bound once."""
        spelled = dotted(region.call.func)  # a conditional alias's own name (`autocast()`)
        for site in ctx.index.calls_named(*{region.api, spelled or region.api}):
            if site.node is region.call:
                stmt = site.context.stmt
                break
        else:  # pragma: no cover - the call came from the index
            return []
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            if not any(item.context_expr is region.call for item in stmt.items):
                return []
            if region.defaulted and region.api in AUTOCAST_GENERIC and _inside_autocast(ctx, stmt):
                return []  # without a dtype it inherits the enclosing region's dtype
            return [stmt]
        if not (isinstance(stmt, ast.Assign) and stmt.value is region.call and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return []
        name = stmt.targets[0].id
        if name not in single_assignments(scope_body(ctx, region.function)):
            return []
        return [
            s for s, _ in guarded_statements(scope_body(ctx, region.function))
            if isinstance(s, (ast.With, ast.AsyncWith))
            and any(isinstance(i.context_expr, ast.Name) and i.context_expr.id == name for i in s.items)
        ]

    @staticmethod
    def _unscaled_backward(ctx, with_stmt: ast.stmt, function) -> ast.Call | None:
        # No gradient flows out of a no-grad region.
        context = ctx.index.context_of_stmt(with_stmt)
        resolver = scope_resolver(ctx, function)
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
        for stmt, _ in guarded_statements(with_stmt.body):
            for target, value in assignments(stmt):
                if _has_call(value) or _names(value) & tainted:
                    tainted |= _names(target)
        if not tainted:
            return None
        for stmt, _ in guarded_statements(scope_body(ctx, function)):
            if not _before(with_stmt, stmt) or _within(stmt, with_stmt):
                continue
            if exclusive_arms(ctx, function, with_stmt, stmt):
                continue  # the `else` of the region's `if`: it neither sees nor replaces the region's values
            for target, value in assignments(stmt):
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
    return any(site.name and OPTIMIZER.search(site.name) and "optim" in site.name for site in ctx.index.calls)


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
