"""The memory answer of one launch: the one computation behind `estimate`, CFX701/CFX702,
`fix --fit`, `explain` and `review` (which carries CFX701/CFX702), so they never disagree.

Every input the launch's files leave open is resolved in this order: the value the code
path really uses (a framework default, already in the resolved setup; the model's
`max_position_embeddings`; transformers 4.x loading in fp32 without a `torch_dtype`),
otherwise a range with its assumption stated in words. The answer is estimated at both ends
of every range:

- "does not fit": even the least-memory end (the bottom of its band) is over the GPU;
- "fits": the most-memory end (the top of its band) is within, every input bounded and
  every part of the model counted;
- otherwise "conditional": the threshold that decides, solved with the estimator ("fits if
  the sequence length is ≤ 1,536", "… if the micro batch is ≤ 2", "… with bf16 weights").

`fix --fit`'s plan is made against the most-memory end, so it never claims "fits" for a
value the files leave open or a term it did not count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cfgfix.records import dataclass, field, replace

if TYPE_CHECKING:
    from cfgfix.memory.estimator import Estimate

GIB = 1024**3  # memory.estimator's, without importing it on a check that has no GPU to judge

FITS, DOES_NOT_FIT, CONDITIONAL = "fits", "does not fit", "conditional"
# how far an input with no upper bound is searched for its threshold
_SEARCH_CAP = {"seq_len": 1 << 20, "micro_batch": 1 << 14, "resolution": 16_384, "num_gpus": 4096}
_LABEL = {"seq_len": "the sequence length", "micro_batch": "the micro batch", "resolution": "the image resolution",
          "num_gpus": "the number of GPUs", "weights": "the weights' dtype", "optimizer": "the optimizer"}
_UNIT = {"seq_len": " tokens", "resolution": " px"}


@dataclass(frozen=True)
class OpenInput:
    """One input the files leave open, as a range of `MemorySetup` values."""

    setting: str  # the MemorySetup field
    low: object  # the value needing the least memory
    high: object  # the value needing the most; for an unbounded input, the point the figures use
    bounded: bool  # False: nothing in the files bounds it from above (from below for num_gpus)
    words: str  # the assumption, for the report

    @property
    def numeric(self) -> bool:
        return isinstance(self.low, int) and not isinstance(self.low, bool)


@dataclass
class MemoryAnswer:
    training: object  # TrainingSetup
    gpu: object | None  # memory.gpus.Gpu, None without a target GPU
    inputs: object  # MemoryInput
    problem: str | None = None  # why nothing was estimated
    open: tuple[OpenInput, ...] = ()
    uncounted: tuple[str, ...] = ()  # parts of the model that could not be sized (a lower bound)
    low: Estimate | None = None  # every open input at its least-memory end
    high: Estimate | None = None  # every open input at its most-memory end: what the commands show
    verdict: str | None = None  # FITS, DOES_NOT_FIT, CONDITIONAL; None without a GPU or an estimate
    condition: str | None = None  # the conditional verdict's threshold, in words
    text: str = ""  # the verdict in one sentence
    plan: object = None  # fit.Plan against the most-memory end (only for a training step)
    plan_verdict: tuple | None = None  # (verdict, condition, text) after the plan
    notes: list[str] = field(default_factory=list)
    simulated: tuple[int, int] | None = None  # (device bytes, bottom of its band) from `--simulate`

    @property
    def estimated(self) -> bool:
        return self.high is not None

    @property
    def peak(self) -> int:
        return self.high.peak

    @property
    def range(self) -> tuple[int, int]:
        """The bottom of the least-memory end's band, the top of the most-memory end's."""
        return self.low.low, self.high.high

    @property
    def assumed(self) -> list[str]:
        return [o.words for o in self.open] + list(self.inputs.assumptions if self.inputs else ())

    def range_text(self) -> str:
        lo, hi = self.range
        return f"{lo / GIB:.1f}-{hi / GIB:.1f} GiB"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "condition": self.condition, "text": self.text,
            "peak_bytes": self.high.peak if self.high else None,
            "range_bytes": list(self.range) if self.high else None,
            "open": [{"setting": o.setting, "low": o.low, "high": o.high, "bounded": o.bounded, "assumption": o.words}
                     for o in self.open],
            "uncounted": list(self.uncounted),
        }


def answers(project) -> list[MemoryAnswer]:
    """One answer per launch of the project, memoised per run (every command reads these)."""
    from cfgfix.training.resolve import training_setups

    return [answer_for(project, setup) for setup in training_setups(project)]


def judged(project) -> list[MemoryAnswer]:
    """The answers CFX701/CFX702 read: launches with a target GPU and a training step only,
    so a check without a GPU (the usual pre-commit run) imports and estimates nothing."""
    from cfgfix.training.resolve import training_setups

    return [answer_for(project, setup) for setup in training_setups(project) if setup.get("gpu") and setup.trains]


def answer_for(project, setup) -> MemoryAnswer:
    """The launch's answer, computed once per run."""
    memo = project._scripts.setdefault(("memory-answers",), {})
    if id(setup) not in memo:
        memo[id(setup)] = (setup, answer(setup, project))  # the setup kept: its id stays its own
    return memo[id(setup)][1]


