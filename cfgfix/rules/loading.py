"""CFX1xx: model loading and placement (Python)."""

from __future__ import annotations

from typing import Iterable

from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.loading_support import (
    LOAD_TRIGGERS,
    MOVE_TRIGGERS,
    call_text,
    drop_call_edits,
    dtype_source_text,
    load_related,
    may_load_model,
    name_of,
)


@register
class RedundantDtypeCast(Rule):
    """## What it does
    Flags a cast of a model to the dtype its weights already have: a model loaded with
    `from_pretrained(..., torch_dtype=torch.bfloat16)` (or `dtype=`, or `"bfloat16"`) and then
    `.to(torch.bfloat16)`, `.to(dtype=torch.bfloat16)`, `.bfloat16()`, `.half()` after a
    float16 load, or `.float()` after a float32 load.

    ## Why is this bad?
    It does nothing to the weights. `nn.Module.to()` converts parameters in place and
    returns the same module; when the dtype already matches, not even a parameter is
    touched (only float32 buffers, see Fix safety). The folklore
    that `model = model.to(dtype)` "makes a second copy of the model" is wrong, and so is
    the hope that repeating the cast saves memory: it costs 0 bytes and saves 0 bytes.
    The line only misleads readers about where the dtype is decided.

    ## Example
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    model = model.to(torch.bfloat16)
    ```

    ## Use instead
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    ```

    One exception matters: transformers keeps a few modules in float32 on purpose
    (`_keep_in_fp32_modules`, e.g. T5's `wo` layers under float16;
    `_keep_in_fp32_modules_strict`, e.g. DeepSeek-V3's router bias, under any half dtype).
    For those the repeated cast is not a no-op: it undoes that protection.

    ## Fix safety
    Unsafe: the removed cast changes no weight, but it did convert the floating-point
    buffers that the load left in float32, such as the rotary embeddings' `inv_freq` of
    Llama-family models (computed in float32 at construction), and, for float16, the modules
    transformers keeps in float32 (`_keep_in_fp32_modules`, the T5 family). Without the cast
    those stay float32: measured with `cfgfix verify` on a tiny Llama, the seeded losses
    moved in the fifth decimal (6.255969 vs 6.255995). Memory is unchanged either way (the
    buffers are a few hundred bytes). When the call also moves the model
    (`.to("cuda", torch.bfloat16)`) only the dtype argument is removed. cfgfix stays silent
    when anything between the load and the cast may have changed the dtype (a branch, a
    loop, the model passed to another function).

    ## References
    - facts A1: `Module._apply` swaps `param.data` in place and returns `self`
      (torch/nn/modules/module.py); `Tensor.to` returns `self` when nothing changes.
    - PyTorch docs, `torch.nn.Module.to`: "This method modifies the module in-place."
    """

    code = "CFX101"
    name = "redundant-dtype-cast"
    severity = Severity.INFO
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, MOVE_TRIGGERS)

    VALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model = model.to(torch.float16)\n",
            why="a cast to a different dtype is a real conversion",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model = build_other_model()\n"
            "model = model.to(torch.bfloat16)\n",
            why="the name was reassigned between load and cast",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "for batch in loader:\n"
            "    batch = batch.to(torch.bfloat16)\n",
            why="casts of tensors and batches are not casts of the model",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model = prepare_model_for_kbit_training(model)\n"
            "model = model.to(torch.bfloat16)\n",
            why="the model went through a function that may up-cast parts of it",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "if args.fp32:\n"
            "    model.float()\n"
            "model.to(torch.bfloat16)\n",
            why="branches disagree about the dtype",
        ),
        Example(
            "import torch\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained('m'), torch_dtype=torch.bfloat16)\n"
            "model = model.to(torch.bfloat16)\n",
            why="models from `from_config` are not tracked",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=args.dtype)\n"
            "model = model.to(torch.bfloat16)\n",
            why="a dtype cfgfix cannot resolve",
        ),
        Example(
            "import torch\nfrom diffusers import StableDiffusionXLPipeline\n"
            "pipe = StableDiffusionXLPipeline.from_pretrained('m', vae=vae, torch_dtype=torch.float16)\n"
            "pipe.to(torch.float16)\n",
            why="a pipeline mixes components (a float32 VAE passed in): its cast is not a no-op",
        ),
        Example(
            "import torch\nfrom diffusers import WanTransformer3DModel\n"
            "t = WanTransformer3DModel.from_pretrained('m', torch_dtype=torch.bfloat16).to(torch.bfloat16)\n",
            why="diffusers keeps `_keep_in_fp32_modules` in float32 under any dtype: the cast is real",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "m = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16, load_in_8bit=True)\n"
            "m.half()\n",
            why="a quantized model: the cast raises (CFX104), it is not a no-op",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "from mylib import model\n"
            "model.to(torch.bfloat16)\n",
            why="an import rebinds the name",
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16)\n"
            "model = model.to(torch.bfloat16)\n"
            "model.train()\n",
            why="the classic: the same dtype again",
            line=4,
            fixed="import torch\nfrom transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16)\n"
            "model.train()\n",
        ),
        Example(
            "import torch as th\nfrom transformers import AutoModelForCausalLM as LM\n"
            "DTYPE = 'bfloat16'\n"
            "model = LM.from_pretrained('m', dtype=DTYPE).to(dtype=th.bfloat16)\n",
            why="aliases, a string dtype through a constant, and a chained cast",
            line=4,
            fixed="import torch as th\nfrom transformers import AutoModelForCausalLM as LM\n"
            "DTYPE = 'bfloat16'\n"
            "model = LM.from_pretrained('m', dtype=DTYPE)\n",
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', torch_dtype=torch.float16)\n"
            "        self.model.half()\n",
            why="`self.model` within one method; `.half()` after a float16 load",
            line=6,
            fixed="import torch\nfrom transformers import AutoModel\n"
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', torch_dtype=torch.float16)\n",
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model.to('cuda', torch.bfloat16)\n",
            why="a move plus the same dtype: only the dtype argument goes",
            line=4,
            fixed="import torch\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "model.to('cuda')\n",
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "def main():\n"
            "    model = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "    if True:\n"
            "        model.bfloat16()\n"
            "    return model\n",
            why="the only statement of a block becomes `pass`",
            line=6,
            fixed="import torch\nfrom transformers import AutoModel\n"
            "def main():\n"
            "    model = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "    if True:\n"
            "        pass\n"
            "    return model\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        for mc in ctx.models.calls:
            state = mc.state
            if mc.target_dtype is None or state.dtype != mc.target_dtype:
                continue
            if state.load.library != "transformers" or state.load.quant_keywords:
                continue  # diffusers keeps float32 modules under any dtype; quantized: CFX104
            if mc.moves_device is False:
                edits = drop_call_edits(src, mc)
                description = f"Remove the no-op `{call_text(src, mc)}`"
            elif mc.moves_device is True and mc.dtype_arg is not None and mc.method == "to":
                edits = [python_edits.remove_argument(src, mc.call, mc.dtype_arg)]
                description = "Remove the dtype argument that changes nothing"
            else:
                edits = None
                description = ""
            if state.cast_by is None:
                origin = f"loaded with `{ctx.source.node_text(state.load.dtype_keyword)}` on line {state.load.line}"
                related = [load_related(src, state.load, f"loaded in {state.dtype} here")]
            else:
                origin = f"already cast on line {state.cast_by.lineno}"
                related = [Related(src.span_of_node(state.cast_by), f"cast to {state.dtype} here")]
            # unsafe: the cast also converts float32 buffers (rotary inv_freq) and, for float16,
            # the modules kept in float32; dropping it changes numerics slightly
            applicability = Applicability.UNSAFE
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} already holds {state.dtype} weights ({origin}): "
                f"`{call_text(src, mc)}` returns the same module and copies no weight that is "
                f"already {state.dtype}, so it neither costs nor saves memory. It only converts the "
                "float32 buffers the load kept (such as rotary `inv_freq`) and any module transformers "
                "keeps in float32 on purpose.",
                fix=Fix(tuple(edits), description, applicability) if edits else None,
                related=related,
            )


