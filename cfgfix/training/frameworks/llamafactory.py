"""LLaMA-Factory as data: what `llamafactory-cli train cfg.yaml` (and `src/train.py cfg.yaml`
under torchrun / accelerate / deepspeed, and the older `src/train_bash.py --flags`) does with
the keys a YAML leaves out, per release.

Read from the released wheels: llmtuner 0.5.3 and 0.6.3 (the package's name before 0.7),
llamafactory 0.7.1, 0.8.0, 0.8.3, 0.9.0, 0.9.1, 0.9.2, 0.9.3, 0.9.4 and 0.9.5. Paths below are
inside the wheel (`llamafactory/...`, `llmtuner/...` before 0.7).
"""

from __future__ import annotations

from cfgfix.analysis.training_keys import NAME_TO_SETTING
from cfgfix.training.frameworks.yaml_tools import (
    Fact,
    ToolRun,
    dotlist_overrides,
    fact,
    flag_overrides,
    release_for,
    top_level,
)
from cfgfix.training.values import Value

RELEASES = ("0.5.3", "0.6.3", "0.7.1", "0.8.0", "0.8.3", "0.9.0", "0.9.1", "0.9.2", "0.9.3", "0.9.4", "0.9.5")
NEWEST = RELEASES[-1]

FACTS = (
    Fact("cutoff_len", 1024, None, "0.9.1", "hparams/data_args.py DataArguments.cutoff_len"),
    Fact("cutoff_len", 2048, "0.9.1", None, "hparams/data_args.py DataArguments.cutoff_len"),
    Fact("finetuning_type", "lora", None, None, "hparams/finetuning_args.py FinetuningArguments.finetuning_type"),
    Fact("lora_rank", 8, None, None, "hparams/finetuning_args.py LoraArguments.lora_rank"),
    # model/patcher.py (model_utils/checkpointing.py from 0.8): enabled unless disabled
    Fact("disable_gradient_checkpointing", False, None, None, "hparams/model_args.py ModelArguments.disable_gradient_checkpointing"),
    # Seq2SeqTrainingArguments, transformers' defaults
    Fact("per_device_train_batch_size", 8, None, None, "transformers TrainingArguments (hparams/training_args.py)"),
    Fact("gradient_accumulation_steps", 1, None, None, "transformers TrainingArguments (hparams/training_args.py)"),
    Fact("bf16", False, None, None, "transformers TrainingArguments (hparams/training_args.py)"),
    Fact("fp16", False, None, None, "transformers TrainingArguments (hparams/training_args.py)"),
    # `llamafactory-cli train` starts torchrun itself when FORCE_TORCHRUN is on or more than one
    # GPU is visible: nproc NPROC_PER_NODE else the device count, nnodes NNODES else 1
    Fact("torchrun", True, "0.8.0", None, "cli.py main; launcher.py launch from 0.9.4"),
    # `llamafactory-cli train cfg.yaml key=value`: OmegaConf.from_cli(sys.argv[2:]) merged over the YAML
    Fact("dotlist_overrides", True, "0.9.3", None, "hparams/parser.py read_args"),
    # the load dtype: the compute dtype (bf16 / fp16 key, else bf16 where the GPU has it) ...
    Fact("load_dtype", "compute", None, "0.9.4", "model/patcher.py patch_config: init_kwargs['torch_dtype'] = compute_dtype"),
    # ... then the checkpoint's own dtype
    Fact("load_dtype", "auto", "0.9.4", None, "model/loader.py load_model: init_kwargs['torch_dtype'] = 'auto'"),
    # a full fine-tune's trainable parameters are cast to fp32 unless pure_bf16 / use_badam, or
    # under ZeRO-3 (which keeps its own fp32 copy); FSDP skipped the cast from 0.7.1 to 0.9.3
    Fact("fsdp_keeps_load_dtype", True, "0.7.1", "0.9.4", "model/adapter.py init_adapter: cast_trainable_params_to_fp32"),
    Fact("fsdp_keeps_load_dtype", False, "0.9.4", None, "model/adapter.py init_adapter: cast_trainable_params_to_fp32"),
    # data_args.packing: None means on for stage pt only
    Fact("packing", "pt", "0.7.1", None, "hparams/parser.py get_train_args: packing if not None else stage == 'pt'"),
)

