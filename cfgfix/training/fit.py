"""`fix --fit` and CFX701/CFX702: does a launch's setup fit its target GPU, and if not,
what is the cheapest ladder of changes that makes it fit while keeping the effective batch?

The ladder, cheapest first (each rung keeps what the ones before it changed):
mixed precision -> gradient checkpointing -> a smaller micro batch with more accumulation ->
an 8-bit optimizer -> the paged 8-bit optimizer (bitsandbytes) -> ZeRO-2 -> optimizer offload ->
ZeRO-3 -> parameter offload.
A rung that does not apply (already on, one GPU for sharding, an optimizer built in code other
than torch's AdamW for the 8-bit switch) is skipped. With several GPUs ZeRO-2 moves up
(`_order`); on cards without NVLink ZeRO-3's cost says so (`_cost`). Changes that alter what is trained (LoRA instead of full
fine-tuning, a quantised base) are never written: CFX702 names them as advice.
"""

from __future__ import annotations

from cfgfix.memory.estimator import GIB, Estimate, estimate, verdict
from cfgfix.memory.setup import MemorySetup
from cfgfix.records import dataclass, field, replace


@dataclass(frozen=True)
class Rung:
    key: str  # which ladder step (_RUNGS)
    name: str
    settings: dict  # setting -> value written into the files
    cost: str  # what it costs in speed (or quality)
    setup: MemorySetup
    estimate: Estimate


@dataclass
class Plan:
    before: Estimate
    rungs: list[Rung] = field(default_factory=list)
    fits: bool = False

    @property
    def after(self) -> Estimate:
        return self.rungs[-1].estimate if self.rungs else self.before


def fits(result: Estimate, usable: int) -> bool:
    """Even at the top of the estimate's band, which already holds 5% for the allocator's
    caching and fragmentation (so a written plan is not a coin toss)."""
    return result.high <= usable


def _half(gpu) -> str:
    return "bf16" if gpu is None or gpu.bf16 else "fp16"


def _deepspeed_engine(setup: MemorySetup) -> MemorySetup:
    """Under DeepSpeed an autocast precision becomes the engine's 16-bit weights with fp32
    master copies (the accelerate/HF integrations fill the bf16/fp16 block from it)."""
    if setup.deepspeed_half or setup.lora_rank is not None:
        return setup
    half = setup.autocast or (setup.weights if setup.weights != "fp32" else None)
    if half is None:
        return setup
    return replace(setup, deepspeed_half=half, weights=half, autocast=None)


def _mixed(current, half, can_switch):
    if current.weights == "fp32" and not current.autocast and not current.deepspeed_half:
        return {"mixed_precision": half}, replace(current, autocast=half)
    return None


def _checkpointing(current, half, can_switch):
    return ({"gradient_checkpointing": True}, replace(current, checkpointing=True)) if not current.checkpointing else None


