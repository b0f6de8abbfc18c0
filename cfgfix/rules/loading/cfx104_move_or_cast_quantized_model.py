"""CFX104 move-or-cast-quantized-model."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.model_calls import (
    LOAD_OR_LOADER_TRIGGERS,
    MOVE_TRIGGERS,
    call_text,
    drop_call_edits,
    load_related,
    may_hold_model_with,
    name_of,
)
from cfgfix.core import Finding, Fix, Severity
from cfgfix.rules.base import Example, Rule, register


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
    Safe: the call raises, so removing it cannot change a run that worked. Where only some
    paths reach the call with a quantized model (`load_in_8bit=args.int8`, a branch that
    loads 4-bit), it is reported without a fix; under the opposite condition on the same
    name (`if not args.int8:`) it is not reported. Moves of 4-bit
    models on a recent or unknown bitsandbytes are left alone: they work there.

    ## Versions
    Dtype casts (`.to(dtype)`, `.half()`, `.float()`, `.bfloat16()`) and `.cuda()` on an
    8-bit model raise on every transformers version the facts read (4.46.3 and 5.23), so
    they are flagged whatever the versions. Device moves depend on bitsandbytes: flagged
    only when its pin or installed copy is known to be below 0.48 (8-bit) or 0.43.2
    (4-bit). Where nothing says which bitsandbytes, cfgfix stays silent: moves work on
    every release from those on, and the facts read no current release to assume.

    ## References
    - facts A3: transformers `modeling_utils.py` (5.23 L3716, L3766; 4.46.3) errors for
      `.to`, `.cuda`, `.half`, `.float` on quantized models.
    """

    code = "CFX104"
    name = "move-or-cast-quantized-model"
    severity = Severity.ERROR
    fix_availability = "safe"
    trigger_check = staticmethod(may_hold_model_with(b"load_in_", b"quantization_config"))
    triggers = (LOAD_OR_LOADER_TRIGGERS, MOVE_TRIGGERS)

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
            "from transformers import AutoModelForCausalLM\n"
            "def build(args):\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=args.int8)\n"
            "    if not args.int8:\n"
            "        model = model.half().cuda()\n"
            "    return model\n",
            why="the cast and the move run only on the path where the flag is off",
        ),
        Example(
            "import torch\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
            "bnb = BitsAndBytesConfig(load_in_4bit=True)\n"
            "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb if args.q else None)\n"
            "if not args.q:\n"
            "    model.to(torch.float16)\n",
            why="a conditional quantization config, and a cast only where it is off",
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
            "from transformers import AutoModelForCausalLM\n"
            "def build(args):\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', load_in_8bit=args.int8)\n"
            "    model.cuda()\n"
            "    return model\n",
            why="`load_in_8bit=` a flag: when it is set the model is 8-bit and `.cuda()` raises (no fix)",
            line=4,
        ),
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
        if not ctx.models.calls and not ctx.models.possible_calls:
            return  # no call on a model: no version question (the first one reads the code's idioms)
        bnb = ctx.versions.get("bitsandbytes")
        for mc in ctx.models.calls:
            problem = _problem(mc, bnb)
            if problem is None:
                continue
            bits = mc.state.load.quantized
            casts = _casts(mc)
            edits = drop_call_edits(src, mc) if (casts and mc.moves_device is not True) or not casts else None
            kind = _KIND.get(bits, "quantized")
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} is loaded {kind} ({mc.state.load.where}); "
                f"`{call_text(src, mc)}`: {problem}. The load already chose its device and dtype.",
                fix=Fix(tuple(edits), f"Remove `{call_text(src, mc)}`") if edits else None,
                related=[load_related(src, mc.state.load, f"loaded {kind} here")],
            )
        # A name that holds one of several loads (branches, `load_in_8bit=flag`): speak when
        # one that reaches the call is quantized. No fix: the other branches may need the call.
        reported: set[int] = set()
        for mc in sorted(ctx.models.possible_calls, key=lambda c: (c.call.lineno, c.state.load.line)):
            problem = _problem(mc, bnb) if id(mc.call) not in reported else None
            if problem is None:
                continue
            reported.add(id(mc.call))
            kind = _KIND.get(mc.state.load.quantized, "quantized")
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} may hold the model loaded {kind} ({mc.state.load.where}): it is one of "
                f"{mc.alternatives} values that reach this call on different paths; on that path `{call_text(src, mc)}`: "
                f"{problem}. Make the call only where the model is not quantized.",
                related=[load_related(src, mc.state.load, f"loaded {kind} here, on one branch")],
            )


_KIND = {"4bit": "4-bit", "8bit": "8-bit"}


def _casts(mc) -> bool:
    return mc.method in ("half", "float", "bfloat16") or mc.target_dtype is not None


def _problem(mc, bnb) -> str | None:
    """Why the call fails on this quantized load, or None when it works (or is not one)."""
    bits = mc.state.load.quantized
    if bits is None or mc.state.load.library != "transformers":
        return None
    if _casts(mc):
        return "transformers raises `ValueError`: a quantized model cannot be cast to another dtype"
    if mc.device_guarded:
        return None  # `if model.device.type != "cuda":`: a load placed on the GPU never gets here
    if mc.method == "cuda" and bits == "8bit":
        return "transformers raises `ValueError`: calling `cuda()` is not supported for 8-bit models"
    if mc.moves_device and bits == "8bit" and bnb.below("0.48") is True:
        return f"moving an 8-bit model needs bitsandbytes >= 0.48 (the project has {bnb.specifier})"
    if mc.moves_device and bits == "4bit" and bnb.below("0.43.2") is True:
        return f"moving a 4-bit model needs bitsandbytes >= 0.43.2 (the project has {bnb.specifier})"
    return None
