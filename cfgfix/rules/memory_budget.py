"""CFX7xx: the memory budget of each launch against its target GPU [C14, C15].

Both rules read the resolved training setup, turn it into the memory model's input, and
run the analytic estimator; both stay silent without a target GPU (`gpu` in the settings or
`--gpu`), without a model the catalog or a local config.json describes, or when the
estimate's error band reaches below the GPU's memory. Unknown inputs are taken at the value
that needs the least memory (micro batch 1, no activations without a sequence length, the
smaller of fp32 and 16-bit weights when the dtype is unknown), so a finding holds for every
value the files leave open.
"""

from __future__ import annotations

from dataclasses import replace

from cfgfix.core import Related, Severity
from cfgfix.project import ProjectRule
from cfgfix.rules.base import Example, register


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


def _over(budget) -> bool:
    """The whole error band is above the GPU's memory (the simulator's band with `--simulate`)."""
    if budget.simulated is not None:
        return budget.simulated[1] > budget.gpu.usable_bytes
    return budget.result.low > budget.gpu.usable_bytes


def _related(setup):
    related = []
    for setting in ("micro_batch", "seq_len", "resolution", "precision", "zero_stage", "gradient_checkpointing"):
        value = setup.values.get(setting)
        if value is not None and value.span is not None:
            related.append(Related(value.span, f"{setting.replace('_', ' ')}: {value.value}"))
    return related


