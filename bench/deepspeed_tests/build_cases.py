#!/usr/bin/env python3
"""Write `cases.jsonl`: DeepSpeed's own config tests rebuilt as whole configs, each labelled
with what DeepSpeed's test asserts (the config is accepted, or DeepSpeed refuses it).

Source: deepspeedai/DeepSpeed at edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (version.txt
0.19.6, the 0.19.6 release line), files under tests/unit/runtime/ named in each case's
`source`. A test that builds one sub-model (`DeepSpeedFP16Config(**kw)`,
`DeepSpeedZeroConfig(**kw)`) becomes a config holding that block next to
`"train_batch_size": 1`, which DeepSpeedConfig validates through the same model. Batch tests
keep their world size (2). The labels are transcriptions of the tests' assertions; this
script holds no opinion of cfgfix's. Run it once; `score.py` reads the file it writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

SOURCE_COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
DICT = "tests/unit/runtime/test_ds_config_dict.py"
MODEL = "tests/unit/runtime/test_ds_config_model.py"
DYN = "tests/unit/runtime/test_precision_config_dynamic_scale.py"
LOSS = "tests/unit/runtime/test_precision_config_loss_scale.py"
ZERO = "tests/unit/runtime/zero/test_zero_config.py"
ZF = "tests/unit/runtime/zenflow/test_zf_config.py"

cases: list[dict] = []


def case(source: str, config, expected: str, world: int = 1, text: str | None = None) -> None:
    row = {"id": f"c{len(cases) + 1:03d}", "source": source, "world_size": world, "expected": expected}
    if text is not None:
        row["text"] = text
    else:
        row["config"] = config
    cases.append(row)


def block(name: str, body: dict) -> dict:
    return {"train_batch_size": 1, name: body}


# TestBatchConfig (world size 2): the calls each parametrization makes, in order.
for batch, micro, gas, ok in [(32, 16, 1, True), (32, 8, 2, True), (33, 17, 2, False), (32, 18, 1, False)]:
    src = f"{DICT}::TestBatchConfig[{batch}-{micro}-{gas}-{ok}]"
    expect = "accept" if ok else "refuse"
    full = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas}
    case(src + " all three", full, expect, world=2)
    case(src + " batch+micro", {"train_batch_size": batch, "train_micro_batch_size_per_gpu": micro}, expect, world=2)
    if ok:
        case(src + " batch+gas", {"train_batch_size": batch, "gradient_accumulation_steps": gas}, "accept", world=2)
        case(src + " micro+gas", {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas},
             "accept", world=2)
        if gas == 1:
            case(src + " micro only", {"train_micro_batch_size_per_gpu": micro}, "accept", world=2)
            case(src + " batch only", {"train_batch_size": batch}, "accept", world=2)
    else:
        case(src + " gas only", {"gradient_accumulation_steps": gas}, "refuse", world=2)
        if gas != 1:
            case(src + " batch+gas", {"train_batch_size": batch, "gradient_accumulation_steps": gas}, "refuse", world=2)

for value in ("mean", "SUM"):
    case(f"{DICT}::test_gradient_allreduce_op[{value}]", {"train_batch_size": 1, "gradient_allreduce_op": value}, "accept")
case(f"{DICT}::test_gradient_allreduce_op_default", {"train_batch_size": 1}, "accept")
case(f"{DICT}::test_invalid_gradient_allreduce_op", {"train_batch_size": 1, "gradient_allreduce_op": "max"}, "refuse")
case(f"{DICT}::test_sum_gradient_allreduce_rejects_zero3",
     {"train_batch_size": 1, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}}, "refuse")
case(f"{DICT}::test_sum_gradient_allreduce_rejects_zenflow",
     {"train_batch_size": 1, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 2, "zenflow": {}}}, "refuse")
for stage in (1, 2):
    case(f"{DICT}::test_sum_gradient_allreduce_rejects_deepcompile[{stage}]",
         {"train_batch_size": 1, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": stage},
          "compile": {"deepcompile": True}}, "refuse")
for key in ("stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"):
    case(f"{DICT}::test_gather_16bit_params_on_model_save[{key}]", block("zero_optimization", {key: True}), "accept")
for key in ("bf16", "bfloat16"):
    case(f"{DICT}::test_get_bfloat16_enabled[{key}]", block(key, {"enabled": True}), "accept")
case(f"{DICT}::test_quantized_eigenvalue_config_parses (tests/model/BingBertSquad/"
     "deepspeed_bsz24_fp16_eigenvalue_quantize_config.json)",
     {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "steps_per_print": 1,
      "optimizer": {"type": "Adam", "params": {"lr": 3e-5, "weight_decay": 0.0, "bias_correction": False}},
      "gradient_clipping": 1.0, "fp16": {"enabled": True},
      "tensorboard": {"enabled": True, "output_path": "/tmp/eigenvalue_quantize_output", "job_name": "eigenvalue_quantize"},
      "eigenvalue": {"enabled": True, "verbose": True, "max_iter": 50, "tol": 1e-2, "stability": 0,
                     "gas_boundary_resolution": 1, "model_name": "bert-large"},
      "quantize_training": {"quantize_bits": {"start_bits": 12, "target_bits": 4}, "quantize_type": "symmetric",
                            "quantize_schedule": {"quantize_period": 400, "schedule_offset": 400},
                            "quantize_groups": 16, "fp16_mixed_quantize": {"enabled": True, "quantize_change_ratio": 0.001},
                            "quantize_verbose": True, "quantize_eigenvalue": True}}, "accept")
case(f"{DICT}::test_compression_training_without_legacy_quantize_training_uses_defaults",
     {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
      "compression_training": {"weight_quantization": {"shared_parameters": {"enabled": True}, "different_groups": {}}}},
     "accept")
case(f"{DICT}::TestConfigLoad (base_config + bf16)",
     {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.00015}}, "bf16": {"enabled": True}}, "accept")
case(f"{DICT}::TestConfigLoad (base_config + fp16)",
     {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.00015}}, "fp16": {"enabled": True}}, "accept")

case(f"{MODEL}::test_only_required_fields", {"train_batch_size": 64}, "accept")
case(f"{MODEL}::test_config_duplicate_key", None, "refuse",
     text='\n    {\n        "train_batch_size": 24,\n        "train_batch_size": 24,\n    }\n    ')

for field in ("loss_scale_window", "min_loss_scale"):
    for value in (0, -1):
        case(f"{DYN}::test_fp16_dynamic_scale_rejects_nonpositive_when_dynamic[{value}-{field}]",
             block("fp16", {"enabled": True, "loss_scale": 0, field: value}), "refuse")
        case(f"{DYN}::test_fp16_dynamic_scale_ignored_with_static_loss_scale[{value}-{field}]",
             block("fp16", {"enabled": True, "loss_scale": 128, field: value}), "accept")
        case(f"{DYN}::test_fp16_dynamic_scale_ignored_when_fp16_disabled[{value}-{field}]",
             block("fp16", {"enabled": False, "loss_scale": 0, field: value}), "accept")
    for value in (1, 1000):
        case(f"{DYN}::test_fp16_dynamic_scale_accepts_positive_when_dynamic[{value}-{field}]",
             block("fp16", {"enabled": True, "loss_scale": 0, field: value}), "accept")
    for value in (True, False):
        case(f"{DYN}::test_fp16_dynamic_scale_rejects_bool[{value}-{field}]",
             block("fp16", {"enabled": True, "loss_scale": 0, field: value}), "refuse")
    for value in (math.inf, math.nan, "abc", None):
        case(f"{DYN}::test_fp16_dynamic_scale_rejects_non_integer[{value}-{field}]",
             block("fp16", {"enabled": True, "loss_scale": 0, field: value}), "refuse")

for value in (-1, math.inf, math.nan, True):
    case(f"{LOSS}::test_fp16_loss_scale_rejects_invalid_values[{value}]", block("fp16", {"loss_scale": value}), "refuse")
for value in (0, 1, 2.0, "3"):
    case(f"{LOSS}::test_fp16_loss_scale_accepts_valid_values[{value}]", block("fp16", {"loss_scale": value}), "accept")
for value in ([], {}):
    case(f"{LOSS}::test_fp16_loss_scale_invalid_type_has_clear_error[{value}]", block("fp16", {"loss_scale": value}),
         "refuse")

for body in ({"cpu_offload_param": True}, {"cpu_offload": True}, {"stage3_gather_fp16_weights_on_model_save": True}):
    case(f"{ZERO}::test_zero_config_deprecatedfields[{next(iter(body))}]", block("zero_optimization", body), "accept")
for key in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_reuse_distance"):
    case(f"{ZERO}::test_zero_config_aliasfields[{key}]", block("zero_optimization", {key: 12345}), "accept")
case(f"{ZERO}::test_zero_config_aliasfields[stage3_gather_16bit_weights_on_model_save]",
     block("zero_optimization", {"stage3_gather_16bit_weights_on_model_save": True}), "accept")
for stage in (0, 1, 2, 3):
    case(f"{ZERO}::test_zero_config_overlapcomm[stage {stage}]", block("zero_optimization", {"stage": stage}), "accept")
case(f"{ZERO}::test_zero_config_offload_configs[None]",
     block("zero_optimization", {"offload_param": None, "offload_optimizer": None}), "accept")
case(f"{ZERO}::test_zero_config_offload_configs[{{}}]",
     block("zero_optimization", {"offload_param": {}, "offload_optimizer": {}}), "accept")
for read, write in ((True, False), (False, True), (True, True)):
    case(f"{ZERO}::test_zero_offload_optimizer_config_pipeline[{read}-{write}]",
         block("zero_optimization", {"offload_optimizer": {"pipeline_read": read, "pipeline_write": write}}), "accept")

case(f"{ZF}::test_stage_enum_accepts_int_and_enum", block("zero_optimization", {"stage": 2}), "accept")
case(f"{ZF}::test_offload_optimizer_config_from_dict",
     block("zero_optimization", {"offload_optimizer": {"device": "cpu", "pin_memory": True}}), "accept")
case(f"{ZF}::test_invalid_offload_optimizer_type_raises",
     block("zero_optimization", {"offload_optimizer": "not a dict"}), "refuse")
case(f"{ZF}::test_zenflow_config_from_dict",
     block("zero_optimization", {"zenflow": {"topk_ratio": 0.25, "select_strategy": "auto", "select_interval": 4,
                                             "update_interval": 8, "full_warm_up_rounds": 1, "overlap_step": True}}),
     "accept")
case(f"{ZF}::test_invalid_zenflow_type_raises", block("zero_optimization", {"zenflow": 123}), "refuse")
case(f"{ZF}::test_offload_and_zenflow_combined",
     block("zero_optimization", {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                 "zenflow": {"topk_ratio": 0.3, "select_strategy": "epoch", "select_interval": 3,
                                             "update_interval": 6, "full_warm_up_rounds": 0, "overlap_step": False}}),
     "accept")

if __name__ == "__main__":
    out = Path(__file__).with_name("cases.jsonl")
    out.write_text("".join(json.dumps(row) + "\n" for row in cases))
    print(f"{len(cases)} cases ({sum(r['expected'] == 'refuse' for r in cases)} refused) -> {out}")
