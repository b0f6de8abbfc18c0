"""What kind of config a YAML/JSON document is: accelerate, DeepSpeed, or neither, by its
content (the file name says little: `config.yaml`, `ds.json`, `zero2.json` all occur).
A cheap byte test first, then the parsed top-level keys against each tool's known keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cfgfix.documents.config import ConfigDocument, Node

ACCELERATE_MARKERS = (b"distributed_type", b"compute_environment")
DEEPSPEED_MARKERS = (b"zero_optimi", b"train_micro_batch_size_per_gpu", b"train_batch_size", b"gradient_accumulation_steps")
CONFIG_MARKERS = ACCELERATE_MARKERS + DEEPSPEED_MARKERS


def looks_like_config(data: bytes) -> bool:
    """The cheap byte prefilter: can this YAML/JSON be an accelerate or DeepSpeed config?"""
    return any(marker in data for marker in CONFIG_MARKERS)


def config_kinds(doc: ConfigDocument) -> frozenset[str]:
    """{"accelerate"} / {"deepspeed"} by content, empty when neither (training configs, Helm
    charts, data): only recognised files are checked."""
    # The key tables are imported here: most runs never get past `looks_like_config`.
    from cfgfix.analysis.accelerate_keys import TOP_LEVEL as ACCELERATE_TOP
    from cfgfix.analysis.deepspeed_keys import TOP_LEVEL as DEEPSPEED_TOP

    root = doc.root
    if root is None or root.kind != "mapping" or not root.entries:
        return frozenset()
    keys = set(root.keys())
    if keys & {"distributed_type", "compute_environment"}:
        # accelerate's own files: most top-level keys are accelerate's.
        known = len(keys & ACCELERATE_TOP)
        if known * 2 >= len(keys) and known >= 2:
            return frozenset({"accelerate"})
        return frozenset()
    if _is_deepspeed(root, keys) and len(keys & DEEPSPEED_TOP) * 2 >= len(keys):
        return frozenset({"deepspeed"})
    return frozenset()


# Top-level keys no training-argument file uses: they mark a DeepSpeed config.
_DEEPSPEED_ONLY = frozenset({
    "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "amp", "activation_checkpointing", "flops_profiler", "comms_logger", "sparse_attention", "elasticity",
    "prescale_gradients", "communication_data_type", "gradient_predivide_factor",
})


def _enabled_block(root: Node, key: str) -> bool:
    block = root.get(key)
    return block is not None and block.kind == "mapping" and "enabled" in block


def _is_deepspeed(root: Node, keys: set[str]) -> bool:
    zero = root.get("zero_optimization")
    if zero is not None and (zero.kind == "mapping" or isinstance(zero.value, bool)):
        return True
    if "train_micro_batch_size_per_gpu" in keys:
        return True
    # `train_batch_size` alone is also a diffusers/training argument: need a DeepSpeed block.
    if "train_batch_size" in keys or "gradient_accumulation_steps" in keys:
        optimizer = root.get("optimizer")
        return (
            _enabled_block(root, "fp16")
            or _enabled_block(root, "bf16")
            or any(k.startswith("zero_optimi") for k in keys)
            or bool(keys & _DEEPSPEED_ONLY)
            or (optimizer is not None and optimizer.kind == "mapping" and "type" in optimizer)
        )
    return False
