"""axolotl as data: what `axolotl train cfg.yml`, `accelerate launch -m axolotl.cli.train
cfg.yml` and `python -m axolotl.cli.train cfg.yml` do with the keys a YAML leaves out.

Read from the released axolotl 0.6.0 (sdist: src/axolotl/utils/config/models/input/v0_4_1,
src/axolotl/utils/config/__init__.py) and 0.19.0 (wheel: axolotl/utils/schemas/*.py,
axolotl/utils/config/__init__.py resolve_dtype, axolotl/cli/main.py); the defaults below are
the same in both.
"""

from __future__ import annotations

import re

from cfgfix.training.frameworks.yaml_tools import (
    Fact,
    ToolRun,
    fact,
    flag_overrides,
    pick_release,
    release_for,
    top_level,
    visible_gpus,
)
from cfgfix.training.values import Value

RELEASES = ("0.6.0", "0.19.0")
NEWEST = RELEASES[-1]

FACTS = (
    Fact("micro_batch_size", 1, None, None, "utils/schemas/training.py (0.6.0: v0_4_1 HyperparametersConfig)"),
    Fact("gradient_accumulation_steps", 1, None, None, "utils/schemas/training.py (0.6.0: v0_4_1 HyperparametersConfig)"),
    Fact("sequence_len", 512, None, None, "utils/schemas/config.py AxolotlInputConfig.sequence_len"),
    Fact("gradient_checkpointing", False, None, None, "utils/schemas/config.py AxolotlInputConfig.gradient_checkpointing"),
    # bf16 "auto": bf16 where the GPU has it, else fp16; the model loads in that dtype
    # (resolve_dtype: bf16 -> bfloat16, load_in_8bit / fp16 -> float16, else float32)
    Fact("bf16", "auto", None, None, "utils/config/__init__.py resolve_dtype (0.6.0: normalize_config)"),
    # `axolotl train` runs `accelerate launch -m axolotl.cli.train` unless --launcher says otherwise
    Fact("launcher", "accelerate", None, None, "cli/main.py train --launcher"),
)
# the DeepSpeed JSONs axolotl ships (`axolotl fetch deepspeed_configs`): stage, offload optimizer, offload params
BUNDLED_DEEPSPEED = {
    "zero1.json": (1, False, False), "zero1_torch_compile.json": (1, False, False),
    "zero2.json": (2, True, False), "zero2_torch_compile.json": (2, True, False),
    "zero3.json": (3, False, False), "zero3_bf16.json": (3, False, False),
    "zero3_bf16_cpuoffload_all.json": (3, True, True), "zero3_bf16_cpuoffload_params.json": (3, False, True),
}
KEYS = frozenset({
    "base_model", "adapter", "lora_r", "load_in_4bit", "load_in_8bit", "micro_batch_size", "gradient_accumulation_steps",
    "sequence_len", "sample_packing", "gradient_checkpointing", "bf16", "fp16", "optimizer", "deepspeed",
    "num_processes", "launcher",
})
_SIGNATURE = frozenset({"base_model", "micro_batch_size", "sequence_len", "sample_packing", "adapter", "lora_r",
                        "datasets", "num_epochs", "output_dir", "val_set_size"})
_MODULES = ("axolotl.cli.train", "axolotl.cli.train.do_cli")
# axolotl's other entry points (cli/*.py): they read the same YAML but run no training step
_NOT_TRAINING = re.compile(r"axolotl\.cli\.(?:preprocess|inference|merge_lora|merge_sharded_fsdp_weights|evaluate|"
                           r"quantize|vllm_serve|chat|shard|delinearize_llama4)")


