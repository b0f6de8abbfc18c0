"""CFX202 grad-scaler-with-bf16."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cfgfix.analysis.amp import AmpFacts, Scaler, parent_of, short
from cfgfix.analysis.fp16_text import may_run_float16, may_run_float16_text
from cfgfix.analysis.names import dotted
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

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
    resolve, when the file mentions float16 / `.half()` / fp16 anywhere (except in a cast
    of a state dict's tensors, `{k: v.half() for k, v in model.state_dict().items()}` when
    a checkpoint is saved: that makes copies and leaves the model's dtype alone), when the scaler is
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
    # float16 may be in play somewhere in the file: a scaler there may be needed after all
    # (the text says so unless a state-dict cast at save time may explain the mention)
    trigger_check = staticmethod(lambda data: not may_run_float16_text(data))

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
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n"
            "model.half()\n"
            "torch.save({k: v.half() for k, v in model.state_dict().items()}, 'w.pt')\n",
            why="the model itself is cast to float16: not only a state dict's copies",
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n"
            "inputs = {k: v.half() for k, v in batch.items()}\n"
            "torch.save(model.state_dict(), 'w.pt')\n",
            why="a float16 cast of the batch, not of a state dict: float16 is in play",
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
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "ctx = torch.autocast('cuda', dtype=torch.bfloat16)\n"
            "with ctx:\n"
            "    loss = model(x).loss\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n"
            "state_dict = {k: v.half().cpu() for k, v in model.state_dict().items()}\n"
            "torch.save(state_dict, 'w.pt')\n",
            why="float16 only in copies of the state dict written to disk: the run is bfloat16",
            line=2,
            fixed="import torch\n"
            "ctx = torch.autocast('cuda', dtype=torch.bfloat16)\n"
            "with ctx:\n"
            "    loss = model(x).loss\n"
            "loss.backward()\n"
            "optimizer.step()\n"
            "state_dict = {k: v.half().cpu() for k, v in model.state_dict().items()}\n"
            "torch.save(state_dict, 'w.pt')\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        if may_run_float16(ctx.source.text.encode("utf-8"), ctx.document.tree):
            return
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
                f"`{scaler.key} = {short(src, scaler.call, 50)}` scales a loss that is only computed "
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
                parent = parent_of(ctx, call)
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


def _expression_statement(ctx, call: ast.Call) -> ast.Expr | None:
    parent = parent_of(ctx, call)
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
        parent = parent_of(ctx, node)
        grand = parent_of(ctx, parent) if parent is not None else None
        if (isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in _SCALER_METHODS
                and isinstance(grand, ast.Call) and grand.func is parent):
            uses.append((parent.attr, grand))
        else:
            return None
    return uses
