"""CFX101 redundant-dtype-cast."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.model_calls import (
    LOAD_OR_LOADER_TRIGGERS,
    MOVE_TRIGGERS,
    call_text,
    drop_call_edits,
    load_related,
    load_text,
    may_hold_model,
    name_of,
)
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register


@register
class RedundantDtypeCast(Rule):
    """## What it does
    Flags a cast of a model to the dtype its weights already have: a model loaded with
    `from_pretrained(..., torch_dtype=torch.bfloat16)` (or `dtype=`, or `"bfloat16"`) and then
    `.to(torch.bfloat16)`, `.to(dtype=torch.bfloat16)`, `.bfloat16()`, `.half()` after a
    float16 load, or `.float()` after a float32 load. A transformers load without a dtype is
    a float32 load on transformers 4.x (see Versions), so `.float()` after it is flagged too,
    unless the load runs the hub's own modeling code (`trust_remote_code=True` on a model
    transformers does not implement itself): that code often builds its layers in a dtype of
    its choosing (ChatGLM-6B `params_dtype=torch.half`; ChatGLM2/3 and GLM-4
    `dtype=config.torch_dtype`), so the weights' dtype is not known. A quantized load is
    CFX104's question and is not judged here, nor is one that may be quantized
    (`load_in_8bit=args.int8`, a `quantization_config` variable); `load_in_8bit=False`,
    `load_in_4bit=False` and `quantization_config=None` (literally, or through a name bound
    once to that value) load plain weights, and are judged like a load without them. A cast
    under a test of the model's own dtype (`if self.model.dtype != torch.bfloat16:`) is not
    flagged: where the model already has that dtype, it never runs. A cast under the test
    that picks a conditional dtype (`torch_dtype=torch.float16 if args.fp16 else None`,
    then `if args.fp16: model.half()`) is judged on that side's dtype. The model may come from
    another module of the project: a loader it imports, or the construction of this
    module's class there (`CompleteOptimizedTrainer(model, tokenizer)` in `train.py` for a
    cast in the trainer's `__init__`), or another method of the class that returns it and
    hands it on (`model, tok = self.load(path)`, then `self.export_all(model)` and there
    `self._export(model, fmt)`, whose `.half()` is judged on the model every call passes).

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

    ## Versions
    A load that names its dtype is judged on every version. A transformers load without a
    dtype has the version's default: float32 on transformers 4.x (facts A2: "If not
    specified - the model will get loaded in `torch.float`"), the checkpoint's own dtype
    (`"auto"`) from 5.0. So `.float()` (or `.to(torch.float32)`) after such a load is flagged
    only when the project's transformers is known to be below 5 (a pin, the installed copy,
    or an API the code uses that 5 removed); with no evidence cfgfix assumes the current
    release and stays silent, as CFX102 does. A module that calls `torch.set_default_dtype`
    changes that default, and such loads are not judged.

    ## References
    - facts A2: transformers 4.46-4.57 load float32 when no dtype is passed; 5.x loads "auto".
    - facts A1: `Module._apply` swaps `param.data` in place and returns `self`
      (torch/nn/modules/module.py); `Tensor.to` returns `self` when nothing changes.
    - PyTorch docs, `torch.nn.Module.to`: "This method modifies the module in-place."
    """

    code = "CFX101"
    name = "redundant-dtype-cast"
    severity = Severity.INFO
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_hold_model)
    triggers = (LOAD_OR_LOADER_TRIGGERS, MOVE_TRIGGERS)

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
            "m = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16, load_in_8bit=args.int8)\n"
            "m.half()\n",
            why="`load_in_8bit=` an option: the model may be 8-bit, where the cast raises (CFX104)",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
            "from mylib import model\n"
            "model.to(torch.bfloat16)\n",
            why="an import rebinds the name",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m').float()\n",
            why="no dtype and no transformers version known: the current 5.x loads the checkpoint's dtype, "
            "so `.float()` may be a real cast",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m').float()\n",
            why="transformers 5 loads the checkpoint's own dtype (\"auto\") when none is given",
            files={"requirements.txt": "transformers==5.0.0\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m').half()\n",
            why="a real cast from the float32 default (CFX102's question, not this rule's)",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "torch.set_default_dtype(torch.float16)\n"
            "model = AutoModel.from_pretrained('m').float()\n",
            why="the module changed torch's default dtype, which a load without a dtype uses",
            files={"requirements.txt": "transformers==4.46.3\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('THUDM/chatglm-6b', trust_remote_code=True).float()\n",
            why="the hub's own modeling code builds the layers (ChatGLM: `params_dtype=torch.half`): "
            "no dtype says nothing about the weights, and `.float()` is the real cast a CPU run needs",
            files={"requirements.txt": "transformers==4.27.1\n"},
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import LlamaForCausalLM\n"
            "model = LlamaForCausalLM.from_pretrained(\n"
            "    path,\n"
            "    load_in_8bit=False,\n"
            "    torch_dtype=torch.float16,\n"
            ").half()\n",
            why="`load_in_8bit=False` loads plain float16 weights: the `.half()` is a no-op",
            line=3,
            fixed="import torch\nfrom transformers import LlamaForCausalLM\n"
            "model = LlamaForCausalLM.from_pretrained(\n"
            "    path,\n"
            "    load_in_8bit=False,\n"
            "    torch_dtype=torch.float16,\n"
            ")\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(args.model_path).float()\n",
            why="no dtype on transformers 4.x is already float32",
            line=2,
            files={"requirements.txt": "transformers==4.27.1\n"},
            fixed="from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(args.model_path)\n",
        ),
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
        transformers = None  # asked only for a load without a dtype (reading versions costs)
        for mc in ctx.models.calls:
            state = mc.state
            if mc.target_dtype is None or state.load.library != "transformers" or state.load.quant_keywords:
                continue  # diffusers keeps float32 modules under any dtype; quantized: CFX104
            if mc.dtype_guarded:
                continue  # `if model.dtype != torch.bfloat16:`: where it already is, the cast never runs
            dtype = state.dtype
            if dtype == "default" and mc.target_dtype == "float32":
                transformers = transformers or ctx.versions.get("transformers")
            if dtype == "default" and transformers is not None and transformers.below("5") is True:
                dtype = "float32"  # transformers 4.x loads float32 when no dtype is given
            if dtype != mc.target_dtype:
                continue
            if mc.moves_device is False:
                edits = drop_call_edits(src, mc)
                description = f"Remove the no-op `{call_text(src, mc)}`"
            elif mc.moves_device is True and mc.dtype_arg is not None and mc.method == "to":
                edits = [python_edits.remove_argument(src, mc.call, mc.dtype_arg)]
                description = "Remove the dtype argument that changes nothing"
            else:
                edits = None
                description = ""
            if state.dtype == "default":
                origin = (f"loaded without a dtype on {state.load.where}, which transformers "
                          f"{transformers.describe()} loads in float32")
                related = [load_related(src, state.load, "loaded in float32 here (no dtype)")]
            elif state.cast_by is None:
                origin = f"loaded with `{load_text(src, state.load, state.load.dtype_keyword)}` on {state.load.where}"
                related = [load_related(src, state.load, f"loaded in {state.dtype} here")]
            else:
                origin = f"already cast on line {state.cast_by.lineno}"
                related = [Related(src.span_of_node(state.cast_by), f"cast to {state.dtype} here")]
            # unsafe: the cast also converts float32 buffers (rotary inv_freq) and, for float16,
            # the modules kept in float32; dropping it changes numerics slightly
            applicability = Applicability.UNSAFE
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} already holds {dtype} weights ({origin}): "
                f"`{call_text(src, mc)}` returns the same module and copies no weight that is "
                f"already {dtype}, so it neither costs nor saves memory. It only converts the "
                "float32 buffers the load kept (such as rotary `inv_freq`) and any module transformers "
                "keeps in float32 on purpose.",
                fix=Fix(tuple(edits), description, applicability) if edits else None,
                related=related,
            )
