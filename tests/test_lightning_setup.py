"""PyTorch Lightning launches resolved as Lightning runs them (training/frameworks/lightning.py):
Lightning starts devices x num_nodes processes itself under plain `python`, the strategy
decides ZeRO / FSDP, `precision` decides autocast or converted weights; LightningCLI's
`--config` files and `--trainer.X` flags in order."""


import pytest

from cfgfix.training.frameworks.lightning import device_count, unified_precision
from conftest import setting_value, training_setups_of, write_project


def _setup(root, script="train.py"):
    return next(s for s in training_setups_of(root) if s.launch.script == script)


_value = setting_value


def _trainer_script(arguments, header="import lightning as L\n", trainer="L.Trainer", before=""):
    return (f"{header}from model import LitModel\n\n{before}"
            f"def main():\n    trainer = {trainer}({arguments})\n    trainer.fit(LitModel())\n\n"
            "if __name__ == '__main__':\n    main()\n")


def _project(tmp_path, script, launch="python train.py\n", extra=None):
    write_project(tmp_path, {"train.py": script, "run.sh": launch, **(extra or {})})
    return tmp_path


def test_deepspeed_stage_2_at_32_true_started_by_python(tmp_path):
    script = _trainer_script('devices=4, strategy="deepspeed_stage_2", precision="32-true", accumulate_grad_batches=2')
    setup = _setup(_project(tmp_path, script))
    assert _value(setup, "world_size") == 4  # Lightning spawns the 4 processes itself
    assert _value(setup, "zero_stage") == 2
    assert _value(setup, "offload_optimizer") is False
    assert _value(setup, "grad_accum") == 2
    assert _value(setup, "mixed_precision") == "no"
    assert _value(setup, "precision") == "fp32"  # DeepSpeed without a 16-bit engine
    assert "Lightning" in setup.values["world_size"].origin


@pytest.mark.parametrize("header, trainer", [
    ("import pytorch_lightning as pl\n", "pl.Trainer"),
    ("from lightning.pytorch import Trainer\n", "Trainer"),
    ("import lightning.pytorch as lp\n", "lp.Trainer"),
])
def test_legacy_precision_and_gpus_under_every_import(tmp_path, header, trainer):
    setup = _setup(_project(tmp_path, _trainer_script("gpus=2, precision=16", header=header, trainer=trainer)))
    assert _value(setup, "world_size") == 2
    assert _value(setup, "mixed_precision") == "fp16"
    assert _value(setup, "precision") == "amp-fp16"


def test_a_deepspeed_strategy_object_bound_to_a_name(tmp_path):
    before = ("from lightning.pytorch.strategies import DeepSpeedStrategy\n"
              "strategy = DeepSpeedStrategy(stage=3, offload_optimizer=True)\n\n")
    script = _trainer_script('devices=[0, 1], num_nodes=2, strategy=strategy, precision="bf16-mixed"', before=before)
    setup = _setup(_project(tmp_path, script))
    assert _value(setup, "world_size") == 4
    assert (_value(setup, "zero_stage"), _value(setup, "offload_optimizer"), _value(setup, "offload_param")) == (3, True, False)
    assert _value(setup, "precision") == "deepspeed-bf16"


def test_fsdp_strategy_and_true_half_precision(tmp_path):
    before = "from lightning.pytorch.strategies import FSDPStrategy\n"
    script = _trainer_script('devices="0,1,2", strategy=FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"), '
                             'precision="bf16-true"', before=before)
    setup = _setup(_project(tmp_path, script))
    assert _value(setup, "world_size") == 3
    assert _value(setup, "fsdp") == "grad-op"
    assert _value(setup, "weights") == "bf16"
    assert _value(setup, "precision") == "bf16"


@pytest.mark.parametrize("devices", ['"auto"', "-1", "n_gpus"])
def test_devices_the_machine_decides_leave_processes_unknown(tmp_path, devices):
    setup = _setup(_project(tmp_path, _trainer_script(f'devices={devices}, precision="bf16-mixed"')))
    assert _value(setup, "world_size") is None
    assert _value(setup, "mixed_precision") == "bf16"


def test_defaults_are_32_true_and_no_accumulation(tmp_path):
    setup = _setup(_project(tmp_path, _trainer_script("max_epochs=3")))
    assert _value(setup, "mixed_precision") == "no" and _value(setup, "precision") == "fp32"
    assert _value(setup, "grad_accum") == 1
    assert _value(setup, "world_size") is None  # devices="auto"