@register
class CastAfterLoad(Rule):
    """## What it does
    Flags a model loaded in float32 and then cast to float16 or bfloat16: an explicit
    `torch_dtype=torch.float32` (or `dtype=`), or no dtype at all on transformers < 5, where
    `from_pretrained` loads float32 by default.

    ## Why is this bad?
    The whole float32 model is materialised first: 4 bytes per parameter, twice what the
    half-precision model needs, and that peak is what runs out of memory when loading a 7B
    model (28 GB in float32 against 14 GB in bfloat16). Passing the dtype to
    `from_pretrained` loads each weight straight into the target dtype.

    The default changed in transformers 5: without `dtype` it loads the checkpoint's own
    dtype (`"auto"`), so on 5.x cfgfix only flags an explicit float32 load. The keyword is
    `dtype` from transformers 4.56 (`torch_dtype` before, and still accepted).

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name)  # transformers 4.46
    model = model.half()
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)
    ```

    ## Fix safety
    Unsafe: the weights end in the same dtype, but with the dtype passed at load time the
    float32 buffers that a model computes at construction (rotary `inv_freq` in the Llama
    family) stay float32 where the blanket cast converted them, and for float16
    transformers keeps `_keep_in_fp32_modules` (the T5 family's `wo` layers) in float32.
    That is the behaviour the model's authors intended, but a small numerics change
    (`cfgfix verify` measured it on a tiny Llama: losses differ in the fifth decimal). The
    fix writes `dtype=` when the project pins transformers >= 4.56 and `torch_dtype=`
    otherwise.

    ## References
    - facts A1, A2: `from_pretrained` defaults by version (transformers 4.46.3 docstring:
      "If not specified - the model will get loaded in `torch.float` (fp32)"; 5.0 defaults
      to `"auto"`); `dtype` introduced in 4.56 (huggingface/transformers#39782).
    """

    code = "CFX102"
    name = "cast-after-load"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, MOVE_TRIGGERS)

    VALID = [
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = model.half()\n",
            why="transformers 5 loads the checkpoint dtype by default, not float32",
            files={"requirements.txt": "transformers>=5.0\n"},
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = model.half()\n",
            why="no pin and no installed transformers: the default dtype is unknown",
            files={"requirements.txt": "transformers\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float32)\n"
            "model = model.to(device)\n",
            why="a move is not a cast",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', **kwargs)\n"
            "model = model.half()\n",
            why="`**kwargs` may already carry a dtype",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model.float()\n"
            "model = model.half()\n",
            why="only the first cast after the load is the one that materialised float32 needlessly",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "from transformers import AutoModelForCausalLM, GPTQConfig\n"
            "m = AutoModelForCausalLM.from_pretrained('m', load_in_4bit=True)\n"
            "m.half()\n"
            "g = AutoModelForCausalLM.from_pretrained('m', quantization_config=GPTQConfig(bits=4))\n"
            "g.half()\n",
            why="quantized loads pick their own dtype (float16 for bitsandbytes and GPTQ)",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "from auto_gptq import AutoGPTQForCausalLM\n"
            "model = AutoGPTQForCausalLM.from_pretrained('m', qc)\n"
            "model.half()\n",
            why="another library's loader, with its own default dtype",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(\n"
            "    'Qwen/Qwen2.5-7B',\n"
            "    trust_remote_code=True,\n"
            ")\n"
            "model = model.half()\n",
            why="no dtype on transformers 4.46: loads float32, then halves",
            line=7,
            files={"requirements.txt": "transformers==4.46.3\n"},
            fixed="import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(\n"
            "    'Qwen/Qwen2.5-7B',\n"
            "    trust_remote_code=True, torch_dtype=torch.float16,\n"
            ")\n",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
            "model.to(torch.bfloat16)\n",
            why="an explicit float32 load is float32 on every version",
            line=4,
            files={"requirements.txt": "transformers>=5.0\n"},
            fixed="import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=torch.bfloat16)\n",
        ),
        Example(
            "from transformers import T5ForConditionalGeneration\n"
            "model = T5ForConditionalGeneration.from_pretrained('t5-base').bfloat16()\n",
            why="a chained cast; transformers >= 4.56 takes `dtype`; no torch import: a string dtype",
            line=2,
            files={"requirements.txt": "transformers>=4.56,<5\n"},
            fixed="from transformers import T5ForConditionalGeneration\n"
            "model = T5ForConditionalGeneration.from_pretrained('t5-base', dtype=\"bfloat16\")\n",
        ),
        Example(
            "from diffusers import AutoencoderKL\n"
            "vae = AutoencoderKL.from_pretrained('sdxl', subfolder='vae')\n"
            "vae.half()\n",
            why="diffusers loads float32 on every version, and takes `torch_dtype` even where transformers says `dtype`",
            line=3,
            files={"requirements.txt": "transformers==4.57.1\ndiffusers==0.30.0\n"},
            fixed="from diffusers import AutoencoderKL\n"
            "vae = AutoencoderKL.from_pretrained('sdxl', subfolder='vae', torch_dtype=\"float16\")\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        transformers = ctx.versions.get("transformers")
        for mc in ctx.models.calls:
            state, load = mc.state, mc.state.load
            if mc.target_dtype not in ("float16", "bfloat16") or state.cast_by is not None:
                continue
            if load.library is None or load.quant_keywords:
                continue  # other loaders have other defaults; quantized loads pick their own dtype
            if state.dtype == "float32":
                why = f"`{src.node_text(load.dtype_keyword)}`"
            elif state.dtype == "default" and load.library == "diffusers":
                why = "no dtype: diffusers loads float32 by default"
            elif state.dtype == "default" and transformers.below("5") is True:
                why = f"no dtype, and transformers {transformers.specifier} loads float32 by default"
            else:
                continue
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} is loaded in float32 (line {load.line}: {why}) and then cast "
                f"to {mc.target_dtype} with `{call_text(src, mc)}`: the whole float32 model is "
                f"materialised first, twice the memory of {mc.target_dtype} weights. Pass the dtype "
                "to `from_pretrained` instead.",
                fix=self._fix(ctx, mc, transformers),
                related=[load_related(src, load, "loaded in float32 here")],
            )

    def _fix(self, ctx, mc, transformers) -> Fix | None:
        src, load = ctx.source, mc.state.load
        dtype_text = dtype_source_text(ctx.models, mc.target_dtype)
        if load.dtype_keyword is not None:
            load_edit = python_edits.replace_node(src, load.dtype_keyword.value, dtype_text)
            keyword = load.dtype_keyword.arg
        else:  # diffusers takes `torch_dtype`; transformers renamed it `dtype` in 4.56
            renamed = load.library == "transformers" and transformers.at_least("4.56") is True
            keyword = "dtype" if renamed else "torch_dtype"
            load_edit = python_edits.add_keyword(src, load.call, f"{keyword}={dtype_text}")
        if mc.moves_device is False:
            cast_edits = drop_call_edits(src, mc)
        elif mc.moves_device is True and mc.dtype_arg is not None:
            cast_edits = [python_edits.remove_argument(src, mc.call, mc.dtype_arg)]
        else:
            cast_edits = None
        if load_edit is None or cast_edits is None:
            return None
        # unsafe: float32 buffers (rotary inv_freq) and kept-fp32 modules stay float32 when the
        # dtype is chosen at load time, where the cast converted them
        return Fix((load_edit, *cast_edits), f"Load with `{keyword}={dtype_text}` and drop the cast", Applicability.UNSAFE)


@register
class MoveDispatchedModel(Rule):
    """## What it does
    Flags `.to(device)` or `.cuda()` on a model loaded with a `device_map` that can spread it
    over several devices: `"auto"`, `"balanced"`, `"balanced_low_0"`, `"sequential"`, or an
    explicit map naming more than one device.

    ## Why is this bad?
    accelerate already placed every module and attached hooks that move activations between
    devices. Moving the model afterwards fights those hooks: accelerate warns "You shouldn't
    move a model that is dispatched using accelerate hooks.", and when some modules were
    offloaded to the CPU or disk (`"cpu"`/`"disk"` in the map, `max_memory=`,
    `offload_folder=`) it raises `RuntimeError: You can't move a model that has some modules
    offloaded to cpu or disk.` — that case is an error; the others are warnings, because the
    move either crowds everything onto one GPU or does nothing useful.

    ## Example
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, device_map="auto")
    model.to(device)
    ```

    ## Use instead
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, device_map="auto")
    ```

    ## Fix safety
    Safe: the move is dropped; the model stays where `device_map` put it. Inputs go to
    `model.device` (the first device of the map). cfgfix stays silent for single-device maps
    (`device_map="cuda"`, `{"": rank}`), where a `.to()` is harmless, and for maps it cannot
    resolve.

    ## References
    - facts A3: accelerate `big_modeling.py` wraps `.to`/`.cuda` of dispatched models
      (warning, and RuntimeError when a parameter is offloaded to `meta`).
    """

    code = "CFX103"
    name = "move-dispatched-model"
    severity = Severity.WARNING
    fix_availability = "safe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b"device_map",), (b".to(", b".cuda("))

    VALID = [
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m')\n"
            "model.to(device)\n",
            why="`.to(device)` on a model built without `device_map`",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={'': accelerator.process_index})\n"
            "model.to(accelerator.device)\n",
            why="a single-device map attaches no hooks",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map=args.device_map)\n"
            "model.to(device)\n",
            why="`device_map` from a value that cannot be resolved",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "for batch in loader:\n"
            "    batch = {k: v.to(model.device) for k, v in batch.items()}\n",
            why="moving the inputs to the model's device is right",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "model = get_peft_model(model, config)\n"
            "model.to(device)\n",
            why="the model was wrapped by a function cfgfix does not follow",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "moved = [model.to('cuda') for model in others]\n",
            why="a comprehension variable shadows the name",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto', load_in_8bit=True).cuda()\n",
            why="a quantized model: whether moving it works depends on bitsandbytes (CFX104's call)",
        ),
    ]
    INVALID = [
        Example(
            "from transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', device_map='auto')\n"
            "model.to(device)  # make sure it is on the GPU\n"
            "model.train()\n",
            why="the story's move after an auto map",
            line=3,
            fixed="from transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', device_map='auto')\n"
            "model.train()\n",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto', max_memory={0: '20GiB', 'cpu': '60GiB'})\n"
            "model = model.cuda()\n",
            why="with offloading possible, accelerate raises: an error",
            line=3,
            fixed="from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto', max_memory={0: '20GiB', 'cpu': '60GiB'})\n",
        ),
        Example(
            "from transformers import AutoModel\n"
            "class Runner:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', device_map={'encoder': 0, 'decoder': 'cpu'})\n"
            "    def train(self):\n"
            "        self.model.to('cuda')\n",
            why="`self.model` across methods, and an explicit map with a CPU entry",
            line=6,
            fixed="from transformers import AutoModel\n"
            "class Runner:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', device_map={'encoder': 0, 'decoder': 'cpu'})\n"
            "    def train(self):\n"
            "        pass\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = (AutoModelForCausalLM.from_pretrained('m', device_map='auto')  # load\n"
            "         .to('cuda'))  # move\n",
            why="a chained move over two lines: only `.to('cuda')` goes, both comments stay",
            line=2,
            fixed="from transformers import AutoModelForCausalLM\n"
            "model = (AutoModelForCausalLM.from_pretrained('m', device_map='auto')  # load\n"
            "         )  # move\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        for mc in ctx.models.calls:
            device_map = mc.state.load.device_map
            if device_map is None or device_map.kind != "multi" or mc.state.load.library is None:
                continue
            if mc.state.load.quant_keywords:
                continue  # moving a quantized model is CFX104's call (it depends on bitsandbytes)
            moves = mc.method == "cuda" or (mc.method == "to" and mc.moves_device is True)
            casts_offloaded = mc.method == "to" and mc.moves_device is False and device_map.offload
            if not (moves or casts_offloaded):
                continue
            severity = Severity.ERROR if device_map.offload else Severity.WARNING
            map_text = src.node_text(device_map.node)
            if device_map.offload:
                consequence = (
                    "with modules offloaded to the CPU or disk, accelerate raises "
                    "`RuntimeError: You can't move a model that has some modules offloaded to cpu or disk.`"
                )
            else:
                consequence = (
                    "accelerate warns \"You shouldn't move a model that is dispatched using accelerate hooks.\" "
                    "and the move crowds the model onto one device"
                )
            pure_move = mc.method == "cuda" or mc.target_dtype is None
            edits = drop_call_edits(src, mc) if pure_move and moves else None
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} was dispatched with `device_map={map_text}` "
                f"(line {mc.state.load.line}); `{call_text(src, mc)}` moves it again: {consequence}.",
                fix=Fix(tuple(edits), f"Remove `{call_text(src, mc)}`; `device_map` already placed the model") if edits else None,
                related=[load_related(src, mc.state.load, "dispatched here")],
                severity=severity,
            )


