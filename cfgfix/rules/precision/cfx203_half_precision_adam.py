"""CFX203 half-precision-adam."""

from __future__ import annotations

import math
from collections.abc import Iterable

from cfgfix.core import Finding, Severity
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.precision.common import builds_torch_adam, dtype_origin, optimizer_name

# float16: values at or below 2**-25 round to 0; 2**-14 is the smallest normal number.
FP16_ROUNDS_TO_ZERO = 2.0**-25  # 2.98e-08
FP16_SMALLEST_NORMAL = 2.0**-14  # 6.10e-05


@register
class HalfPrecisionAdam(Rule):
    """## What it does
    Flags a torch `Adam`/`AdamW` built over float16 weights (`model.half()`,
    `.to(torch.float16)`, `from_pretrained(..., torch_dtype=torch.float16)`) with the default
    `eps=1e-8`, or any `eps` below float16's smallest normal number (6.1e-05), when nothing
    keeps float32 master weights.
    The weights are followed through a trainer class's methods (a model loaded in `__init__`,
    the optimizer built in another method).

    ## Why is this bad?
    torch Adam keeps its moment estimates in the parameter's dtype, here float16. The second
    moment `v = (1 - beta2) * grad**2` underflows to 0 for every gradient smaller than about
    5e-3 (with the default betas), and `eps=1e-8` itself rounds to 0 in float16 (anything at
    or below 2**-25 = 2.98e-08 does). The first `optimizer.step()` then divides by zero:
    the weights become `-inf`/NaN (pytorch/pytorch#147437). A larger eps that float16 can
    still store but that is below its smallest normal number (6.1e-05) does not divide by
    zero, but the step becomes `lr * m / eps`: 1000x the learning rate for a gradient of 1e-3
    with `eps=1e-6`. No float32 copy of the weights exists to fall back on.

    ## Example
    ```python
    model = Net().cuda().half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ```

    ## Use instead
    ```python
    model = Net().cuda()  # float32 weights and optimizer state
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).loss
    scaler.scale(loss).backward()
    ```
    Or let a framework keep float32 master weights (DeepSpeed's fp16 engine, accelerate's
    mixed precision over float32 weights). `eps=1e-4` (the workaround in
    pytorch/pytorch#8860) avoids the division by zero, but updates still lose everything
    below float16's precision.

    ## Fix safety
    No automatic fix: the remedy (float32 weights with autocast, or a framework's master
    weights) changes memory and numerics. cfgfix stays silent when the eps cannot be read
    (`eps=args.eps`, `**kwargs`), with `fused=True` (the fused kernel does its arithmetic in
    float32 and does not divide by zero, measured on CPU; its steps still grow once `v`
    underflows in storage, but that is not this rule's claim), when the optimizer or model goes to
    `accelerator.prepare`, `deepspeed.initialize`, `amp.initialize`, a `*Trainer`, FSDP or
    PEFT (but a `.half()` of the whole model after `get_peft_model` casts the adapters too,
    and is followed), when the parameters are copied (`[p.float() for p in model.parameters()]` is a
    master copy), and when the model is cast again, frozen, or its parameters edited in a loop.

    ## References
    - facts A6: torch Adam stores `exp_avg`/`exp_avg_sq` in the parameter dtype; an fp16
      weight of 1.0 becomes `-inf` after one step with eps=1e-8 (for-loop and foreach
      implementations, CPU); pytorch/pytorch#147437, #8860; chainer/chainer#6299.
    - `torch.finfo(torch.float16)`: smallest normal 6.104e-05, smallest subnormal 5.96e-08.
    """

    code = "CFX203"
    name = "half-precision-adam"
    severity = Severity.ERROR
    fix_availability = "none"
    triggers = ((b"Adam",), (b"parameters(",), (b"float16", b".half(", b"'half'", b'"half"'))
    trigger_check = staticmethod(builds_torch_adam)

    VALID = [
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)\n"
            "loss = model(x).sum()\nloss.backward()\noptimizer.step()\n",
            why="an eps of 1e-4 is a normal float16 number: no division by zero",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), fused=True)\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="`fused=True` computes the update in float32",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.Adam(model.parameters(), eps=args.eps)\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="an eps cfgfix cannot resolve",
        ),
        Example(
            "import torch\nfrom accelerate import Accelerator\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "model = Net().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(x).sum())\noptimizer.step()\n",
            why="accelerate may run DeepSpeed or FSDP, which keep or make float32 weights",
        ),
        Example(
            "import deepspeed\nimport torch\n"
            "model = Net().half()\n"
            "optimizer = torch.optim.Adam(model.parameters())\n"
            "engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config='ds.json')\n"
            "engine.backward(engine(x).sum())\nengine.step()\n",
            why="DeepSpeed's fp16 engine keeps float32 master weights",
        ),
        Example(
            "import torch\nfrom apex import amp\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.Adam(model.parameters())\n"
            "model, optimizer = amp.initialize(model, optimizer, opt_level='O2')\n"
            "loss = model(x).sum()\nloss.backward()\noptimizer.step()\n",
            why="apex O2 keeps float32 master weights",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "master = [p.detach().clone().float() for p in model.parameters()]\n"
            "optimizer = torch.optim.Adam(master)\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="the optimizer steps float32 master copies, not the float16 parameters",
        ),
        Example(
            "import torch\n"
            "model = Net().half()\n"
            "model.float()\n"
            "optimizer = torch.optim.Adam(model.parameters())\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="cast back to float32 before the optimizer is built",
        ),
        Example(
            "import torch\n"
            "model = Net()\n"
            "if args.fp16:\n"
            "    model.half()\n"
            "optimizer = torch.optim.Adam(model.parameters())\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="branches disagree about the dtype",
        ),
        Example(
            "import torch\nimport bitsandbytes as bnb\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "optimizer = bnb.optim.AdamW8bit(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="not a torch Adam: bitsandbytes keeps its own state",
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="PEFT trains float32 adapters; the float16 base stays frozen",
        ),
        Example(
            "import torch\n"
            "teacher = Teacher().half().eval()\n"
            "student = Student()\n"
            "optimizer = torch.optim.Adam(student.parameters())\n"
            "loss = distill(student(x), teacher(x))\nloss.backward()\noptimizer.step()\n",
            why="the float16 model is not the one trained",
        ),
        Example(
            "import torch\n"
            "model = Net().half()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="SGD has no eps and no second moment",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="bfloat16 has float32's range: eps and v do not underflow (that is CFX205)",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "class Runner:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)\n"
            "    def to_fp32(self):\n"
            "        self.model.float()\n"
            "    def configure_optimizers(self):\n"
            "        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)\n"
            "    def step(self, batch):\n"
            "        self.model(**batch).loss.backward()\n"
            "        self.optimizer.step()\n",
            why="another method of the class casts the model back to float32",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x.cuda().half()), y.cuda())\n"
            "    optimizer.zero_grad()\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="`.half()` on a plain module, default eps",
            line=3,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "nd = ['bias', 'norm']\n"
            "groups = [\n"
            "    {'params': [p for n, p in model.named_parameters() if not any(k in n for k in nd)], 'weight_decay': 0.1},\n"
            "    {'params': [p for n, p in model.named_parameters() if any(k in n for k in nd)], 'weight_decay': 0.0},\n"
            "]\n"
            "optimizer = torch.optim.AdamW(groups, lr=2e-5, eps=1e-8)\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="a float16 load; param groups from `named_parameters()`; an explicit eps=1e-8",
            line=9,
        ),
        Example(
            "from torch import optim\nimport torch\n"
            "class Runner:\n"
            "    def __init__(self, net):\n"
            "        self.net = net.to(torch.float16)\n"
            "        self.opt = optim.AdamW(params=self.net.parameters(), eps=1e-6)\n"
            "    def step(self, x):\n"
            "        self.net(x).sum().backward()\n"
            "        self.opt.step()\n",
            why="`self.net` within one method; `params=`; eps=1e-6 survives in float16 but blows up the step",
            line=6,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "class Runner:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16).cuda()\n"
            "    def configure_optimizers(self):\n"
            "        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)\n"
            "    def step(self, batch):\n"
            "        self.model(**batch).loss.backward()\n"
            "        self.optimizer.step()\n",
            why="a trainer class: loaded in `__init__`, the optimizer built in another method",
            line=7,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        from cfgfix.analysis.optimizers import optimizer_analysis  # heavy: only for files that passed the prefilter

        analysis = optimizer_analysis(ctx)
        src = ctx.source
        for build in analysis.builds:
            if build.hidden or build.fused or build.eps is None or build.eps >= FP16_SMALLEST_NORMAL:
                continue
            source = next(
                (s for s in build.sources if s.dtype == "float16" and not analysis.owner_of(build, s)), None
            )
            if source is None:
                continue
            origin, related = dtype_origin(src, source)
            threshold = math.sqrt(FP16_ROUNDS_TO_ZERO / max(1.0 - build.beta2, 1e-12))
            eps_text = "the default `eps=1e-8`" if build.eps_default else f"`eps={src.node_text(build.eps_node)}`"
            underflow = (
                f"`{build.cls}` keeps its moments in float16 too, and the second moment underflows to 0 "
                f"for every gradient below ~{threshold:.0e}".replace("e-0", "e-")
            )
            if build.eps <= FP16_ROUNDS_TO_ZERO:
                consequence = (
                    f"{eps_text} rounds to 0 in float16 as well, so the first `step()` divides by zero "
                    "and those weights become -inf/NaN"
                )
            else:
                consequence = (
                    f"{eps_text} is below float16's smallest normal number (6.1e-05), so the step becomes "
                    f"lr * m / eps: {1e-3 / build.eps:.0f}x the learning rate for a gradient of 1e-3"
                )
            yield self.finding(
                src.span_of_node(build.call),
                f"`{source.key}` holds float16 weights ({origin}) and `{optimizer_name(build)}` updates "
                f"them with no float32 master copy: {underflow}; {consequence}. Keep float32 weights and "
                "train under float16 autocast with a GradScaler, or let DeepSpeed/apex keep master weights.",
                related=[related],
            )
