"""CFX603 and a config module's placeholders (issue 25, heldout4's DeepSpeed-Chat shape):
`GLOBAL_BATCH_SIZE = 32` read only as a key's value in the dict a builder returns, where
the launched script assigns that key again before using the dict, states nothing about the
run. Near misses keep the finding: the dict used as built, a key left alone, the builder's
result handed on directly."""

from __future__ import annotations

import pytest
from conftest import lint_project, write_project

DS_UTILS = (
    "{total} = 32\n"
    "{micro} = 4\n"
    "\n"
    "def {builder}(offload, stage=2):\n"
    "    zero = {{'stage': stage, 'offload_param': {{'device': 'cpu' if offload else 'none'}}}}\n"
    "    return {{\n"
    "        'train_batch_size': {total},\n"
    "        'train_micro_batch_size_per_gpu': {micro},\n"
    "        'zero_optimization': zero,\n"
    "    }}\n"
)
MAIN = (
    "import argparse\nimport deepspeed\n"
    "from utils.ds_utils import {builder}\n"
    "parser = argparse.ArgumentParser()\n"
    "parser.add_argument('--per_device_train_batch_size', type=int, default=16)\n"
    "parser.add_argument('--gradient_accumulation_steps', type=int, default=1)\n"
    "parser.add_argument('--local_rank', type=int, default=-1)\n"
    "def main():\n"
    "    args = parser.parse_args()\n"
    "{body}"
    "    engine, *_ = deepspeed.initialize(model=model, config={config})\n"
    "main()\n"
)
OVERRIDE = (
    "    ds_config = {builder}(offload=False)\n"
    "    ds_config['train_micro_batch_size_per_gpu'] = args.per_device_train_batch_size\n"
    "    if args.gradient_accumulation_steps:\n"
    "        ds_config['train_batch_size'] = args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps\n"
)
LAUNCH = "deepspeed --num_gpus 8 training/main.py --per_device_train_batch_size 16 --gradient_accumulation_steps 1\n"


def _findings(tmp_path, body, *, config="ds_config", total="GLOBAL_BATCH_SIZE", micro="MICRO_BATCH_SIZE",
              builder="get_train_ds_config"):
    write_project(tmp_path, {
        "training/utils/__init__.py": "",
        "training/utils/ds_utils.py": DS_UTILS.format(total=total, micro=micro, builder=builder),
        "training/main.py": MAIN.format(builder=builder, body=body.format(builder=builder), config=config),
        "run.sh": LAUNCH,
    })
    _, _, result = lint_project(tmp_path, select=["CFX603"])
    return [(f.code, str(f.path).replace("\\", "/").split("training/")[-1], f.span.line) for f in result.findings]


@pytest.mark.parametrize("total, micro, builder", [
    ("GLOBAL_BATCH_SIZE", "MICRO_BATCH_SIZE", "get_train_ds_config"),
    ("TRAIN_BATCH_SIZE", "MICRO_BATCH_SIZE", "make_deepspeed_config"),
])
def test_a_placeholder_the_script_assigns_again_is_silent(tmp_path, total, micro, builder):
    assert _findings(tmp_path, OVERRIDE, total=total, micro=micro, builder=builder) == []


def test_the_dict_used_as_built_states_the_batch(tmp_path):
    body = "    ds_config = {builder}(offload=False)\n"
    assert _findings(tmp_path, body) == [("CFX603", "utils/ds_utils.py", 1)]


def test_the_builders_result_handed_on_directly_states_the_batch(tmp_path):
    assert _findings(tmp_path, "", config="get_train_ds_config(offload=False)") == [
        ("CFX603", "utils/ds_utils.py", 1)]


def test_a_key_the_script_leaves_alone_still_states_it(tmp_path):
    body = OVERRIDE.replace("    if args.gradient_accumulation_steps:\n", "").replace(
        "        ds_config['train_batch_size']", "    ds_config['steps_per_print']")
    assert _findings(tmp_path, body) == [("CFX603", "utils/ds_utils.py", 1)]
