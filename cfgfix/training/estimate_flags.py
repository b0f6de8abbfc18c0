"""`cfgfix estimate --model/--params ...`: the run the flags state, as the `MemoryInput` a
launch's files would give, answered by training/memory_answer.py like every launch of a
project (the same ranges for what the flags leave open, the same verdicts and exit codes).

The flags that state more than one `MemorySetup` field live here: `--lora-targets` (the
Linear layers adapted, memory/lora_targets.py), `--task dpo` (TRL's DPOTrainer: chosen and
rejected in one batch, a frozen reference model), `--deepspeed-config` (the JSON read by the
project mode's own readers) and `--torch-version` (the optimizer's defaults by release).
"""

from __future__ import annotations

import re
from pathlib import Path

from cfgfix.records import dataclass, field


class FlagError(ValueError):
    """Flags that state no run (bad input); the message names what is wrong or missing."""


@dataclass(frozen=True)
class RunFlags:
    """`estimate`'s run-describing flags as given (None: not given)."""

    model: str | None = None
    params: float | None = None
    gpu: str | None = None
    num_gpus: int = 1
    precision: str = "fp32"
    optimizer: str = "adamw"
    zero: int = 0
    fsdp: str | None = None
    offload: str = "none"
    batch: int = 1
    seq: int | None = None
    target_seq: int | None = None
    resolution: int | None = None
    lora_rank: int | None = None
    lora_targets: str | None = None
    quantize: str | None = None
    checkpointing: bool = False
    device: str = "cuda"
    attention: str | None = None
    optimizer_impl: str | None = None
    head: str | None = None
    grad_accum: int = 1
    variable_length: bool | None = None
    task: str = "sft"
    no_reference: bool = False
    deepspeed_config: Path | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    given: frozenset = field(default_factory=frozenset)  # the flags given on the command line, by name


# what an open input's words say for flags: the flag that would close it
UNSTATED = {"seq_len": "not given (--seq)", "resolution": "not given (--resolution)"}


def flags_answer(flags: RunFlags, simulate: bool = False):
    """(MemoryAnswer, warnings) of the run the flags state; FlagError for bad input."""
    from cfgfix.training.memory_answer import answer_of

    inputs, gpu, warnings = flags_input(flags)
    return answer_of(inputs, gpu, None, simulate=simulate, unstated=UNSTATED), warnings


def flags_input(flags: RunFlags):
    """(MemoryInput, Gpu or None, warnings) of the flags."""
    from cfgfix.memory.setup import MemorySetup
    from cfgfix.memory.shapes import ShapeError, params_only, resolve_shape
    from cfgfix.training.memory_setup import MemoryInput, _cuda_of

    try:
        shape = resolve_shape(flags.model) if flags.model else params_only(int(flags.params))
    except ShapeError as exc:
        raise FlagError(str(exc)) from None
    if flags.target_seq is not None and shape.family not in ("t5", "whisper"):
        what = f"{flags.model!r} is a {shape.family} model" if flags.model else "--params gives no architecture"
        raise FlagError(f"--target-seq: the decoder's length of an encoder-decoder model (T5, Whisper); {what}, whose "
                        f"sequence is --seq alone")
    gpu = _gpu(flags.gpu)
    assumptions: list[str] = []
    values = _with_deepspeed_config(flags, assumptions)
    precision = values["precision"]
    weights, autocast, ds_half = "fp32", None, None
    if precision.startswith("amp-"):
        autocast = precision[4:]
    elif precision.startswith("ds-"):
        ds_half, weights = precision[3:], precision[3:]
    elif precision in ("bf16", "fp16"):
        weights = precision
    torch_version = _version("--torch-version", flags.torch_version, "2.1.2, 1.13.1+cu117")
    transformers_version = _version("--transformers-version", flags.transformers_version, "4.46.3")
    lora_targets = None
    if flags.lora_targets is not None:
        if flags.lora_rank is None:
            raise FlagError("--lora-targets: the layers a LoRA adapts; give --lora-rank too (a full fine-tune has none)")
        from cfgfix.memory.lora_targets import TargetError, resolve_targets

        try:
            lora_targets, words = resolve_targets(flags.lora_targets, shape)
        except TargetError as exc:
            raise FlagError(str(exc)) from None
        assumptions.append(words)
    offload = values["offload"]
    setup = MemorySetup(
        params=int(flags.params) if flags.params and flags.model else shape.params, model=flags.model, weights=weights,
        autocast=autocast, deepspeed_half=ds_half, optimizer=values["optimizer"], zero_stage=values["zero"],
        fsdp=flags.fsdp, offload_optimizer=offload != "none", offload_params=offload == "optimizer+params",
        num_gpus=flags.num_gpus, micro_batch=values["batch"], seq_len=flags.seq, target_len=flags.target_seq,
        resolution=flags.resolution, checkpointing=flags.checkpointing, lora_rank=flags.lora_rank,
        lora_targets=lora_targets, quantization=flags.quantize, gradient_accumulation=values["grad_accum"],
        device=flags.device, attention=flags.attention, optimizer_impl=flags.optimizer_impl, head=flags.head,
        gpu=gpu.name if gpu else None, torch_version=torch_version, cuda_version=_cuda_of(torch_version),
        transformers_version=transformers_version, variable_length=flags.variable_length,
        extras=values["extras"],
    )
    problems = setup.impossible() + setup.conflicts()
    if flags.device == "cpu" and flags.gpu:
        problems.append("--device cpu estimates a CPU run (no GPU to fit); drop --gpu, or estimate --device cuda")
    if flags.no_reference and flags.task != "dpo":
        problems.append("--no-reference: DPO's reference model; give --task dpo")
    if problems:
        raise FlagError("; ".join(problems))
    if flags.task == "dpo":
        from cfgfix.training.memory_setup import dpo_setup

        setup = dpo_setup(setup, shape, flags.no_reference, assumptions)
    return MemoryInput(setup, shape, assumptions), gpu, estimate_warnings(setup, shape, gpu)