def answer(training, project=None) -> MemoryAnswer:
    """The answer of one launch of a project, from its resolved `TrainingSetup`."""
    from cfgfix.memory.gpus import find_gpu
    from cfgfix.training.memory_setup import memory_input

    gpu_value = training.get("gpu")
    gpu = find_gpu(gpu_value) if gpu_value else None
    inputs = memory_input(training, project)
    simulate = project is not None and getattr(project, "simulate", False)
    return answer_of(inputs, gpu, training, simulate=simulate)


def answer_of(inputs, gpu, training=None, simulate: bool = False, unstated: dict | None = None) -> MemoryAnswer:
    """The answer for `inputs` (a `MemoryInput`) on `gpu`: what a launch's files give
    (`answer`), or what `cfgfix estimate --model/--params` flags state
    (training/estimate_flags.py), through the same ranges and verdict. `training`: the
    launch's `TrainingSetup`, None for flags (no fit plan: a plan edits the launch's files).
    `unstated`: how an open input is said missing, by setting ("not given (--seq)")."""
    from cfgfix.memory.estimator import estimate

    result = MemoryAnswer(training, gpu, inputs, problem=inputs.model_problem)
    if inputs.shape is None:
        return result
    result.notes = [n for n in inputs.shape.notes if "guessed from the name" in n]
    result.uncounted = tuple(inputs.uncounted)
    low, high, opened = resolve_open(training, inputs, unstated)
    result.open = tuple(opened)
    result.low, result.high = estimate(low, inputs.shape), estimate(high, inputs.shape)
    if gpu is None:
        return result
    if simulate:
        model = training.get("model") if training is not None else inputs.setup.model
        result.simulated = _simulated(high, model)  # the most-memory end's step
    # the simulator's band bottom is the answer's only when nothing is open (it measured one end)
    result.verdict, result.condition, result.text = judge(low, high, opened, result.uncounted, inputs.shape, gpu,
                                                          None if opened else result.simulated)
    if training is not None and training.trains is not False:
        from cfgfix.training.fit import plan
        from cfgfix.training.write_setup import is_torch_adamw

        in_code = training.sources.get("script", {}).get("optimizer")
        can_switch = training.trainer or any(
            "optimizer" in found and source in ("flags", "training config", "config module")
            for source, found in training.sources.items()) or (
            in_code is not None and is_torch_adamw(in_code))  # patched: torch's AdamW -> bnb's 8-bit one
        deepspeed_ready = bool(training.trainer or training.launch.launcher in ("accelerate", "deepspeed")
                               or "deepspeed" in training.files)
        result.plan = plan(high, inputs.shape, gpu, can_switch, deepspeed_ready)
        if result.plan.rungs:
            keys = [r.key for r in result.plan.rungs]
            from cfgfix.training.fit import replay

            low_after = replay(low, keys, gpu, can_switch)
            result.plan_verdict = judge(low_after, result.plan.after.setup, opened, result.uncounted, inputs.shape, gpu)
    return result


