"""`fix --fit` on a Lightning run writes the plan as the Trainer's own arguments
(`strategy="deepspeed_stage_2"`, `precision=`, `accumulate_grad_batches=`): the value replaced
where the call states it, else the keyword added to the script's one Trainer call; a strategy
object, several Trainers or a Fabric's accumulation stay advice."""

import json

from click.testing import CliRunner
from conftest import write_project

from cfgfix.commands import cli

SCRIPT = '''\
import lightning as L
import torch
from transformers import AutoModelForCausalLM


class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B")

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-5)


def main():
    trainer = {trainer}
    trainer.fit(Lit())


if __name__ == "__main__":
    main()
'''


def _run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _project(tmp_path, monkeypatch, trainer, extra=None):
    write_project(tmp_path, {"train.py": SCRIPT.format(trainer=trainer), "run.sh": "python train.py\n",
                             "cfgfix.toml": 'gpu = "A100 80GB"\n', **(extra or {})})
    monkeypatch.chdir(tmp_path)


def _settings():
    _code, out = _run("explain", "--output-format", "json")
    return json.loads(out)[0]["settings"]


def test_the_strategy_keyword_is_added_to_the_trainer_call(tmp_path, monkeypatch):
    _project(tmp_path, monkeypatch, 'L.Trainer(devices=8, precision="32-true", max_epochs=1)')
    _code, _out = _run("fix", "--fit")  # exit 1: it fits only below a sequence length the files leave open
    text = (tmp_path / "train.py").read_text()
    assert 'L.Trainer(devices=8, precision="bf16-mixed", max_epochs=1, strategy="deepspeed_stage_2")' in text
    assert not list(tmp_path.glob("ds_*.json"))  # Lightning builds the DeepSpeed config itself
    assert _settings()["zero_stage"]["value"] == 2


def test_a_strategy_name_is_replaced_where_it_is_written(tmp_path, monkeypatch):
    _project(tmp_path, monkeypatch, 'L.Trainer(\n        devices=8,\n        strategy="ddp",\n    )')
    _code, _out = _run("fix", "--fit")  # exit 1: it fits only below a sequence length the files leave open
    text = (tmp_path / "train.py").read_text()
    assert 'strategy="deepspeed_stage_2"' in text and text.count("strategy=") == 1
    assert 'precision="bf16-mixed"' in text
    assert _settings()["zero_stage"]["value"] == 2


def test_a_strategy_object_stays_advice(tmp_path, monkeypatch):
    trainer = 'L.Trainer(devices=8, strategy=DDPStrategy(find_unused_parameters=True))'
    _project(tmp_path, monkeypatch, trainer)
    path = tmp_path / "train.py"
    path.write_text("from lightning.pytorch.strategies import DDPStrategy\n" + path.read_text())
    before = path.read_text()
    _code, out = _run("fix", "--fit")
    assert path.read_text() == before
    assert "advice only" in out


def test_hydra_trainer_node_is_edited_in_its_yaml(tmp_path, monkeypatch):
    script = SCRIPT.replace("import lightning as L\n", "import hydra\nimport lightning as L\n").replace(
        "def main():\n    trainer = {trainer}",
        "@hydra.main(version_base=None, config_path='conf', config_name='train')\n"
        "def main(cfg):\n    trainer = hydra.utils.instantiate(cfg.trainer)")
    write_project(tmp_path, {"train.py": script, "run.sh": "python train.py\n", "cfgfix.toml": 'gpu = "A100 80GB"\n',
                             "conf/train.yaml": "defaults:\n  - trainer: gpu\n",
                             "conf/trainer/gpu.yaml": ("_target_: lightning.pytorch.Trainer\ndevices: 8\n"
                                                       "strategy: ddp  # data parallel\n")})
    monkeypatch.chdir(tmp_path)
    _code, _out = _run("fix", "--fit")  # exit 1: it fits only below a sequence length the files leave open
    text = (tmp_path / "conf/trainer/gpu.yaml").read_text()
    assert "strategy: deepspeed_stage_2  # data parallel\n" in text and "precision: bf16-mixed" in text
    assert _settings()["zero_stage"]["value"] == 2
