"""What DeepSpeed knows, as data: top-level config keys (any version from 0.10 to 0.19; an
unknown one is silently ignored), the deprecated forms and the keys removed in 0.19.7 and
0.19.8 [C12]."""

# Every top-level key some supported DeepSpeed version reads (runtime/config.py and the
# get_*_config helpers it calls: monitors, profilers, data efficiency, autotuning, ...).
TOP_LEVEL = frozenset("""
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps
managed_gradient_accumulation steps_per_print dump_state wall_clock_breakdown memory_breakdown
optimizer scheduler fp16 bf16 bfloat16 fp32 amp torch_autocast zero_optimization
zero_allow_untested_optimizer zero_force_ds_cpu_optimizer gradient_clipping prescale_gradients
gradient_predivide_factor gradient_allreduce_op sparse_gradients communication_data_type
seq_parallel_communication_data_type disable_allgather disable_python_gc
activation_checkpointing flops_profiler comms_logger tensorboard wandb
csv_monitor comet aim autotuning elasticity pipeline pld progressive_layer_drop
curriculum_learning data_efficiency data_types checkpoint datastates_ckpt nebula
compression_training quantize_training sparse_attention eigenvalue hybrid_engine
graph_harvesting aio nvme swap_tensor compile dataloader_drop_last
use_data_before_expert_parallelism log_level timers weight_quantization tensor_parallel
expert_parallel model_info dynamic_batching random_ltd zenflow mics_shard_size
mics_hierarchical_params_gather load_universal_checkpoint use_node_local_storage
train_micro_batch_size_per_gpu_auto sequence_parallel_size ds_sequence_parallel_size
domino autotp sequence_parallel fp8 fp16_master_weights_and_grads
""".split())

# Keys the HF/accelerate integrations read from the same file (never DeepSpeed's own).
INTEGRATION_KEYS = frozenset({"gradient_clipping"})

# Keys DeepSpeed rejects with DeepSpeedConfigError (`_reject_removed_config_keys` in
# runtime/config.py), with the release that began to, read from the sdists: 0.19.6 has no
# such list, 0.19.7 rejects six keys, 0.19.8 fourteen [C12]. Present at all is enough (a
# `null` or `{"enabled": false}` block is rejected too). Key -> (what DeepSpeed says, since).
REMOVED_TOP_LEVEL = {
    "nebula": ("Nebula checkpointing has been removed", "0.19.7"),
    "compression_training": ("the DeepSpeed compression library has been removed", "0.19.7"),
    "quantize_training": ("Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed", "0.19.7"),
    "sparse_attention": ("DeepSpeed Sparse Attention has been removed", "0.19.7"),
    "amp": ("NVIDIA Apex AMP integration has been removed; use 'fp16', 'bf16' or 'torch_autocast'", "0.19.8"),
    "sparse_gradients": ("sparse compression of dense embedding gradients has been removed", "0.19.8"),
    "eigenvalue": ("eigenvalue-based Mixture-of-Quantization has been removed", "0.19.8"),
    "elasticity": ("elastic training has been removed; set the batch sizes directly", "0.19.8"),
    "graph_harvesting": ("graph harvesting has been removed", "0.19.8"),
    "curriculum_learning": ("the legacy top-level curriculum_learning has been removed "
                            "(use data_efficiency.data_sampling.curriculum_learning)", "0.19.8"),
    "progressive_layer_drop": ("Progressive Layer Dropping has been removed", "0.19.8"),
}
# The same, under `zero_optimization`.
REMOVED_ZERO = {
    "mics_shard_size": ("MiCS ZeRO-3 sharding has been removed", "0.19.7"),
    "mics_hierarchical_params_gather": ("MiCS ZeRO-3 sharding has been removed", "0.19.7"),
    "zeropp_loco_param": ("LoCo-Zero++ has been removed (ZeRO++ quantized gradients work without it)", "0.19.8"),
}

# ZeRO options DeepSpeed reads under two names [C12]. `DeepSpeedZeroConfig`
# (runtime/zero/config.py) declares each as a pydantic field with a `stage3_*` alias, and
# `DeepSpeedConfigModel` (runtime/config_utils.py) sets `populate_by_name=True` (pydantic v1's
# `allow_population_by_field_name` since the pydantic refactor of July 2022, 599758968), so
# `"gather_16bit_weights_on_model_save": true` sets the same option as
# `"stage3_gather_16bit_weights_on_model_save": true`. Field name -> alias, read from DeepSpeed
# 0.19.8's source; 0.16.5 (commit 38327e07) has the same pairs less `allgather_sequential`,
# and `partition_stream_chunk_size` is on the main branch only. Every rule that reads one of
# these options reads it through this table (`zero_entry` in deepspeed_config.py).
ZERO_ALIASES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold": "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential": "stage3_allgather_sequential",
    "partition_stream_chunk_size": "stage3_partition_stream_chunk_size",
}

# Deprecated ZeRO fields DeepSpeed still reads, with a warning, and the field each one sets
# (`json_schema_extra={"deprecated": True, "new_param": ...}`; config_utils.py
# `_process_deprecated_field`). Giving one together with the field it sets (under either
# spelling: pydantic's fields_set holds field names) stops DeepSpeed with "Cannot provide
# deprecated parameter '...' and replacing parameter '...' together". A true `cpu_offload` /
# `cpu_offload_param` becomes `{"device": "cpu"}` in the offload block; `cpu_offload_use_pin_memory`
# sets nothing.
ZERO_DEPRECATED = {
    "stage3_gather_fp16_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
    "cpu_offload_use_pin_memory": None,
}


def zero_option(key: str) -> str:
    """The field name DeepSpeed stores `key` under (`stage3_max_live_parameters` ->
    `max_live_parameters`); a deprecated name maps to itself (it is its own field)."""
    return _FIELD_OF.get(key, key)


def zero_spellings(key: str) -> tuple[str, ...]:
    """Every current name of the option `key` names: the alias first (the name DeepSpeed's and
    accelerate's messages use), then the field name; one name for an option without alias."""
    option = zero_option(key)
    alias = ZERO_ALIASES.get(option)
    return (alias, option) if alias else (option,)


def preferred_zero_name(key: str) -> str:
    """The name to write for the option `key` names: its alias when it has one."""
    return zero_spellings(key)[0]


_FIELD_OF = {alias: field for field, alias in ZERO_ALIASES.items()}

# Deprecated forms that still work, with their current replacement [C12] (CFX504 renames them).
DEPRECATED_ZERO_KEYS = {
    old: preferred_zero_name(new) for old, new in ZERO_DEPRECATED.items() if new in ZERO_ALIASES
}