def read(resolver) -> ToolRun | None:
    launch, project, setup = resolver.launch, resolver.project, resolver.setup
    script = (launch.script or "").replace("\\", "/")
    old_script = script.endswith("scripts/finetune.py")  # axolotl before 0.4: `accelerate launch scripts/finetune.py cfg.yml`
    if launch.module not in _MODULES and not old_script:
        if launch.module and _NOT_TRAINING.fullmatch(launch.module):
            setup.trains = False  # `-m axolotl.cli.preprocess cfg.yml`: tokenizes, trains nothing
        return None
    written = next((text for text, _ in launch.args if text.lower().endswith((".yaml", ".yml"))), None)
    doc = path = None
    if written is not None:
        from cfgfix.project import _resolve

        path = _resolve(written, resolver.launch_file, project.root)
        doc = project.read(path) if path is not None else None
    keys, nodes = top_level(doc, resolver.display(path)) if doc is not None else ({}, {})
    if old_script and len(set(keys) & _SIGNATURE) < 2:
        return None
    release, origin = _release(resolver)
    run = ToolRun("axolotl", release, origin, keys=keys, nodes=nodes, doc=doc, written_path=written,
                  origin=resolver.display(path) if path is not None else "")
    overrides = flag_overrides(launch.args, resolver.display(resolver.launch_file), KEYS)
    run.keys.update(overrides)
    if doc is not None and "training config" not in setup.files:
        from cfgfix.training.values import from_config

        setup.files["training config"] = path
        setup.sources["training config"] = from_config(doc, resolver.display(path))
    from cfgfix.analysis.training_keys import NAME_TO_SETTING

    for name, value in overrides.items():
        setting = NAME_TO_SETTING.get(name)
        if setting is not None:
            setup.sources.setdefault("flags", {})[setting] = Value(setting, value.value, value.origin, value.span, name)
    setup.trainer = setup.trains = True
    return run


def _release(resolver) -> tuple[str, str]:
    root = resolver.project.root
    try:
        text = (root / "src/axolotl/__init__.py").read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        text = ""
    match = re.search(r"^__version__\s*=\s*[\"'](\d+(?:\.\d+){1,3})", text, re.MULTILINE)
    if match and (release := pick_release(RELEASES, f"=={match.group(1)}")) is not None:
        return release, f"{match.group(1)} (src/axolotl/__init__.py of this repository)"
    found = release_for(resolver.project, resolver.setup.script or resolver.launch_file, ("axolotl",), RELEASES)
    if found is not None:
        return found
    return NEWEST, f"{NEWEST}, the newest release read (no axolotl pin or installed copy found)"


def decide(resolver, run: ToolRun) -> None:
    setup = resolver.setup
    tag = f"axolotl {run.release}"
    decided: dict[str, Value] = {}
    defaults: dict[str, Value] = {}

    def default(name: str) -> tuple[object, str]:
        found = fact(FACTS, name, run.release)
        return found.value, f"{tag} default {name}={found.value!r} ({found.where})"

    for name, setting in (("micro_batch_size", "micro_batch"), ("gradient_accumulation_steps", "grad_accum"),
                          ("sequence_len", "seq_len")):
        value, origin = default(name)
        defaults[setting] = Value(setting, value, origin)
    checkpointing = run.keys.get("gradient_checkpointing")
    if checkpointing is None:
        value, origin = default("gradient_checkpointing")
        defaults["gradient_checkpointing"] = Value("gradient_checkpointing", value, origin)
    elif isinstance(checkpointing.value, str) and checkpointing.value.lower() in ("offload", "offload_disk", "unsloth"):
        decided["gradient_checkpointing"] = Value("gradient_checkpointing", True, f"{checkpointing.origin} "
                                                  f"({checkpointing.value}: checkpointed, the saved inputs moved off the GPU)",
                                                  checkpointing.span, checkpointing.name)
    adapter = run.get("adapter")
    run.facts["adapter"] = adapter
    if adapter not in ("lora", "qlora"):  # a full fine-tune, whatever lora_r says
        decided["lora_rank"] = Value("lora_rank", None, f"no adapter: {tag} trains every weight")
    run.facts["sample_packing"] = run.get("sample_packing") is True
    half = _dtype(resolver, run, tag)
    if half is not None:
        weights, mixed = half
        decided["weights"] = weights
        if mixed is not None:
            decided[mixed.setting] = mixed
    fsdp = _fsdp(run)
    if fsdp is not None:
        decided["fsdp"] = fsdp
    decided.update(_bundled_deepspeed(resolver, run, tag))
    world = _world_size(resolver, run, tag)
    if world is not None:
        decided["world_size"] = world
    setup.sources["framework"] = decided
    setup.sources["framework defaults"] = defaults


