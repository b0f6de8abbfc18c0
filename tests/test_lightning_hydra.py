"""A Lightning Trainer built the other ways users build one: by Hydra from a composed config
(`hydra.utils.instantiate(cfg.trainer)` under `@hydra.main`, training/hydra_config.py), from a
`**mapping` (a dict literal, a YAML file's block, a Hydra node), and Lightning Fabric."""

from pathlib import Path

import pytest

from cfgfix.training.hydra_config import compose, lookup
from conftest import setting_value, training_setups_of, write_project

_value = setting_value

HYDRA_SCRIPT = """\
import hydra
from omegaconf import DictConfig
from lightning import LightningModule, Trainer


def train(cfg: DictConfig):
    model = hydra.utils.instantiate(cfg.model)
    trainer: Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=[], logger=False)
    trainer.fit(model)


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
"""

CONFIGS = {
    "configs/train.yaml": ("defaults:\n  - _self_\n  - model: small\n  - trainer: default\n  - experiment: null\n"
                           "  - optional local: default\n\nseed: 1\n"),
    "configs/model/small.yaml": "_target_: src.model.Lit\n",
    "configs/trainer/default.yaml": ("_target_: lightning.pytorch.trainer.Trainer\naccelerator: cpu\ndevices: 1\n"
                                     "# precision: 16\nmax_epochs: 10\n"),
    "configs/trainer/gpu.yaml": "defaults:\n  - default\n\naccelerator: gpu\ndevices: 1\n",
    "configs/trainer/ddp.yaml": ("defaults:\n  - default\n\nstrategy: ddp\naccelerator: gpu\ndevices: 4\nnum_nodes: 2\n"
                                 "precision: bf16-mixed\n"),
    "configs/trainer/ds.yaml": ("defaults:\n  - default\n\naccelerator: gpu\ndevices: 8\nprecision: 16-mixed\n"
                                "strategy:\n  _target_: lightning.pytorch.strategies.DeepSpeedStrategy\n  stage: 3\n"
                                "accumulate_grad_batches: ${accum}\n"),
    "configs/experiment/big.yaml": ("# @package _global_\ndefaults:\n  - override /trainer: ddp\n\naccum: 4\n"
                                    "trainer:\n  accumulate_grad_batches: 2\n"),
}


def _hydra_project(tmp_path, launch, extra=None, script=HYDRA_SCRIPT):
    write_project(tmp_path, {"src/train.py": script, "run.sh": launch, **CONFIGS, **(extra or {})})
    return tmp_path


def _setup(root, script="src/train.py"):
    return next(s for s in training_setups_of(root) if s.launch.script == script)


@pytest.mark.parametrize("launch, world, precision, accum", [
    ("python src/train.py trainer=gpu\n", 1, "no", 1),  # gpu over default (its precision commented out)
    ("python src/train.py\n", 1, "no", 1),  # the defaults list's own choice
    ("python src/train.py trainer=ddp\n", 8, "bf16", 1),  # devices 4 x num_nodes 2
    ("python src/train.py trainer=gpu trainer.devices=2 ++trainer.precision=16\n", 2, "fp16", 1),
    # a key the config lacks, set without `+`: Hydra refuses the override (unknown, not the default)
    ("python src/train.py trainer=gpu trainer.precision=16\n", 1, None, 1),
    ("python src/train.py +trainer.accumulate_grad_batches=8\n", 1, "no", 8),
    # an experiment listed after `trainer` overrides its choice; its own `trainer:` keys win
    ("python src/train.py experiment=big\n", 8, "bf16", 2),
    # the command line's group choice beats the experiment's `override /trainer`
    ("python src/train.py experiment=big trainer=gpu\n", 1, "no", 2),
])
def test_hydra_instantiated_trainer(tmp_path, launch, world, precision, accum):
    setup = _setup(_hydra_project(tmp_path, launch))
    assert _value(setup, "world_size") == world
    assert _value(setup, "mixed_precision") == precision
    assert _value(setup, "grad_accum") == accum
    assert precision in (None, "no") or "Hydra config" in setup.values["mixed_precision"].origin


