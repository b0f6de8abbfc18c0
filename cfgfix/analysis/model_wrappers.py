"""Calls that wrap a model and return it (or hold it), for the model analysis
(models.py): PEFT, `prepare_model_for_kbit_training`, DDP/FSDP, `torch.compile`,
`deepspeed.initialize`, an accelerator's or Fabric's `prepare`/`setup`; what each changes."""

from __future__ import annotations

# Calls that wrap a model and return it (or hold it): what each changes. "keep": dtype and
# placement unchanged (DDP, torch.compile); "adapters": PEFT injects adapter weights, which
# it keeps in float32 by default, so the model's dtype is no longer one value; "upcast":
# `prepare_model_for_kbit_training` casts the non-quantized weights to float32.
_FUNCTION_WRAPPERS = {
    "get_peft_model": "adapters",
    "PeftModel.from_pretrained": "adapters",
    "PeftModelForCausalLM.from_pretrained": "adapters",
    "PeftModelForSeq2SeqLM.from_pretrained": "adapters",
    "inject_adapter_in_model": "adapters",
    "prepare_model_for_kbit_training": "upcast",
    "prepare_model_for_int8_training": "upcast",
    "torch.compile": "keep",
    "DistributedDataParallel": "keep",
    "DataParallel": "keep",
    "FullyShardedDataParallel": "keep",
    "DDP": "keep",
    "FSDP": "keep",
}
# Methods of an accelerator (or a Fabric) that return what they are given.
_PREPARE_METHODS = {"prepare", "prepare_model", "unwrap_model", "setup", "setup_module"}
# Methods of a (PEFT) model that return the base model with its placement.
_BASE_MODEL_METHODS = {"merge_and_unload", "get_base_model", "unload"}
# Of those, the ones that take the adapters out (`get_base_model` leaves them in its layers).
_UNLOADS = {"merge_and_unload", "unload"}


_WRAPPER_LAST = frozenset(k.rsplit(".", 1)[-1] for k in _FUNCTION_WRAPPERS) | {"initialize"}


def wrapper_kind(qualified: str | None) -> str | None:
    """How a call such as `get_peft_model(model, cfg)` or `DDP(model)` treats the model
    it is given (see `_FUNCTION_WRAPPERS`), or None for any other call."""
    if not qualified or qualified.rsplit(".", 1)[-1] not in _WRAPPER_LAST:
        return None
    for suffix, kind in _FUNCTION_WRAPPERS.items():
        if qualified == suffix or qualified.endswith("." + suffix):
            return kind
    if qualified.endswith("deepspeed.initialize"):
        return "keep"
    return None


def _prepares(receiver: str) -> bool:
    """`accelerator.prepare(...)`, `self.accelerator.prepare_model(...)`, `fabric.setup(...)`."""
    last = receiver.rsplit(".", 1)[-1].lower()
    return "accelerator" in last or "fabric" in last


# peft releases whose LoRA layers take the dtype of the base layer they wrap, read from the
# wheels: 0.6.2 `LoraLayer.update_layer` casts to `getattr(self, "weight", None)`, which a new
# LoRA `Linear` does not have yet (its adapters stay float32); 0.7.0-0.11.1 cast to
# `getattr(self.get_base_layer(), "weight", None)`'s dtype (`self.to(weight.device,
# dtype=weight.dtype)`, peft/tuners/lora/layer.py); 0.12.0 adds `autocast_adapter_dtype=True`
# to `get_peft_model`, whose `_cast_adapter_dtype` upcasts float16/bfloat16 adapters to
# float32 (peft/tuners/tuners_utils.py: "this only upcasts float16 and bfloat16 to float32").
LORA_IN_BASE_DTYPE = ("0.7.0", "0.12.0")


def lora_takes_base_dtype(versions) -> bool:
    """The project's own pin of peft admits only releases whose LoRA adapters take the base
    layer's dtype (`LORA_IN_BASE_DTYPE`); an installed or assumed peft does not count."""
    info = versions.get("peft") if versions is not None else None
    if info is None or info.evidence != "pin":
        return False
    low, high = LORA_IN_BASE_DTYPE
    return info.at_least(low) is True and info.below(high) is True


def keeps_base_dtype(call, resolver, in_base_dtype: bool) -> bool:
    """`get_peft_model(model, LoraConfig(...))` whose LoRA adapters take the base model's
    dtype: on such a peft (`in_base_dtype`), or with `autocast_adapter_dtype=False`. Only a
    config the code spells as a `LoraConfig` (or a name bound once to one) counts."""
    import ast

    keywords = {k.arg: k.value for k in call.keywords}
    config = keywords.get("peft_config", call.args[1] if len(call.args) > 1 else None)
    config = resolver.deref(config) if config is not None else None
    if not (isinstance(config, ast.Call) and (resolver.imports.qualify(config.func) or "").endswith("LoraConfig")):
        return False
    autocast = keywords.get("autocast_adapter_dtype")
    if autocast is not None:
        return isinstance(autocast, ast.Constant) and autocast.value is False
    return in_base_dtype