# -- the open inputs --------------------------------------------------------------------------------

def resolve_open(training, inputs, unstated: dict | None = None):
    """(least-memory MemorySetup, most-memory MemorySetup, [OpenInput]) of a launch.
    `training`: its `TrainingSetup`, None for `estimate`'s flags."""
    from cfgfix.memory.estimator import DEFAULT_RESOLUTION, DEFAULT_SEQ, DIFFUSION_TRANSFORMER_TEXT_TOKENS
    from cfgfix.memory.transformers_versions import release

    setup, shape, unknown = inputs.setup, inputs.shape, set(inputs.unknown)
    missing = {"seq_len": "not found", "resolution": "not found", **(unstated or {})}
    opened: list[OpenInput] = []
    # a diffusion model's tokens come from the image (a UNet's latent; SD3/Flux: latent patches
    # + text tokens, memory/estimator.py): its resolution is the open input, never a length
    if shape.family == "unet" or shape.family in DIFFUSION_TRANSFORMER_TEXT_TOKENS:
        if setup.resolution is None:
            top = DEFAULT_RESOLUTION["unet"]
            opened.append(OpenInput("resolution", 8, top, True,
                                    f"image resolution {missing['resolution']}: from 8 px up to {top:,} px (the native size of SDXL, SD3 and FLUX)"))
    elif setup.seq_len is None and not shape.tokens:
        positions = shape.max_positions
        if positions:
            opened.append(OpenInput("seq_len", 1, positions, True,
                                    f"sequence length {missing['seq_len']}: from 1 token up to the model's {positions:,} positions "
                                    "(max_position_embeddings)"))
        else:
            point = DEFAULT_SEQ.get(shape.family, 2048)
            opened.append(OpenInput("seq_len", 1, point, False,
                                    f"sequence length {missing['seq_len']} and the model states no position limit: figures at "
                                    f"{point:,} tokens, no upper bound"))
    if "weights" in unknown:
        version = training.transformers_version if training is not None else setup.transformers_version
        parsed = release(version) if version else None
        if shape.family == "unet":
            # diffusers 0.31.0 models/model_loading_utils.py load_model_dict_into_meta:
            # `dtype = dtype or torch.float32` (a from_pretrained without torch_dtype)
            inputs.assumptions.append("weights: fp32 (no dtype in the script; diffusers loads in float32 without "
                                      "torch_dtype)")
        elif parsed is not None and parsed[0] < 5:
            # transformers 4.46.3 modeling_utils.py from_pretrained: "If torch_dtype is not None, we use
            # that dtype" — without one the model is built in torch's default dtype, float32
            inputs.assumptions.append(f"weights: fp32 (no dtype in the script; transformers {version} loads in "
                                      "torch's default float32 without torch_dtype)")
        else:
            opened.append(OpenInput("weights", "bf16", "fp32", True,
                                    "weights' dtype not found: bf16 (a 16-bit checkpoint loaded with its dtype) "
                                    "up to fp32 (torch's default)"))
    if "optimizer" in unknown:
        opened.append(OpenInput("optimizer", "sgd", "adamw", True,
                                "optimizer not found: from one without states (SGD) up to AdamW (two fp32 states per weight)"))
    if "micro_batch" in unknown:
        opened.append(OpenInput("micro_batch", 1, 1, False, "micro batch not found: figures at 1, no upper bound"))
    if "world_size" in unknown and (setup.zero_stage or setup.fsdp):
        opened.append(OpenInput("num_gpus", 64, 1, True,
                                "number of GPUs not found under sharding: from 1 (nothing sharded) to 64"))
    low = replace(setup, **{o.setting: o.low for o in opened})
    high = replace(setup, **{o.setting: o.high for o in opened})
    if any(o.setting == "weights" for o in opened) and setup.frozen:
        # frozen models loaded without a dtype follow the same load: 16-bit at the low end
        loaded = set(getattr(inputs, "load_dtype", ()))
        low = replace(low, frozen=tuple((n, p, 2 if n in loaded else b) for n, p, b in setup.frozen))
    return low, high, opened


