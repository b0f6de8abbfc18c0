"""`--lora-targets`: which Linear layers of a model's blocks LoRA adapts, as PEFT matches
`target_modules` (peft 0.13.2 tuners/tuners_utils.py `check_target_module_exists`: a module
is adapted when its name equals a target or ends with "." + target), plus the short role
names users write in issues ("q,v", "q,k,v,o") and PEFT's "all-linear" (every Linear in the
blocks, the output head left out: peft 0.13.2 utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND)."""

from __future__ import annotations

ALL_LINEAR = ("all-linear", "all_linear", "all")  # "all": LLaMA-Factory's lora_target spelling

# A role's spellings across the families' Linear names (memory/shapes.py, memory/families.py):
# Llama-style *_proj, BERT's query/key/value, T5's q/k/v/o/wi/wo, Mixtral's w1/w2/w3.
ROLES = {
    "q": ("q_proj", "query", "q", "wq", "to_q"),
    "k": ("k_proj", "key", "k", "wk", "to_k"),
    "v": ("v_proj", "value", "v", "wv", "to_v"),
    "o": ("o_proj", "out_proj", "attention.output.dense", "dense", "o", "wo", "to_out.0"),
    "gate": ("gate_proj", "w1"),
    "up": ("up_proj", "w3"),
    "down": ("down_proj", "w2"),
}


# PEFT's targets for a LoraConfig without target_modules, by model type (peft 0.13.2
# utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, applied by
# tuners/lora/model.py `_prepare_adapter_config`), for the families the shapes model.
PEFT_DEFAULT_TARGETS = {
    "t5": "q,v", "gpt2": "c_attn", "gpt_neox": "query_key_value", "bert": "query,value", "llama": "q_proj,v_proj",
    "mistral": "q_proj,v_proj", "mixtral": "q_proj,v_proj", "phi": "q_proj,v_proj,fc1,fc2", "gemma": "q_proj,v_proj",
    "gemma2": "q_proj,v_proj", "qwen2": "q_proj,v_proj", "falcon": "query_key_value", "chatglm": "query_key_value",
    "deberta-v2": "query_proj,value_proj",
}


def project_targets(spec, shape) -> tuple[tuple[str, ...] | None, str | None]:
    """A project's stated targets (a comma list, "peft-default" for a LoraConfig without
    target_modules), resolved as `resolve_targets`; a target the shape cannot match keeps
    every Linear (the most-memory reading) and says so."""
    if isinstance(spec, (list, tuple)):
        spec = ",".join(str(s) for s in spec)
    if not isinstance(spec, str) or not spec.strip() or not model_linears(shape):
        return None, None  # no layers itemised (a UNet): the estimator's own adapter rule stands
    if spec == "peft-default":
        default = PEFT_DEFAULT_TARGETS.get(shape.family)
        if default is None:
            return None, (f"LoRA targets: peft's default for model type {shape.family!r} is not known here: "
                          "every Linear in the blocks assumed")
        spec = default
    try:
        return resolve_targets(spec, shape)
    except TargetError as exc:
        return None, f"{exc}: every Linear in the blocks assumed"


class TargetError(ValueError):
    """A target list that names no Linear layer of the model."""


def _matches(name: str, target: str) -> bool:
    """PEFT's rule, read both ways: the shapes keep a Linear's name as the tail of its module
    path ("attention.output.dense"), a user may write a longer tail ("self_attn.q_proj")."""
    return name == target or name.endswith("." + target) or target.endswith("." + name)


def model_linears(shape) -> list[str]:
    return list(dict.fromkeys(name for block in shape.blocks for name, _, _ in block.linears))


def resolve_targets(spec: str, shape) -> tuple[tuple[str, ...] | None, str]:
    """(the Linear names adapted, None for every one; the choice in words) of a comma list."""
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        raise TargetError("--lora-targets: empty; give module names (q_proj,v_proj), roles (q,v) or all-linear")
    if len(tokens) == 1 and tokens[0].lower().replace(" ", "-") in ALL_LINEAR:
        return None, "LoRA targets: every Linear in the blocks (all-linear)"
    linears = model_linears(shape)
    if not linears:
        raise TargetError("--lora-targets: --params gives no layers to match module names against; "
                          "name the model (--model), or give --lora-targets all-linear")
    chosen: list[str] = []
    for token in tokens:
        found = [n for n in linears if _matches(n, token)]
        if not found and token.lower() in ROLES:
            found = [n for n in linears if any(_matches(n, alias) for alias in ROLES[token.lower()])][:1]
        if not found:
            raise TargetError(f"--lora-targets: {token!r} names no Linear layer of the model's blocks "
                              f"({', '.join(linears)}; or a role: {', '.join(ROLES)})")
        chosen += found
    chosen = list(dict.fromkeys(chosen))
    if set(chosen) == set(linears):
        return None, f"LoRA targets: {', '.join(chosen)} (every Linear in the blocks)"
    return tuple(chosen), f"LoRA targets: {', '.join(chosen)} (of {', '.join(linears)})"
