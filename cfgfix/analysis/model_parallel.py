"""The model-parallel sizes a launch states (tensor, pipeline, context parallel), read from
its script flags (`--tensor-model-parallel-size 2`) and its training config
(`tensor_parallel_size: 2`): the ranks of one model-parallel group share one batch, so the
data-parallel size that batch arithmetic multiplies by is processes / (TP x PP x CP), as
Megatron's `parallel_state.initialize_model_parallel` builds its groups (and DeepSpeed takes
the data-parallel size from that `mpu`).

Only literal sizes under names this module knows count. Any other model-parallel-looking
name above 1 (an expert or sequence-parallel size, a vLLM engine's own tensor-parallel
size) or a size it cannot read makes the answer unknown: a rule then says nothing rather
than divide by a guess. A size of 1 divides nothing, whatever its name.
"""

from __future__ import annotations

import re

from cfgfix.core import Related
from cfgfix.records import dataclass, field

# name (lower case, `-` as `_`) -> which dimension it sizes
SIZES = {
    "tensor_model_parallel_size": "tensor", "tensor_parallel_size": "tensor", "tp_size": "tensor",
    "pipeline_model_parallel_size": "pipeline", "pipeline_parallel_size": "pipeline", "pp_size": "pipeline",
    "context_parallel_size": "context", "cp_size": "context",
}
_MEGATRON_FLAGS = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"}
# Names that look like a model-parallel size but are not one of the above: unknown effect.
_PARALLEL_LIKE = re.compile(r"(tensor|pipeline|context|sequence|expert)_(model_)?parallel_(size|degree)"
                            r"|^(tp|pp|cp|sp|ep)_(size|degree)$|parallel_degree")


@dataclass
class ModelParallel:
    """`divisor` = TP x PP x CP (1 when nothing is stated, None when unknown), `text` the
    sizes in words ("tensor_parallel_size 2"), `related` where they are set."""

    divisor: int | None = 1
    text: str = ""
    related: list = field(default_factory=list)
    # every size is stated with Megatron's own flag (`--tensor-model-parallel-size`): the
    # launch is Megatron's, which hands DeepSpeed its data-parallel groups (an `mpu`, or a
    # pipeline topology of PP x TP x DP)
    megatron: bool = False


def _name(text: str) -> str:
    return text.lstrip("-").replace("-", "_").lower()


def _size(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 6:
        return int(value) or None
    return None


def _config_sizes(doc) -> list[tuple[str, object, object]]:
    """(key, scalar value, span) of the size-like settings of a config document, found once
    per document: each launch and each round of `fix` asks again (issue 24)."""
    found = doc.memo.get("model-parallel")
    if found is not None:
        return found
    found = []
    stack = [(doc.root, 0)]
    while stack:
        node, depth = stack.pop()
        if node is None or node.kind != "mapping" or depth > 6:
            continue
        for key, value in node.entries:
            if not isinstance(key.value, str):
                continue
            if value.kind == "mapping":
                stack.append((value, depth + 1))
            elif SIZES.get(_name(key.value)) or _PARALLEL_LIKE.search(_name(key.value)):
                found.append((key.value, value.value if value.kind == "scalar" else None, doc.span(value)))
    doc.memo["model-parallel"] = found
    return found


def from_sources(args=(), doc=None, doc_label: str = "") -> ModelParallel:
    """The sizes in a launch's script arguments (`(text, span)` tokens) and a training config
    document; a size stated twice must agree."""
    found: dict[str, tuple[int, str, object]] = {}
    flags: list[bool] = []
    unknown = False

    def note(name: str, value, span, where: str) -> None:
        nonlocal unknown
        key = _name(name)
        if _size(value) == 1:
            return  # a size of 1 divides nothing, whatever it sizes
        if "vllm" in key:  # a generation engine's own size: its effect on training is not read here
            unknown = unknown or bool(_PARALLEL_LIKE.search(key.replace("vllm_", "")))
            return
        dimension = SIZES.get(key)
        if dimension is None:
            if _PARALLEL_LIKE.search(key):
                unknown = True
            return
        size = _size(value)
        if size is None or (dimension in found and found[dimension][0] != size):
            unknown = True
            return
        found.setdefault(dimension, (size, f"{key} {size}", Related(span, f"{key} {size}{where}") if span else None))
        flags.append(bool(not where and name.startswith("--") and key in _MEGATRON_FLAGS))

    tokens = list(args)
    for i, (text, span) in enumerate(tokens):
        if not text.startswith("-"):
            continue
        name, eq, value = text.partition("=")
        if not (SIZES.get(_name(name)) or _PARALLEL_LIKE.search(_name(name))):
            continue
        if not eq:
            value, span = (tokens[i + 1][0], tokens[i + 1][1]) if i + 1 < len(tokens) else (None, span)
        note(name, value, span, "")
    if doc is not None:
        for name, value, span in _config_sizes(doc):
            note(name, value, span, f" in {doc_label}" if doc_label else "")
    if unknown:
        return ModelParallel(None)
    divisor = 1
    for size, _, _ in found.values():
        divisor *= size
    return ModelParallel(divisor, " x ".join(text for _, text, _ in found.values()),
                         [r for _, _, r in found.values() if r is not None], bool(flags) and all(flags))