def _halve_micro(current, half, can_switch):
    if current.micro_batch <= 1 or current.micro_batch % 2:
        return None
    effective = current.micro_batch * current.gradient_accumulation
    micro = current.micro_batch // 2
    return {"micro_batch": micro, "grad_accum": effective // micro}, replace(
        current, micro_batch=micro, gradient_accumulation=effective // micro)


def _eight_bit(current, half, can_switch):
    if current.optimizer == "adamw" and can_switch:
        return {"optimizer": "adamw-8bit"}, replace(current, optimizer="adamw-8bit")
    return None


def _paged(current, half, can_switch):
    """bitsandbytes' paged 8-bit AdamW on top of the 8-bit rung: the states page out to host RAM
    when the GPU runs short. Only the 8-bit one is proposed: when the GPU is short the states
    move every step, and paged_adamw_32bit would move four times the bytes (it is read from a
    project and sized all the same). Not under DeepSpeed or FSDP, which own the optimizer's
    placement (ZeRO-Offload needs DeepSpeed's CPU Adam)."""
    if not can_switch or current.zero_stage or current.fsdp or current.deepspeed_half:
        return None
    if current.optimizer != "adamw-8bit":
        return None
    return {"optimizer": "paged-adamw-8bit"}, replace(current, optimizer="paged-adamw-8bit")


def _zero2(current, half, can_switch):
    if current.zero_stage < 2 and not current.fsdp:
        return {"zero_stage": 2}, _deepspeed_engine(replace(current, zero_stage=2))
    return None


def _offload_optimizer(current, half, can_switch):
    if not current.offload_optimizer and not current.fsdp and current.zero_stage >= 2:
        return {"offload_optimizer": True}, replace(current, offload_optimizer=True)
    return None


def _zero3(current, half, can_switch):
    if current.zero_stage < 3 and current.num_gpus > 1 and not current.fsdp:
        return {"zero_stage": 3}, _deepspeed_engine(replace(current, zero_stage=3))
    return None


def _offload_params(current, half, can_switch):
    if not current.offload_params and not current.fsdp:
        return {"zero_stage": 3, "offload_param": True}, _deepspeed_engine(
            replace(current, zero_stage=3, offload_params=True))
    return None


# (name, change, speed cost, enabler: kept only together with a later rung that gains)
_RUNGS = {
    "mixed": ("mixed precision", _mixed, "none: faster on tensor cores; weights and optimizer states stay fp32, "
              "only activations shrink", False),
    "checkpointing": ("gradient checkpointing", _checkpointing, "about one extra forward pass per step (~20-35% slower)", False),
    "micro": ("smaller micro batch", _halve_micro, "same effective batch; smaller matmuls use the GPU less well "
              "(a few % to ~20% slower)", False),
    "8bit": ("8-bit AdamW", _eight_bit, "little speed cost; bitsandbytes' block-wise 8-bit states track 32-bit "
             "Adam closely (needs bitsandbytes)", False),
    "paged": ("paged 8-bit AdamW (bitsandbytes)", _paged, "none while the GPU has room; when it runs short the optimizer "
              "states page to host RAM and each step waits on PCIe transfers (needs bitsandbytes)", False),
    "zero2": ("DeepSpeed ZeRO-2", _zero2, "gradients and optimizer states sharded across the GPUs; reduce-scatter "
              "traffic (small within one node)", True),
    "offload": ("optimizer offload to CPU", _offload_optimizer, "the optimizer step runs on the CPU: often 1.5-3x "
                "slower steps, and it needs the host RAM shown", False),
    "zero3": ("DeepSpeed ZeRO-3", _zero3, "parameters sharded too: every layer is gathered in forward and backward "
              "(~10-30% slower)", False),
    "offload_params": ("parameter offload to CPU", _offload_params, "parameters stream from host memory every step: "
                       "much slower (several x)", False),
}


# Cards without NVLink: every GPU-to-GPU byte crosses PCIe (NVIDIA's product specifications:
# no NVLink connector on the GeForce RTX 40 and 50 series, the RTX 30 series but the 3090, the
# Ada workstation cards, the RTX A4000, L4 / L40 / L40S, T4, A10 / A10G).
PCIE_ONLY = frozenset({
    "RTX 5090", "RTX 5080", "RTX 5070 Ti", "RTX 5070", "RTX 4090", "RTX 4080 Super", "RTX 4080", "RTX 4070 Ti Super",
    "RTX 4070 Ti", "RTX 4070", "RTX 4060 Ti 16GB", "RTX 4060 Ti", "RTX 4060", "RTX 3080 Ti", "RTX 3080", "RTX 3070",
    "RTX 3060", "RTX 6000 Ada", "RTX A4000", "L4", "L40", "L40S", "Tesla T4", "A10", "A10G",
})


def pcie_only(gpu) -> bool:
    return gpu is not None and gpu.name in PCIE_ONLY


def _cost(key: str, cost: str, gpu, after: MemorySetup) -> str:
    """A rung's cost on this GPU: ZeRO-3 gathers every layer's parameters in forward and
    backward, which over PCIe (about 32 GB/s each way on PCIe 4.0 x16, against 600-900 GB/s
    of NVLink) is often the slowest part of the step."""
    if key in ("zero3", "offload_params") and pcie_only(gpu) and after.num_gpus > 1:
        return (cost + f"; the {gpu.name} has no NVLink: each step all-gathers the whole model over PCIe "
                "(~32 GB/s each way on PCIe 4.0 x16, vs 600-900 GB/s NVLink), often slower than QLoRA or "
                "an 8-bit optimizer would cost")
    return cost


def _order(setup: MemorySetup, deepspeed_ready: bool = False) -> list[str]:
    """The issue's order, cheapest first; with several GPUs ZeRO-2 moves before the 8-bit
    optimizer: sharding costs little there and, unlike 8-bit states, leaves the numerics alone.
    When the launch takes a DeepSpeed config cfgfix can write, it moves before checkpointing
    too: its reduce-scatter plus all-gather move the same bytes as DDP's all-reduce (ZeRO
    paper, Rajbhandari et al. 2020, section 7), while checkpointing costs about a third more
    compute every step and a smaller micro batch uses the GPU less well."""
    order = ["mixed", "checkpointing", "micro", "micro", "micro", "micro", "micro", "micro", "8bit", "paged", "zero2",
             "offload", "zero3", "offload_params"]
    if setup.num_gpus > 1:
        order.remove("zero2")
        order.insert(order.index("checkpointing" if deepspeed_ready else "8bit"), "zero2")
    return order


def ladder(setup: MemorySetup, gpu, can_switch_optimizer: bool = True):
    """Every applicable rung in order, each on top of the ones before (for CFX702's floor)."""
    current = setup
    for key in _order(setup):
        name, change, cost, _ = _RUNGS[key]
        applied = change(current, _half(gpu), can_switch_optimizer)
        if applied is not None:
            current = applied[1]
            yield name, applied[0], current, cost


def plan(setup: MemorySetup, shape, gpu, can_switch_optimizer: bool = True, deepspeed_ready: bool = False) -> Plan:
    """The cheapest prefix of the ladder whose result fits `gpu` (a catalog `Gpu`). A rung
    that does not lower the peak is left out (a smaller micro batch when the optimizer step
    is the peak), except an enabler (ZeRO-2 on one GPU, which only optimizer offload makes
    pay), kept when the next gaining rung needs it. `deepspeed_ready`: the launch takes a
    DeepSpeed config cfgfix can write (an HF Trainer, accelerate, the deepspeed launcher)."""
    before = estimate(setup, shape)
    result = Plan(before)
    if fits(before, gpu.usable_bytes):
        result.fits = True
        return result
    current, best = setup, before
    pending: list[Rung] = []
    skipped: list[str] = []  # rungs that did not gain yet: retried after the next one that does
    queue = _order(setup, deepspeed_ready)
    while queue:
        key = queue.pop(0)
        name, change, cost, enabler = _RUNGS[key]
        applied = change(current, _half(gpu), can_switch_optimizer)
        if applied is None:
            continue
        settings, after = applied
        est = estimate(after, shape)
        if key == "micro":
            name = f"micro batch {after.micro_batch} x accumulation {after.gradient_accumulation}"
        rung = Rung(key, name, settings, _cost(key, cost, gpu, after), after, est)
        if est.peak >= best.peak:
            if enabler:
                pending.append(rung)
                current = after
            else:
                skipped.append(key)
            continue
        result.rungs += pending + [rung]
        pending = []
        current, best = after, est
        if fits(est, gpu.usable_bytes):
            result.fits = True
            return _pruned(result, setup, shape, gpu, can_switch_optimizer)
        queue, skipped = skipped + queue, []
    return _pruned(result, setup, shape, gpu, can_switch_optimizer)


def _replay(setup: MemorySetup, keys: list[str], gpu, can_switch: bool) -> tuple[MemorySetup, list]:
    """The setup after applying the ladder steps `keys` in order; the (key, settings, after)
    of each that applied."""
    current, applied = setup, []
    for key in keys:
        change = _RUNGS[key][1](current, _half(gpu), can_switch)
        if change is not None:
            current = change[1]
            applied.append((key, change[0], current))
    return current, applied


def replay(setup: MemorySetup, keys: list[str], gpu, can_switch: bool) -> MemorySetup:
    """`setup` with the ladder steps `keys` applied in order (the least-memory end of a
    range gets the plan made for its most-memory end)."""
    return _replay(setup, keys, gpu, can_switch)[0]


def _pruned(result: Plan, setup: MemorySetup, shape, gpu, can_switch: bool) -> Plan:
    """Drop every kept rung the plan does without, the most expensive first: in a plan that
    fits, one whose removal still fits; in one that does not, one whose removal leaves the
    final peak as low. A rung that raised the peak, or one a later rung made useless (ZeRO-2
    on one GPU, or autocast's 16-bit weight copies once the parameters are offloaded), is never
    part of a plan."""
    rungs = list(result.rungs)
    changed = True
    while changed and rungs:
        changed = False
        final = rungs[-1].estimate
        for index in range(len(rungs) - 1, -1, -1):
            keys = [r.key for i, r in enumerate(rungs) if i != index]
            after, applied = _replay(setup, keys, gpu, can_switch)
            if len(applied) != len(keys):
                continue  # a later rung needs this one to apply
            est = estimate(after, shape)
            if fits(est, gpu.usable_bytes) if fits(final, gpu.usable_bytes) else est.peak <= final.peak:
                kept = [r for i, r in enumerate(rungs) if i != index]
                # re-estimate the remaining rungs in their new order
                rebuilt = []
                for rung, (key, settings, state) in zip(kept, applied):
                    rebuilt.append(replace(rung, settings=settings, setup=state, estimate=estimate(state, shape)))
                rungs, changed = rebuilt, True
                break
    result.rungs = rungs
    result.fits = fits(result.after, gpu.usable_bytes)
    return result


def what_would_fit(setup: MemorySetup, shape, gpu) -> list[str]:
    """For CFX702: changes outside the ladder (what is trained, or the hardware) that fit."""
    rungs = list(ladder(setup, gpu))
    floor = rungs[-1][2] if rungs else setup  # every rung applied
    ideas = []
    if setup.lora_rank is None:
        lora = replace(floor, lora_rank=16, optimizer="adamw")
        if fits(estimate(lora, shape), gpu.usable_bytes):
            ideas.append("LoRA (rank 16) instead of a full fine-tune")
        else:
            qlora = replace(lora, quantization="4bit", weights="bf16", deepspeed_half=None, zero_stage=0,
                            offload_optimizer=False, offload_params=False)
            if fits(estimate(qlora, shape), gpu.usable_bytes):
                ideas.append("QLoRA (a 4-bit base with rank-16 adapters)")
    for gpus in (2, 4, 8, 16, 32, 64):
        if gpus > setup.num_gpus and fits(estimate(replace(floor, num_gpus=gpus), shape), gpu.usable_bytes):
            ideas.append(f"{gpus} GPUs with ZeRO-3")
            break
    return ideas


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def breakdown(result: Estimate) -> str:
    """`weights 21.2 GiB, gradients ..., activations ...` (the components live at the peak)."""
    names = {"weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
             "master_weights": "fp32 master weights", "activations": "activations", "temporaries": "temporaries",
             "cuda_context": "CUDA context"}
    parts = [f"{names[c.name]} {gib(c.at_peak)}" for c in result.components if c.at_peak]
    return ", ".join(parts)


def myths(setup: MemorySetup, result: Estimate, casts_model: bool) -> list[str]:
    """The usual wrong beliefs that apply to this setup, corrected (facts C15)."""
    out = []
    if setup.autocast:
        out.append(f"{setup.autocast} mixed precision keeps fp32 weights, gradients and optimizer states; "
                   f"it saves only activation memory")
    if setup.checkpointing:
        out.append(f"gradient checkpointing shrinks activations only, not the {gib(result.model_states)} of model states")
    if casts_model:
        out.append("the script's repeated .to()/.half() casts copy nothing (they return the same module)")
    return out


def usable(gpu) -> int:
    return gpu.usable_bytes


def verdict_text(result: Estimate, gpu) -> str:
    return verdict(result, gpu.usable_bytes, gpu.name).text
