"""CFX204 grad-scaler-with-fp16-params."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cfgfix.analysis.optimizer_sites import flow_may_report
from cfgfix.core import Finding, LazyRegex, Related, Severity
from cfgfix.rules.base import Example, Rule, register


@register
class GradScalerWithFp16Params(Rule):
    """## What it does
    Flags `scaler.step(optimizer)` / `scaler.unscale_(optimizer)` where the optimizer trains
    float16 parameters: a model made float16 (`model.half()`, `model.to(torch.float16)`,
    `from_pretrained(..., torch_dtype=torch.float16)`), or a part of one (`model[0].half()`,
    `model.lm_head.to(torch.float16)`, whatever dtype the rest was loaded in), whose
    `.parameters()` the optimizer was built from, with an enabled GradScaler, or stepped
    after `accelerator.prepare` by an `Accelerator(mixed_precision="fp16")` (which steps and
    unscales it with its own GradScaler); and a transformers/trl `Trainer` given such a model
    and `TrainingArguments(..., fp16=True)` (the Trainer's GradScaler; reported on those
    arguments). A PEFT model counts when the project pins a peft whose LoRA adapters take
    the base layer's dtype (0.7.0 to 0.11.x; 0.12 and newer upcast them to float32 unless
    `autocast_adapter_dtype=False`): its trained adapters are float16 too. The model, the
    optimizer and the scaler are followed through a trainer class's methods (`self.x` set in
    `__init__` or in one other method), a loader in another module of the project, and
    wrappers that keep the Parameters (DDP, `torch.compile`).

    ## Why is this bad?
    It crashes at the first step: `ValueError: Attempting to unscale FP16 gradients.` A
    GradScaler unscales gradients in place and refuses float16 ones (`scaler.step` calls
    `unscale_` itself). Loss scaling is designed for float32 weights under float16
    autocast, where the weights and their gradients stay float32; PyTorch's autocast docs
    also say not to call `.half()` on a model that is autocast.

    cfgfix stays silent when the cast happens only under a condition, when the model is
    handed to other code between the cast and the optimizer (PEFT's
    `prepare_model_for_kbit_training` and, on other peft releases, `get_peft_model` create or up-cast float32
    parameters), when the optimizer gets something other than the model's own parameters
    (an fp32 master copy) or only a part the cast did not touch (`model.decoder.parameters()`
    after `model.encoder.half()`), when the cast is to bfloat16 (bfloat16 gradients do not
    raise), when the same code freezes or replaces parameters
    (`requires_grad`, `.data =`: frozen float16 parameters get no gradient and raise
    nothing), and when the scaler is disabled or decided at run time (an accelerator whose
    precision comes from the launch, or with a DeepSpeed, FSDP or Megatron plugin, or in a
    file that mentions DeepSpeed or FSDP: their optimizers accept float16 parameters; a
    Trainer whose arguments come from `**kwargs` or a config), and for quantized models
    (their trained parameters are adapters).

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
    # No float16 spelling required: the float16 load may be in the project's loader module.
    triggers = ((b"GradScaler", b"mixed_precision", b"fp16"),)
    trigger_check = staticmethod(lambda data: _may_scale(data))

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
        Example(
            "import torch\n"
            "model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).cuda()\n"
            "model[1].float()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="a submodule cast to float32: every trained parameter stays float32",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "model.encoder.half()\n"
            "optimizer = torch.optim.AdamW(model.decoder.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="the float16 encoder is not what the optimizer trains (only the decoder's float32 parameters)",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "model.encoder.bfloat16()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="bfloat16 gradients do not make `unscale_` raise (only float16 ones do)",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "if args.half_encoder:\n"
            "    model.encoder.half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="a submodule cast only under a condition",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModel\n"
            "backbone = AutoModel.from_pretrained('m', torch_dtype=torch.float16).cuda().eval()\n"
            "head = torch.nn.Linear(4096, 2).cuda()\n"
            "optimizer = torch.optim.AdamW(head.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for x, y in loader:\n"
            "    with torch.no_grad():\n"
            "        feats = backbone(**x).last_hidden_state[:, 0]\n"
            "    with torch.autocast('cuda', dtype=torch.float16):\n"
            "        loss = torch.nn.functional.cross_entropy(head(feats.float()), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            why="a float16 backbone, but the optimizer trains only a freshly built float32 head",
        ),
        Example(
            "import torch\n"
            "class Trainer:\n"
            "    def __init__(self, net):\n"
            "        self.model = net.cuda()\n"
            "        self.model.encoder.half()\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "    def setup(self):\n"
            "        self.optimizer = torch.optim.AdamW(self.model.decoder.parameters(), lr=1e-4)\n"
            "    def train_step(self, batch):\n"
            "        self.scaler.scale(self.model(batch)).backward()\n"
            "        self.scaler.step(self.optimizer)\n",
            why="a trainer class whose optimizer holds only the float32 decoder",
        ),
        Example(
            "import torch\n"
            "from models.build import build_model\n"
            "model = build_model('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            files={
                "models/__init__.py": "",
                "models/build.py": (
                    "import torch\n"
                    "from transformers import AutoModelForCausalLM\n"
                    "from peft import LoraConfig, get_peft_model\n"
                    "def build_model(name):\n"
                    "    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)\n"
                    "    return get_peft_model(model, LoraConfig(r=8))\n"
                ),
            },
            why="a loader in another module returns a PEFT model: its trained adapters are float32",
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from transformers import AutoModelForCausalLM\n"
            "accelerator = Accelerator(mixed_precision=args.mixed_precision)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(**batch).loss)\n"
            "optimizer.step()\n",
            why="accelerate's precision is chosen at launch: it scales the loss only for fp16",
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from transformers import AutoModelForCausalLM\n"
            "from peft import LoraConfig, get_peft_model\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(**batch).loss)\n"
            "optimizer.step()\n",
            why="accelerate's fp16 scaler over a float16 base whose trained parameters are float32 LoRA adapters",
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator, DeepSpeedPlugin\n"
            "accelerator = Accelerator(mixed_precision='fp16', deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            "model = Net().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "optimizer.step()\n",
            why="under DeepSpeed, accelerate steps DeepSpeed's own fp16 optimizer, which keeps float32 master weights",
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "model = accelerator.prepare(Net().half())\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "optimizer.step()\n",
            why="an optimizer accelerate never prepared is stepped without its GradScaler",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "args = TrainingArguments('out', fp16=True, deepspeed='ds_zero2.json')\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="DeepSpeed's fp16 optimizer keeps float32 master weights of a float16 model",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained(\n"
            "    'm', torch_dtype=torch.float16, quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "model = get_peft_model(prepare_model_for_kbit_training(model), lora_config)\n"
            "args = TrainingArguments('out', fp16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="QLoRA: the trained adapters are float32",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "args = TrainingArguments('out', bf16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="bf16 mixed precision uses no GradScaler",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float32)\n"
            "args = TrainingArguments('out', fp16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="float32 weights under the Trainer's float16 autocast: what `fp16=True` is for",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "args = TrainingArguments(**config)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="the training arguments come from a config cfgfix cannot read here",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "class SFTTrainer:\n"
            "    def __init__(self, args):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(args.model).half().cuda()\n"
            "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr)\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "    def step(self, batch):\n"
            "        with torch.autocast('cuda', dtype=torch.float16):\n"
            "            loss = self.model(**batch).loss\n"
            "        self.scaler.scale(loss).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n",
            why="a trainer class builds the scaler in `__init__` and steps it in another method",
            line=12,
        ),
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
        Example(
            "import torch\n"
            "import torch.nn as nn\n"
            "model = nn.ModuleList([nn.Linear(10, 20), nn.Linear(20, 10)]).cuda()\n"
            "model[0].half()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
            "for x, y in loader:\n"
            "    with torch.cuda.amp.autocast():\n"
            "        loss = nn.functional.mse_loss(model[1](model[0](x)), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            why="a submodule cast (`model[0].half()`) makes part of what the optimizer trains float16",
            line=11,
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('t5-base', torch_dtype=torch.bfloat16).cuda()\n"
            "model.lm_head.to(torch.float16)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.unscale_(optimizer)\n",
            why="a bfloat16 load is fine for the scaler, but a submodule cast to float16 is not",
            line=7,
        ),
        Example(
            "import torch\n"
            "class Trainer:\n"
            "    def __init__(self, net):\n"
            "        self.model = net.cuda()\n"
            "        self.model.encoder.half()\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "    def setup(self):\n"
            "        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)\n"
            "    def train_step(self, batch):\n"
            "        self.optimizer.zero_grad()\n"
            "        self.scaler.scale(self.model(batch)).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n",
            why="a trainer class: the cast in `__init__`, the optimizer built in `setup()`, stepped in `train_step()`",
            line=12,
        ),
        Example(
            "import torch\n"
            "from models.build import build_model\n"
            "model = build_model('google/flan-t5-base')\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "for batch in loader:\n"
            "    scaler.scale(model(**batch).loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            files={
                "models/__init__.py": "",
                "models/build.py": (
                    "import torch\n"
                    "from transformers import AutoModelForSeq2SeqLM\n"
                    "def build_model(name):\n"
                    "    return AutoModelForSeq2SeqLM.from_pretrained(name, torch_dtype=torch.float16)\n"
                ),
            },
            why="the float16 load is in the project's loader module",
            line=8,
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="DDP wraps the same float16 Parameters",
            line=6,
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from transformers import AutoModelForCausalLM\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
            "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "for batch in loader:\n"
            "    with accelerator.accumulate(model):\n"
            "        accelerator.backward(model(**batch).loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
            why="accelerate's fp16 mode steps the prepared optimizer through a GradScaler",
            line=11,
        ),
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self, net):\n"
            "        self.accelerator = Accelerator(mixed_precision='fp16')\n"
            "        self.model = net.cuda()\n"
            "        self.model.half()\n"
            "        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
            "        self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)\n"
            "    def train_step(self, batch):\n"
            "        self.accelerator.backward(self.model(batch).sum())\n"
            "        self.optimizer.step()\n"
            "        self.optimizer.zero_grad()\n",
            why="a trainer class: the accelerator and the prepared optimizer reach `train_step()`",
            line=12,
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForSeq2SeqLM, Trainer, TrainingArguments\n"
            "def load(name):\n"
            "    return AutoModelForSeq2SeqLM.from_pretrained(name, torch_dtype=torch.float16)\n"
            "def build_trainer(model, train_ds):\n"
            "    args = TrainingArguments('out', per_device_train_batch_size=8, fp16=True)\n"
            "    return Trainer(model=model, args=args, train_dataset=train_ds)\n"
            "model = load('google/flan-t5-base')\n"
            "build_trainer(model, ds).train()\n",
            why="a library Trainer with `fp16=True` over a float16 model handed to the helper that builds it",
            line=6,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        if not flow_may_report(ctx):
            return  # no step of an optimizer built here, no library trainer: nothing to report
        # Imported only where one is built (~7 ms together; issue 15).
        from cfgfix.analysis.amp import AmpFacts
        from cfgfix.analysis.attributes import ValueIndex
        from cfgfix.analysis.parameters import parameter_flow

        scalers = {id(s.call): s.call for s in AmpFacts.of(ctx).scalers if s.enabled is True}
        values = ValueIndex.of(ctx)
        reported: set[int] = set()
        for step in sorted(parameter_flow(ctx).steps.values(), key=lambda s: (s.call.lineno, s.call.col_offset)):
            if step.prepared is not None:
                scaler = _fp16_accelerator(ctx, values, step)
            else:
                receiver = step.call.func.value  # type: ignore[attr-defined]
                scaler = scalers.get(id(values.origin(receiver, step.function, step.cls)))
            if scaler is None or id(scaler) in reported:
                continue
            cast = next((h for h in step.held if h.float16_cast is not None), None)
            if cast is None or _edits_parameters(ctx, step):
                continue
            reported.add(id(scaler))
            yield self._finding(ctx.source, step, cast, scaler)
        for use in parameter_flow(ctx).trainers.values():
            finding = self._trainer_finding(ctx, values, use)
            if finding is not None:
                yield finding

    def _trainer_finding(self, ctx, values, use) -> Finding | None:
        """`Trainer(model=model, args=TrainingArguments(fp16=True))` on a float16 model: the
        Trainer scales the loss with a GradScaler and unscales every trainable parameter."""
        from cfgfix.analysis.amp import short

        held = use.model
        if held is None or held.float16_cast is None:
            return None
        load = held.state.load
        if getattr(load, "quantized", None) or getattr(load, "quant_keywords", False):
            return None  # a quantized model trains adapters (the Trainer refuses it otherwise)
        keywords = {k.arg: k.value for k in use.call.keywords}
        if None in keywords or "peft_config" in keywords or use.args is None:
            return None  # trl wraps the model in PEFT adapters (float32)
        args = values.origin(use.args, use.function, use.cls)
        if not _fp16_training_arguments(ctx, args) or _edits_parameters(ctx, use):
            return None
        text = ctx.source.text.lower()
        if "deepspeed" in text or "fsdp" in text:
            return None  # a launch may still select DeepSpeed or FSDP
        src = ctx.source
        cast = held.float16_cast
        there = load.source if cast is load.call and load.path else src
        where = load.where if there is not src else f"line {cast.lineno}"
        what = (f"part of which (`{short(src, cast.func.value, 40)}`) is float16"
                if held.state.dtype == _half_part() else "which are float16")
        # Reported on the `TrainingArguments(..., fp16=True)` that makes the Trainer's
        # GradScaler (as `GradScaler(...)` is), with the Trainer that trains beside it.
        return self.finding(
            src.span_of_node(args),
            f"`{short(src, use.call, 50)}` (line {use.call.lineno}): training raises `ValueError: Attempting "
            f"to unscale FP16 gradients.` at the first step: `fp16=True` makes the Trainer scale the "
            f"loss with a GradScaler, and it trains the parameters of `{held.key}`, {what} "
            f"(`{short(there, cast, 60)}`, {where}). Load the model in float32 (the Trainer autocasts "
            "the forward to float16), or use `bf16=True` on hardware that has it.",
            related=[
                Related(there.span_of_node(cast), "the parameters become float16 here"),
                Related(src.span_of_node(use.call), "the Trainer that trains them"),
            ],
        )

    def _finding(self, src, step, held, scaler: ast.Call) -> Finding:
        from cfgfix.analysis.amp import short
        from cfgfix.analysis.parameters import HALF_PART

        call, built = step.call, step.optimizer.call
        cast, load = held.float16_cast, held.state.load
        there = load.source if cast is load.call and load.path else src  # a loader module's load
        where = load.where if there is not src else f"line {cast.lineno}"
        if held.state.dtype == HALF_PART:
            what = f"part of which (`{short(src, cast.func.value, 40)}`) is float16"
        else:
            what = "which are float16"
        if step.prepared is not None:
            how = (
                f"the optimizer (line {built.lineno}), prepared by `{short(src, scaler, 50)}` (line "
                f"{scaler.lineno}), is stepped and unscaled by accelerate's GradScaler (so is "
                "`accelerator.clip_grad_norm_`), and it"
            )
            scaler_note = "the Accelerator that scales the loss with a GradScaler"
        else:
            how = f"the optimizer (line {built.lineno})"
            scaler_note = "the GradScaler"
        return self.finding(
            src.span_of_node(call),
            f"`{short(src, call)}` raises `ValueError: Attempting to unscale FP16 gradients.`: {how} "
            f"trains the parameters of `{held.key}`, {what} "
            f"(`{short(there, cast, 60)}`, {where}). A GradScaler is for float32 "
            "weights under float16 autocast; keep the weights in float32 and autocast the forward, "
            "or train without the scaler.",
            related=[
                Related(there.span_of_node(cast), "the parameters become float16 here"),
                Related(src.span_of_node(scaler), scaler_note),
            ],
        )


