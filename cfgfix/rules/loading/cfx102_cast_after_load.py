"""CFX102 cast-after-load."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.model_calls import (
    LOAD_OR_LOADER_TRIGGERS,
    MOVE_TRIGGERS,
    call_text,
    drop_call_edits,
    dtype_source_text,
    load_related,
    load_text,
    may_hold_model,
    name_of,
)
from cfgfix.core import Applicability, Finding, Fix, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register


@register
class CastAfterLoad(Rule):
    """## What it does
    Flags a model loaded in float32 and then cast to float16 or bfloat16: an explicit
    `torch_dtype=torch.float32` (or `dtype=`), or no dtype at all on transformers < 5, where
    `from_pretrained` loads float32 by default. A load without a dtype that runs the hub's own
    modeling code (`trust_remote_code=True`, for a model transformers does not implement itself)
    is left alone: ChatGLM's code builds its layers in float16 whatever the default, so its
    `.half()` copies nothing.

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

    When only some paths reach the cast with the float32 load (`if args.quantize: model =
    model.quantize(4)` before it), cfgfix reports it without a fix: loading in the target
    dtype would also change what the other paths start from. A cast under a test entered
    after the paths split is not reported.

    ## Versions
    An explicit float32 load is flagged on every version. A load without a dtype is flagged
    only when the project's transformers is known to be below 5 (a pin, or the installed
    copy); where the project pins nothing, cfgfix assumes the current release (5.x), whose
    load without a dtype is the checkpoint's own dtype, and stays silent. The fix writes
    `dtype=` when transformers is known to be 4.56 or newer, from a pin or from the file's
    own use of `dtype=` in a transformers `from_pretrained` (an API that exists from 4.56),
    and `torch_dtype=` otherwise, which every version accepts.

    ## References
    - facts A1, A2: `from_pretrained` defaults by version (transformers 4.46.3 docstring:
      "If not specified - the model will get loaded in `torch.float` (fp32)"; 5.0 defaults
      to `"auto"`); `dtype` introduced in 4.56 (huggingface/transformers#39782).
    """

    code = "CFX102"
    name = "cast-after-load"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_hold_model)
    triggers = (LOAD_OR_LOADER_TRIGGERS, MOVE_TRIGGERS)

    VALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float32)\n"
            "if args.quantize:\n"
            "    model = model.quantize(4)\n"
            "if args.half:\n"
            "    model = model.half()\n",
            why="the cast sits under a test entered after the paths split: which path reaches it is unknown",
        ),
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
            why="transformers unpinned and not installed: silent, as on the current release (5.x) the load is the checkpoint's dtype",
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
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('THUDM/chatglm-6b', trust_remote_code=True).half().cuda()\n",
            why="ChatGLM's own modeling code builds its layers in float16 (`params_dtype=torch.half`): "
            "nothing float32 is materialised",
            files={"requirements.txt": "transformers==4.27.1\n"},
        ),
    ]
    INVALID = [
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float32)\n"
            "if args.quantize:\n"
            "    model = model.quantize(4)\n"
            "model = model.to(torch.bfloat16)\n",
            why="an unknown method on one path: on the other, the float32 load reaches the cast (no fix: "
            "the load's dtype is what the quantizing path starts from)",
            line=6,
        ),
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
            "from transformers import AutoModelForCausalLM, AutoModel\n"
            "enc = AutoModel.from_pretrained('e', dtype='float32')\n"
            "model = AutoModelForCausalLM.from_pretrained('m')\n"
            "model = model.half()\n",
            why="a pin below 5 that admits 4.55; the file's own `dtype=` (4.56+) dates it: the fix writes `dtype=`",
            line=4,
            files={"requirements.txt": "transformers>=4.40,<5\n"},
            fixed="from transformers import AutoModelForCausalLM, AutoModel\n"
            "enc = AutoModel.from_pretrained('e', dtype='float32')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', dtype=\"float16\")\n",
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
        if not ctx.models.calls and not ctx.models.possible_calls:
            return  # no cast: no version question (the code's idioms are read for the first one)
        transformers = ctx.versions.get("transformers")
        for mc in ctx.models.calls:
            why = _float32_load(src, mc, transformers)
            if why is None:
                continue
            load = mc.state.load
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} is loaded in float32 ({load.where}: {why}) and then cast "
                f"to {mc.target_dtype} with `{call_text(src, mc)}`: the whole float32 model is "
                f"materialised first, twice the memory of {mc.target_dtype} weights. Pass the dtype "
                "to `from_pretrained` instead.",
                fix=self._fix(ctx, mc, transformers),
                related=[load_related(src, load, "loaded in float32 here")],
            )
        # A name that holds one of several values (`if args.quantize: model =
        # model.quantize(4)`): speak when the float32 load reaches the cast on some path.
        # No fix: the load's dtype would change what the other paths start from.
        reported: set[int] = {id(mc.call) for mc in ctx.models.calls}
        for mc in sorted(ctx.models.possible_calls, key=lambda c: (c.call.lineno, c.state.load.line)):
            why = _float32_load(src, mc, transformers) if id(mc.call) not in reported else None
            if why is None:
                continue
            reported.add(id(mc.call))
            load = mc.state.load
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} may hold the model loaded in float32 ({load.where}: {why}): it is one "
                f"of {mc.alternatives} values that reach this call on different paths; on that path "
                f"`{call_text(src, mc)}` casts it to {mc.target_dtype} after the whole float32 model was "
                f"materialised, twice the memory of {mc.target_dtype} weights. Load with the dtype on that path.",
                related=[load_related(src, load, "loaded in float32 here, on one path")],
            )

    def _fix(self, ctx, mc, transformers) -> Fix | None:
        src, load = ctx.source, mc.state.load
        if load.source is not None:
            return None  # the load is in another module: one fix edits one file
        if load.dtype_side:
            return None  # `torch_dtype=X if c else None`: the keyword also serves the other side
        dtype_text = dtype_source_text(ctx.models, mc.target_dtype)
        if load.dtype_keyword is not None and load.dtype_keyword not in load.call.keywords:
            return None  # the dtype sits in a keyword dict (`kw["torch_dtype"] = ...`) other calls may share
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


def _float32_load(src, mc, transformers) -> str | None:
    """Why the model reaching this half-precision cast was loaded in float32, or None."""
    state, load = mc.state, mc.state.load
    if mc.target_dtype not in ("float16", "bfloat16") or state.cast_by is not None:
        return None
    if load.library is None or load.quant_keywords:
        return None  # other loaders have other defaults; quantized loads pick their own dtype
    if state.dtype == "float32":
        return f"`{load_text(src, load, load.dtype_keyword)}`"
    if state.dtype == "default" and load.library == "diffusers":
        return "no dtype: diffusers loads float32 by default"
    if state.dtype == "default" and transformers.below("5") is True:
        return f"no dtype, and transformers {transformers.specifier} loads float32 by default"
    return None
