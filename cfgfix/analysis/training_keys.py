"""The names training settings go by, as data: in training configs (YAML/JSON at any
depth, Python config modules), in HF `TrainingArguments` keywords, and as script flags
(`--per_device_train_batch_size 4`).

Only names whose meaning is not in doubt are listed. `train_batch_size` is left out on
purpose: DeepSpeed means the global batch, diffusers' scripts the per-device one, so a
training config's `train_batch_size` says nothing certain. `batch_size` alone is left out
too (evaluation, data loading and inference use it as often as training).
"""

from __future__ import annotations

# canonical setting -> the names it goes by (matched exactly; case as written by the tools)
SETTING_NAMES: dict[str, tuple[str, ...]] = {
    "model": ("model_name_or_path", "pretrained_model_name_or_path", "base_model", "model_name", "model_id"),
    "micro_batch": ("per_device_train_batch_size", "micro_batch_size", "train_micro_batch_size_per_gpu"),
    "grad_accum": ("gradient_accumulation_steps",),
    "mixed_precision": ("mixed_precision",),
    "bf16": ("bf16",),
    "fp16": ("fp16",),
    "seq_len": ("max_seq_length", "max_seq_len", "model_max_length", "sequence_len", "cutoff_len",
                "max_source_length", "seq_length", "block_size", "max_length"),
    "target_len": ("max_target_length",),
    # TRL GRPO: a sequence is a prompt plus a completion (training/frameworks/trl.py)
    "prompt_len": ("max_prompt_length",),
    "completion_len": ("max_completion_length",),
    "resolution": ("resolution",),
    # transformers 5.23.0 TrainingArguments: `activation_checkpointing`, with
    # `gradient_checkpointing` its deprecated alias
    "gradient_checkpointing": ("gradient_checkpointing", "activation_checkpointing"),
    "optimizer": ("optim", "optimizer"),
    "use_8bit_adam": ("use_8bit_adam",),
    "lora_rank": ("lora_r", "lora_rank"),
    # the Linear layers LoRA adapts: LLaMA-Factory's lora_target ("q_proj,v_proj", "all"),
    # axolotl's lora_target_modules (a list), PEFT's target_modules
    "lora_targets": ("lora_target", "lora_target_modules", "target_modules"),
    # TRL DPOConfig: the reference model's log-probs computed before training (none held)
    "precompute_ref_log_probs": ("precompute_ref_log_probs",),
    # what is trained: "full", "lora", ... (LLaMA-Factory's finetuning_type: lora | freeze | full)
    "training_method": ("training_method", "finetuning_type", "finetune_type", "training_type"),
    "load_in_4bit": ("load_in_4bit",),
    "load_in_8bit": ("load_in_8bit",),
    "quantization_bit": ("quantization_bit",),  # LLaMA-Factory: 4 or 8
    "deepspeed": ("deepspeed",),
    "fsdp": ("fsdp",),
    "weights_config": ("torch_dtype", "model_dtype"),  # a config's dtype for the loaded weights  # HF TrainingArguments: "full_shard auto_wrap", "shard_grad_op", ...
    # HF TrainingArguments: batches of similar lengths, so each batch is padded to a different
    # length from step to step (memory: the caching allocator's variable-length margin)
    "group_by_length": ("group_by_length",),
    "learning_rate": ("learning_rate",),
    "max_grad_norm": ("max_grad_norm",),
    "weight_decay": ("weight_decay",),
    "num_train_epochs": ("num_train_epochs",),
    "global_batch": ("global_batch_size", "total_batch_size", "effective_batch_size", "total_train_batch_size"),
}

NAME_TO_SETTING: dict[str, str] = {name: setting for setting, names in SETTING_NAMES.items() for name in names}

# `training_method` values that train every weight: a LoRA rank beside one is a leftover
FULL_TRAINING_METHODS = frozenset({"full", "full_finetune", "full_finetuning", "full-finetune", "full_ft", "fft"})

# Mappings whose `r` is a LoRA rank (`lora: {r: 16}`, `LORA_CONFIG = {"r": 16}`).
LORA_BLOCKS = frozenset({"lora", "lora_config", "peft", "peft_config", "adapter"})

# Settings that mark a file as a training config: two different ones must appear.
TRAINING_MARKERS = frozenset({
    "micro_batch", "grad_accum", "mixed_precision", "bf16", "fp16", "gradient_checkpointing",
    "learning_rate", "num_train_epochs", "lora_rank", "optimizer",
})

# HF `TrainingArguments` defaults for the values CFX511 compares: the same in every wheel read,
# transformers 4.20.1 to 5.23.0 (training/frameworks/hf_trainer.py lists them and holds the
# defaults that changed):
# a launch whose script parses TrainingArguments from the command line gets these for
# every flag it does not pass.
TRAINING_ARGUMENT_DEFAULTS: dict[str, object] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "fp16": False,
    "bf16": False,
    "learning_rate": 5e-5,
    "max_grad_norm": 1.0,
    "weight_decay": 0.0,
}

# HF optimizer names (`optim`) by what they keep per parameter.
EIGHT_BIT_OPTIMIZERS = ("8bit",)  # adamw_bnb_8bit, paged_adamw_8bit, adamw_8bit, ...