# LLaMA-Factory's own keys that decide the setup (its HfArgumentParser flags, its YAML keys)
KEYS = frozenset({
    "model_name_or_path", "stage", "finetuning_type", "lora_rank", "lora_target", "quantization_bit", "template",
    "cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "pure_bf16",
    "disable_gradient_checkpointing", "deepspeed", "packing", "neat_packing", "use_badam", "optim", "flash_attn",
    "use_unsloth",
})
# a YAML (or flags) written for LLaMA-Factory: two of these
_SIGNATURE = frozenset({"finetuning_type", "template", "cutoff_len", "lora_target", "stage", "quantization_bit",
                        "disable_gradient_checkpointing", "pure_bf16", "dataset_dir"})
_IMPORTS = ("llamafactory", "llmtuner")


def read(resolver) -> ToolRun | None:
    """The run when this launch is LLaMA-Factory's, with its YAML's keys and overrides added to
    the setup's sources; None for any other launch."""
    launch, project, setup = resolver.launch, resolver.project, resolver.setup
    written_args = [text for text, _ in launch.args]
    first = written_args[0] if written_args else ""
    has_yaml = first.lower().endswith((".yaml", ".yml", ".json"))
    doc = path = None
    if has_yaml:
        from cfgfix.project import _resolve

        path = _resolve(first, resolver.launch_file, project.root)
        doc = project.read(path) if path is not None else None
    keys, nodes = top_level(doc, resolver.display(path)) if doc is not None else ({}, {})
    flags = flag_overrides(launch.args, resolver.display(resolver.launch_file), KEYS | _SIGNATURE) if not has_yaml else {}
    if not _is_llamafactory(resolver, set(keys) | set(flags)):
        return None
    release, origin = _release(resolver)
    run = ToolRun("llamafactory", release, origin, doc=doc, written_path=first if doc is not None else None,
                  origin=resolver.display(path) if doc is not None else "")
    run.keys.update(keys)
    run.nodes.update(nodes)
    launch_name = resolver.display(resolver.launch_file)
    overrides = flags
    if has_yaml and fact(FACTS, "dotlist_overrides", release) is not None:
        overrides = dotlist_overrides(launch.args, launch_name, start=1)
    run.keys.update(overrides)
    if doc is not None and "training config" not in setup.files:
        from cfgfix.training.values import from_config

        setup.files["training config"] = path
        setup.sources["training config"] = from_config(doc, resolver.display(path))
    for name, value in overrides.items():  # `cutoff_len=8192` beats the YAML's key
        setting = NAME_TO_SETTING.get(name)
        if setting is not None:
            setup.sources.setdefault("flags", {})[setting] = Value(setting, value.value, value.origin, value.span, name)
    setup.trainer = setup.trains = True
    return run


def _is_llamafactory(resolver, keys: set[str]) -> bool:
    launch = resolver.launch
    if launch.module == "llamafactory.train":
        return True
    script = (launch.script or "").replace("\\", "/")
    name = script.rsplit("/", 1)[-1]
    if name == "train_bash.py":  # llmtuner before 0.7: `python src/train_bash.py --stage sft ...`
        return True
    if name not in ("train.py", "launcher.py"):
        return False
    if len(keys & _SIGNATURE) >= 2:
        return True
    source = resolver.setup.script
    parsed = resolver.project.script(source) if source is not None else None
    if parsed is None:
        return False
    import ast

    # the project's own parse of the script (read once per run), not a second read of the file
    for node in ast.walk(parsed[1]):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(name.split(".", 1)[0] in _IMPORTS for name in names):
            return True
    return False


def _release(resolver) -> tuple[str, str]:
    """The release whose facts apply: the project's own LLaMA-Factory source (a clone of the
    repository), its pin or installed copy, the launch's shape (`train_bash.py`: llmtuner), else
    the newest release read."""
    own = _own_version(resolver.project.root)
    if own is not None:
        return own
    where = resolver.setup.script or resolver.launch_file
    found = release_for(resolver.project, where, ("llamafactory", "llmtuner"), RELEASES)
    if found is not None:
        return found
    if (resolver.launch.script or "").endswith("train_bash.py"):
        return "0.6.3", "src/train_bash.py: llmtuner before 0.7 (assumed 0.6.3, the last release with it)"
    return NEWEST, f"{NEWEST}, the newest release read (no llamafactory pin or installed copy found)"


