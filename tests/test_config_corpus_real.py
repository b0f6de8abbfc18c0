"""Real accelerate and DeepSpeed configs nobody here wrote, from the precision check of the
CFX4xx/CFX5xx rules (issue 4): the ones the tools accept must stay free of CFX4/CFX5
errors and warnings, and the real mistakes in them must stay found.

Sources (text as published; long comments dropped): accelerate 1.15 examples and tests
(GitHub huggingface/accelerate), transformers tests/deepspeed, DeepSpeedExamples, and the
sdists of llamafactory 0.9.5. What accelerate 1.15's config loader and DeepSpeed 0.19.8's
`DeepSpeedConfig` said about each file is noted beside it.
"""

import pytest

from conftest import lint_project, write_project

DS_PIN = {"requirements.txt": "deepspeed==0.19.8\n"}

# -- accepted by the tools: no CFX4/CFX5 finding ---------------------------------------------------
CLEAN = {
    "accelerate template with a DeepSpeed file, precision left to the JSON": {
        "examples/config_yaml_templates/deepspeed.yaml": (
            "distributed_type: DEEPSPEED\n"
            "deepspeed_config:\n"
            "  deepspeed_config_file: ../deepspeed_config_templates/zero_stage1_config.json\n"
            "  zero3_init_flag: false # true \n"
            "num_processes: 2\n"
            "# mixed_precision: \"bf16\"\n"),
        "examples/deepspeed_config_templates/zero_stage1_config.json": (
            '{\n    "fp16": {\n        "enabled": true,\n        "loss_scale": 0,\n        "loss_scale_window": 1000,\n'
            '        "initial_scale_power": 16,\n        "hysteresis": 2,\n        "min_loss_scale": 1\n    },\n'
            '    "optimizer": {\n        "type": "AdamW",\n        "params": {\n            "lr": "auto",\n'
            '            "weight_decay": "auto",\n            "torch_adam": true,\n            "adam_w_mode": true\n'
            '        }\n    },\n    "scheduler": {\n        "type": "WarmupDecayLR",\n        "params": {\n'
            '            "warmup_min_lr": "auto",\n            "warmup_max_lr": "auto",\n'
            '            "warmup_num_steps": "auto",\n            "total_num_steps": "auto"\n        }\n    },\n'
            '    "zero_optimization": {\n        "stage": 1,\n        "allgather_partitions": true,\n'
            '        "allgather_bucket_size": 2e8,\n        "overlap_comm": true,\n        "reduce_scatter": true,\n'
            '        "reduce_bucket_size": "auto",\n        "contiguous_gradients": true\n    },\n'
            '    "gradient_accumulation_steps": 1,\n    "gradient_clipping": "auto",\n    "steps_per_print": 2000,\n'
            '    "train_batch_size": "auto",\n    "train_micro_batch_size_per_gpu": "auto",\n'
            '    "wall_clock_breakdown": false\n}'),
    },
    "FSDP2 with parallelism_config (accelerate torch_native_parallelism/configs/cp.yaml)": {
        "cp.yaml": (
            "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: FSDP\ndowncast_bf16: 'no'\n"
            "enable_cpu_affinity: false\nfsdp_config:\n  fsdp_activation_checkpointing: true\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_cpu_ram_efficient_loading: false\n"
            "  fsdp_offload_params: false\n  fsdp_reshard_after_forward: true\n"
            "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_version: 2\nmachine_rank: 0\n"
            "main_training_function: main\nmixed_precision: bf16\nnum_machines: 1\nnum_processes: 8\n"
            "parallelism_config:\n  parallelism_config_cp_size: 8\n  parallelism_config_dp_replicate_size: 1\n"
            "  parallelism_config_dp_shard_size: 1\n  parallelism_config_tp_size: 1\nrdzv_backend: static\n"
            "same_network: true\ntpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n"),
    },
    "fp8 with fp8_config (accelerate tests/test_configs/0_34_0_fp8.yaml)": {
        "0_34_0_fp8.yaml": (
            "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\ndowncast_bf16: 'no'\n"
            "enable_cpu_affinity: false\nfp8_config:\n  amax_compute_algo: max\n  amax_history_len: 1024\n"
            "  backend: TE\n  fp8_format: E4M3\n  interval: 1\n  margin: 0\n"
            "  override_linear_precision: (false, false, false)\n  use_autocast_during_eval: false\n"
            "gpu_ids: all\nmachine_rank: 0\nmain_training_function: main\nmixed_precision: fp8\nnum_machines: 1\n"
            "num_processes: 2\nrdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\n"
            "tpu_use_sudo: false\nuse_cpu: false\n"),
    },
    "SageMaker config: unquoted `distributed_type: NO` (YAML reads False), `debug` twice": {
        "0_30_0_sagemaker.yaml": (
            "compute_environment: AMAZON_SAGEMAKER\ndebug: false\ndistributed_type: NO\nmixed_precision: fp16\n"
            "debug: false\nuse_cpu: false\nec2_instance_type: MY_TYPE\niam_role_name: MY_ROLE\n"),
    },
    "a never-read deepspeed_config block next to distributed_type 'NO' (accelerate's validate_launch_cmd.yaml)": {
        "validate_launch_cmd.yaml": (
            "compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\ndistributed_type: 'NO'\n"
            "fsdp_config:\n  fsdp_sync_module_states: false\ndeepspeed_config:\n"
            "  deepspeed_config_file: path/to/be/ignored\n"),
    },
    "ZenFlow inside zero_optimization (DeepSpeedExamples DeepSpeed-ZenFlow/finetuning/zf_config.json)": {
        **DS_PIN,
        "zf_config.json": (
            '{\n    "train_batch_size": 32,\n    "bf16": { "enabled": true },\n    "zero_optimization": {\n'
            '      "stage": 2,\n      "offload_optimizer": {\n        "device": "cpu",\n        "pin_memory": true\n'
            '      },\n      "zenflow": {\n            "topk_ratio": 0.1,\n            "update_interval": 4,\n'
            '            "full_warm_up_rounds": 0,\n            "overlap_step": true\n        }\n    },\n'
            '    "optimizer": {\n      "type": "AdamW",\n      "params": {\n        "lr": 2e-5,\n'
            '        "betas": [0.9, 0.999],\n        "eps": 1e-8,\n        "weight_decay": 0.01\n      }\n    },\n'
            '    "gradient_accumulation_steps": 1,\n    "gradient_clipping": 1.0,\n'
            '    "zero_allow_untested_optimizer": true\n}\n  \n'),
    },
    "leaf_module under ZeRO-3 (DeepSpeedExamples expert_parallel/configs/ds_zero3_leaf_qwen3_5.json)": {
        **DS_PIN,
        "ds_zero3_leaf_qwen3_5.json": (
            '{\n    "bf16": {"enabled": true},\n    "zero_optimization": {\n        "stage": 3,\n'
            '        "stage3_param_persistence_threshold": 1e5,\n        "leaf_module": {\n            "classes": [\n'
            '                "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeSparseMoeBlock"\n'
            '            ]\n        }\n    },\n    "optimizer": {\n        "type": "AdamW",\n'
            '        "params": {\n            "lr": 1e-4\n        }\n    },\n'
            '    "train_micro_batch_size_per_gpu": 2,\n    "gradient_accumulation_steps": 1,\n'
            '    "steps_per_print": 10\n}\n'),
    },
    "expert_parallel at the top level (DeepSpeedExamples training/expert_parallel)": {
        **DS_PIN,
        "ds_autoep_zero1_qwen3_5_moe.json": (
            '{\n    "bf16": {"enabled": true},\n    "zero_optimization": {\n        "stage": 1\n    },\n'
            '    "expert_parallel": {\n        "enabled": true,\n        "autoep_size": 8,\n'
            '        "preset_model": "qwen3_5_moe",\n        "load_balance_coeff": null\n    },\n'
            '    "train_micro_batch_size_per_gpu": 2,\n    "gradient_accumulation_steps": 1,\n'
            '    "steps_per_print": 10\n}\n'),
    },
    "Ulysses: train_batch_size 1 on 2 processes with sequence_parallel_size 2 (DeepSpeedExamples "
    "benchmarks/autosp; DeepSpeed 0.19.8 accepts it at world size 2 and refuses train_batch_size 2)": {
        **DS_PIN,
        "configs/autosp_config.yaml": (
            "compute_environment: LOCAL_MACHINE\ndebug: false\ndeepspeed_config:\n"
            "  deepspeed_multinode_launcher: standard\n  deepspeed_config_file: configs/autosp_config.json\n"
            "distributed_type: DEEPSPEED\nmachine_rank: 0\nmain_training_function: main\nnum_machines: 1\n"
            "num_processes: 2\nrdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\n"
            "tpu_use_sudo: false\nuse_cpu: false\n"),
        "configs/autosp_config.json": (
            '{\n    \n    "bf16": {\n        "enabled": true\n    },\n    \n    "zero_optimization": {\n'
            '        "stage": 0\n    },\n    "compile": {\n        "deepcompile": true,\n\t"passes": ["autosp"]\n'
            '    },\n    "gradient_accumulation_steps": 1,\n    "gradient_clipping": "auto",\n'
            '    "steps_per_print": 2000,\n    "train_batch_size": 1,\n    "train_micro_batch_size_per_gpu": 1,\n'
            '    "wall_clock_breakdown": false,\n    "sequence_parallel_size": 2\n}\n'),
    },
    "ZeRO-3 with both offloads, profiler and tensorboard blocks, 32 GPUs (DeepSpeedExamples t5_xl_multi_node)": {
        **DS_PIN,
        "run.sh": "deepspeed --num_nodes 4 --num_gpus 8 train.py --deepspeed_config t5_xl_multi_node.json\n",
        "t5_xl_multi_node.json": (
            '{\n  "train_batch_size": 512,\n  "train_micro_batch_size_per_gpu": 1,\n'
            '  "gradient_accumulation_steps": 16,\n  "gradient_clipping": 1.0,\n  "steps_per_print": 50,\n\n'
            '  "bf16": {\n    "enabled": true\n  },\n\n  "zero_optimization": {\n    "stage": 3,\n'
            '    "overlap_comm": true,\n    "contiguous_gradients": true,\n    "reduce_bucket_size": 100000000,\n'
            '    "stage3_prefetch_bucket_size": 100000000,\n    "stage3_param_persistence_threshold": 200000,\n'
            '    "stage3_max_live_parameters": 3000000000,\n    "stage3_max_reuse_distance": 3000000000,\n'
            '    "stage3_gather_16bit_weights_on_model_save": true,\n\n    "offload_optimizer": {\n'
            '      "device": "cpu",\n      "pin_memory": true,\n      "buffer_count": 4,\n      "fast_init": false\n'
            '    },\n\n    "offload_param": {\n      "device": "cpu",\n      "pin_memory": true,\n'
            '      "buffer_count": 5,\n      "buffer_size": 200000000,\n      "max_in_cpu": 2000000000\n    }\n'
            '  },\n\n  "activation_checkpointing": {\n    "partition_activations": true,\n'
            '    "cpu_checkpointing": true,\n    "contiguous_memory_optimization": true,\n'
            '    "number_checkpoints": 8,\n    "synchronize_checkpoint_boundary": false,\n    "profile": false\n'
            '  },\n\n  "flops_profiler": {\n    "enabled": false,\n    "profile_step": 1,\n    "module_depth": -1,\n'
            '    "top_modules": 3,\n    "detailed": true\n  },\n\n  "wall_clock_breakdown": false,\n'
            '  "tensorboard": {\n    "enabled": true,\n    "output_path": "./tensorboard_logs/",\n'
            '    "job_name": "t5_xl_training"\n  }\n}\n'),
    },
}

