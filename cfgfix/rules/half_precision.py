"""CFX203, CFX205, CFX206: half-precision weights and their optimizers (Python).

CFX203 and CFX205 connect a model whose weights end up float16 or bfloat16 (a half load
with no later up-cast, or a cast; `analysis/models.py`) to a torch Adam/AdamW built over
its parameters (`analysis/optimizers.py`), and stay silent wherever something else may own
the precision of the update. CFX206 reads the project's transformers pin.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Iterable

from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.loading_support import LOAD_TRIGGERS, dtype_source_text, may_load_model

# float16: values at or below 2**-25 round to 0; 2**-14 is the smallest normal number.
FP16_ROUNDS_TO_ZERO = 2.0**-25  # 2.98e-08
FP16_SMALLEST_NORMAL = 2.0**-14  # 6.10e-05

_ADAM_CALL = re.compile(rb"\bAdamW?\s*\(")  # `torch.optim.AdamW(`, not `PagedAdamW(`


def _builds_torch_adam(data: bytes) -> bool:
    return _ADAM_CALL.search(data) is not None

_V5 = {"requirements.txt": "transformers>=5.0\n"}


def _origin(src, source) -> tuple[str, Related]:
    """How the weights got their dtype: `loaded with torch_dtype=... on line 3`."""
    state = source.state
    if state.cast_by is None:
        load = state.load
        text = f"loaded with `{src.node_text(load.dtype_keyword)}` on line {load.line}"
        return text, Related(src.span_of_node(load.call), f"loaded in {state.dtype} here")
    cast = state.cast_by
    method = src.node_text(cast)[len(src.node_text(cast.func.value)):]
    text = f"cast with `{' '.join(method.split())}` on line {cast.lineno}"
    return text, Related(src.span_of_node(cast), f"cast to {state.dtype} here")


def _optimizer_name(build) -> str:
    return f"torch.optim.{build.cls}"


@register
class HalfPrecisionAdam(Rule):
    """## What it does
    Flags a torch `Adam`/`AdamW` built over float16 weights (`model.half()`,
    `.to(torch.float16)`, `from_pretrained(..., torch_dtype=torch.float16)`) with the default
    `eps=1e-8`, or any `eps` below float16's smallest normal number (6.1e-05), when nothing
    keeps float32 master weights.

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
    PEFT, when the parameters are copied (`[p.float() for p in model.parameters()]` is a
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
    trigger_check = staticmethod(_builds_torch_adam)

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
            origin, related = _origin(src, source)
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
                f"`{source.key}` holds float16 weights ({origin}) and `{_optimizer_name(build)}` updates "
                f"them with no float32 master copy: {underflow}; {consequence}. Keep float32 weights and "
                "train under float16 autocast with a GradScaler, or let DeepSpeed/apex keep master weights.",
                related=[related],
            )


