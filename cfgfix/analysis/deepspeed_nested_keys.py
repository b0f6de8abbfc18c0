"""Keys DeepSpeed's pydantic config models accept inside `zero_optimization`, its
`offload_*` blocks, and (DeepSpeed >= 0.19) `fp16` / `bf16`. The models are declared with
`extra="forbid"`, so any other key raises "Extra inputs are not permitted" [facts C12].

The lists are the union of DeepSpeed 0.19.8 (checked field by field against its source) and
the main branch (`runtime/zero/config.py`, `runtime/zero/offload_config.py`,
`runtime/precision_config.py`), field names and their `stage3_*` aliases both (the aliased
and deprecated ZeRO options come from `deepspeed_keys.ZERO_ALIASES` / `ZERO_DEPRECATED`): a key newer
than the user's DeepSpeed is missed, never flagged. Older versions are not covered (CFX507
skips nested blocks when the project's DeepSpeed is known to be older than 0.19).
"""

from cfgfix.analysis.deepspeed_keys import ZERO_ALIASES, ZERO_DEPRECATED

# The options without a second name; the aliased and deprecated ones come from deepspeed_keys
# (one table for every rule that reads them).
ZERO = frozenset("""
stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce
allgather_partitions allgather_bucket_size overlap_comm load_from_fp32_weights elastic_checkpoint
offload_param offload_optimizer zenflow sub_group_size ignore_unused_parameters legacy_stage1
round_robin_gradients zero_hpz_partition_size zero_quantized_weights
zero_quantized_nontrainable_weights zero_quantized_gradients zeropp_loco_param mics_shard_size
mics_hierarchical_params_gather memory_efficient_linear pipeline_loading_checkpoint
override_module_apply log_trace_cache_warnings enable_sanity_checks
save_muon_momentum_buffer_in_memory leaf_module compute_grad_norm parameter_alignment
""".split()) | frozenset(ZERO_ALIASES) | frozenset(ZERO_ALIASES.values()) | frozenset(ZERO_DEPRECATED)

OFFLOAD_PARAM = frozenset("device nvme_path buffer_count buffer_size max_in_cpu pin_memory".split())

OFFLOAD_OPTIMIZER = frozenset("""
device nvme_path buffer_count pin_memory pipeline_read pipeline_write fast_init ratio super_offload
convert_grad_on_cpu cpuadam_cores_perc pipeline
""".split())

FP16 = frozenset("""
enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis consecutive_hysteresis
min_loss_scale fp16_master_weights_and_grads
""".split())

BF16 = frozenset("enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads "
                 "bf16_optimizer_states".split())
