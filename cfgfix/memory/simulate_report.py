"""`cfgfix estimate --simulate`: run the FakeTensor simulator for a setup and print its
result next to the analytic estimate (the two are checked against each other in tests)."""

from __future__ import annotations

import json
from pathlib import Path

from cfgfix.memory.estimator import GIB


def model_config(model: str | None) -> dict | None:
    """The HF config dict the simulator builds the model from: a local folder's or file's
    config.json, else the catalog's figures for a well-known id."""
    if not model:
        return None
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            return None
    from cfgfix.memory.shapes import catalog_entry

    row = catalog_entry(model)
    return dict(row["config"]) if row is not None and "config" in row else None


def simulate_text(setup, model: str | None, analytic_peak: int, shape=None) -> str:
    """A few lines: the simulated peak (or why it could not run). With `shape`, the analytic
    figure it is compared with follows the CPU's kernels too, as the simulator does."""
    from cfgfix.memory.simulate import SimulationUnsupported, SimulatorUnavailable, simulate

    config = model_config(model)
    if config is None:
        return "Simulation: needs a model config (a local folder with config.json, or a catalog id)\n"
    try:
        result = simulate(setup, config)
    except SimulatorUnavailable as exc:
        return f"Simulation: {exc}\n"
    except SimulationUnsupported as exc:
        return f"Simulation: not supported for this setup ({exc}); the analytic estimate stands\n"
    device = result.peak_bytes + result.cuda_context_bytes
    low, high = result.error_band
    lines = [
        f"Simulated (FakeTensor on the CPU, CPU kernels, {result.steps} steps in {result.wall_seconds:.1f} s): "
        f"peak {result.peak_bytes / GIB:.2f} GiB of tensors; on a GPU + {result.cuda_context_bytes / GIB:.2f} GiB CUDA "
        f"context = {device / GIB:.2f} GiB (band {device * (1 + low) / GIB:.2f}-{device * (1 + high) / GIB:.2f} GiB)",
    ]
    if shape is not None:
        # like with like: the analytic model on the CPU's kernels (attention, dropout masks, no
        # CUDA context) and the optimizer implementation the simulator ran
        from cfgfix.memory.estimator import estimate
        from cfgfix.records import replace

        cpu_peak = estimate(replace(setup, device="cpu", optimizer_impl=setup.optimizer_impl or "foreach"), shape).peak
        lines.append(f"Analytic estimate on the same CPU kernels: {cpu_peak / GIB:.2f} GiB "
                     f"({(cpu_peak - result.peak_bytes) / result.peak_bytes * 100:+.1f}% against the simulation); "
                     f"on CUDA kernels (above): {analytic_peak / GIB:.2f} GiB with the context")
    else:
        lines.append(f"Analytic estimate: {analytic_peak / GIB:.2f} GiB "
                     f"({(analytic_peak - device) / device * 100:+.1f}% against the simulation)")
    lines += [f"  - {a}" for a in result.assumptions]
    return "\n".join(lines) + "\n"


def simulate_json(setup, model: str | None) -> dict:
    from cfgfix.memory.simulate import SimulationUnsupported, SimulatorUnavailable, simulate

    config = model_config(model)
    if config is None:
        return {"error": "no model config"}
    try:
        result = simulate(setup, config)
    except (SimulatorUnavailable, SimulationUnsupported) as exc:
        return {"error": str(exc)}
    return {"peak_bytes": result.peak_bytes, "cuda_context_bytes": result.cuda_context_bytes,
            "device_bytes": result.peak_bytes + result.cuda_context_bytes, "phases": result.phases,
            "error_band": list(result.error_band), "wall_seconds": result.wall_seconds,
            "assumptions": result.assumptions}
