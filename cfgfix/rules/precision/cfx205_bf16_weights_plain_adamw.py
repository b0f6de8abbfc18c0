"""CFX205 bf16-weights-plain-adamw."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.core import Finding, Severity
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.precision.common import V5, builds_torch_adam, dtype_origin, may_hold_bf16_weights, optimizer_name


@register
class Bf16WeightsPlainAdamw(Rule):
    """## What it does
    Flags a plain torch `AdamW` (or `Adam`) built over bfloat16 weights
    (`from_pretrained(..., torch_dtype=torch.bfloat16)`, `.bfloat16()`,
    `.to(torch.bfloat16)`) when nothing keeps float32 master weights. The weights may be
    loaded in another module of the project (`model = setup_lora_model(name)`; the GPU side
    of `torch.bfloat16 if torch.cuda.is_available() else torch.float32`), and the trained
    ones may be made by the project's own module class in the dtype of the layer it wraps
    (a LoRA layer written by hand that casts its adapters `.to(original.weight.dtype)` and
    replaces the base's layers with `setattr(parent, name, LoRALinear(module))`): an
    optimizer over `[p for p in model.parameters() if p.requires_grad]` then steps
    bfloat16 adapters. A replacement by any other module (torch's float32 layers, a class
    cfgfix cannot read) makes the dtype unknown.

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
    `deepspeed.initialize`, a `*Trainer`, FSDP with a `mixed_precision` policy or PEFT (they
    may keep float32 master weights or train float32 adapters; FSDP without a policy keeps
    the module's dtype in its flat Parameters, so it is followed, and so is a bfloat16 cast
    of the whole model after `get_peft_model`, which casts the adapters too), when the model is quantized, cast again, frozen, or
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
    triggers = ((b"Adam",), (b"parameters(",))
    trigger_check = staticmethod(lambda data: builds_torch_adam(data) and may_hold_bf16_weights(data))

    VALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "def freeze_embeddings(model):\n"
            "    for p in model.get_input_embeddings().parameters():\n"
            "        p.requires_grad = False\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "freeze_embeddings(model)\n"
            "opt = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\n"
            "opt.step()\n",
            why="a helper of the file that changes the model in place: what it leaves is unknown",
        ),
        Example(
            "import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
            "from transformers import AutoModelForCausalLM\n"
            "def train(rank):\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16).to(rank)\n"
            "    model = FSDP(model, mixed_precision=policy)\n"
            "    opt = torch.optim.AdamW(model.parameters())\n"
            "    model(**batch).loss.backward()\n"
            "    opt.step()\n",
            why="FSDP with a mixed-precision policy: the user chose a precision plan",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "def train(target):\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16).to(target)\n"
            "    opt = torch.optim.AdamW(model.parameters())\n"
            "    model(**batch).loss.backward()\n"
            "    opt.step()\n",
            why="`.to(target)` may be a dtype: the weights' dtype is unknown",
        ),
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
            "import torch\nfrom peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model.to(torch.bfloat16)\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="cast before `get_peft_model`: peft (>= 0.12, by default) creates float32 adapters over it",
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
            files=V5,
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
            "import torch\nfrom peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
            "class Tuner:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name)\n"
            "        self.model = get_peft_model(self.model, LoraConfig(r=8))\n"
            "        self.model.to(torch.bfloat16)\n"
            "    def train(self, loader):\n"
            "        optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)\n"
            "        for batch in loader:\n"
            "            self.model(**batch).loss.backward()\n"
            "            optimizer.step()\n",
            why="a bfloat16 cast of the PeftModel after `get_peft_model` makes the LoRA adapters bfloat16 too",
            line=10,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "def print_model_size(model, name):\n"
            "    total = sum(p.numel() for p in model.parameters())\n"
            "    print(f'{name}: {total / 1e6:.1f}M parameters')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "print_model_size(model, 'm')\n"
            "opt = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\n"
            "opt.step()\n",
            why="a helper of the file that only reads the model (its parameters' sizes) keeps its dtype",
            line=8,
        ),
        Example(
            "import torch\nimport torch.multiprocessing as mp\n"
            "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
            "from transformers import BloomForCausalLM\n"
            "def train(rank, world_size):\n"
            "    model = BloomForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "    model = model.to(rank)\n"
            "    model = FSDP(model, device_id=rank)\n"
            "    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
            "    model(**batch).loss.backward()\n"
            "    opt.step()\n"
            "mp.spawn(train, args=(2,), nprocs=2)\n",
            why="`.to(rank)` moves to a GPU index; FSDP without a mixed-precision policy keeps bfloat16 flat weights",
            line=9,
        ),
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
            origin, related = dtype_origin(src, source)
            yield self.finding(
                src.span_of_node(build.call),
                f"`{source.key}` holds bfloat16 weights ({origin}) and plain `{optimizer_name(build)}` "
                "updates them in place with no float32 master copy: bfloat16 keeps 8 significant bits, "
                "so an update smaller than ~0.4% (2**-8) of a weight rounds away (one step with lr=1e-3 "
                "leaves a weight of 1.0 at 1.0). Keep float32 weights and train under bf16 autocast, or "
                "use a Kahan-summation or stochastic-rounding optimizer (e.g. `optimi.AdamW(..., "
                "kahan_sum=True)`).",
                related=[related],
            )