def _may_scale(data: bytes) -> bool:
    """A GradScaler or an accelerator stepping an optimizer built here, or a library
    Trainer with fp16 arguments."""
    # the rarest words first: a file with no GradScaler and no mixed_precision (the prefilter
    # found one of them, or `fp16`) needs no scan for the three common ones
    scales = b"GradScaler" in data or b"mixed_precision" in data
    steps = scales and (b".step(" in data or b"unscale_(" in data) and b"parameters(" in data
    return steps or (b"Trainer(" in data and b"fp16" in data)


def _half_part() -> str:
    from cfgfix.analysis.parameters import HALF_PART

    return HALF_PART


_ARGUMENTS = LazyRegex(r"^(transformers|trl)\.(\w+\.)*\w*(TrainingArguments|Config)$")


def _fp16_training_arguments(ctx, node) -> bool:
    """`TrainingArguments(..., fp16=True)` written out: no `**kwargs` that may hide
    DeepSpeed or FSDP, no DeepSpeed or FSDP of its own, the native (GradScaler) backend."""
    if not isinstance(node, ast.Call) or not _ARGUMENTS.match(ctx.imports.qualify(node.func) or ""):
        return False
    keywords = {k.arg: k.value for k in node.keywords}
    if any(isinstance(a, ast.Starred) for a in node.args) or None in keywords:
        return False
    fp16 = keywords.get("fp16")
    if not (isinstance(fp16, ast.Constant) and fp16.value is True):
        return False
    for name in ("deepspeed", "fsdp", "fsdp_config"):
        value = keywords.get(name)
        if value is not None and not (isinstance(value, ast.Constant) and not value.value):
            return False
    backend = keywords.get("half_precision_backend")
    return backend is None or isinstance(backend, ast.Constant) and backend.value in ("auto", "cuda_amp", "amp")