def _dtype(resolver, run: ToolRun, tag: str) -> tuple[Value, Value | None] | None:
    """(weights, autocast) as resolve_dtype sets them: the model loads in cfg.torch_dtype and the
    Trainer's bf16/fp16 follow the same keys."""
    bf16, fp16 = run.keys.get("bf16"), run.keys.get("fp16")
    eight = run.keys.get("load_in_8bit")
    where = fact(FACTS, "bf16", run.release).where
    if fp16 is not None and fp16.value is True and (bf16 is None or bf16.value is not True):
        return (Value("weights", "fp16", f"{fp16.origin}: {tag} loads float16 ({where})", fp16.span, fp16.name),
                Value("fp16", True, fp16.origin, fp16.span, fp16.name))
    if bf16 is None or bf16.value == "auto":
        gpu_bf16 = _target_bf16(resolver)
        stated = f"{bf16.origin} (\"auto\")" if bf16 is not None else f"{tag} default bf16: auto"
        if gpu_bf16 is False:
            how = f"{stated}: the target GPU has no bf16, so {tag} uses fp16 ({where})"
            return (Value("weights", "fp16", how, bf16.span if bf16 else None, "bf16"),
                    Value("fp16", True, how, bf16.span if bf16 else None, "bf16"))
        how = f"{stated}: bf16 on GPUs that have it (Ampere and newer; fp16 on older ones), the model loads bfloat16 ({where})"
        return (Value("weights", "bf16", how, bf16.span if bf16 else None, "bf16"),
                Value("bf16", True, how, bf16.span if bf16 else None, "bf16"))
    if bf16.value is True:
        return (Value("weights", "bf16", f"{bf16.origin}: {tag} loads bfloat16 ({where})", bf16.span, bf16.name), None)
    if bf16.value is False:
        if eight is not None and eight.value is True:
            return Value("weights", "fp16", f"{eight.origin} without bf16: {tag} loads float16 ({where})",
                         eight.span, eight.name), None
        how = f"{bf16.origin} and no fp16: {tag} loads float32 ({where})"
        return (Value("weights", "fp32", how, bf16.span, bf16.name),
                Value("mixed_precision", "no", how, bf16.span, bf16.name))
    return None


def _target_bf16(resolver) -> bool | None:
    gpu = getattr(resolver.project, "target_gpu", None)
    if not gpu:
        return None
    from cfgfix.memory.gpus import find_gpu

    found = find_gpu(gpu)
    return None if found is None else bool(found.bf16)


_STRATEGIES = {"full_shard": "full", "hybrid_shard": "full", "shard_grad_op": "grad-op", "_hybrid_shard_zero2": "grad-op",
               "no_shard": "none"}