def _own_version(root) -> tuple[str, str] | None:
    """A clone of LLaMA-Factory itself: `VERSION = "0.9.4.dev0"` in src/llamafactory/extras/env.py
    (`__version__` in src/llmtuner/__init__.py before 0.7)."""
    import re

    from cfgfix.training.frameworks.yaml_tools import pick_release

    for relative in ("src/llamafactory/extras/env.py", "src/llmtuner/extras/env.py", "src/llmtuner/__init__.py"):
        path = root / relative
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[:20000]
        except OSError:
            continue
        match = re.search(r"^(?:VERSION|__version__)\s*=\s*[\"'](\d+(?:\.\d+){1,3})", text, re.MULTILINE)
        if match:
            release = pick_release(RELEASES, f"=={match.group(1)}")
            if release is not None:
                return release, f"{match.group(1)} ({relative} of this repository)"
    return None


def decide(resolver, run: ToolRun) -> None:
    """The settings only LLaMA-Factory decides, as the sources "framework" (they win: the tool
    sets them whatever the generic keys say) and "framework defaults" (for a key left out).
    Called once the launch's DeepSpeed and accelerate configs are read."""
    setup = resolver.setup
    release = run.release
    decided: dict[str, Value] = {}
    defaults: dict[str, Value] = {}
    tag = f"LLaMA-Factory {release}"

    def default(name: str) -> tuple[object, str]:
        found = fact(FACTS, name, release)
        return found.value, f"{tag} default {name}={found.value!r} ({found.where})"

    finetuning = run.keys.get("finetuning_type")
    if finetuning is None:
        value, origin = default("finetuning_type")
        finetuning = Value("finetuning_type", value, origin)
    run.facts["finetuning_type"] = finetuning.value
    for name, setting in (("cutoff_len", "seq_len"), ("per_device_train_batch_size", "micro_batch"),
                          ("gradient_accumulation_steps", "grad_accum"), ("bf16", "bf16"), ("fp16", "fp16")):
        value, origin = default(name)
        defaults[setting] = Value(setting, value, origin)
    if finetuning.value == "lora":
        rank = run.keys.get("lora_rank")
        if rank is None:
            value, origin = default("lora_rank")
            decided["lora_rank"] = Value("lora_rank", value, f"{origin}, with finetuning_type lora")
    else:  # a lora_rank key counts only for finetuning_type lora
        decided["lora_rank"] = Value("lora_rank", None, f"finetuning_type {finetuning.value}: no LoRA adapter")
    disabled = run.keys.get("disable_gradient_checkpointing")
    if disabled is not None and disabled.value is True:
        decided["gradient_checkpointing"] = Value("gradient_checkpointing", False, disabled.origin, disabled.span, disabled.name)
    elif disabled is None or disabled.value is False:
        where = fact(FACTS, "disable_gradient_checkpointing", release).where
        decided["gradient_checkpointing"] = Value(
            "gradient_checkpointing", True,
            f"{tag} enables gradient checkpointing unless disable_gradient_checkpointing: true ({where})",
            disabled.span if disabled is not None else None, "disable_gradient_checkpointing")
    weights = _weights(resolver, run, finetuning.value, tag)
    if weights is not None:
        decided["weights"] = weights
    world = _world_size(resolver, run, tag)
    if world is not None:
        decided["world_size"] = world
    stage = run.get("stage", "sft")
    packing = run.get("packing")
    neat = run.get("neat_packing") is True
    run.facts.update({"stage": stage, "template": run.get("template"),
                      "packing": True if neat else packing if packing is not None else stage == "pt"})
    setup.sources["framework"] = decided
    setup.sources["framework defaults"] = defaults


