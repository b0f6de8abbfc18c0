"""The memory budget of each launch against its target GPU [C14, C15], read by CFX701,
CFX702 and `fix --fit`.

Each budget reads the resolved training setup, turns it into the memory model's input, and
runs the analytic estimator (or the simulator with `--simulate`); there is none without a
target GPU (`gpu` in the settings or `--gpu`), or without a model the catalog or a local
config.json describes. Unknown inputs are taken at the value that needs the least memory
(micro batch 1, no activations without a sequence length, the smaller of fp32 and 16-bit
weights when the dtype is unknown), so a finding holds for every value the files leave
open."""

from __future__ import annotations

from cfgfix.core import Related
from cfgfix.records import replace


class _Budget:
    """One launch's estimate and plan, computed once per run for both rules."""

    def __init__(self, setup, gpu, inputs, result, plan, lower_bound_notes) -> None:
        self.setup = setup
        self.gpu = gpu
        self.inputs = inputs
        self.result = result
        self.plan = plan
        self.notes = lower_bound_notes
        self.simulated: tuple[int, int] | None = None  # (device bytes, bottom of its band) from `--simulate`


def _simulated(memory, model: str | None):
    """(device bytes, the bottom of the simulator's band) of a full-size step, or None when
    the simulator cannot run here or for this setup (the analytic estimate stands)."""
    from cfgfix.memory.simulate_report import model_config

    try:
        from cfgfix.memory.simulate import SimulationUnsupported, SimulatorUnavailable, simulate
    except ImportError:
        return None
    config = model_config(model)
    if config is None:
        return None
    try:
        result = simulate(memory, config)
    except (SimulatorUnavailable, SimulationUnsupported):
        return None
    device = result.peak_bytes + result.cuda_context_bytes
    return device, int(result.peak_bytes * (1 + result.error_band[0])) + result.cuda_context_bytes


def budgets(project) -> list[_Budget]:
    key = ("memory-budgets",)
    if key not in project._scripts:
        project._scripts[key] = [b for b in (_budget(project, s) for s in _setups(project)) if b is not None]
    return project._scripts[key]


def _setups(project):
    from cfgfix.training.resolve import training_setups

    return training_setups(project)


def _budget(project, setup):
    gpu_value = setup.values.get("gpu")
    if gpu_value is None:
        return None  # no target GPU: nothing to import or estimate (the usual pre-commit run)
    if not setup.trains:
        return None  # inference, evaluation, data preparation: no training step to size
    from cfgfix.memory.estimator import estimate
    from cfgfix.memory.gpus import find_gpu
    from cfgfix.training.fit import plan
    from cfgfix.training.memory_setup import memory_input

    gpu = find_gpu(gpu_value.value)
    if gpu is None:
        return None
    inputs = memory_input(setup, project)
    if inputs.shape is None:
        return None
    memory = inputs.setup
    notes = [n for n in inputs.shape.notes if "guessed from the name" in n]
    if memory.zero_stage and setup.get("world_size") is None:
        return None  # sharding over an unknown number of GPUs: no lower bound
    if memory.seq_len is None and memory.resolution is None:
        memory = replace(memory, seq_len=1, resolution=None if inputs.shape.family != "unet" else 8)
        notes.append("activations not counted: no sequence length or resolution found")
    candidates = [memory]
    if setup.get("weights") is None and not memory.deepspeed_half:
        candidates.append(replace(memory, weights="bf16"))
        notes.append("weights dtype unknown: the smaller of fp32 and bf16")
    if setup.get("optimizer") is None:
        candidates = [replace(c, optimizer="sgd") for c in candidates]
        notes.append("optimizer unknown: counted without optimizer states")
    results = [(estimate(c, inputs.shape), c) for c in candidates]
    result, memory = min(results, key=lambda pair: pair[0].peak)
    can_switch = setup.trainer or any(
        "optimizer" in found and source in ("flags", "training config", "config module")
        for source, found in setup.sources.items())
    budget = _Budget(setup, gpu, inputs, result, plan(memory, inputs.shape, gpu, can_switch), notes)
    if getattr(project, "simulate", False) and memory.seq_len != 1:
        budget.simulated = _simulated(memory, setup.get("model"))
    return budget


def over_budget(budget) -> bool:
    """The whole error band is above the GPU's memory (the simulator's band with `--simulate`)."""
    if budget.simulated is not None:
        return budget.simulated[1] > budget.gpu.usable_bytes
    return budget.result.low > budget.gpu.usable_bytes


def budget_related(setup):
    related = []
    for setting in ("micro_batch", "seq_len", "resolution", "precision", "zero_stage", "gradient_checkpointing"):
        value = setup.values.get(setting)
        if value is not None and value.span is not None:
            related.append(Related(value.span, f"{setting.replace('_', ' ')}: {value.value}"))
    return related
