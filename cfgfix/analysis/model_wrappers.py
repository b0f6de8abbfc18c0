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
