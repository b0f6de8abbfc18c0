"""A DeepSpeed config dict built in code (training/bound_dict.py): returned by a function of
the script or of another project module (also re-exported by a package), with the keys the
script assigns before `deepspeed.initialize` winning, and values computed at run time unknown
rather than the placeholders the dict was built with."""

import pytest
from conftest import lint_project, setting_value, training_setups_of, write_project

DS_UTILS = '''\
GLOBAL_BATCH_SIZE = 32
MICRO_BATCH_SIZE = 4


def get_train_ds_config(offload, stage=2, bf16=True):
    device = "cpu" if offload else "none"
    zero = {"stage": stage, "offload_optimizer": {"device": device}}
    return {
        "train_batch_size": GLOBAL_BATCH_SIZE,
        "train_micro_batch_size_per_gpu": MICRO_BATCH_SIZE,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
    }
'''

MAIN = '''\
import argparse
import deepspeed
import torch
{import_line}

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--offload", action="store_true")
    args = parser.parse_args()
    ds_config = {call}
{updates}
    model = torch.nn.Linear(4, 4)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)


main()
'''

LAUNCH = "deepspeed --num_gpus 8 train/main.py --per_device_train_batch_size 16 --gradient_accumulation_steps 1\n"


def _project(tmp_path, call="get_train_ds_config(offload=False)", updates="",
             import_line="from utils.ds_utils import get_train_ds_config", extra=None):
    files = {"run.sh": LAUNCH, "train/main.py": MAIN.format(import_line=import_line, call=call, updates=updates),
             "utils/ds_utils.py": DS_UTILS, **(extra or {})}
    write_project(tmp_path, files)
    return training_setups_of(tmp_path)[0]


def test_a_dict_returned_by_a_function_of_another_module(tmp_path):
    setup = _project(tmp_path, call="get_train_ds_config(offload=False, stage=3)")
    assert setting_value(setup, "zero_stage") == 3  # the literal argument
    assert setting_value(setup, "offload_optimizer") is False  # "cpu" if offload else "none", offload=False
    assert setting_value(setup, "precision") == "deepspeed-bf16"  # bf16's default True
    assert "deepspeed.initialize(config=...)" in setup.values["zero_stage"].origin


def test_a_parameter_left_at_its_default_and_one_computed_at_run_time(tmp_path):
    setup = _project(tmp_path, call="get_train_ds_config(offload=args.offload)")
    assert setting_value(setup, "zero_stage") == 2  # stage=2 default
    assert setting_value(setup, "offload_optimizer") is None  # device computed from a flag


def test_keys_assigned_again_before_use_win(tmp_path):
    updates = ("    ds_config['train_micro_batch_size_per_gpu'] = 2\n"
               "    ds_config['zero_optimization']['stage'] = 1\n")
    setup = _project(tmp_path, updates=updates)
    assert setup.sources["deepspeed config"]["micro_batch"].value == 2
    assert setting_value(setup, "zero_stage") == 1


def test_a_key_computed_at_run_time_is_unknown_not_the_placeholder(tmp_path):
    updates = ("    ds_config['train_micro_batch_size_per_gpu'] = args.per_device_train_batch_size\n"
               "    ds_config['train_batch_size'] = args.per_device_train_batch_size * torch.distributed.get_world_size()"
               " * args.gradient_accumulation_steps\n")
    setup = _project(tmp_path, updates=updates)
    deepspeed = setup.sources["deepspeed config"]
    assert "micro_batch" not in deepspeed and "train_batch_size" not in deepspeed
    assert setting_value(setup, "micro_batch") == 16  # the launch's flag
    # the builder module's GLOBAL_BATCH_SIZE = 32 is the dict's placeholder (CFX603 silent)
    _, _, result = lint_project(tmp_path, select=["CFX603", "CFX502"])
    assert [f.code for f in result.findings] == []


def test_update_calls_and_an_unreadable_update(tmp_path):
    setup = _project(tmp_path, updates="    ds_config.update({'train_micro_batch_size_per_gpu': 8}, )\n")
    assert setup.sources["deepspeed config"]["micro_batch"].value == 8
    setup = _project(tmp_path / "other", updates="    ds_config.update(load_overrides())\n")
    assert "deepspeed config" not in setup.sources or "zero_stage" not in setup.sources["deepspeed config"]


@pytest.mark.parametrize("import_line, extra", [
    # a package re-exporting the builder from a submodule
    ("from utils import get_train_ds_config", {"utils/__init__.py": "from .ds_utils import get_train_ds_config\n"}),
    # an alias
    ("from utils.ds_utils import get_train_ds_config as make_ds", {}),
])
def test_builder_through_a_package_and_an_alias(tmp_path, import_line, extra):
    call = "make_ds(offload=False, stage=3)" if " as " in import_line else "get_train_ds_config(offload=False, stage=3)"
    setup = _project(tmp_path, call=call, import_line=import_line, extra=extra)
    assert setting_value(setup, "zero_stage") == 3


def test_a_builder_with_several_returns_is_not_read(tmp_path):
    utils = DS_UTILS.replace("    device = ", "    if offload:\n        return {'zero_optimization': {'stage': 0}}\n"
                             "    device = ")
    setup = _project(tmp_path, call="get_train_ds_config(offload=False, stage=3)", extra={"utils/ds_utils.py": utils})
    assert setting_value(setup, "zero_stage") is None


def test_a_dict_literal_in_the_script_with_a_key_set_again(tmp_path):
    call = "{'train_micro_batch_size_per_gpu': 4, 'zero_optimization': {'stage': 2}}"
    setup = _project(tmp_path, call=call, updates="    ds_config['zero_optimization'] = {'stage': 3}\n")
    assert setting_value(setup, "zero_stage") == 3
