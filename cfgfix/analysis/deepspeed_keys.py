"""What DeepSpeed knows, as data: top-level config keys (any version from 0.10 to 0.19; an
unknown one is silently ignored), the deprecated forms and the keys removed in 0.19 [C12]."""

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

# Keys that DeepSpeed 0.19 rejects with DeepSpeedConfigError [C12]; the message to quote.
REMOVED_IN_019 = {
    "amp": "NVIDIA Apex AMP integration has been removed; use 'fp16', 'bf16' or 'torch_autocast'",
    "elasticity": "elastic training support has been removed",
    "nebula": "the Nebula checkpoint engine has been removed",
    "compression_training": "compression training has been removed",
    "quantize_training": "quantize training has been removed",
    "sparse_gradients": "sparse gradients have been removed",
    "eigenvalue": "the eigenvalue computation has been removed",
    "sparse_attention": "sparse attention has been removed",
    "graph_harvesting": "graph harvesting has been removed",
    "curriculum_learning": "the legacy curriculum learning block has been removed (use data_efficiency)",
    "progressive_layer_drop": "progressive layer drop has been removed",
}
# Under zero_optimization: `mics_*` and `zeropp_loco_param`.
REMOVED_ZERO_PREFIXES = ("mics_",)
REMOVED_ZERO_KEYS = frozenset({"zeropp_loco_param"})

# Deprecated forms that still work, with their current replacement [C12].
DEPRECATED_ZERO_KEYS = {
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}