def test_hydra_deepspeed_strategy_node_and_interpolated_accumulation(tmp_path):
    setup = _setup(_hydra_project(tmp_path, "python src/train.py trainer=ds +accum=3\n"))
    assert _value(setup, "world_size") == 8
    assert _value(setup, "zero_stage") == 3
    assert _value(setup, "precision") == "deepspeed-fp16"
    assert _value(setup, "grad_accum") == 3  # ${accum}, added on the command line


@pytest.mark.parametrize("launch", [
    "python src/train.py trainer=$TRAINER\n",  # a choice made at run time
    "python src/train.py trainer.devices=$NGPU\n",
    "python src/train.py -m trainer.devices=1,2\n",  # a sweep: several runs
    "python src/train.py experiment=missing\n",  # Hydra stops: no such config
])
def test_hydra_choices_it_cannot_read_leave_the_processes_unknown(tmp_path, launch):
    setup = _setup(_hydra_project(tmp_path, launch))
    assert _value(setup, "world_size") in (None, 1)
    lightning = setup.sources.get("lightning", {})
    assert "world_size" not in lightning


def test_hydra_target_that_is_not_a_lightning_trainer_is_not_read(tmp_path):
    extra = {"configs/trainer/default.yaml": "_target_: src.my_loop.Loop\ndevices: 4\nprecision: 16\n"}
    setup = _setup(_hydra_project(tmp_path, "python src/train.py\n", extra))
    assert "lightning" not in setup.sources


def test_hydra_spread_and_keyword_references(tmp_path):
    script = HYDRA_SCRIPT.replace(
        "hydra.utils.instantiate(cfg.trainer, callbacks=[], logger=False)",
        "Trainer(**cfg.lightning, precision=cfg.run.precision)")
    extra = {"configs/train.yaml": "defaults:\n  - _self_\nlightning:\n  devices: 2\n  num_nodes: 1\nrun:\n  precision: bf16-mixed\n"}
    setup = _setup(_hydra_project(tmp_path, "python src/train.py lightning.devices=3\n", extra, script))
    assert _value(setup, "world_size") == 3
    assert _value(setup, "mixed_precision") == "bf16"


def test_hydra_instantiate_imported_by_name_and_config_passed_by_keyword(tmp_path):
    script = HYDRA_SCRIPT.replace("import hydra\n", "import hydra\nfrom hydra.utils import instantiate\n").replace(
        "hydra.utils.instantiate(cfg.trainer, callbacks=[], logger=False)", "instantiate(conf['trainer'])").replace(
        "def train(cfg: DictConfig):", "def train(conf: DictConfig):").replace("    train(cfg)", "    train(conf=cfg)")
    setup = _setup(_hydra_project(tmp_path, "python src/train.py trainer=ddp\n", script=script))
    assert _value(setup, "world_size") == 8


def test_compose_package_headers_and_nested_groups(tmp_path):
    write_project(tmp_path, {
        "conf/config.yaml": "defaults:\n  - db: mysql\n  - _self_\ndb:\n  port: 1\n",
        "conf/db/mysql.yaml": "defaults:\n  - pool: small\nhost: a\nport: 2\n",
        "conf/db/pool/small.yaml": "size: 4\n",
        "conf/db/pool/big.yaml": "# @package _global_\ntop: true\n",
    })

    def read(path: Path):
        from cfgfix.documents.config import parse_config
        from cfgfix.documents.text import SourceText

        return parse_config(SourceText.from_bytes(str(path), path.read_bytes()), "yaml")

    composed = compose(read, str, tmp_path / "conf", "config", [])
    assert lookup(composed, ("db", "port")).value == 1  # _self_ after the group: its keys win
    assert lookup(composed, ("db", "pool", "size")).value == 4  # a nested group under its parent's package
    composed = compose(read, str, tmp_path / "conf", "config", [("db/pool=big", None)])
    assert lookup(composed, ("top",)).value is True  # `# @package _global_`
    assert lookup(composed, ("db", "pool")) is None