@register
class MoveOrCastQuantizedModel(Rule):
    """## What it does
    Flags a dtype cast (`.to(dtype)`, `.half()`, `.float()`, `.bfloat16()`) of a model loaded
    4-bit or 8-bit (`load_in_4bit=True`, `load_in_8bit=True`, `quantization_config=...`), and
    device moves that the project's bitsandbytes cannot do: `.cuda()` on an 8-bit model,
    `.to(device)` on 8-bit with bitsandbytes < 0.48 or on 4-bit with bitsandbytes < 0.43.2.

    ## Why is this bad?
    transformers refuses: `ValueError: You cannot cast a bitsandbytes model in a new dtype`,
    "`.half()` is not supported for quantized model", "Calling `cuda()` is not supported for
    `8-bit` quantized models". The quantized weights were already placed and typed by the
    load; the compute dtype is `bnb_4bit_compute_dtype`, not a cast.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb_config)
    model = model.to(torch.float16)
    ```

    ## Use instead
    ```python
    bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb_config)
    ```

    ## Fix safety
    Safe: the call raises, so removing it cannot change a run that worked. Moves of 4-bit
    models on a recent or unknown bitsandbytes are left alone: they work there.

    ## References
    - facts A3: transformers `modeling_utils.py` (5.23 L3716, L3766; 4.46.3) errors for
      `.to`, `.cuda`, `.half`, `.float` on quantized models.
    """

    code = "CFX104"
    name = "move-or-cast-quantized-model"
    severity = Severity.ERROR
    fix_availability = "safe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b"load_in_", b"quantization_config"), MOVE_TRIGGERS)

    VALID = [
        Example(
            "from transformers import AutoModel, BitsAndBytesConfig\n"
            "model = AutoModel.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
            "model.to('cuda')\n",
            why="moving a 4-bit model works on a recent bitsandbytes",
            files={"requirements.txt": "bitsandbytes>=0.45\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', quantization_config=qconfig)\n"
            "model.half()\n",
            why="a quantization config variable that may hold None",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', load_in_8bit=False)\n"
            "model.half()\n",
            why="`load_in_8bit=False` is not quantized",
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', load_in_4bit=True)\n"
            "inputs = inputs.to(torch.float16)\n",
            why="a tensor cast, not the model",
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb)\n"
            "model = model.to(torch.float16)\n",
            why="a dtype cast of a 4-bit model raises",
            line=5,
            fixed="import torch\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb)\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=True)\n"
            "model.cuda()\n",
            why="`.cuda()` on an 8-bit model raises on every version",
            line=3,
            fixed="from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=True)\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=True)\n"
            "model.to('cuda:0')\n",
            why="8-bit `.to(device)` needs bitsandbytes >= 0.48",
            line=3,
            files={"requirements.txt": "bitsandbytes==0.41.1\n"},
            fixed="from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=True)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        bnb = ctx.versions.get("bitsandbytes")
        for mc in ctx.models.calls:
            bits = mc.state.load.quantized
            if bits is None or mc.state.load.library != "transformers":
                continue
            casts = mc.method in ("half", "float", "bfloat16") or mc.target_dtype is not None
            if casts:
                problem = "transformers raises `ValueError`: a quantized model cannot be cast to another dtype"
            elif mc.method == "cuda" and bits == "8bit":
                problem = "transformers raises `ValueError`: calling `cuda()` is not supported for 8-bit models"
            elif mc.moves_device and bits == "8bit" and bnb.below("0.48") is True:
                problem = f"moving an 8-bit model needs bitsandbytes >= 0.48 (the project has {bnb.specifier})"
            elif mc.moves_device and bits == "4bit" and bnb.below("0.43.2") is True:
                problem = f"moving a 4-bit model needs bitsandbytes >= 0.43.2 (the project has {bnb.specifier})"
            else:
                continue
            edits = drop_call_edits(src, mc) if (casts and mc.moves_device is not True) or not casts else None
            kind = {"4bit": "4-bit", "8bit": "8-bit"}.get(bits, "quantized")
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} is loaded {kind} (line {mc.state.load.line}); "
                f"`{call_text(src, mc)}`: {problem}. The load already chose its device and dtype.",
                fix=Fix(tuple(edits), f"Remove `{call_text(src, mc)}`") if edits else None,
                related=[load_related(src, mc.state.load, f"loaded {kind} here")],
            )


