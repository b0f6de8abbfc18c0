"""PyTorch Lightning's `Trainer` arguments as data: what `devices`, `num_nodes`, `strategy`,
`precision` and `accumulate_grad_batches` make of a run.

Read from the released wheels (`pip download lightning==X` / `pytorch_lightning==X --no-deps`):
lightning 2.0.0 and 2.5.0, pytorch_lightning 1.9.5. The meanings below are the same in all
three, so no release selects them:
- `Trainer.__init__` (trainer/trainer.py): 2.x `devices="auto"`, `strategy="auto"`,
  `precision=None` (then "32-true"), `num_nodes=1`, `accumulate_grad_batches=1`; 1.9.5
  `devices=None` (the accelerator's `auto_device_count()`), `gpus=None` (removed in 2.0),
  `precision=32`.
- precision aliases (fabric/plugins/precision/precision.py `_PRECISION_INPUT_STR_ALIAS_
  CONVERSION`): 64 -> "64-true", 32 -> "32-true", 16 -> "16-mixed", "bf16" -> "bf16-mixed".
  "*-mixed" autocasts over fp32 weights; "*-true" converts the module
  (`Precision.convert_module`: `module.to(dtype)`).
- strategies (strategies/deepspeed.py `register_strategies`, strategies/fsdp.py):
  "deepspeed" is `DeepSpeedStrategy(stage=2)` (its `stage: int = 2` default);
  "deepspeed_stage_{1,2,3}", "_offload" (optimizer, and for stage 3 parameters too),
  "_nvme"; "fsdp" is `FSDPStrategy(sharding_strategy="FULL_SHARD")`, "fsdp_cpu_offload" adds
  `cpu_offload=True`. With DeepSpeed, "16-mixed"/"16-true" write `fp16: {enabled: true}` and
  "bf16-mixed"/"bf16-true" `bf16: {enabled: true}` into its config (fabric/strategies/
  deepspeed.py `_format_precision_config`): DeepSpeed's own 16-bit engine.
- devices (fabric/utilities/device_parser.py `_normalize_parse_gpu_string_input`): an int is that
  many GPUs, a list its length, a string "0,1,3" its ids, "2" two GPUs; -1 and "auto" are
  every visible GPU (unknown here).
"""

from __future__ import annotations

TRAINER_CLASSES = frozenset({
    "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer",
    "pytorch_lightning.trainer.trainer.Trainer",
})
CLI_CLASSES = frozenset({
    "lightning.pytorch.cli.LightningCLI", "pytorch_lightning.cli.LightningCLI",
    "pytorch_lightning.utilities.cli.LightningCLI", "lightning.pytorch.LightningCLI",
})
# the Trainer arguments that decide the setup
ARGUMENTS = ("devices", "gpus", "num_nodes", "strategy", "precision", "accumulate_grad_batches")
# Fabric (lightning 2.5.0 fabric/fabric.py `Fabric.__init__`: accelerator="auto", strategy="auto",
# devices="auto", num_nodes=1, precision=None -> "32-true"; the same strategy and precision
# registries as the Trainer). No accumulation argument: the script's own loop accumulates. Under
# plain `python` with more than one device it starts the processes in `.launch()` (without it,
# `_validate_launched` raises "To use Fabric with more than one device, you must call `.launch()`").
FABRIC_CLASSES = frozenset({
    "lightning.Fabric", "lightning.fabric.Fabric", "lightning.fabric.fabric.Fabric", "lightning_fabric.Fabric",
    "lightning_fabric.fabric.Fabric",
})
FABRIC_ARGUMENTS = ("devices", "num_nodes", "strategy", "precision")

PRECISION_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
DEFAULT_PRECISION = "32-true"
# unified precision -> (autocast, module dtype when converted)
PRECISIONS = {
    "32-true": ("no", None), "16-mixed": ("fp16", None), "bf16-mixed": ("bf16", None),
    "16-true": ("no", "fp16"), "bf16-true": ("no", "bf16"),
}
# DeepSpeed's engine half for a precision
DEEPSPEED_HALF = {"16-mixed": "fp16", "16-true": "fp16", "bf16-mixed": "bf16", "bf16-true": "bf16"}

# registered strategy names -> (ZeRO stage, offload optimizer, offload parameters)
DEEPSPEED_STRATEGIES = {
    "deepspeed": (2, False, False), "deepspeed_stage_1": (1, False, False), "deepspeed_stage_2": (2, False, False),
    "deepspeed_stage_2_offload": (2, True, False), "deepspeed_stage_3": (3, False, False),
    "deepspeed_stage_3_offload": (3, True, True), "deepspeed_stage_3_offload_nvme": (3, True, True),
}
DEEPSPEED_DEFAULT_STAGE = 2  # DeepSpeedStrategy(stage: int = 2)
FSDP_STRATEGIES = {"fsdp": "full", "fsdp_cpu_offload": "full"}
FSDP_SHARDING = {"FULL_SHARD": "full", "HYBRID_SHARD": "full", "SHARD_GRAD_OP": "grad-op",
                 "_HYBRID_SHARD_ZERO2": "grad-op", "NO_SHARD": "none"}
# one process driving several GPUs (pytorch_lightning 1.x DataParallel): processes are not devices
SINGLE_PROCESS_STRATEGIES = frozenset({"dp"})


def unified_precision(value) -> str | None:
    """"16-mixed" for 16, "16" or "16-mixed"; None for what Lightning refuses or cfgfix does
    not model (64-true, transformer-engine)."""
    if isinstance(value, bool):
        return None
    text = str(value).strip().strip("'\"") if isinstance(value, (int, str)) else None
    if text is None:
        return None
    text = PRECISION_ALIASES.get(text, text)
    return text if text in PRECISIONS else None


def device_count(value) -> int | None:
    """The number of devices a `devices=` / `gpus=` value names; None for "auto", -1 and
    anything unreadable (the machine decides)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value) if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) else None
    if isinstance(value, str):
        text = value.strip().strip("'\"")
        if "," in text:
            ids = [part for part in text.split(",") if part.strip()]
            return len(ids) if ids and all(part.strip().isdigit() for part in ids) else None
        if text.isdigit():
            return int(text) if int(text) > 0 else None
        if text.startswith("[") and text.endswith("]"):
            ids = [part for part in text[1:-1].split(",") if part.strip()]
            return len(ids) if ids and all(part.strip().isdigit() for part in ids) else None
    return None
