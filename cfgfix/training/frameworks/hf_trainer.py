"""The HF Trainer's own defaults (transformers `TrainingArguments`) where they changed between
releases, read from the released wheels' transformers/training_args.py (`pip download
transformers==X --no-deps`): 4.20.1, 4.30.2, 4.31.0, 4.32.1, 4.33.3, 4.34.1, 4.35.2, 4.36.2,
4.37.2, 4.38.2, 4.39.3, 4.45.2, 4.52.3, 4.53.3, 4.54.1, 4.55.4, 4.56.2, 4.57.1, 5.0.0, 5.23.0.

The defaults that did not change in any of them (`per_device_train_batch_size` 8,
`gradient_accumulation_steps` 1, `learning_rate` 5e-5, `bf16`/`fp16` False, `max_grad_norm`
1.0, `weight_decay` 0.0) are `analysis/training_keys.py` TRAINING_ARGUMENT_DEFAULTS. Rows are
(first release read, value), each holding until the next (training/frameworks/trl.py
`value_for` reads them).
"""

from __future__ import annotations

# `optim`'s default: "adamw_hf" (transformers' own AdamW) through 4.31.0; "adamw_torch" from
# 4.32.1; from 4.54.1 `default_optim = "adamw_torch_fused"` when torch >= 2.8
# (`is_torch_greater_or_equal_than_2_8`), else "adamw_torch".
DEFAULT_OPTIMIZER = (("4.20.1", "adamw_hf"), ("4.32.1", "adamw_torch"), ("4.54.1", "adamw_torch_fused if torch>=2.8"))
FUSED_FROM_TORCH = "2.8.0"
# The setting is first read in wheels no older than this; older releases are unknown here.
FIRST_READ = "4.20.1"