_LAUNCH_2 = {"launch.sh": "torchrun --nproc_per_node 2 train.py\n"}


@register
class DeviceMapInDistributedTraining(Rule):
    """## What it does
    Flags `device_map="auto"` (or `"balanced"`, `"sequential"`) in a training script that a
    launch script of the project starts with more than one process (`torchrun
    --nproc_per_node 2`, `accelerate launch --num_processes 4`, `deepspeed --num_gpus 8`, or
    an accelerate config with `num_processes: 4`).

    ## Why is this bad?
    Each process would spread its own copy of the model over all visible GPUs, and
    accelerate refuses to train it: `ValueError: You can't train a model that has been loaded
    with device_map='auto' in any distributed mode.` (raised by `accelerator.prepare`, which
    the HF `Trainer` calls too). Data-parallel training wants one whole model per process, on
    that process's GPU.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
    ```
    launched by `torchrun --nproc_per_node 2 train.py`.

    ## Use instead
    ```python
    from accelerate import PartialState
    model = AutoModelForCausalLM.from_pretrained(name, device_map={"": PartialState().local_process_index})
    ```

    ## Fix safety
    Unsafe: it changes where the model lives, and a model that only fits when split over
    several GPUs needs a sharding strategy (FSDP, DeepSpeed ZeRO-3) instead. The fix uses
    `local_process_index` rather than `process_index`, so it stays right on several nodes.
    The rule is silent for single-process launches, for scripts that no launch script
    starts, and for loads that never reach training: the loaded model (through wrappers
    such as `get_peft_model` and functions that return it) must be handed to a `*Trainer`,
    `accelerator.prepare` or `deepspeed.initialize`, or be loaded in a function that calls
    `backward()`. A model loaded after training to merge adapters is left alone.

    ## References
    - facts A3: accelerate `accelerator.py` `verify_device_map` and the ValueError in
      `prepare` (L1479, L1820); HF Trainer goes through `accelerator.prepare` under torchrun.
    """

    code = "CFX105"
    name = "device-map-in-distributed-training"
    severity = Severity.ERROR
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b"device_map",))
    condition = "multi-process-launch"

    VALID = [
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="no launch script starts it with more than one process",
            files={"launch.sh": "python train.py --lr 1e-4\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="a single-process torchrun",
            files={"launch.sh": "torchrun --nproc_per_node 1 train.py\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "print(model.generate(**inputs))\n",
            why="inference only: nothing is trained",
            files=_LAUNCH_2,
        ),
        Example(
            "from accelerate import Accelerator\nfrom peft import AutoPeftModelForCausalLM\n"
            "from transformers import AutoModelForCausalLM\nfrom trl import SFTTrainer\n"
            "def main():\n"
            "    base = AutoModelForCausalLM.from_pretrained('m', device_map={'': Accelerator().local_process_index})\n"
            "    SFTTrainer(model=base).train()\n"
            "    model = AutoPeftModelForCausalLM.from_pretrained('out', device_map='auto')\n"
            "    model = model.merge_and_unload()\n"
            "    model.save_pretrained('merged')\n",
            why="a model loaded after training only to merge adapters is never prepared",
            files=_LAUNCH_2,
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={'': rank})\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="one device per process is the right map",
            files=_LAUNCH_2,
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="a world size from a variable the script cannot prove",
            files={"launch.sh": "torchrun --nproc_per_node ${NGPU:-2} train.py\n"},
        ),
    ]
    INVALID = [
        Example(
            "from transformers import AutoModelForCausalLM, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', device_map='auto')\n"
            "Trainer(model=model, args=args).train()\n",
            why="torchrun with two processes",
            line=2,
            files=_LAUNCH_2,
            fixed="from transformers import AutoModelForCausalLM, Trainer\n"
            "from accelerate import PartialState\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', device_map={\"\": PartialState().local_process_index})\n"
            "Trainer(model=model, args=args).train()\n",
        ),
        Example(
            "from accelerate import (\n    Accelerator,\n)\nfrom transformers import AutoModel\n"
            "accelerator = Accelerator()\n"
            "model = AutoModel.from_pretrained('m', device_map='sequential')\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="deepspeed launcher with --num_gpus; the existing `from accelerate import` is extended",
            line=6,
            files={"train.sh": "deepspeed --num_gpus=8 train.py --deepspeed ds.json\n"},
            fixed="from accelerate import (\n    Accelerator, PartialState,\n)\nfrom transformers import AutoModel\n"
            "accelerator = Accelerator()\n"
            "model = AutoModel.from_pretrained('m', device_map={\"\": PartialState().local_process_index})\n"
            "accelerator.backward(model(**batch).loss)\n",
        ),
        Example(
            "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "def load(name):\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
            "    return get_peft_model(model, config)\n"
            "def main():\n"
            "    model = load('m')\n"
            "    Trainer(model=model).train()\n",
            why="the model reaches the Trainer through a wrapper and a returning function",
            line=4,
            files=_LAUNCH_2,
            fixed="from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "from accelerate import PartialState\n"
            "def load(name):\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, device_map={\"\": PartialState().local_process_index})\n"
            "    return get_peft_model(model, config)\n"
            "def main():\n"
            "    model = load('m')\n"
            "    Trainer(model=model).train()\n",
        ),
        Example(
            "import accelerate\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='balanced')\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="accelerate launch with an accelerate config of 4 processes; accelerate already imported",
            line=3,
            files={
                "scripts/run.sh": "accelerate launch --config_file configs/acc.yaml train.py\n",
                "configs/acc.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 1\n",
            },
            fixed="import accelerate\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={\"\": accelerate.PartialState().local_process_index})\n"
            "accelerator.backward(model(**batch).loss)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        candidates = [
            load
            for load in ctx.models.loads
            if load.device_map is not None and load.device_map.kind == "multi" and load.library is not None
        ]
        if not candidates or not ctx.models.trains:
            return
        from cfgfix.analysis.training_flow import model_is_trained

        for load in candidates:
            if not model_is_trained(ctx.index, load.call):
                continue  # loaded to merge adapters or to generate: accelerate never prepares it
            device_map = load.device_map
            keyword = next(k for k in load.call.keywords if k.arg == "device_map")
            yield self.finding(
                src.span_of_node(keyword),
                f"`device_map={src.node_text(device_map.node)}` spreads the model over every GPU of "
                "each process, but this script is launched with more than one process: "
                "`accelerator.prepare` (and the HF Trainer) raise `ValueError: You can't train a "
                "model that has been loaded with device_map='auto' in any distributed mode.` Load "
                "one whole model per process instead.",
                fix=self._fix(ctx, keyword),
            )

    def _fix(self, ctx, keyword) -> Fix:
        src, imports = ctx.source, ctx.models.imports
        edits = []
        local = imports.local_name_for("accelerate.PartialState")
        if local is None:
            module = imports.local_name_for("accelerate")
            if module is not None:
                local = f"{module}.PartialState"
            else:
                local = "PartialState"
                edits.append(
                    python_edits.import_name(src, ctx.document.tree, "accelerate", "PartialState", keyword.value.lineno)
                )
        edits.append(python_edits.replace_node(src, keyword.value, f'{{"": {local}().local_process_index}}'))
        return Fix(tuple(edits), "Load one whole model per process", Applicability.UNSAFE)
