"""Print an `Estimate`: a table of the breakdown, a bar chart of the components against the
GPU's memory, and the verdict; or the same as JSON."""

from __future__ import annotations

import json

from cfgfix.memory.estimator import GIB, Estimate, Verdict

_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "master_weights": "fp32 master weights",
    "activations": "activations",
    "temporaries": "temporaries",
    "cuda_context": "CUDA context",
}
_BAR_CHARS = "#=+*%@o~"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def render_text(result: Estimate, gpu_name: str | None = None, usable: int | None = None,
                verdict: Verdict | None = None, width: int = 60) -> str:
    setup, shape = result.setup, result.shape
    lines = [
        f"Model: {shape.source or shape.family} — {shape.params / 1e9:.3g}B parameters"
        + (f", {result.trainable_params / 1e6:.3g}M trainable" if result.trainable_params != shape.params else ""),
        f"Setup: {_describe(setup)}",
        "",
    ]
    # the columns widen with the largest figure, so no two run into each other at any magnitude
    figures = [_gib(n) for comp in (*result.components, *result.cpu) for n in (comp.size, comp.at_peak)]
    w = max(12, 2 + max(len(f) for f in [*figures, _gib(result.peak)]))
    lines.append(f"{'component':<22}{'size':>{w}}{'at peak':>{w}}  how")
    for comp in result.components:
        lines.append(f"{_LABELS[comp.name]:<22}{_gib(comp.size):>{w}}{_gib(comp.at_peak):>{w}}  {comp.formula}")
    lines.append(f"{'peak per GPU':<22}{'':>{w}}{_gib(result.peak):>{w}}  at {result.peak_phase}; "
                 f"band {result.low / GIB:.2f}-{result.high / GIB:.2f} GiB")
    for comp in result.cpu:
        lines.append(f"{'CPU RAM: ' + comp.name:<22}{_gib(comp.size):>{w}}{'':>{w}}  {comp.formula}")
    lines.append("")
    lines.extend(_bar(result, usable, width))
    if verdict is not None:
        lines += ["", f"Verdict: {verdict.text}"]
    if result.assumptions:
        lines += ["", "Assumptions:"] + [f"  - {a}" for a in result.assumptions]
    return "\n".join(lines) + "\n"


def _bar(result: Estimate, usable: int | None, width: int) -> list[str]:
    """One bar of the components live at the peak, scaled to the larger of the peak and the
    GPU; a '|' marks the GPU's usable memory."""
    scale_to = max(result.peak, usable or 0) or 1
    bar, legend = "", []
    for index, comp in enumerate(c for c in result.components if c.at_peak):
        char = _BAR_CHARS[index % len(_BAR_CHARS)]
        cells = max(1, round(comp.at_peak / scale_to * width))
        bar += char * cells
        legend.append(f"{char} {_LABELS[comp.name]}")
    bar = bar[:width].ljust(width, ".")
    lines = []
    if usable:
        mark = min(width - 1, round(usable / scale_to * width))
        lines.append(" " * mark + f"| GPU {usable / GIB:.2f} GiB")
        bar = bar[:mark] + "|" + bar[mark + 1:] if mark < width else bar
    lines.append("[" + bar + "]")
    lines.append("  ".join(legend))
    return lines


def _describe(setup) -> str:
    parts = []
    if setup.deepspeed_half:
        parts.append(f"DeepSpeed {setup.deepspeed_half} engine, ZeRO-{setup.zero_stage}")
    else:
        parts.append(f"{setup.weights} weights" + (f" + {setup.autocast} autocast" if setup.autocast else ""))
        if setup.zero_stage:
            parts.append(f"ZeRO-{setup.zero_stage}")
    if setup.fsdp:
        parts.append(f"FSDP {setup.fsdp}")
    if setup.offload_optimizer:
        parts.append("optimizer offload")
    if setup.offload_params:
        parts.append("parameter offload")
    parts.append(setup.optimizer)
    if setup.lora_rank is not None:
        parts.append(f"{'Q' if setup.quantization else ''}LoRA r={setup.lora_rank}" + (f" ({setup.quantization} base)" if setup.quantization else ""))
    parts.append(f"{setup.num_gpus} GPU{'s' if setup.num_gpus != 1 else ''}")
    parts.append(f"micro batch {setup.micro_batch}" + (f" x {setup.seq_len} tokens" if setup.seq_len else "")
                 + (f" x {setup.sequences_per_sample} sequences (chosen and rejected)" if setup.sequences_per_sample > 1 else ""))
    if setup.checkpointing:
        parts.append("gradient checkpointing")
    return ", ".join(parts)


def render_json(result: Estimate, gpu=None, verdict: Verdict | None = None) -> str:
    data = result.to_dict()
    if gpu is not None:
        data["gpu"] = gpu.to_dict()
    if verdict is not None:
        data["verdict"] = {"fits": verdict.fits, "certain": verdict.certain, "margin_bytes": verdict.margin,
                           "usable_bytes": verdict.usable, "text": verdict.text}
    return json.dumps(data, indent=2) + "\n"