_OTHER_ENGINES = ("deepspeed_plugin", "deepspeed_plugins", "fsdp_plugin", "megatron_lm_plugin")


def _fp16_accelerator(ctx, values, step) -> ast.Call | None:
    """The `Accelerator(mixed_precision="fp16")` that prepared the stepped optimizer, when it
    surely steps it through a GradScaler: fp16 written in the call, no DeepSpeed, FSDP or
    Megatron plugin (their own optimizers and scalers accept float16 parameters), and a
    file that does not mention DeepSpeed or FSDP (a launch config may still select them)."""
    from cfgfix.analysis.attributes import call_site_origin

    # the accelerator may come in as a parameter (`def train(unet, accelerator, loader)`)
    node = call_site_origin(values, ctx.index, step.prepared.func.value, step.function, step.cls)  # type: ignore[attr-defined]
    if not isinstance(node, ast.Call) or not (ctx.imports.qualify(node.func) or "").endswith("Accelerator"):
        return None
    keywords = {k.arg: k.value for k in node.keywords}
    precision = keywords.get("mixed_precision")
    if node.args or None in keywords or any(k in keywords for k in _OTHER_ENGINES):
        return None
    if not (isinstance(precision, ast.Constant) and precision.value == "fp16"):
        return None
    text = ctx.source.text.lower()
    return None if "deepspeed" in text or "fsdp" in text else node


def _edits_parameters(ctx, step) -> bool:
    """Parameters frozen or replaced where the optimizer is built or stepped (the whole
    class for a trainer class): cfgfix cannot follow which of them are trained."""
    from cfgfix.analysis.parameters import edits_parameters

    if step.cls is not None:
        return edits_parameters([step.cls])
    built = step.optimizer.call if hasattr(step, "optimizer") else step.call
    site = next((s for s in ctx.index.calls if s.node is built), None)
    scopes = {id(n): n for n in (step.function, site.context.function if site else None) if n is not None}
    return edits_parameters(list(scopes.values()) or [ctx.document.tree])