@register
class Bf16WeightsPlainAdamw(Rule):
    """## What it does
    Flags a plain torch `AdamW` (or `Adam`) built over bfloat16 weights
    (`from_pretrained(..., torch_dtype=torch.bfloat16)`, `.bfloat16()`,
    `.to(torch.bfloat16)`) when nothing keeps float32 master weights.

    ## Why is this bad?
    bfloat16 has float32's range but only 8 significant bits: an update smaller than about
    2**-8 (0.4%) of a weight rounds away entirely. One AdamW step with `lr=1e-3` leaves a
    bfloat16 weight of 1.0 at exactly 1.0, and so do 1000 updates of -1e-4 (float32 ends at
    0.9). torch AdamW applies its update straight to the bfloat16 parameter, so with the
    small learning rates of fine-tuning most updates never land: training stalls or
    degrades silently. bf16 *autocast* (mixed precision) is different: it keeps float32
    weights and only computes in bfloat16.

    ## Example
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Use instead
    ```python
    from optimi import AdamW  # Kahan summation compensates the lost low bits
    optimizer = AdamW(model.parameters(), lr=1e-4, kahan_sum=True)
    ```
    Or keep float32 weights and train under `torch.autocast("cuda", dtype=torch.bfloat16)`
    when memory allows (4 more bytes per parameter for the weights alone), or use
    `AnyPrecisionAdamW(use_kahan_summation=True)` or a stochastic-rounding AdamW.

    ## Fix safety
    No automatic fix: both remedies change memory use and numerics, and which one fits is
    the user's call. cfgfix stays silent when the optimizer is not torch's (optimi, bitsandbytes,
    AnyPrecisionAdamW), when the optimizer or model goes to `accelerator.prepare`,
    `deepspeed.initialize`, a `*Trainer`, FSDP or PEFT (they may keep float32 master
    weights or train float32 adapters), when the model is quantized, cast again, frozen, or
    its parameters edited in a loop, and when its dtype is not certain (a transformers 5
    load without `dtype` is CFX206).

    ## References
    - facts A6: `bf16(1.0) + 1e-3 == 1.0`; one AdamW step (lr=1e-3) leaves a bf16 weight
      of 1.0 unchanged; optimi ("can nearly reach or match the performance of mixed
      precision when training in BFloat16 by using Kahan summation");
      huggingface/transformers#21312 (AnyPrecisionAdamW with Kahan summation).
    """

    code = "CFX205"
    name = "bf16-weights-plain-adamw"
    severity = Severity.WARNING
    fix_availability = "none"
    triggers = ((b"Adam",), (b"parameters(",), (b"bfloat16",))
    trigger_check = staticmethod(_builds_torch_adam)

    VALID = [
        Example(
            "import torch\nfrom optimi import AdamW\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "optimizer = AdamW(model.parameters(), lr=1e-4, kahan_sum=True)\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="a Kahan-summation optimizer (optimi)",
        ),
        Example(
            "import torch\nfrom torchdistx.optimizers import AnyPrecisionAdamW\n"
            "model = Net().to(torch.bfloat16)\n"
            "optimizer = AnyPrecisionAdamW(model.parameters(), use_kahan_summation=True)\n"
            "model(x).sum().backward()\noptimizer.step()\n",
            why="AnyPrecisionAdamW with Kahan summation",
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16, device_map='auto')\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="`get_peft_model` rebuilds `model`; the LoRA adapters stay float32",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
            "trainer = Trainer(model=model, args=args, optimizers=(optimizer, None))\n"
            "trainer.train()\n",
            why="the HF Trainer may run DeepSpeed, which keeps float32 master weights",
        ),
        Example(
            "import torch\nfrom accelerate import Accelerator\nfrom transformers import AutoModelForCausalLM\n"
            "accelerator = Accelerator(mixed_precision='bf16')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(**batch).loss)\noptimizer.step()\n",
            why="accelerate under a DeepSpeed or FSDP config keeps or makes float32 weights",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model = model.float()\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = model(**batch).loss\nloss.backward()\noptimizer.step()\n",
            why="up-cast to float32 before the optimizer: real mixed precision",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "for p in model.parameters():\n"
            "    p.data = p.data.float()\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="a loop that up-casts the parameters in place",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "teacher = AutoModelForCausalLM.from_pretrained('big', torch_dtype=torch.bfloat16)\n"
            "teacher.requires_grad_(False)\n"
            "student = AutoModelForCausalLM.from_pretrained('small', torch_dtype=torch.float32)\n"
            "optimizer = torch.optim.AdamW(student.parameters())\n"
            "loss = kl(student(**batch).logits, teacher(**batch).logits)\nloss.backward()\noptimizer.step()\n",
            why="the bfloat16 teacher is frozen; the trained student is float32",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="no dtype on transformers 5 loads the checkpoint's dtype, which cfgfix cannot know",
            files=_V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "print(model.generate(**inputs))\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n",
            why="an optimizer that is never stepped in a script that never trains",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16,\n"
            "    quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="a quantized model: its bfloat16 parts are not what trains",
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained(\n"
            "    'google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto'\n"
            ")\n"
            "model = model.to(torch.bfloat16)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)\n"
            "scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)\n"
            "for batch in loader:\n"
            "    model(**batch).loss.backward()\n"
            "    optimizer.step()\n"
            "    scheduler.step()\n",
            why="a bfloat16 load trained by plain AdamW (a scheduler is not a precision owner)",
            line=7,
        ),
        Example(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "model = Net().to(torch.bfloat16)\n"
            "model = DDP(model, device_ids=[rank])\n"
            "optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=3e-4)\n"
            "model = torch.compile(model)\n"
            "train(model, optimizer, loader)\n"
            "def train(model, optimizer, loader):\n"
            "    for x in loader:\n"
            "        model(x).sum().backward()\n"
            "        optimizer.step()\n",
            why="a plain module cast to bfloat16; DDP and torch.compile keep its parameters; the script's own loop",
            line=5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "class FineTuner:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name).bfloat16()\n"
            "        params = [p for n, p in self.model.named_parameters() if 'embed' not in n]\n"
            "        self.optimizer = torch.optim.AdamW(params, lr=1e-5)\n"
            "    def step(self, batch):\n"
            "        self.model(**batch).loss.backward()\n"
            "        self.optimizer.step()\n",
            why="`.bfloat16()` chained on the load; parameters through a name bound once",
            line=7,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        from cfgfix.analysis.optimizers import optimizer_analysis  # heavy: only for files that passed the prefilter

        analysis = optimizer_analysis(ctx)
        src = ctx.source
        for build in analysis.builds:
            source = next(
                (s for s in build.sources if s.dtype == "bfloat16" and not analysis.owner_of(build, s)), None
            )
            if source is None:
                continue
            origin, related = _origin(src, source)
            yield self.finding(
                src.span_of_node(build.call),
                f"`{source.key}` holds bfloat16 weights ({origin}) and plain `{_optimizer_name(build)}` "
                "updates them in place with no float32 master copy: bfloat16 keeps 8 significant bits, "
                "so an update smaller than ~0.4% (2**-8) of a weight rounds away (one step with lr=1e-3 "
                "leaves a weight of 1.0 at 1.0). Keep float32 weights and train under bf16 autocast, or "
                "use a Kahan-summation or stochastic-rounding optimizer (e.g. `optimi.AdamW(..., "
                "kahan_sum=True)`).",
                related=[related],
            )


# ---------------------------------------------------------------------------- CFX206

_AUTOCAST = {
    "torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
    "torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.cpu.amp.GradScaler",
    "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast_mode.autocast",
}


def _constant(node: ast.AST | None):
    return node.value if isinstance(node, ast.Constant) else None


def uses_amp(ctx) -> str | None:
    """The autocast/AMP evidence in the script, as text, or None."""
    index = ctx.index
    for site in index.calls_named(*_AUTOCAST):
        return f"`{site.name}` on line {site.node.lineno}"
    for site in index.calls_to_method("autocast"):
        return f"`{site.name}` on line {site.node.lineno}"
    for site in index.calls:
        name = site.name or ""
        keywords = {k.arg: k.value for k in site.node.keywords if k.arg}
        if name.endswith("Accelerator") and _constant(keywords.get("mixed_precision")) in ("fp16", "bf16", "fp8"):
            return f"`Accelerator(mixed_precision=...)` on line {site.node.lineno}"
        if name.endswith(("TrainingArguments", "Config")) and any(
            _constant(keywords.get(k)) is True for k in ("fp16", "bf16")
        ):
            flag = next(k for k in ("bf16", "fp16") if _constant(keywords.get(k)) is True)
            return f"`{name.split('.')[-1]}({flag}=True)` on line {site.node.lineno}"
    return None


def _uses_deepspeed(ctx) -> bool:
    """DeepSpeed in the script's code (an import, `DeepSpeedPlugin`, `deepspeed_plugin`,
    `TrainingArguments(deepspeed=...)`): its engines keep float32 master weights whatever
    dtype the model was loaded in. Comments and strings do not count."""
    for node in ast.walk(ctx.document.tree):
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.keyword):
            if node.arg == "deepspeed" and isinstance(node.value, ast.Constant) and node.value.value is None:
                continue
            text = node.arg or ""
        elif isinstance(node, ast.alias):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module or ""
        else:
            continue
        if "deepspeed" in text.lower():
            return True
    return False


@register
class ImplicitCheckpointDtype(Rule):
    """## What it does
    On transformers 5 or later (from the project's pins), flags a `from_pretrained` load of
    a transformers model without `dtype` (or `torch_dtype`) in a script that trains that
    model: hands it to an optimizer, a `*Trainer`, `accelerator.prepare`, or calls
    `model.train()`.

    ## Why is this bad?
    transformers 5 changed the default: `from_pretrained` now loads `dtype="auto"`, the
    checkpoint's own dtype (from `config.json`, else the weights), where 4.x loaded float32.
    Most current checkpoints are stored in bfloat16 or float16, so a script written for 4.x
    that expects float32 weights under autocast now silently trains in pure half precision:
    no float32 master weights, small updates rounded away (CFX205), or float16 weights with
    Adam's eps rounding to 0 (CFX203) and `GradScaler` raising on float16 gradients.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name)  # transformers 5
    optimizer = torch.optim.AdamW(model.parameters())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    ```
    or `dtype=torch.bfloat16` when pure bfloat16 is the plan (then with a Kahan-summation
    optimizer).

    ## Fix safety
    Unsafe, and offered only when the script uses autocast or AMP (`torch.autocast`,
    `GradScaler`, `Accelerator(mixed_precision=...)`, `TrainingArguments(bf16=True)`):
    `dtype=torch.float32` restores the float32 weights that mixed precision expects, at
    twice the weight memory of a bfloat16 checkpoint. Without autocast the intended dtype
    is unclear, so there is no fix. cfgfix stays silent on transformers < 5 or an unknown
    version, for models the script does not train (a frozen teacher, an inference load, a
    `ref_model=` handed to a Trainer, a model `accelerator.prepare` gets without an
    optimizer), for PEFT base models (frozen; adapters are float32), quantized loads, loads
    followed by an explicit cast, `**kwargs` loads, scripts that use DeepSpeed (an import,
    `DeepSpeedPlugin`, `TrainingArguments(deepspeed=...)`: its engines keep float32 master
    weights), and classes that do not come from transformers.

    ## References
    - facts A2, D2: transformers 5.0 `from_pretrained` defaults to `dtype="auto"`
      (`modeling_utils.py` 5.0 L3901-3902; 5.23 docstring "`dtype` ... defaults to
      `"auto"`"); 4.46.3 loads float32 ("If not specified - the model will get loaded in
      `torch.float` (fp32)"); huggingface/transformers#39782 (`dtype` rename).
    """

    code = "CFX206"
    name = "implicit-checkpoint-dtype"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b".backward(", b"Trainer(", b"deepspeed.initialize"))

    VALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="transformers 4.x loads float32 by default",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="no pin and no installed transformers: the version is unknown",
            files={"requirements.txt": "transformers\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="an explicit dtype",
            files=_V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "tokenizer = AutoTokenizer.from_pretrained('m')\n"
            "teacher = AutoModelForCausalLM.from_pretrained('big')\n"
            "student = AutoModelForCausalLM.from_pretrained('small', dtype=torch.float32)\n"
            "optimizer = torch.optim.AdamW(student.parameters())\n"
            "with torch.no_grad():\n    target = teacher(**batch).logits\n"
            "kl(student(**batch).logits, target).backward()\noptimizer.step()\n",
            why="a frozen teacher is not trained; a tokenizer is not a model",
            files=_V5,
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "Trainer(model=model, args=args).train()\n",
            why="a PEFT base model stays frozen; its adapters are float32",
            files=_V5,
        ),
        Example(
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "Trainer(model=model, args=args).train()\n",
            why="a quantized load",
            files=_V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m').float()\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="an explicit cast decides the dtype",
            files=_V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', **model_kwargs)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="`**kwargs` may carry a dtype",
            files=_V5,
        ),
        Example(
            "import deepspeed\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config='ds.json')\n"
            "engine.backward(engine(**batch).loss)\nengine.step()\n",
            why="DeepSpeed keeps float32 master weights",
            files=_V5,
        ),
        Example(
            "import torch\nfrom diffusers import UNet2DConditionModel\n"
            "unet = UNet2DConditionModel.from_pretrained('m', subfolder='unet')\n"
            "optimizer = torch.optim.AdamW(unet.parameters())\n"
            "unet(x, t, c).sample.mean().backward()\noptimizer.step()\n",
            why="diffusers keeps its own float32 default",
            files={"requirements.txt": "transformers>=5.0\ndiffusers>=0.31\n"},
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "print(model.generate(**inputs))\n"
            "other.backward()\n",
            why="a generation-only load in a file that also trains something else",
            files=_V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\nfrom trl import DPOTrainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
            "ref = AutoModelForCausalLM.from_pretrained('m')\n"
            "DPOTrainer(model=model, ref_model=ref, args=args).train()\n",
            why="a reference model goes to the Trainer but is not trained",
            files=_V5,
        ),
        Example(
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\nfrom transformers import AutoModelForCausalLM\n"
            "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="DeepSpeed through accelerate keeps float32 master weights",
            files=_V5,
        ),
    ]
    INVALID = [
        Example(
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
            "args = TrainingArguments('out', bf16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="Trainer with bf16 AMP: float32 weights were expected; no torch import: a string dtype",
            line=2,
            files=_V5,
            fixed="from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B', dtype=\"float32\")\n"
            "args = TrainingArguments('out', bf16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="an own loop without autocast: the intended dtype is unclear, no fix",
            line=3,
            files={"requirements.txt": "transformers==5.2.0\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "def load(name):\n"
            "    model = AutoModelForSeq2SeqLM.from_pretrained(\n"
            "        name,\n"
            "    )\n"
            "    return model\n"
            "def main():\n"
            "    model = load('t5-base')\n"
            "    model.train()\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = model(**batch).loss\n"
            "    loss.backward()\n",
            why="the model comes back from a loader function; bf16 autocast: float32 weights expected",
            line=4,
            files=_V5,
            fixed="import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "def load(name):\n"
            "    model = AutoModelForSeq2SeqLM.from_pretrained(\n"
            "        name, dtype=torch.float32,\n"
            "    )\n"
            "    return model\n"
            "def main():\n"
            "    model = load('t5-base')\n"
            "    model.train()\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = model(**batch).loss\n"
            "    loss.backward()\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        transformers = ctx.versions.get("transformers")
        if transformers.at_least("5") is not True:
            return
        candidates = [
            load for load in ctx.models.loads
            if load.dtype is None and load.dtype_keyword is None and not load.hidden_kwargs
            and not load.pipeline and not load.quantized and not getattr(load, "quant_keywords", False)
            and getattr(load, "library", None) == "transformers"
            and not load.class_name.startswith("AutoPeftModel")
        ]
        if not candidates or not ctx.models.trains or _uses_deepspeed(ctx):
            return
        cast_loads = {id(mc.state.load.call) for mc in ctx.models.calls if mc.target_dtype or mc.dtype_unknown}
        amp = None
        src = ctx.source
        for load in candidates:
            if id(load.call) in cast_loads:
                continue  # `.float()`, `.bfloat16()`: the script picks the dtype itself
            from cfgfix.analysis.optimizers import load_training

            training = load_training(ctx, load.call)
            if training.other or not training.evidence:
                continue
            amp = amp if amp is not None else (uses_amp(ctx) or "")
            fix = None
            if amp:
                dtype_text = dtype_source_text(ctx.models, "float32")
                edit = python_edits.add_keyword(src, load.call, f"dtype={dtype_text}")
                if edit is not None:
                    fix = Fix((edit,), f"Load float32 weights: `dtype={dtype_text}`", Applicability.UNSAFE)
            advice = (
                f"This script uses autocast ({amp}), which expects float32 weights: pass `dtype=torch.float32`."
                if amp
                else "Pass `dtype=torch.float32` for mixed-precision training, or `dtype=torch.bfloat16` "
                "on purpose (with a Kahan-summation optimizer, see CFX205)."
            )
            yield self.finding(
                src.span_of_node(load.call),
                f"`{load.class_name}.from_pretrained` without `dtype` on transformers {transformers.specifier}: "
                "since 5.0 the default is `dtype=\"auto\"`, the checkpoint's own dtype (bfloat16 or float16 "
                "for most checkpoints), not float32 as on 4.x. The script trains this model "
                f"({training.evidence}), so it may silently train in pure half precision, with no float32 "
                f"master weights. {advice}",
                fix=fix,
            )
