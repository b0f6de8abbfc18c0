"""A launch's resolved training setup as the memory model's input (`MemorySetup`), with the
assumptions made for what the files do not say, each stated in words for the report."""

from __future__ import annotations

import os

from cfgfix.memory.setup import ATTENTIONS, HEADS, OPTIMIZER_IMPLS, OPTIMIZERS, MemorySetup
from cfgfix.records import dataclass, field


@dataclass
class MemoryInput:
    setup: MemorySetup
    shape: object | None  # cfgfix.memory.shapes.ModelShape, None when the model is unknown
    assumptions: list[str] = field(default_factory=list)
    model_problem: str | None = None  # why no shape was found
    # settings the files leave open, given a placeholder value here: the memory answer
    # (training/memory_answer.py) turns each into a range
    unknown: list[str] = field(default_factory=list)
    uncounted: list[str] = field(default_factory=list)  # parts of the model that could not be sized
    load_dtype: list[str] = field(default_factory=list)  # frozen models kept in the dtype they load in


def memory_input(training, project=None, params: int | None = None) -> MemoryInput:
    """`training`: a `TrainingSetup`. `params` overrides the model's size (`--params`)."""
    from cfgfix.memory import shapes

    assumptions: list[str] = list(getattr(training, "conflicts", ()))
    unknown: list[str] = []
    uncounted: list[str] = []
    load_dtype: list[str] = []
    get = training.get
    shape = None
    problem = None
    model = get("model")
    composite = getattr(training, "composite", None)
    if params is not None:
        shape = shapes.params_only(params)
    elif composite is not None:
        shape, problem = _composite(composite, assumptions, uncounted)
        model = None
    elif isinstance(model, str) and derivative_part(model):
        problem = (f"{model} is a {derivative_part(model)} ({KNOWN_PARTS[derivative_part(model)] / 1e6:.1f}M parameters), "
                   "a diffusion pipeline's frozen part, not the model it trains: name the trained model's id")
    elif isinstance(model, str):
        try:
            shape = shapes.resolve_shape(_local(model, training) or model)
        except shapes.ShapeError as exc:
            problem = str(exc)
    else:
        problem = "no model id or folder found in the launch's files"
    stated = (getattr(project, "target_model", None) or {}).get("params") if params is None else None
    if stated and composite is None:
        # `[tool.cfgfix.model] params`: the user's count, for any launch shape (a model id
        # the catalog lacks, none at all, or one whose count the user corrects)
        from cfgfix.records import replace

        shape = replace(shape, params=int(stated)) if shape is not None else shapes.params_only(int(stated))
        assumptions.append(f"parameters: {_count(int(stated))} from [tool.cfgfix.model] params in the settings"
                           + (f" (instead of: {problem})" if problem else ""))
        problem = None

    precision = get("precision") or ""
    weights = get("weights")
    if precision.startswith("deepspeed-"):
        half = precision.split("-", 1)[1]
        weights, autocast, deepspeed_half = half, None, half
    else:
        deepspeed_half = None
        mixed = get("mixed_precision")
        autocast = mixed if mixed in ("bf16", "fp16") else None
        if weights is None:
            weights = "fp32"
            unknown.append("weights")
    if weights not in ("fp32", "bf16", "fp16"):
        weights = "fp32"
    optimizer = get("optimizer")
    if optimizer not in OPTIMIZERS:
        optimizer = "adamw"
        unknown.append("optimizer")
    micro = get("micro_batch")
    if not _positive(micro):
        micro = 1
        unknown.append("micro_batch")
    world = get("world_size")
    if not _positive(world):
        world = 1
        unknown.append("world_size")
        stated = training.values.get("world_size")  # a tool that starts one process per visible GPU says why
        if stated is not None and stated.value is None:
            assumptions.append(f"processes: the count is unknown ({stated.origin})")
    accum = get("grad_accum")
    seq = get("seq_len")
    resolution = get("resolution")
    zero = get("zero_stage")
    lora_targets = None
    if shape is not None and _positive(get("lora_rank")) and get("lora_targets") is not None:
        from cfgfix.memory.lora_targets import project_targets

        lora_targets, said = project_targets(get("lora_targets"), shape)
        if said:
            assumptions.append(said)
    setup = MemorySetup(
        params=shape.params if shape is not None else None,
        model=model if isinstance(model, str) else None,
        weights=weights,
        autocast=autocast,
        deepspeed_half=deepspeed_half,
        optimizer=optimizer,
        zero_stage=zero if zero in (0, 1, 2, 3) else 0,
        fsdp=get("fsdp") if get("fsdp") in ("full", "grad-op") else None,
        offload_optimizer=get("offload_optimizer") is True,
        offload_params=get("offload_param") is True,
        num_gpus=world,
        micro_batch=micro,
        seq_len=seq if _positive(seq) else None,
        resolution=resolution if _positive(resolution) else None,
        checkpointing=get("gradient_checkpointing") is True or _composite_checkpointing(composite, assumptions),
        lora_rank=get("lora_rank") if _positive(get("lora_rank")) else None,
        lora_targets=lora_targets,
        quantization=get("quantization") if get("quantization") in ("4bit", "8bit") else None,
        gradient_accumulation=accum if _positive(accum) else 1,
        target_len=get("target_len") if _positive(get("target_len")) else None,
        attention=get("attention") if get("attention") in ATTENTIONS else None,
        optimizer_impl=get("optimizer_impl") if get("optimizer_impl") in OPTIMIZER_IMPLS else None,
        # a composite's backbones are base models (no vocabulary head) under the user's own head
        head=get("head") if get("head") in HEADS else ("classification" if composite is not None else None),
        frozen=_frozen(get("frozen_models"), autocast or deepspeed_half, assumptions, uncounted, load_dtype),
        transformers_version=getattr(training, "transformers_version", None),
        frozen_params=composite.frozen_params if composite is not None and shape is not None and params is None else 0,
        extras=deepspeed_extras(getattr(training, "files", {}).get("deepspeed"), project),
        torch_version=(torch_version := _torch_version(training, project)),
        gpu=_catalog_gpu(get("gpu")),
        cuda_version=_cuda_of(torch_version),
        # group_by_length pads each batch to its own longest sample: shapes vary step to step
        variable_length=True if get("group_by_length") is True else None,
    )
    dpo = _dpo(training)
    if dpo is not None and shape is not None:
        setup = dpo_setup(setup, shape, dpo, assumptions)
    return MemoryInput(setup, shape, assumptions, problem, unknown, uncounted, load_dtype)