def _gpu(name: str | None):
    """The catalog's GPU (the CLI checked the name with settings.check_gpu, as every --gpu)."""
    if name is None:
        return None
    from cfgfix.memory.gpus import find_gpu

    found = find_gpu(name)
    if found is None:
        raise FlagError(f"--gpu: unknown GPU {name!r}; `cfgfix estimate --list-gpus` lists the catalog's GPUs")
    return found


_RELEASE = re.compile(r"\d+\.\d+(\.\d+)?([a-z]+\d*)?(\+(cu\d{2,3}|cpu|rocm[\d.]+))?")


def _version(flag: str, version: str | None, example: str) -> str | None:
    if version is None:
        return None
    version = version.strip()
    if not _RELEASE.fullmatch(version):
        raise FlagError(f"{flag}: {version!r} is not a release number ({example})")
    return version


def _with_deepspeed_config(flags: RunFlags, assumptions: list[str]) -> dict:
    """The flags' values, with what `--deepspeed-config` states filled in where the flag was
    not given (read by the project mode's readers: training/resolve.py deepspeed_settings for
    the stage, offload, precision, batch and optimizer; memory_setup.deepspeed_extras for the
    buckets, overlap_comm and ZeRO-3's live / prefetched / persistent parameters). A flag
    given that contradicts the file is an error: the run has one value."""
    values = {"precision": flags.precision, "optimizer": flags.optimizer, "zero": flags.zero, "offload": flags.offload,
              "batch": flags.batch, "grad_accum": flags.grad_accum, "extras": {}}
    path = flags.deepspeed_config
    if path is None:
        return values
    if flags.fsdp:
        raise FlagError("--deepspeed-config with --fsdp: a run uses DeepSpeed or FSDP, not both")
    from cfgfix.training.memory_setup import deepspeed_extras
    from cfgfix.training.resolve import deepspeed_settings

    doc = _read_json(path)
    found = {name: value.value for name, value in deepspeed_settings(doc, str(path)).items()}
    stated: dict[str, object] = {}
    if "zero_stage" in found:
        stated["zero"] = found["zero_stage"]
    if found.get("offload_param"):
        stated["offload"] = "optimizer+params"
    elif found.get("offload_optimizer"):
        stated["offload"] = "optimizer"
    elif "offload_optimizer" in found or "offload_param" in found:
        stated["offload"] = "none"
    if isinstance(found.get("micro_batch"), int):
        stated["batch"] = found["micro_batch"]
    if isinstance(found.get("grad_accum"), int):
        stated["grad_accum"] = found["grad_accum"]
    if found.get("optimizer") in ("adamw", "adafactor", "sgd"):
        stated["optimizer"] = found["optimizer"]
    half = next((h for h in ("bf16", "fp16") if found.get(h) is True), None)
    if half is None and any(found.get(h) == "auto" for h in ("bf16", "fp16")):
        # "auto": the HF Trainer fills it from its own bf16/fp16 flag, here --precision's dtype
        half = next((h for h in ("bf16", "fp16") if h in flags.precision), None)
    if half is not None:
        stated["precision"] = f"ds-{half}"
    names = {"zero": "--zero", "offload": "--offload", "batch": "--batch", "grad_accum": "--grad-accum",
             "optimizer": "--optimizer", "precision": "--precision"}
    for key, value in stated.items():
        # --precision amp-bf16 (or bf16) with the JSON's bf16: DeepSpeed's bf16 engine runs it
        same_half = key == "precision" and flags.precision.removeprefix("amp-").removeprefix("ds-") == half
        if key in flags.given and value != values[key] and not same_half:
            raise FlagError(f"{names[key]} {values[key]} but {path} states {value}: give one of them")
        values[key] = value
    extras = deepspeed_extras(path)
    values["extras"] = extras
    read = [f"{k} {v}" for k, v in stated.items()] + [f"{k} {v}" for k, v in extras.items()]
    assumptions.append(f"from {path}: " + (", ".join(read) if read else "nothing the memory model reads"))
    return values


def _read_json(path: Path):
    from cfgfix.documents.config import ConfigError, parse_config
    from cfgfix.documents.text import SourceText

    try:
        doc = parse_config(SourceText.from_bytes(str(path), Path(path).read_bytes()), "json", lenient=True)
    except (OSError, ValueError, ConfigError, RecursionError) as exc:
        raise FlagError(f"--deepspeed-config: {path} cannot be read as JSON: {exc}") from None
    if doc.root is None or doc.root.kind != "mapping":
        raise FlagError(f"--deepspeed-config: {path} is not a JSON object")
    return doc


def estimate_warnings(setup, shape, target) -> list[str]:
    """Inputs that are possible but surely not what the user meant."""
    found = []
    positions = getattr(shape, "max_positions", None)
    if setup.seq_len and positions and setup.seq_len > positions:
        found.append(f"--seq {setup.seq_len:,} is beyond the model's {positions:,} positions "
                     f"(max_position_embeddings): a learned position table has no row past it, and RoPE models need scaling for it")
    wants_bf16 = "bf16" in (setup.weights, setup.autocast, setup.deepspeed_half)
    if target is not None and wants_bf16 and not target.bf16:
        found.append(f"{target.name} has no bf16 support: a bf16 run fails there or runs emulated; "
                     f"use fp16 with loss scaling or a newer GPU")
    return found