def _fsdp(run: ToolRun) -> Value | None:
    """`fsdp: [full_shard, auto_wrap]` (the older form) or an `fsdp_config:` block (its
    sharding strategy, or FSDP2's reshard_after_forward: false for ZeRO-2-like sharding)."""
    listed = run.nodes.get("fsdp")
    config = run.nodes.get("fsdp_config")
    words: list[str] = []
    if listed is not None and listed.kind == "sequence":
        words = [str(item.value).lower() for item in listed.children if item.kind == "scalar"]
    elif listed is not None and listed.kind == "scalar" and isinstance(listed.value, str):
        words = listed.value.lower().split()
    mode = next((_STRATEGIES[w] for w in words if w in _STRATEGIES), None)
    if config is not None and config.kind == "mapping":
        for key in ("fsdp_sharding_strategy", "sharding_strategy"):
            node = config.get(key)
            if node is not None and node.kind == "scalar":
                text = str(node.value).lower()
                mode = _STRATEGIES.get(text) or {"1": "full", "2": "grad-op", "3": "none", "4": "full"}.get(text, mode)
        for key in ("fsdp_reshard_after_forward", "reshard_after_forward"):
            node = config.get(key)
            if node is not None and node.kind == "scalar" and node.truthy() is False:
                mode = "grad-op"
        if mode is None:
            mode = "full"  # accelerate's FSDP plugin default: FULL_SHARD / reshard after forward
    if mode is None or mode == "none":
        return None
    what, node = ("fsdp_config", config) if config is not None else ("fsdp", listed)
    return Value("fsdp", mode, f"{what} in {run.origin}", run.doc.span(node) if run.doc is not None else None, what)


def _bundled_deepspeed(resolver, run: ToolRun, tag: str) -> dict[str, Value]:
    """`deepspeed: deepspeed_configs/zero2.json` that is not in the repository: the JSON axolotl
    ships under that name (`axolotl fetch deepspeed_configs` copies them)."""
    written = run.get("deepspeed")
    if not isinstance(written, str) or "deepspeed" in resolver.setup.files:
        return {}
    known = BUNDLED_DEEPSPEED.get(written.replace("\\", "/").rsplit("/", 1)[-1])
    if known is None:
        return {}
    stage, optimizer, params = known
    where = f"{written}, the DeepSpeed config {tag} ships (deepspeed_configs/)"
    node = run.keys["deepspeed"]
    return {"zero_stage": Value("zero_stage", stage, where, node.span, "deepspeed"),
            "offload_optimizer": Value("offload_optimizer", optimizer, where, node.span, "deepspeed"),
            "offload_param": Value("offload_param", params, where, node.span, "deepspeed")}


def _world_size(resolver, run: ToolRun, tag: str) -> Value | None:
    """`axolotl train`: accelerate launch without a config of its own starts one process per
    visible GPU (unless ~/.cache/huggingface/accelerate holds a default config); `--launcher
    python` one. The other launches keep their launcher's count."""
    launch = resolver.launch
    if launch.launcher != "axolotl":
        return None
    where = f"axolotl train in {resolver.display(resolver.launch_file)}"
    launcher = run.get("launcher") or "accelerate"
    processes = run.get("num_processes")
    if launcher == "python":
        return Value("world_size", 1, f"{where}: --launcher python, one process", launch.span)
    if isinstance(processes, int) and not isinstance(processes, bool) and processes > 0:
        return Value("world_size", processes, f"{where}: --num_processes {processes}", launch.span)
    visible = visible_gpus(launch.cuda_devices)
    if visible and launcher == "accelerate":
        return Value("world_size", visible, f"{where}: accelerate launch on every visible GPU "
                     f"(CUDA_VISIBLE_DEVICES={launch.cuda_devices})", launch.span)
    return Value("world_size", None, f"{where}: {launcher} launch on every visible GPU (accelerate's default "
                 "without a config); how many is not stated (set CUDA_VISIBLE_DEVICES, or gpus in the cfgfix settings)")


WRITE_KEYS = {
    "micro_batch": "micro_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_checkpointing": "gradient_checkpointing",
    "optimizer": "optimizer",
    "bf16": "bf16",
    "fp16": "fp16",
}


def write_plan(setting: str, value, run: ToolRun) -> list[tuple[str, object]] | str | None:
    if setting == "quantization":
        bits = "load_in_4bit" if value == "4bit" else "load_in_8bit"
        adapter = "qlora" if value == "4bit" else "lora"
        return [(bits, True), ("adapter", adapter)]
    if setting == "mixed_precision":
        other = "fp16" if value == "bf16" else "bf16"
        return [(value, True)] + ([(other, False)] if run.get(other) is True else [])
    name = WRITE_KEYS.get(setting)
    return [(name, value)] if name else None