# -- **mapping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("before, spread", [
    ('TRAINER_KW = {"devices": 4, "precision": "bf16-mixed", "accumulate_grad_batches": 2}\n', "**TRAINER_KW"),
    ("", '**{"devices": 4, "precision": "bf16-mixed", "accumulate_grad_batches": 2}'),
])
def test_trainer_from_a_dict_literal(tmp_path, before, spread):
    script = f"import lightning as L\n{before}\ndef main():\n    L.Trainer({spread}).fit(None)\n\nmain()\n"
    write_project(tmp_path, {"train.py": script, "run.sh": "python train.py\n"})
    setup = _setup(tmp_path, "train.py")
    assert _value(setup, "world_size") == 4
    assert _value(setup, "mixed_precision") == "bf16"
    assert _value(setup, "grad_accum") == 2


def test_a_dict_changed_after_it_is_built_is_not_read_as_the_literal(tmp_path):
    script = ("import os\nimport lightning as L\nkw = {'devices': 4}\nkw['devices'] = int(os.environ['N'])\n"
              "L.Trainer(**kw).fit(None)\n")
    write_project(tmp_path, {"train.py": script, "run.sh": "python train.py\n"})
    setup = _setup(tmp_path, "train.py")
    assert "world_size" not in setup.sources.get("lightning", {})


def test_trainer_from_a_yaml_block(tmp_path):
    script = ("import argparse, yaml\nimport pytorch_lightning as pl\n"
              "parser = argparse.ArgumentParser()\nparser.add_argument('--config', default='cfg/base.yaml')\n"
              "args = parser.parse_args()\ncfg = yaml.safe_load(open(args.config))\n"
              "trainer = pl.Trainer(**cfg['trainer'])\n")
    write_project(tmp_path, {"train.py": script, "run.sh": "python train.py --config cfg/big.yaml\n",
                             "cfg/base.yaml": "trainer:\n  devices: 1\n",
                             "cfg/big.yaml": "trainer:\n  devices: 2\n  num_nodes: 2\n  precision: 16-mixed\n"})
    setup = _setup(tmp_path, "train.py")
    assert _value(setup, "world_size") == 4
    assert _value(setup, "mixed_precision") == "fp16"
    assert "cfg/big.yaml" in setup.values["world_size"].origin


# -- Fabric -------------------------------------------------------------------------------------
@pytest.mark.parametrize("header, fabric", [
    ("import lightning as L\n", "L.Fabric"),
    ("from lightning.fabric import Fabric\n", "Fabric"),
    ("import lightning_fabric as lf\n", "lf.Fabric"),
])
def test_fabric_that_launches(tmp_path, header, fabric):
    script = (f"{header}\ndef main():\n    f = {fabric}(devices=4, strategy='deepspeed_stage_2', precision='bf16-mixed')\n"
              "    f.launch()\n    model, opt = f.setup(None, None)\n\nmain()\n")
    write_project(tmp_path, {"train.py": script, "run.sh": "python train.py\n"})
    setup = _setup(tmp_path, "train.py")
    assert _value(setup, "world_size") == 4
    assert _value(setup, "zero_stage") == 2
    assert _value(setup, "precision") == "deepspeed-bf16"
    assert "grad_accum" not in setup.sources["lightning"]  # the script's own loop accumulates


def test_fabric_without_launch_starts_no_processes_itself(tmp_path):
    script = "import lightning as L\nf = L.Fabric(devices=4, precision='16-mixed')\nf.setup(None)\n"
    write_project(tmp_path, {"train.py": script, "run.sh": "torchrun --nproc_per_node 2 train.py\n"})
    setup = _setup(tmp_path, "train.py")
    assert _value(setup, "world_size") == 2
    assert _value(setup, "mixed_precision") == "fp16"