# -- real mistakes: accelerate 1.15 / DeepSpeed 0.19.8 refuse or ignore them ---------------------------
FLAGGED = {
    "kt_config: unknown to accelerate 1.15 and to accelerate-kt 1.14.0.post4 (llamafactory ktransformers example)": (
        {"fsdp2_kt_bf16.yaml": (
            "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_cpu_ram_efficient_loading: true\n"
            "  fsdp_offload_params: false\n  fsdp_reshard_after_forward: true\n"
            "  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_version: 2\nmixed_precision: bf16\nnum_machines: 1\n"
            "num_processes: 4 # Adjust based on your GPU count; 4 is suitable for 4 GPUs\nrdzv_backend: static\n"
            "same_network: true\nuse_cpu: false\n\nkt_config:\n  enabled: true\n  kt_backend: AMXBF16\n"
            "  kt_num_threads: 96\n")},
        [("CFX405", "fsdp2_kt_bf16.yaml", 17)]),
    "`command` for `commands` (accelerate tests/test_configs/latest.yaml; the loader refuses it)": (
        {"latest.yaml": (
            "compute_environment: LOCAL_MACHINE\ndeepspeed_config: {}\ndistributed_type: 'NO'\ndowncast_bf16: 'no'\n"
            "fsdp_config: {}\ngpu_ids: all\nmachine_rank: 0\nmain_process_ip: null\nmain_process_port: null\n"
            "main_training_function: main\nmegatron_lm_config: {}\nmixed_precision: 'no'\nnum_machines: 1\n"
            "num_processes: 1\nrdzv_backend: static\nsame_network: true\nuse_cpu: false\ntpu_name: 'test-tpu'\n"
            "tpu_zone: 'us-central1-a'\ncommand: null\ncommand_file: tests/test_samples/test_command_file.sh\n")},
        [("CFX405", "latest.yaml", 20)]),
    "comms_config and monitor_config: no DeepSpeed version reads them (llamafactory examples/deepspeed/ds_z3_fp8_config.json, shortened)": (
        {**DS_PIN, "ds_z3_fp8_config.json": (
            '{\n  "train_micro_batch_size_per_gpu": "auto",\n  "gradient_clipping": "auto",\n'
            '  "zero_allow_untested_optimizer": true,\n  "zero_force_ds_cpu_optimizer": true,\n'
            '  "fp16": {\n    "enabled": false,\n    "loss_scale": 0\n  },\n  "bf16": {\n    "enabled": "auto"\n  },\n'
            '  "zero_optimization": {\n    "stage": 3,\n    "offload_optimizer": {\n      "device": "cpu",\n'
            '      "pin_memory": false\n    },\n    "stage3_gather_16bit_weights_on_model_save": true\n  },\n'
            '  "steps_per_print": 10000000,\n  "gradient_accumulation_steps": "auto",\n'
            '  "comms_config": {\n    "verbose": false\n  },\n  "monitor_config": {\n    "enabled": true,\n'
            '    "tag": "DeepSpeedMonitor",\n    "csv_monitor": {\n      "enabled": false\n    }\n  }\n}\n')},
        # comms_config, and monitor_config: DeepSpeed's get_monitor_config reads only the
        # top-level tensorboard / wandb / csv_monitor / comet blocks, so this one is ignored
        [("CFX507", "ds_z3_fp8_config.json", 23), ("CFX507", "ds_z3_fp8_config.json", 26)]),
    "the deprecated fp16 gather name (transformers tests/deepspeed/ds_config_zero3_bf16.json, shortened)": (
        {"ds_config_zero3_bf16.json": (
            '{\n    "bfloat16": {\n        "enabled": "auto"\n    },\n\n    "zero_optimization": {\n'
            '        "stage": 3,\n        "offload_param": {\n            "device": "cpu",\n'
            '            "pin_memory": true\n        },\n        "stage3_gather_fp16_weights_on_model_save": true\n'
            '    },\n\n    "gradient_accumulation_steps": "auto",\n    "train_batch_size": "auto",\n'
            '    "train_micro_batch_size_per_gpu": "auto"\n}\n')},
        [("CFX504", "ds_config_zero3_bf16.json", 12)]),
}


def _config_findings(tmp_path, files):
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX4", "CFX5"])
    return sorted((f.code, f.path, f.span.line) for f in result.findings)


@pytest.mark.parametrize("files", CLEAN.values(), ids=list(CLEAN))
def test_real_configs_the_tools_accept_stay_clean(tmp_path, files):
    assert _config_findings(tmp_path, files) == []


@pytest.mark.parametrize("files, expected", FLAGGED.values(), ids=list(FLAGGED))
def test_real_mistakes_stay_found(tmp_path, files, expected):
    assert _config_findings(tmp_path, files) == expected