@register
class DoesNotFit(ProjectRule):
    """## What it does
    Estimates the peak memory per GPU of each launch's training setup (model size from the
    model catalog or a local `config.json`, precision, optimizer, ZeRO/FSDP sharding and
    offload, LoRA, micro batch, sequence length, gradient checkpointing) and flags a launch
    whose estimate exceeds the target GPU's memory over its whole error band. The target GPU
    comes from `gpu` in `[tool.cfgfix]` (or `--gpu`); with none set, nothing is reported.

    The message carries the breakdown (weights, gradients, optimizer states, master weights,
    activations, temporaries, the CUDA context) and corrects the beliefs that usually lead
    there: mixed precision keeps fp32 weights and states; gradient checkpointing shrinks
    activations only; a repeated `.to()` copies nothing.

    ## Why is this bad?
    The run will stop with CUDA out-of-memory, usually after minutes of loading, and the
    usual remedies (`empty_cache()`, `expandable_segments`, a second cast) do not touch the
    model states that do not fit.

    ## Example
    FLAN-T5-XL (2.85B) with bf16 weights and AdamW, batch 8 x 512, no checkpointing, on one
    RTX 5090 (`gpu = "RTX 5090"`): about 21 GiB of model states plus tens of GiB of
    activations.

    ## Use instead
    `cfgfix fix --fit` walks the cheapest changes first (mixed precision, checkpointing, a
    smaller micro batch with more accumulation, an 8-bit optimizer, ZeRO-2, optimizer
    offload, ZeRO-3, parameter offload), keeps the effective batch, and writes the first
    setup that fits into the configs. `cfgfix estimate` shows the numbers.

    ## Fix safety
    No fix on the finding itself: `cfgfix fix --fit` writes the plan (its changes alter
    speed and sometimes numerics; each is explained).

    ## References
    - facts.md C14 (ZeRO and DeepSpeed estimator formulas, HF memory anatomy, activations),
      C15 (the myths)
    """

    code = "CFX701"
    name = "does-not-fit"
    severity = Severity.ERROR

    def check_project(self, project):
        for budget in budgets(project):
            if not _over(budget) or not budget.plan.fits:
                continue  # fits, uncertain, or nothing fits (CFX702)
            from cfgfix.training.fit import breakdown, gib, myths

            setup, result, gpu = budget.setup, budget.result, budget.gpu
            casts = "weights_cast" in setup.sources.get("script", {})
            steps = " -> ".join(r.name for r in budget.plan.rungs)
            corrections = myths(result.setup, result, casts)
            text = (
                f"{setup.get('model')} ({result.shape.params / 1e9:.3g}B parameters) needs about "
                f"{gib(result.peak)} per GPU (band {gib(result.low)}-{gib(result.high)}) against the "
                f"{gpu.name}'s {gib(gpu.usable_bytes)}: {breakdown(result)}"
                + (f"; a simulated step (FakeTensor, --simulate) peaks at {gib(budget.simulated[0])}"
                   if budget.simulated else "")
                + (f". Note: {'; '.join(corrections)}" if corrections else "")
                + f". Cheapest setup that fits: {steps} (`cfgfix fix --fit`)"
                + (f", with {gib(budget.plan.after.cpu_bytes)} of host RAM for the offloaded states"
                   if budget.plan.after.cpu_bytes else "")
                + (f" [{'; '.join(budget.notes)}]" if budget.notes else "")
            )
            yield self.finding(setup.launch.span, text, related=_related(setup))

    _SCRIPT = ("import torch\nfrom transformers import AutoModelForSeq2SeqLM\n\n"
               "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16)\n"
               "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
               "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n")
    _CONFIG = "per_device_train_batch_size: {micro}\ngradient_accumulation_steps: 4\nmax_source_length: 512\n" \
              "gradient_checkpointing: false\nlearning_rate: 1.0e-4\n"
    VALID = [
        Example("python infer.py --config train.yaml\n", "a script that never trains (no backward, no Trainer)",
                path="run.sh", files={"infer.py": _SCRIPT.split("optimizer =")[0] + "model.generate(**inputs)\n",
                                      "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
        Example("python train.py --config train.yaml\n", "no target GPU: silent", path="run.sh",
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8)}),
        Example("python train.py --config train.yaml\n", "fits an H100 80GB", path="run.sh",
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "H100 SXM"\n'}),
        Example("python train.py --config train.yaml\n", "a model nobody knows: silent", path="run.sh",
                files={"train.py": _SCRIPT.replace("google/flan-t5-xl", "acme/secret-model"),
                       "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
    ]
    INVALID = [
        Example("python train.py --config train.yaml\n", "FLAN-T5-XL, AdamW, batch 8 x 512 on an RTX 5090",
                path="run.sh", line=1,
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
    ]


@register
class CannotFitAnySetting(ProjectRule):
    """## What it does
    Flags a launch whose training setup does not fit the target GPU even at the end of
    `fix --fit`'s ladder: ZeRO-3 with optimizer and parameter offload, micro batch 1 and
    gradient checkpointing. The message says by how much, and what would fit instead: LoRA
    or QLoRA instead of a full fine-tune, or more GPUs.

    ## Why is this bad?
    No config change makes this run fit; tuning flags, clearing caches or changing the
    allocator only postpones the out-of-memory error.

    ## Example
    A full fine-tune of a 70B model on one 24 GB GPU.

    ## Use instead
    A parameter-efficient fine-tune (LoRA / QLoRA), or enough GPUs to shard the model.

    ## Fix safety
    No fix: what would fit changes what is trained or the hardware.

    ## References
    - facts.md C14 (DeepSpeed's ZeRO-3 offload estimate: 4L on the GPU, 18 Psi x 1.5 in RAM)
    """

    code = "CFX702"
    name = "cannot-fit-any-setting"
    severity = Severity.ERROR

    def check_project(self, project):
        for budget in budgets(project):
            if not _over(budget) or budget.plan.fits:
                continue
            from cfgfix.training.fit import gib, what_would_fit

            floor = budget.plan.after
            if floor.low <= budget.gpu.usable_bytes:
                continue  # the last rung might fit within the band: not certain
            setup, gpu = budget.setup, budget.gpu
            ideas = what_would_fit(budget.result.setup, budget.result.shape, gpu)
            text = (
                f"{setup.get('model')} ({budget.result.shape.params / 1e9:.3g}B parameters) does not fit the "
                f"{gpu.name} ({gib(gpu.usable_bytes)}) with any config change: even ZeRO-3 with optimizer and "
                f"parameter offload, micro batch 1 and gradient checkpointing needs about {gib(floor.peak)} per GPU "
                f"({gib(floor.peak - gpu.usable_bytes)} over)"
                + (f"; what would fit: {' or '.join(ideas)}" if ideas else "")
            )
            yield self.finding(setup.launch.span, text, related=_related(setup))

    _SCRIPT = ("import torch\nfrom transformers import AutoModelForCausalLM\n\n"
               "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-70B', torch_dtype=torch.bfloat16)\n"
               "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
               "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n")
    VALID = [
        Example("python train.py --max_seq_length 1024\n", "no target GPU: silent", path="run.sh",
                files={"train.py": _SCRIPT}),
        Example("python train.py --max_seq_length 1024\n",
                "70B on one RTX 4090 fits with ZeRO-3 parameter offload (CFX701's, with the host RAM it needs)",
                path="run.sh", files={"train.py": _SCRIPT, "cfgfix.toml": 'gpu = "RTX 4090"\n'}),
    ]
    INVALID = [
        Example("python train.py --max_seq_length 131072\n",
                "128k-token sequences: the checkpointed layer inputs alone outgrow an RTX 4090", path="run.sh", line=1,
                files={"train.py": _SCRIPT.replace("Llama-3.1-70B", "Llama-3.1-8B"), "cfgfix.toml": 'gpu = "RTX 4090"\n'}),
    ]