def test_torchrun_decides_the_processes(tmp_path):
    setup = _setup(_project(tmp_path, _trainer_script('devices=2, precision="16-mixed"'),
                            launch="torchrun --nproc_per_node 8 train.py\n"))
    assert _value(setup, "world_size") == 8
    assert _value(setup, "mixed_precision") == "fp16"


def test_arguments_from_the_scripts_flags(tmp_path):
    script = ("import argparse\nimport lightning as L\n\n"
              "parser = argparse.ArgumentParser()\n"
              "parser.add_argument('--gpus', type=int, default=1)\n"
              "parser.add_argument('--precision', default='32-true')\n"
              "args = parser.parse_args()\n"
              "trainer = L.Trainer(devices=args.gpus, precision=args.precision)\n"
              "trainer.fit(model)\n")
    setup = _setup(_project(tmp_path, script, launch="python train.py --gpus 4 --precision bf16-mixed\n"))
    assert _value(setup, "world_size") == 4
    assert _value(setup, "precision") == "amp-bf16"


def test_lightning_cli_config_files_and_flags_in_order(tmp_path):
    script = "from lightning.pytorch.cli import LightningCLI\n\nLightningCLI(trainer_defaults={'precision': 'bf16-mixed'})\n"
    extra = {
        "configs/base.yaml": "trainer: trainer.yaml\nmodel:\n  hidden: 8\n",
        "configs/trainer.yaml": "devices: 2\nstrategy:\n  class_path: lightning.pytorch.strategies.DeepSpeedStrategy\n"
                                "  init_args:\n    stage: 3\n",
        "configs/fp16.yaml": "trainer:\n  precision: 16-mixed\n",
    }
    launch = "python train.py fit -c configs/base.yaml --trainer.devices 8 --config configs/fp16.yaml\n"
    setup = _setup(_project(tmp_path, script, launch=launch, extra=extra))
    assert _value(setup, "world_size") == 8
    assert _value(setup, "zero_stage") == 3
    assert _value(setup, "precision") == "deepspeed-fp16"  # the later config beats trainer_defaults
    only_defaults = _setup(_project(tmp_path, script, launch="python train.py fit -c configs/base.yaml\n", extra=extra))
    assert _value(only_defaults, "world_size") == 2
    assert _value(only_defaults, "precision") == "deepspeed-bf16"


def test_a_config_the_launch_computes_leaves_the_trainer_unknown(tmp_path):
    script = "from lightning.pytorch.cli import LightningCLI\n\nLightningCLI()\n"
    setup = _setup(_project(tmp_path, script, launch="python train.py fit -c $CONFIG_FILE\n"))
    assert _value(setup, "world_size") is None
    assert _value(setup, "mixed_precision") is None


def test_near_misses_are_not_lightning(tmp_path):
    two = ("import lightning as L\n"
           "def fast():\n    return L.Trainer(devices=1)\n"
           "def big():\n    return L.Trainer(devices=8, precision='bf16-mixed')\n"
           "big().fit(model)\n")
    setup = _setup(_project(tmp_path, two))
    assert _value(setup, "world_size") == 1 or _value(setup, "world_size") is None
    assert _value(setup, "mixed_precision") is None  # which Trainer runs is not certain
    other = "from mylib import Trainer\nTrainer(devices=4, precision='bf16-mixed').fit(model)\nimport torch\nloss.backward()\n"
    setup = _setup(_project(tmp_path, other))
    assert _value(setup, "mixed_precision") is None and _value(setup, "world_size") == 1


def test_readme_fence_inside_a_list_item(tmp_path):
    readme = ("# Train\n\n1.  **Start**:\n    Run:\n    ```bash\n    python train.py --trainer.devices 2\n    ```\n")
    script = "from lightning.pytorch.cli import LightningCLI\n\nLightningCLI()\n"
    write_project(tmp_path, {"train.py": script, "README.md": readme})
    assert _value(_setup(tmp_path), "world_size") == 2


def test_precision_and_device_readers():
    assert [unified_precision(v) for v in (16, "16", "bf16", 32, "bf16-true", "64-true", True)] == [
        "16-mixed", "16-mixed", "bf16-mixed", "32-true", "bf16-true", None, None]
    assert [device_count(v) for v in (4, [0, 1], "0,1,2", "2", "0,", "auto", -1, 0, True)] == [
        4, 2, 3, 2, 1, None, None, None, None]