# -- the verdict ------------------------------------------------------------------------------------

def _fits(setup, shape, usable: int) -> bool:
    from cfgfix.memory.estimator import estimate

    return estimate(setup, shape).high <= usable


def judge(low, high, opened, uncounted, shape, gpu, simulated=None) -> tuple[str, str | None, str]:
    """(verdict, condition, text) of the range from `low` to `high` on `gpu`."""
    from cfgfix.memory.estimator import estimate

    usable, name = gpu.usable_bytes, gpu.name
    bottom = simulated[1] if simulated else estimate(low, shape).low
    top_estimate = estimate(high, shape)
    top = top_estimate.high
    lower = " (a lower bound: " + ", ".join(uncounted) + " not counted)" if uncounted else ""
    if bottom > usable:
        what = "" if not opened else " even at the least-memory end of what the files leave open"
        return DOES_NOT_FIT, None, (f"does not fit {name}: at least {bottom / GIB:.1f} GiB{what}{lower}, "
                                    f"{(bottom - usable) / GIB:.1f} GiB over")
    unbounded = [o for o in opened if not o.bounded]
    if top <= usable and not unbounded and not uncounted:
        return FITS, None, f"fits {name}: {(usable - top_estimate.peak) / GIB:.1f} GiB to spare (even at the band's top)"
    condition = _condition(low, high, opened, shape, usable)
    if condition is None and uncounted and top <= usable:
        condition = f"the parts not counted ({', '.join(uncounted)}) need at most {(usable - top) / GIB:.1f} GiB"
    if condition is None and top <= usable:
        condition = ", ".join(f"{_LABEL[o.setting]} stays near the figures' {o.high:,}{_UNIT.get(o.setting, '')}"
                              for o in unbounded) or None
    if condition is None:
        peak = top_estimate.peak
        if peak <= usable:
            return CONDITIONAL, "the step peaks in the lower part of the estimate's band", (
                f"tight on {name}: fits at the estimate's {peak / GIB:.1f} GiB, not at its band's top "
                f"({top / GIB:.1f} GiB)")
        return CONDITIONAL, "the step peaks at the bottom of the estimate's band", (
            f"probably does not fit {name}: {(peak - usable) / GIB:.1f} GiB over at the estimate's "
            f"{peak / GIB:.1f} GiB (the band's bottom, {bottom / GIB:.1f} GiB, would fit)")
    return CONDITIONAL, condition, f"fits {name} only if {condition}{lower}"


def _condition(low, high, opened, shape, usable: int) -> str | None:
    """The threshold that decides, in words: one numeric input solved for its limit with the
    rest at their most-memory end; else the categorical ones (dtype, optimizer) at their
    least-memory end and a numeric one solved; else one categorical input alone, or all of
    them at their least-memory end (only when no numeric input is left unbounded)."""
    numeric = [o for o in opened if o.numeric]
    categorical = [o for o in opened if not o.numeric]

    def solved(base, prefix):
        for item in numeric:
            limit = _solve(base, item, shape, usable)
            if limit is None:
                continue
            sign = "≥" if item.setting == "num_gpus" else "≤"
            if item.bounded and (limit >= item.high if sign == "≤" else limit <= item.high):
                continue  # the whole range of this input fits: another one decides
            return " and ".join(prefix + [f"{_LABEL[item.setting]} is {sign} {limit:,}{_UNIT.get(item.setting, '')}"])
        return None

    found = solved(high, [])
    if found is None and categorical and numeric:
        found = solved(replace(high, **{o.setting: o.low for o in categorical}),
                       [f"{_LABEL[o.setting]} is {_shown(o.low)}" for o in categorical])
    if found is not None or any(not o.bounded for o in numeric):
        return found
    for item in categorical:
        if _fits(replace(high, **{item.setting: item.low}), shape, usable):
            return f"{_LABEL[item.setting]} is {_shown(item.low)}, not {_shown(item.high)}"
    if categorical and _fits(low, shape, usable):
        return " and ".join(f"{_LABEL[o.setting]} is {_shown(o.low)}" for o in categorical)
    return None


