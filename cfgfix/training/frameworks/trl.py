"""TRL (huggingface/trl) as data: the `TrainingArguments` defaults its config classes
override, per release, and the dtype its trainers load a model given by name in.

Read from the released wheels (`pip download trl==X --no-deps`): trl/trainer/<kind>_config.py
(from 1.0 their shared base `_BaseConfig`, trl/trainer/base_config.py; KTO from 0.26 and ORPO
from 0.28 under trl/experimental/<kind>/), trl/trainer/<kind>_trainer.py, and
trl/trainer/utils.py `create_model_from_path`. Wheels read: 0.8.6, 0.9.6, 0.10.1, 0.11.4,
0.12.0, 0.12.2, 0.13.0, 0.14.0, 0.15.2, 0.16.1, 0.17.0, 0.18.2, 0.19.0, 0.19.1, 0.20.0, 0.21.0,
0.22.0, 0.22.2, 0.23.0, 0.24.0, 0.25.1, 0.26.0, 0.26.2, 0.27.0, 0.27.2, 0.28.0, 0.29.0, 1.0.0,
1.2.0, 1.4.0, 1.6.0, 1.8.0, 1.9.0, 1.10.0, 1.12.0, 1.14.2, 1.16.0.

Each table lists (first release, value) oldest first: a value holds from its release until
the next row's. Before a table's first row nothing was read (unknown). A version range that
admits two rows with different values gives no value.
"""

from __future__ import annotations

# the config class each trainer builds when `args` is not given (`SFTConfig(f"{model}-SFT")`)
CONFIG_OF_TRAINER = {
    "SFTTrainer": "SFTConfig", "DPOTrainer": "DPOConfig", "GRPOTrainer": "GRPOConfig",
    "KTOTrainer": "KTOConfig", "ORPOTrainer": "ORPOConfig", "RewardTrainer": "RewardConfig",
}
CONFIGS = frozenset(CONFIG_OF_TRAINER.values())

_ALL = "*"
_Rows = tuple[tuple[str, object], ...]

# `gradient_checkpointing: bool = field(default=True)` in every *Config from 0.22.0 (0.21.0:
# TrainingArguments' False); from 1.0 in `_BaseConfig`.
GRADIENT_CHECKPOINTING: dict[str, _Rows] = {_ALL: (("0.8.6", False), ("0.22.0", True))}

# `bf16: bool | None = None` and `__post_init__`: `self.bf16 = not self.fp16 if self.bf16 is
# None else self.bf16` in every *Config from 0.19.0 (0.18.2: TrainingArguments' False).
BF16_UNLESS_FP16: dict[str, _Rows] = {_ALL: (("0.8.6", False), ("0.19.0", True))}

# The tokens of one training sequence when the config does not set them.
SEQUENCE_LENGTH: dict[str, _Rows] = {
    # 0.9.6-0.14.0: `max_seq_length = None`, and SFTTrainer then takes
    # `min(tokenizer.model_max_length, 1024)`; 0.15: `max_seq_length = 1024`; 0.16 on:
    # `max_length = 1024` (max_seq_length a deprecated alias until 0.20)
    "SFTConfig": (("0.9.6", 1024),),
    # 0.12-0.13: `max_length = None`, DPOTrainer truncates nothing (unknown); 0.14 on: 1024
    "DPOConfig": (("0.12.0", None), ("0.14.0", 1024)),
    # 0.12.2: `max_length = None`, the trainer falls back to 512; 0.14 on: `max_length = 1024`
    "KTOConfig": (("0.12.2", 512), ("0.14.0", 1024)),
    "ORPOConfig": (("0.12.2", 512), ("0.14.0", 1024)),
    "RewardConfig": (("0.12.2", 512), ("0.14.0", 1024)),
}
# GRPO trains on prompt + completion: `max_prompt_length = 512` 0.14-0.25 (from 0.26 None:
# prompts are not truncated), `max_completion_length = 256` 0.14-1.9, 512 from 1.10.0.
GRPO_PROMPT_LENGTH: _Rows = (("0.14.0", 512), ("0.26.0", None))
GRPO_COMPLETION_LENGTH: _Rows = (("0.14.0", 256), ("1.10.0", 512))
# GRPOConfig 0.14.0 only: `per_device_train_batch_size = 1`, `gradient_accumulation_steps = 8`
# (0.15.2: TrainingArguments' 8 and 1 again)
GRPO_BATCH: _Rows = (("0.14.0", (1, 8)), ("0.15.0", None))

# `learning_rate` (for CFX511's comparisons): SFT 2e-5 from 0.12.0 (0.11.4: 5e-5); DPO, ORPO
# 1e-6 from 0.12; KTO 5e-7 in 0.11, 1e-6 from 0.12; GRPO 1e-6 (0.14 on); Reward 1e-4 from 0.24.
LEARNING_RATE: dict[str, _Rows] = {
    "SFTConfig": (("0.9.6", 5e-5), ("0.12.0", 2e-5)),
    "DPOConfig": (("0.12.0", 1e-6),),
    "ORPOConfig": (("0.12.0", 1e-6),),
    "KTOConfig": (("0.11.4", 5e-7), ("0.12.0", 1e-6)),
    "GRPOConfig": (("0.14.0", 1e-6),),
    "RewardConfig": (("0.8.6", 5e-5), ("0.24.0", 1e-4)),
}

# The dtype a trainer loads a model given by name in, without `model_init_kwargs` dtype:
# before 0.26 `model_init_kwargs.get("dtype")` (None: transformers' own default, float32
# below 5, the checkpoint's from 5); 0.26 `kwargs.get("dtype", "auto")` (the checkpoint's);
# 0.27 on `kwargs.get("dtype", "float32")`.
NAMED_MODEL_DTYPE: _Rows = (("0.12.0", "transformers"), ("0.26.0", "auto"), ("0.27.0", "fp32"))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def value_for(rows: _Rows, versions) -> tuple[bool, object]:
    """(known, value) of `rows` for `versions` (a `VersionInfo`): the value every row the
    range admits agrees on; (False, None) when they differ, or when the range may hold a
    release older than the first one read."""
    if not rows or versions.below(rows[0][0]) is not False:
        return False, None
    admitted = []
    for index, (since, value) in enumerate(rows):
        following = rows[index + 1][0] if index + 1 < len(rows) else None
        if versions.below(since) is True or (following is not None and versions.at_least(following) is True):
            continue  # every admitted release is before this row, or at or past the next one
        admitted.append(value)
    if not admitted or any(value != admitted[0] for value in admitted[1:]):
        return False, None
    return True, admitted[0]


def table_for(table: dict[str, _Rows], config: str) -> _Rows | None:
    return table.get(config) or table.get(_ALL)


# `trl <command>` (trl/cli): the script it runs and the config class that script parses
CLI_CONFIGS = {"sft": "SFTConfig", "dpo": "DPOConfig", "grpo": "GRPOConfig", "kto": "KTOConfig",
               "reward": "RewardConfig"}
# trl/scripts/<command>.py load the model with `dtype=model_args.dtype`: ModelConfig's
# `dtype`/`torch_dtype` default None through 0.26.0 (transformers' own default), "float32" from
# 0.27.0 (trl/trainer/model_config.py)
CLI_MODEL_DTYPE: _Rows = (("0.19.1", "transformers"), ("0.27.0", "fp32"))
