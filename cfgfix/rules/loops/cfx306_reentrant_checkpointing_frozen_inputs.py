"""CFX306 reentrant-checkpointing-frozen-inputs."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.checkpointing import may_break_peft
from cfgfix.core import Finding, Severity
from cfgfix.rules.base import Example, Rule, register

_PINS_V4 = {"requirements.txt": "transformers==4.45.2\npeft==0.13.2\ntorch==2.4.1\n"}
_PINS_V5 = {"requirements.txt": "transformers==5.2.0\npeft==0.18.0\ntorch==2.9.0\n"}
_HEAD = (
    "import torch\n"
    "from peft import LoraConfig, get_peft_model\n"
    "from transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', torch_dtype=torch.bfloat16)\n"
)


@register
class ReentrantCheckpointingFrozenInputs(Rule):
    """## What it does
    Flags reentrant gradient checkpointing on a PEFT model whose embeddings are frozen, when
    nothing calls `enable_input_require_grads()`: `model.gradient_checkpointing_enable()`
    (or `TrainingArguments(gradient_checkpointing=True)` handed to the HF `Trainer`) after
    `get_peft_model(...)` with a LoRA-family config, on transformers 4.x where the default is
    `use_reentrant=True`, or with an explicit `use_reentrant=True`.

    ## Why is this bad?
    The reentrant variant of `torch.utils.checkpoint` records a graph for a checkpointed layer
    only when one of its *inputs* requires grad; the layer's own weights do not count. LoRA
    freezes everything but the adapters, so the hidden states that enter the first
    checkpointed layer come from a frozen embedding and require no grad. torch warns "None of
    the inputs have requires_grad=True. Gradients will be None", `backward` raises "element 0
    of tensors does not require grad and does not have a grad_fn", or, when a head after the
    layers is trainable, the run goes on and the adapters silently never learn.

    `enable_input_require_grads()` (a hook that marks the embeddings' output as requiring
    grad) fixes it, and some libraries call it for you, which is why the bug depends on the
    order of calls and on versions:
    - PEFT's `get_peft_model` calls it only when checkpointing is *already on* as it wraps a
      non-quantized model. Enabling checkpointing after `get_peft_model` misses it, and so does
      enabling it before on a 4/8-bit model without `prepare_model_for_kbit_training`.
    - transformers 4.x `gradient_checkpointing_enable()` calls it only for adapters added with
      the built-in `model.add_adapter(...)`, not for `get_peft_model` models; the HF `Trainer`
      (with `gradient_checkpointing=True`) does nothing more.
    - transformers 5 defaults to `use_reentrant=False`, and calls it itself for every model
      whose main input is `input_ids`.
    - `prepare_model_for_kbit_training` calls it for quantized models unless you ask for
      `use_reentrant=False`; TRL's trainers call it themselves.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)  # transformers 4.45
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable()
    ```

    ## Use instead
    ```python
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ```
    (or enable checkpointing before `get_peft_model`, or call `model.enable_input_require_grads()`).

    ## Fix safety
    Safe: the non-reentrant variant computes the same gradients, and here it is the one that
    computes any. The fix adds `gradient_checkpointing_kwargs={"use_reentrant": False}` (to
    the call, or to the `TrainingArguments`), or sets the key in the dict literal already
    passed. There is no automatic fix on transformers < 4.35, which has no such keyword, for
    kwargs held in a variable (other code may share the dict), and for `trust_remote_code`
    models, whose Hub code may use the old checkpointing format that ignores the kwargs: the
    message says to call `model.enable_input_require_grads()` there.

    cfgfix stays silent when it cannot be sure: the transformers version is unknown and the
    answer depends on it, the base model does not come from a `from_pretrained` /
    `from_config` in the same function, a helper or an earlier call may have enabled
    checkpointing before `get_peft_model`, the file calls `enable_input_require_grads` or
    `prepare_model_for_kbit_training`, registers a forward hook that calls `requires_grad_`,
    or sets `requires_grad = True` on anything that may be the embeddings (a loop over
    parameters that does not filter on adapter names), the config trains the embeddings
    (`modules_to_save`, `target_modules` or `trainable_token_indices` naming them), the
    config is not an adapter config (prompt tuning trains its virtual tokens), the model or
    its `Trainer` arguments come from elsewhere (`HfArgumentParser`), the model is rebound
    between the two calls, or the two sit in different branches of an `if`. TRL trainers,
    `add_adapter` and `PeftModel.from_pretrained` models are out of scope.

    ## Versions
    Checkpointing enabled without arguments is flagged only when the project's
    transformers is known to be 4.x (a pin or the installed copy): from 5.0
    `use_reentrant` defaults to False. `use_reentrant=True`, or a kwargs dict without the
    key, is flagged on 4.x and, for a model whose main input is not `input_ids`, on every
    version. Where nothing says which transformers, cfgfix assumes the current release
    (5.x) and so stays silent on the default. The automatic fix needs
    `gradient_checkpointing_kwargs` (transformers 4.35+): withheld on a pin below 4.35.
    PEFT before 0.4 did not call `enable_input_require_grads` in `get_peft_model`.

    ## References
    - facts A4: transformers 4.46.3 / 4.57 `gradient_checkpointing_enable` defaults to
      `{"use_reentrant": True}` and calls `enable_input_require_grads` only when
      `_hf_peft_config_loaded`; 5.x defaults to False and calls it when
      `main_input_name == "input_ids"`; PEFT `peft_model.py` calls it in `__init__` only
      `if getattr(model, "is_gradient_checkpointing", True)`, for non-quantized models.
    - torch docs, `torch.utils.checkpoint`: "At least one input and output must have
      `requires_grad=True` for the reentrant variant."
    - Experiment (CPU: transformers 4.57.6, peft 0.13.2, torch 2.13): a tiny Llama with LoRA,
      `gradient_checkpointing_enable()` after `get_peft_model` raises "element 0 of tensors
      does not require grad"; before it, or with `use_reentrant=False`, the adapters get
      gradients; `modules_to_save=["lm_head"]` runs with zero adapter gradients;
      `Trainer(args=TrainingArguments(gradient_checkpointing=True))` raises, and trains with
      `gradient_checkpointing_kwargs={"use_reentrant": False}`.
    - huggingface/transformers#26334, #25841, #42489; huggingface/peft#137, #742.
    """

    code = "CFX306"
    name = "reentrant-checkpointing-frozen-inputs"
    severity = Severity.ERROR
    fix_availability = "safe"
    triggers = ((b"get_peft_model",), (b"_checkpointing",))
    trigger_check = staticmethod(may_break_peft)

    VALID = [
        Example(
            "from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb_cfg = BitsAndBytesConfig(load_in_8bit=True) if args.int8 else None\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb_cfg)\n"
            "model.gradient_checkpointing_enable()\n"
            "model = get_peft_model(model, LoraConfig(r=64))\n",
            why="a config name that may hold None: whether PEFT prepares the inputs is unknown",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model.gradient_checkpointing_enable()\n"
            "model = get_peft_model(model, LoraConfig(r=16, target_modules=['q_proj', 'v_proj']))\n",
            why="checkpointing enabled before get_peft_model: PEFT calls enable_input_require_grads() as it wraps",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})\n",
            why="non-reentrant checkpointing needs no input that requires grad",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n"
            "model.enable_input_require_grads()\n",
            why="the script calls enable_input_require_grads() itself",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n",
            why="transformers 5 defaults to use_reentrant=False",
            files=_PINS_V5,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})\n",
            why="transformers 5 calls enable_input_require_grads() for models whose main input is input_ids",
            files=_PINS_V5,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n",
            why="no transformers pin: the default use_reentrant depends on the version",
            files={"requirements.txt": "transformers\npeft\n"},
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16, modules_to_save=['embed_tokens', 'lm_head']))\n"
            "model.gradient_checkpointing_enable()\n",
            why="the embeddings are trained (modules_to_save): the layers' inputs require grad",
            files=_PINS_V4,
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "model = prepare_model_for_kbit_training(model)\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n",
            why="prepare_model_for_kbit_training calls enable_input_require_grads() for the quantized model",
            files=_PINS_V4,
        ),
        Example(
            _HEAD.replace("LoraConfig", "PromptTuningConfig")
            + "model = get_peft_model(model, PromptTuningConfig(task_type='CAUSAL_LM', num_virtual_tokens=20))\n"
            "model.gradient_checkpointing_enable()\n",
            why="prompt tuning trains virtual token embeddings that enter the first layer",
            files=_PINS_V4,
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM\n"
            "def train(model, args):\n"
            "    model = get_peft_model(model, LoraConfig(r=16))\n"
            "    model.gradient_checkpointing_enable()\n",
            why="a model from the caller may already have checkpointing on (PEFT then prepared it)",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "if args.lora:\n"
            "    model = get_peft_model(model, LoraConfig(r=16))\n"
            "else:\n"
            "    model.gradient_checkpointing_enable()\n",
            why="full fine-tuning in the other branch: the embeddings are trainable there",
            files=_PINS_V4,
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "args = TrainingArguments('out', gradient_checkpointing=True,\n"
            "                         gradient_checkpointing_kwargs={'use_reentrant': False})\n"
            "Trainer(model=model, args=args).train()\n",
            why="Trainer with non-reentrant checkpointing kwargs",
            files=_PINS_V4,
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM\nfrom trl import SFTConfig, SFTTrainer\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "SFTTrainer(model=model, args=SFTConfig('out', gradient_checkpointing=True)).train()\n",
            why="TRL trainers call enable_input_require_grads() themselves",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable(**gc_options)\n",
            why="`**kwargs` may carry use_reentrant=False",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.get_input_embeddings().weight.requires_grad_(True)\n"
            "model.gradient_checkpointing_enable()\n",
            why="the embeddings are unfrozen by hand",
            files=_PINS_V4,
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n"
            "training_args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "Trainer(model=model, args=training_args).train()\n",
            why="TrainingArguments from the command line: whether checkpointing is on is unknown",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "enable_checkpointing(model, args)\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n",
            why="a helper that receives the base model may have enabled checkpointing before the wrap",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model = accelerator.prepare(model)\n"
            "model.gradient_checkpointing_enable()\n",
            why="the name is rebound between the wrap and the call",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16, target_modules=['embed_tokens', 'q_proj']))\n"
            "model.gradient_checkpointing_enable()\n",
            why="LoRA on the embeddings: their output requires grad",
            files=_PINS_V4,
        ),
        Example(
            _HEAD + "model.config.use_cache = True\n"
            "model.gradient_checkpointing_enable()\n",
            why="use_cache=True with checkpointing is not a rule on purpose (transformers turns the cache off while training); no PEFT here",
            files=_PINS_V4,
        ),
    ]
    INVALID = [
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16, target_modules=['q_proj', 'v_proj']))\n"
            "model.print_trainable_parameters()\n"
            "model.gradient_checkpointing_enable()\n",
            why="checkpointing enabled after get_peft_model on transformers 4 (default use_reentrant=True)",
            line=7,
            files=_PINS_V4,
            fixed=_HEAD + "model = get_peft_model(model, LoraConfig(r=16, target_modules=['q_proj', 'v_proj']))\n"
            "model.print_trainable_parameters()\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n",
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM\n"
            "def main(cfg):\n"
            "    model = AutoModelForCausalLM.from_pretrained(cfg['model'])\n"
            "    lora = LoraConfig(**cfg['lora'])\n"
            "    peft_model = get_peft_model(model, lora)\n"
            "    if cfg['gradient_checkpointing']:\n"
            "        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})\n",
            why="an explicit use_reentrant=True, through the base model's name, inside an `if`",
            line=9,
            files=_PINS_V4,
            fixed="import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM\n"
            "def main(cfg):\n"
            "    model = AutoModelForCausalLM.from_pretrained(cfg['model'])\n"
            "    lora = LoraConfig(**cfg['lora'])\n"
            "    peft_model = get_peft_model(model, lora)\n"
            "    if cfg['gradient_checkpointing']:\n"
            "        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})\n",
        ),
        Example(
            "import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "model.gradient_checkpointing_enable()\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n",
            why="checkpointing before get_peft_model does not help a quantized model: PEFT skips it",
            line=5,
            files=_PINS_V4,
            fixed="import torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n",
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb_cfg = BitsAndBytesConfig(load_in_8bit=True)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto', quantization_config=bnb_cfg)\n"
            "model.gradient_checkpointing_enable()\n"
            "model = get_peft_model(model, LoraConfig(r=64))\n",
            why="the quantization config through a name bound once: checkpointing first does not help",
            line=5,
            files=_PINS_V4,
            fixed="from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb_cfg = BitsAndBytesConfig(load_in_8bit=True)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto', quantization_config=bnb_cfg)\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n"
            "model = get_peft_model(model, LoraConfig(r=64))\n",
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "args = TrainingArguments(\n"
            "    output_dir='out',\n"
            "    gradient_checkpointing=True,\n"
            ")\n"
            "Trainer(model=model, args=args).train()\n",
            why="HF Trainer enables checkpointing with the 4.x default and does not call enable_input_require_grads()",
            line=7,
            files=_PINS_V4,
            fixed="from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = get_peft_model(model, LoraConfig(r=16))\n"
            "args = TrainingArguments(\n"
            "    output_dir='out',\n"
            "    gradient_checkpointing=True, gradient_checkpointing_kwargs={\"use_reentrant\": False},\n"
            ")\n"
            "Trainer(model=model, args=args).train()\n",
        ),
        Example(
            "from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForImageClassification\n"
            "model = AutoModelForImageClassification.from_pretrained('google/vit-base-patch16-224')\n"
            "model = get_peft_model(model, LoraConfig(target_modules=['query', 'value'], modules_to_save=['classifier']))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})\n",
            why="transformers 5 with explicit use_reentrant=True on a vision model (main input pixel_values)",
            line=5,
            files=_PINS_V5,
            fixed="from peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForImageClassification\n"
            "model = AutoModelForImageClassification.from_pretrained('google/vit-base-patch16-224')\n"
            "model = get_peft_model(model, LoraConfig(target_modules=['query', 'value'], modules_to_save=['classifier']))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})\n",
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable()\n",
            why="transformers 4.30 has no gradient_checkpointing_kwargs: flagged without a fix",
            line=6,
            files={"requirements.txt": "transformers==4.30.2\npeft==0.4.0\n"},
        ),
        Example(
            _HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False})\n",
            why="a kwargs dict without use_reentrant: torch's own default (True) applies",
            line=6,
            files=_PINS_V4,
            fixed=_HEAD + "model = get_peft_model(model, LoraConfig(r=16))\n"
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False, \"use_reentrant\": False})\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        from cfgfix.analysis.peft_checkpointing import peft_analysis  # past the prefilter only

        seen = set()
        for hit in peft_analysis(ctx).hits:
            if id(hit.node) in seen:
                continue  # two wraps (or two Trainers) reaching the same call
            seen.add(id(hit.node))
            yield self.finding(ctx.source.span_of_node(hit.node), hit.message, fix=hit.fix, related=hit.related)