def _weights(resolver, run: ToolRun, finetuning: str, tag: str) -> Value | None:
    """The dtype the trained model's weights have: the load dtype (16-bit), or fp32 where a full
    fine-tune casts its trainable parameters up (model/adapter.py)."""
    pure = run.keys.get("pure_bf16")
    bf16, fp16 = run.keys.get("bf16"), run.keys.get("fp16")
    if pure is not None and pure.value is True:
        return Value("weights", "bf16", f"{pure.origin}: bf16 weights, no fp32 copy", pure.span, pure.name)
    load = fact(FACTS, "load_dtype", run.release)
    if load.value == "auto":
        half, how = "bf16", (f"{tag} loads torch_dtype=\"auto\" ({load.where}): the checkpoint's dtype, "
                             "bf16 for current released checkpoints")
    elif bf16 is not None and bf16.value is True:
        half, how = "bf16", f"{bf16.origin}: {tag} loads in the compute dtype ({load.where})"
    elif fp16 is not None and fp16.value is True:
        half, how = "fp16", f"{fp16.origin}: {tag} loads in the compute dtype ({load.where})"
    else:
        half, how = "bf16", (f"{tag} loads in the compute dtype ({load.where}): bf16 on GPUs that have it "
                             "(infer_optim_dtype), fp16 on older ones")
    if finetuning != "full":
        return Value("weights", half, how)
    badam = run.keys.get("use_badam")
    if badam is not None and badam.value is True:
        return Value("weights", half, f"{how}; use_badam keeps them there")
    if "deepspeed" in resolver.setup.files:
        return Value("weights", half, f"{how}; DeepSpeed's 16-bit engine holds them (an fp32 master copy beside them)")
    if run.get("quantization_bit") is None and _zero3(resolver):
        return Value("weights", half, f"{how}; under ZeRO-3 DeepSpeed keeps the fp32 copy")
    keeps = fact(FACTS, "fsdp_keeps_load_dtype", run.release)
    if keeps is not None and keeps.value and _fsdp(resolver):
        return Value("weights", half, f"{how}; under FSDP {tag} leaves them there ({keeps.where})")
    return Value("weights", "fp32", f"finetuning_type full: {tag} casts the trainable parameters to fp32 "
                 "(model/adapter.py init_adapter), 16-bit autocast where bf16/fp16 is set")


def _zero3(resolver) -> bool:
    found = resolver.setup.sources.get("deepspeed config", {}).get("zero_stage")
    return found is not None and found.value == 3


def _fsdp(resolver) -> bool:
    return resolver.setup.sources.get("accelerate config", {}).get("fsdp") is not None


def _world_size(resolver, run: ToolRun, tag: str) -> Value | None:
    """`llamafactory-cli train`: one process on one visible GPU, else torchrun with
    NPROC_PER_NODE (else every visible GPU) on each of NNODES nodes. A script under torchrun,
    accelerate or deepspeed: the launcher's own count (None here)."""
    launch = resolver.launch
    if launch.module != "llamafactory.train":
        return None
    where = f"llamafactory-cli train in {resolver.display(resolver.launch_file)}"
    if fact(FACTS, "torchrun", run.release) is None:
        return Value("world_size", 1, f"{where}: {tag} runs one process (no torchrun of its own before 0.8.0)",
                     launch.span)
    from cfgfix.analysis.tool_processes import llamafactory_processes

    count, how = llamafactory_processes(dict(launch.tool_env), launch.cuda_devices)
    facts = fact(FACTS, "torchrun", run.release).where
    return Value("world_size", count, f"{where}: {how} ({facts})", launch.span if count is not None else None)


# fix --fit: LLaMA-Factory's key for each setting it writes
WRITE_KEYS = {
    "micro_batch": "per_device_train_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "optimizer": "optim",
    "bf16": "bf16",
    "fp16": "fp16",
}


def write_plan(setting: str, value, run: ToolRun) -> list[tuple[str, object]] | str | None:
    """The YAML keys that make `setting` = `value` in LLaMA-Factory (written in this order), a
    reason it cannot be written, or None to use the generic key."""
    if setting == "gradient_checkpointing":
        if value:
            return [("disable_gradient_checkpointing", False)]
        return [("disable_gradient_checkpointing", True)]
    if setting == "quantization":
        if run.facts.get("finetuning_type") not in ("lora", "oft"):
            return "LLaMA-Factory quantizes only LoRA/OFT runs (hparams/parser.py): set finetuning_type lora first"
        return [("quantization_bit", 4 if value == "4bit" else 8)]
    if setting == "mixed_precision":
        other = "fp16" if value == "bf16" else "bf16"
        return [(value, True)] + ([(other, False)] if run.get(other) is True else [])
    name = WRITE_KEYS.get(setting)
    return [(name, value)] if name else None
