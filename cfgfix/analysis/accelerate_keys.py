"""What accelerate's config loader knows, as data [B10] (accelerate 1.x,
commands/config/config_args.py and utils/launch.py)."""

from cfgfix.analysis.deepspeed_keys import ZERO_DEPRECATED, zero_spellings

TOP_LEVEL = frozenset("""
compute_environment distributed_type mixed_precision use_cpu debug enable_cpu_affinity
num_processes machine_rank num_machines gpu_ids main_process_ip main_process_port
rdzv_backend same_network main_training_function deepspeed_config fsdp_config
megatron_lm_config parallelism_config ipex_config mpirun_config dynamo_config fp8_config
downcast_bf16 tpu_name tpu_zone tpu_use_cluster tpu_use_sudo command_file commands tpu_vm
tpu_env ec2_instance_type iam_role_name image_uri profile region base_job_name
pytorch_version transformers_version py_version sagemaker_inputs_file sagemaker_metrics_file
additional_args fp16 use_mps_device dynamo_backend
""".split())
# `fp16` and `dynamo_backend` are legacy top-level keys that ClusterConfig.process_config
# still converts (to mixed_precision, and to dynamo_config.dynamo_backend): not unknown.

# Keys the launcher copies from `deepspeed_config:` (launch.py's DeepSpeed argument group).
DEEPSPEED_CONFIG_KEYS = frozenset("""
deepspeed_config_file zero_stage offload_optimizer_device offload_param_device
offload_optimizer_nvme_path offload_param_nvme_path gradient_accumulation_steps
gradient_clipping zero3_init_flag zero3_save_16bit_model deepspeed_hostfile
deepspeed_exclusion_filter deepspeed_inclusion_filter deepspeed_multinode_launcher
deepspeed_moe_layer_cls_names
""".split())

# What accelerate rejects next to `deepspeed_config_file` (dataclasses.py; mixed_precision
# joins when it comes from the YAML).
IGNORED_WITH_DS_FILE = (
    "gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
    "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)

# Where the DeepSpeed JSON states what each rejected inline key says (key paths, the first
# one present wins), and the value DeepSpeed uses when the JSON leaves it out (MISSING: none
# that can agree). CFX403's fix removes a key only when the JSON already says the same [B10, C12].
MISSING = object()
_ZERO = "zero_optimization"
_GATHER_NAMES = zero_spellings("gather_16bit_weights_on_model_save") + tuple(
    old for old, new in ZERO_DEPRECATED.items() if new == "gather_16bit_weights_on_model_save")
IGNORED_KEY_IN_JSON = {
    "zero_stage": (((_ZERO, "stage"),), MISSING),
    "gradient_accumulation_steps": ((("gradient_accumulation_steps",),), MISSING),
    "gradient_clipping": ((("gradient_clipping",),), MISSING),
    # a deprecated cpu_offload / cpu_offload_param boolean is found too, and never agrees
    # with a device string (so it is never removed as "the same")
    "offload_optimizer_device": (((_ZERO, "offload_optimizer", "device"), (_ZERO, "cpu_offload")), "none"),
    "offload_param_device": (((_ZERO, "offload_param", "device"), (_ZERO, "cpu_offload_param")), "none"),
    "offload_optimizer_nvme_path": (((_ZERO, "offload_optimizer", "nvme_path"),), "none"),
    "offload_param_nvme_path": (((_ZERO, "offload_param", "nvme_path"),), "none"),
    # every name DeepSpeed reads the option under: alias, pydantic field name, deprecated fp16
    # name (deepspeed_keys.ZERO_ALIASES / ZERO_DEPRECATED, C12); default false
    "zero3_save_16bit_model": (tuple((_ZERO, name) for name in _GATHER_NAMES), False),
}

# Enum values checked at load (distributed_type, compute_environment) or at launch.
VALUES = {
    "distributed_type": ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                         "MULTI_MUSA", "MULTI_XPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM",
                         "MULTI_HPU", "MULTI_NEURON", "DATA_PARALLEL", "MODEL_PARALLEL"),
    "compute_environment": ("LOCAL_MACHINE", "AMAZON_SAGEMAKER"),
    "mixed_precision": ("no", "fp16", "bf16", "fp8"),
}
DEEPSPEED_VALUES = {
    "offload_optimizer_device": ("none", "cpu", "nvme"),
    "offload_param_device": ("none", "cpu", "nvme"),
    "deepspeed_multinode_launcher": ("pdsh", "standard", "openmpi", "mvapich", "mpich", "slurm", "nossh"),
}
