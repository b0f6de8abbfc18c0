"""What the rules over resolved training setups share (CFX511, CFX601-CFX603): integer
tests, where a training config's values come from, the edit that flips a value, and whether
a GPU computes in bf16."""

from __future__ import annotations

from cfgfix.core import Edit


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


CONFIG_SOURCES = ("training config", "config module")


def flip_edit(project, value, new) -> Edit | None:
    """An edit that writes `new` (a bool or a string) where `value` is set, in the style of its
    file: a YAML/JSON scalar, or a Python literal (the same writer as `fix --fit`)."""
    from cfgfix.training.write_setup import replace_value

    return replace_value(project, "config", value, new)


def gpu_bf16(name: str) -> bool | None:
    """Whether the named GPU computes in bf16 (None: not in the catalog)."""
    try:
        from cfgfix.memory.gpus import find_gpu
    except ImportError:
        return None
    gpu = find_gpu(name)
    return getattr(gpu, "bf16", None) if gpu is not None else None


def weights_may_be_half(setup) -> bool:
    """A config's `torch_dtype: bfloat16`, or a load whose dtype is computed at run time:
    `bf16: false` alone then does not mean fp32 training."""
    if "weights_open" in setup.sources.get("script", {}):
        return True
    for found in setup.sources.values():
        value = found.get("weights_config")
        if value is not None and str(value.value).lower() not in ("float32", "fp32", "torch.float32"):
            return True
    return False