def _dpo(training) -> bool | None:
    """None for a run that is not DPO; else whether it holds no reference model.

    TRL: a DPOTrainer / DPOConfig launch (TrainingSetup.task), without a reference under
    `precompute_ref_log_probs` (a setting). LLaMA-Factory (v0.9.3): `stage: dpo` runs
    CustomDPOTrainer, a subclass of TRL's DPOTrainer (train/dpo/trainer.py) whose reference
    is prepared by TRL's `_prepare_deepspeed`; `use_ref_model = stage == "dpo" and pref_loss
    not in ["orpo", "simpo"]` (hparams/finetuning_args.py), and `create_ref_model` builds
    none for `finetuning_type: lora` (train/trainer_utils.py: the adapters are disabled)."""
    framework = getattr(training, "framework", None)
    if getattr(framework, "tool", None) == "llamafactory" and framework.facts.get("stage") == "dpo":
        return framework.get("pref_loss") in ("orpo", "simpo")
    if getattr(training, "task", None) == "dpo":
        return training.get("precompute_ref_log_probs") is True
    return None


def dpo_setup(setup, shape, no_reference: bool, assumptions: list[str]):
    """TRL's DPOTrainer (trl 0.12.0 trainer/dpo_trainer.py): `concatenated_forward` runs chosen
    and rejected through the policy as one batch of twice the micro batch; without
    `ref_model` it builds the reference as `create_reference_model(model)` (a frozen copy in
    the policy's dtype) unless the model is a PEFT model (the reference is the base with the
    adapters disabled) or `precompute_ref_log_probs` (log-probs computed before training).
    Under DeepSpeed, `_prepare_deepspeed` shards the copy only at ZeRO-3 ("Otherwise, we
    assume the reference model fits in memory and is initialized on each device with ZeRO
    disabled (stage 0)"); other runs prepare it with the accelerator (FSDP shards it)."""
    from cfgfix.records import replace

    setup = replace(setup, sequences_per_sample=2)
    assumptions.append(f"DPO: chosen and rejected in one batch of {2 * setup.micro_batch} sequences "
                       "(twice the micro batch)")
    if no_reference:
        assumptions.append("DPO: no reference model held (precompute_ref_log_probs)")
        return setup
    if setup.lora_rank is not None:
        assumptions.append("DPO with LoRA: the reference is the base with the adapters disabled (no copy)")
        return setup
    nbytes = 4 if (setup.deepspeed_half or setup.weights) == "fp32" else 2
    params = shape.params
    if setup.zero_stage == 3 or setup.fsdp == "full":
        params = -(-params // setup.num_gpus)
        how = f"sharded over {setup.num_gpus} GPUs ({'ZeRO-3' if setup.zero_stage == 3 else 'FSDP'})"
    else:
        how = "a whole copy on every GPU" + (" (DeepSpeed prepares it with ZeRO off below stage 3)"
                                              if setup.zero_stage else "")
    assumptions.append(f"DPO: a frozen reference model in the policy's dtype ({nbytes} B per weight), {how}; "
                       "none with precompute_ref_log_probs")
    return replace(setup, frozen=(*setup.frozen, ("DPO reference model", params, nbytes)))


# Frozen parts of diffusion pipelines, by class: parameters counted from the configs of
# stabilityai/stable-diffusion-xl-base-1.0 (CLIP text models instantiated from them with
# transformers; the same CLIP ViT-L text encoder is SD 1.x's) and the published count of the
# SDXL / SD VAE (diffusers AutoencoderKL, 83.65M; not counted here: diffusers not installed).
KNOWN_PARTS = {"CLIPTextModel": 123_060_480, "CLIPTextModelWithProjection": 694_659_840,
               "AutoencoderKL": 83_653_863}


# Fine-tuned or re-exported checkpoints of a known part, by id -> the part's class: the
# SDXL fp16-fix VAE is the SDXL VAE with rescaled weights (its config.json is the SDXL VAE's
# AutoencoderKL config: same blocks and channels), so it has the same 83.65M parameters.
KNOWN_DERIVATIVES = {"madebyollin/sdxl-vae-fp16-fix": "AutoencoderKL"}


def derivative_part(model: str | None) -> str | None:
    """The part class a known derivative checkpoint id is (case-insensitive), or None."""
    if not isinstance(model, str):
        return None
    lowered = model.strip().lower()
    return next((cls for name, cls in KNOWN_DERIVATIVES.items() if name.lower() == lowered), None)


def _frozen(found, half: str | None, assumptions: list[str], uncounted: list[str], load_dtype: list[str]) -> tuple:
    """(name, parameters, bytes per weight) of each frozen model moved to the GPU."""
    from cfgfix.memory import shapes

    out = []
    for item in found if isinstance(found, list) else ():
        params = KNOWN_PARTS.get(item.get("class")) or KNOWN_PARTS.get(derivative_part(item.get("model")))
        if params is None and item.get("model"):
            try:
                params = shapes.resolve_shape(item["model"]).params
            except shapes.ShapeError:
                params = None
        if params is None:
            assumptions.append(f"frozen model {item['name']} ({item.get('class')}) moved to the GPU: size unknown, not counted")
            uncounted.append(f"frozen {item['name']}")
            continue
        dtype = item.get("dtype")
        if dtype in ("fp32", "bf16", "fp16"):
            nbytes = 4 if dtype == "fp32" else 2
        elif dtype == "load":
            # loaded without a dtype and never cast: fp32 (transformers 4.x, diffusers), the
            # memory answer's dtype range when the trained weights' dtype is open too
            nbytes = 4
            load_dtype.append(item["name"])
        else:
            nbytes = 2 if half else 4
            assumptions.append(f"frozen model {item['name']}: the mixed-precision dtype assumed ({nbytes} B per weight)")
        out.append((item["name"], int(params), nbytes))
    return tuple(out)


def _composite(sized, assumptions: list[str], uncounted: list[str]):
    """The shape of the script's own model class (training/custom_model.py), with what was
    left out stated: parts that could not be sized, frozen parts counted as trained."""
    for part in sized.unresolved:
        uncounted.append(f"{sized.class_name}.{part.name}")
        assumptions.append(f"{sized.class_name}.{part.name} not counted: {part.problem} "
                           f"(state its size in the cfgfix settings: [tool.cfgfix.model.modules] {part.name} = <parameters>)")
    assumptions.extend(sized.notes)
    if sized.frozen_params:
        frozen = ", ".join(p.name for p in sized.parts if p.frozen)
        assumptions.append(f"{sized.class_name}: frozen parts ({frozen}, {_count(sized.frozen_params)}) keep their weights "
                           "but no gradients or optimizer states")
    if sized.shape is None:
        return None, f"{sized.class_name} in the script: none of its parts could be sized" + (
            f" ({sized.unresolved[0].problem})" if sized.unresolved else "")
    parts = ", ".join(f"{p.name} {_count(p.params)}" for p in sized.parts if p.params is not None)
    from cfgfix.records import replace

    return replace(sized.shape, source=f"{sized.shape.source} ({parts})"), None


def _count(params: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if params >= scale / 10 and scale > 1e3 or params >= scale:
            return f"{params / scale:.3g}{suffix}"
    return str(params)


def _composite_checkpointing(sized, assumptions: list[str]) -> bool:
    """`self.text.gradient_checkpointing_enable()` in the class's __init__: the activation model
    follows the largest backbone, so its checkpointing is the run's."""
    if sized is None or not sized.checkpointed:
        return False
    main = sized.main
    if main is None or main.name not in sized.checkpointed:
        assumptions.append(f"{sized.class_name}: gradient checkpointing enabled on {', '.join(sorted(sized.checkpointed))} "
                           "only, not on the largest backbone: not counted")
        return False
    return True


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _local(model: str, training) -> str | None:
    """A model folder written relative to the launch script or the training script."""
    if model.startswith(("/", ".")) or not os.path.exists(model):
        for base in (training.launch_file.parent, training.script.parent if training.script else None):
            if base is not None and os.path.exists(base / model):
                return str(base / model)
    return None


# zero_optimization options the memory model reads: communication buckets, overlap_comm and
# ZeRO-3's live / prefetched / persistent parameters (DeepSpeed runtime/zero/config.py)
DEEPSPEED_MEMORY_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "prefetch_bucket_size",
                         "max_live_parameters", "param_persistence_threshold")


def deepspeed_extras(path, project=None) -> dict:
    """The launch's DeepSpeed JSON values for DEEPSPEED_MEMORY_KEYS, under whichever spelling it
    writes them (`stage3_max_live_parameters` or `max_live_parameters`): numbers, booleans or
    "auto" (the HF integration fills it from the model). {} when there is no readable file."""
    import json

    from cfgfix.analysis.deepspeed_keys import zero_spellings

    if path is None:
        return {}
    try:
        if project is not None:
            doc = project.read(path)
            root = doc.root.to_python() if doc is not None and doc.root is not None else None
        else:
            with open(path, encoding="utf-8") as f:
                root = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    zero = root.get("zero_optimization") if isinstance(root, dict) else None
    if not isinstance(zero, dict):
        return {}
    out = {}
    for key in DEEPSPEED_MEMORY_KEYS:
        value = next((zero[name] for name in zero_spellings(key) if name in zero), None)
        if key == "overlap_comm":
            if isinstance(value, bool):
                out[key] = value
        elif value == "auto" or isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**50:
            out[key] = value
    return out


def _torch_version(training, project) -> str | None:
    """The project's exact torch pin for the training script (None without a project or a pin)."""
    if project is None or not hasattr(project, "_scripts"):
        return None
    from cfgfix.analysis.versions import ProjectVersions
    from cfgfix.memory.transformers_versions import exact_version

    key = ("project-versions",)
    if key not in project._scripts:
        project._scripts[key] = ProjectVersions(project.root)
    where = getattr(training, "script", None) or getattr(training, "launch_file", None)
    if where is None:
        return None
    try:
        info = project._scripts[key].for_file(where).get("torch")
    except (OSError, ValueError):
        return None
    return exact_version(info.specifier) if info is not None else None


def _cuda_of(torch_version: str | None) -> str | None:
    """"2.1.2+cu121" -> "12.1": the CUDA release a torch wheel was built for (its local tag)."""
    import re

    match = re.search(r"\+cu(\d{2,3})$", torch_version or "")
    if not match:
        return None
    digits = match.group(1)
    return f"{digits[:-1]}.{digits[-1]}"


def _catalog_gpu(name) -> str | None:
    from cfgfix.memory.gpus import find_gpu

    found = find_gpu(name) if isinstance(name, str) else None
    return found.name if found is not None else None

