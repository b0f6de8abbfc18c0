"""CFX206 implicit-checkpoint-dtype."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cfgfix.analysis.checkpoint_dtypes import stored_dtype
from cfgfix.analysis.model_calls import LOAD_TRIGGERS, dtype_source_text, may_load_model
from cfgfix.analysis.model_ids import ModelIds
from cfgfix.core import Applicability, Finding, Fix, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Conditioned, Example, Rule, register
from cfgfix.rules.precision.common import V5

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
    On transformers 5 or later (see Versions), flags a `from_pretrained` load of
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

    Silent for checkpoints stored in float32, where `"auto"` is float32 as on 4.x, also
    when the id reaches the load through a function's or constructor's parameter (every
    call in the project passes one, `BERTfinetuning(model_name, ...)` in another module)
    or a config object's default field (`ModelConfig().model_name`): a local
    checkpoint whose `config.json` says so, a hub checkpoint whose `config.json` in the
    user's Hugging Face cache says so (`HF_HUB_CACHE`, `HF_HOME`; never the network), and
    the published BERT, RoBERTa, DistilBERT,
    ALBERT, XLM-R, ELECTRA, DeBERTa, BART, T5 (original and v1.1) and GPT-2 checkpoints
    (analysis/checkpoint_dtypes.py).

    ## Fix safety
    Unsafe, and offered only when the script uses autocast or AMP (`torch.autocast`,
    `GradScaler`, `Accelerator(mixed_precision=...)`, `TrainingArguments(bf16=True)`):
    `dtype=torch.float32` restores the float32 weights that mixed precision expects, at
    twice the weight memory of a bfloat16 checkpoint. Without autocast the intended dtype
    is unclear, so there is no fix. cfgfix stays silent for models the script does not train (a frozen teacher, an inference load
    (also one that rebinds `model` after `trainer.train()`: a load is trained only by what its
    name reaches in statement order), a Trainer that only evaluates, a
    `ref_model=` handed to a Trainer, a model `accelerator.prepare` gets without an
    optimizer), for PEFT base models (frozen; adapters are float32), quantized loads, loads
    followed by an explicit cast, `**kwargs` loads, scripts that use DeepSpeed (an import,
    `DeepSpeedPlugin`, `TrainingArguments(deepspeed=...)`: its engines keep float32 master
    weights), and classes that do not come from transformers.

    ## Versions
    Speaks on transformers 5 or later; silent on 4.x (float32 is the default there) and on
    a pin that admits both (`transformers>=4.40`). Where the project pins nothing and no
    transformers is installed, it assumes the current release (5.x: what an install without
    a pin gets) and says so in the message, naming the unpinned requirement or `pip install`
    line when there is one: the failure it warns about is silent on 5.x, and passing `dtype`
    is harmless on 4.x. An API removed in 5.0 that the code uses (`Trainer(tokenizer=...)`,
    `TrainingArguments(evaluation_strategy=...)`) dates it to 4.x: silent there, and silent
    in every file of the project when any Python file of it uses such an API and no pin says
    otherwise (the project
    runs one transformers; read at the project stage, so a pre-commit run of one changed file
    sees the others too). An API added earlier (`attn_implementation=`, 4.36+) does not
    change the assumption.

    ## References
    - facts A2, D2: transformers 5.0 `from_pretrained` defaults to `dtype="auto"`
      (`modeling_utils.py` 5.0 L3901-3902; 5.23 docstring "`dtype` ... defaults to
      `"auto"`"); 4.46.3 loads float32 ("If not specified - the model will get loaded in
      `torch.float` (fp32)"); huggingface/transformers#39782 (`dtype` rename).
    """

    code = "CFX206"
    condition = "version"  # project-stage check of an assumed release (project.py `_version_holds`)
    name = "implicit-checkpoint-dtype"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b".backward(", b"Trainer(", b"deepspeed.initialize"))

    VALID = [
        Example("from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained('m')\n"
                "optimizer = torch.optim.AdamW(model.parameters())\nmodel.train()\n",
                "another module of the project passes Trainer(tokenizer=...): the project runs transformers 4.x",
                files={"evaluate_tools/run_eval.py": "from transformers import Trainer\n"
                                                     "trainer = Trainer(model=m, tokenizer=tok)\n"}),
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
            why="a pin that admits 4.x and 5.x: the project says older versions are in use",
            files={"requirements.txt": "transformers>=4.40\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="an explicit dtype",
            files=V5,
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
            files=V5,
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "Trainer(model=model, args=args).train()\n",
            why="a PEFT base model stays frozen; its adapters are float32",
            files=V5,
        ),
        Example(
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "Trainer(model=model, args=args).train()\n",
            why="a quantized load",
            files=V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m').float()\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="an explicit cast decides the dtype",
            files=V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', **model_kwargs)\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="`**kwargs` may carry a dtype",
            files=V5,
        ),
        Example(
            "import deepspeed\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config='ds.json')\n"
            "engine.backward(engine(**batch).loss)\nengine.step()\n",
            why="DeepSpeed keeps float32 master weights",
            files=V5,
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
            files=V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\nfrom trl import DPOTrainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
            "ref = AutoModelForCausalLM.from_pretrained('m')\n"
            "DPOTrainer(model=model, ref_model=ref, args=args).train()\n",
            why="a reference model goes to the Trainer but is not trained",
            files=V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForSequenceClassification\n"
            "MODEL = 'google-bert/bert-base-uncased'\n"
            "model = AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=2)\n"
            "gpt = AutoModelForSequenceClassification.from_pretrained('gpt2')\n"
            "optimizer = torch.optim.AdamW(list(model.parameters()) + list(gpt.parameters()))\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="checkpoints stored in float32 (BERT, GPT-2): \"auto\" loads float32, as 4.x did",
            files=V5,
        ),
        Example(
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('my-org/sft-model')\n"
            "trainer = Trainer(model=model, args=TrainingArguments('out', bf16=True), eval_dataset=ds)\n"
            "print(trainer.evaluate())\n",
            why="a Trainer that only evaluates: the model is not trained",
            files=V5,
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('./checkpoints/base')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="a local checkpoint whose config.json says float32",
            files={**V5, "checkpoints/base/config.json": '{"model_type": "llama", "torch_dtype": "float32"}\n'},
        ),
        Example(
            "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\nfrom transformers import AutoModelForCausalLM\n"
            "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="DeepSpeed through accelerate keeps float32 master weights",
            files=V5,
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', attn_implementation='sdpa')\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "model(**batch).loss.backward()\noptimizer.step()\n",
            why="transformers unpinned in requirements.txt: the current release (5.x) is assumed and the message says so",
            line=3,
            files={"requirements.txt": "transformers\n"},
        ),
        Example(
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
            "args = TrainingArguments('out', bf16=True)\n"
            "Trainer(model=model, args=args, train_dataset=ds).train()\n",
            why="Trainer with bf16 AMP: float32 weights were expected; no torch import: a string dtype",
            line=2,
            files=V5,
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
            "    model = load('my-org/t5-sft')\n"
            "    model.train()\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = model(**batch).loss\n"
            "    loss.backward()\n",
            why="the model comes back from a loader function; bf16 autocast: float32 weights expected",
            line=4,
            files=V5,
            fixed="import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "def load(name):\n"
            "    model = AutoModelForSeq2SeqLM.from_pretrained(\n"
            "        name, dtype=torch.float32,\n"
            "    )\n"
            "    return model\n"
            "def main():\n"
            "    model = load('my-org/t5-sft')\n"
            "    model.train()\n"
            "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "        loss = model(**batch).loss\n"
            "    loss.backward()\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        candidates = [
            load for load in ctx.models.loads
            if load.dtype is None and load.dtype_keyword is None and not load.hidden_kwargs
            and not load.pipeline and not load.quantized and not getattr(load, "quant_keywords", False)
            and getattr(load, "library", None) == "transformers"
            and not load.class_name.startswith("AutoPeftModel")
        ]
        if not candidates:
            return  # before the version question: its first one reads the code's idioms
        transformers = ctx.versions.resolve("transformers")
        if transformers.at_least("5") is not True or not ctx.models.trains or _uses_deepspeed(ctx):
            return
        cast_loads = {id(mc.state.load.call) for mc in ctx.models.calls if mc.target_dtype or mc.dtype_unknown}
        amp = None
        src = ctx.source
        folder = ctx.path.parent if getattr(ctx, "path", None) is not None else None
        ids = None
        for load in candidates:
            if id(load.call) in cast_loads:
                continue  # `.float()`, `.bfloat16()`: the script picks the dtype itself
            if load.path is None:
                if ids is None:
                    ids = ModelIds(ctx.document.tree, ctx.path, ctx.project)
                loaded = ids.of(load.call)
                ctx.functions.deps.update(ids.deps)  # the callers read: the cache's dependencies
                if loaded and all(stored_dtype(model_id, folder) == "float32" for model_id in loaded):
                    continue  # "auto" loads a float32 checkpoint in float32, as 4.x did
            from cfgfix.analysis.load_training import load_training

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
            finding = self.finding(
                src.span_of_node(load.call),
                f"`{load.class_name}.from_pretrained` without `dtype` on {transformers.describe()}: "
                "since 5.0 the default is `dtype=\"auto\"`, the checkpoint's own dtype (bfloat16 or float16 "
                "for most checkpoints), not float32 as on 4.x. The script trains this model "
                f"({training.evidence}), so it may silently train in pure half precision, with no float32 "
                f"master weights. {advice}",
                fix=fix,
            )
            # On an assumed release, or the copy installed where cfgfix runs (as a file's own
            # idioms do, versions.py `get`), the project stage drops it when another file of the
            # project dates transformers below 5 (`Trainer(tokenizer=...)` in a sibling module).
            yield Conditioned(finding, "version;at_least:transformers:5.0.0") \
                if transformers.evidence in ("assumed", "installed") else finding