def _shown(value) -> str:
    return {"sgd": "one without states (SGD)", "adamw": "AdamW"}.get(value, str(value))


def _solve(base, item: OpenInput, shape, usable: int) -> int | None:
    """The largest value of `item` (the smallest number of GPUs) at which `base` fits, or None
    when even its least-memory value does not."""
    setting = item.setting
    if setting == "num_gpus":
        if not _fits(replace(base, num_gpus=item.low), shape, usable):
            return None
        lo, hi = 1, item.low  # fits at hi; find the smallest that fits
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _fits(replace(base, num_gpus=mid), shape, usable) else (mid + 1, hi)
        return lo
    start = item.low
    if not _fits(replace(base, **{setting: start}), shape, usable):
        return None
    top = item.high if item.bounded else _SEARCH_CAP[setting]
    if _fits(replace(base, **{setting: top}), shape, usable):
        return top
    lo, hi = start, top  # fits at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(replace(base, **{setting: mid}), shape, usable) else (lo, mid)
    if setting == "seq_len" and lo > 256:
        lo -= lo % 64  # a length a user would write
    if setting == "resolution" and lo > 64:
        lo -= lo % 64
    return lo


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
        result = simulate(as_simulated(memory), config)
    except (SimulatorUnavailable, SimulationUnsupported):
        return None
    device = result.peak_bytes + result.cuda_context_bytes
    return device, int(result.peak_bytes * (1 + result.error_band[0])) + result.cuda_context_bytes


def as_simulated(memory):
    """The setup the simulator runs: DPO's chosen and rejected as one batch of 2 x micro batch
    (what TRL's concatenated_forward feeds the model)."""
    if memory.sequences_per_sample == 1:
        return memory
    return replace(memory, micro_batch=memory.micro_batch * memory.sequences_per_sample, sequences_per_sample=1)


def related(training):
    """The settings behind the answer, as a finding's related spans."""
    from cfgfix.core import Related

    found = []
    for setting in ("micro_batch", "seq_len", "resolution", "precision", "zero_stage", "gradient_checkpointing"):
        value = training.values.get(setting)
        if value is not None and value.span is not None:
            found.append(Related(value.span, f"{setting.replace('_', ' ')}: {value.value}"))
    return found


def reported(found: MemoryAnswer) -> str | None:
    """Which memory rule reports the answer: "CFX702" (no config change fits, surely),
    "CFX701" (does not fit; or conditional, while even the bottom of the band at the
    most-memory end of what the files leave open is over), or None."""
    if found.verdict is None or not found.training.trains or found.plan is None:
        return None
    usable = found.gpu.usable_bytes
    if found.verdict == DOES_NOT_FIT:
        # the plan is made for the most-memory end; CFX702 only when even the least-memory
        # end, after every rung the ladder applied, surely does not fit
        after = found.plan_verdict[0] if found.plan_verdict else DOES_NOT_FIT
        if not found.plan.fits and after == DOES_NOT_FIT:
            return "CFX702"
        return "CFX701"
    if found.verdict == CONDITIONAL and found.open and found.high.low > usable:
        return "CFX701"
    return None
