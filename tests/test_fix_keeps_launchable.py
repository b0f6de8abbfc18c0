"""Fixes that keep a project launchable (issue 14): after the fixes of a run are made in
memory, the project stage runs again on the result; a fix set that adds a project finding is
not written, and says why. `fix --unsafe-fixes` then `check` never shows a new finding."""

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from conftest import REPO, write_project

SCRIPT = (
    "import argparse\n\nimport torch\nimport yaml\nfrom accelerate import Accelerator\n\n"
    "parser = argparse.ArgumentParser()\nparser.add_argument('--config')\n"
    "cfg = yaml.safe_load(open(parser.parse_args().config))\n"
    "accelerator = Accelerator(mixed_precision=cfg['mixed_precision'], gradient_accumulation_steps=cfg['gradient_accumulation_steps'])\n"
    "model = torch.nn.Linear(2, 2)\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
    "for batch in loader:\n    accelerator.backward(model(batch).sum())\n    optimizer.step()\n"
)
TRAIN_YAML = "mixed_precision: fp16\ngradient_accumulation_steps: 4\n"


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_a_fix_that_would_break_the_deepspeed_launch_is_not_applied(in_tmp):
    """The SDXL story: one training YAML read by a plain and a DeepSpeed launch; CFX602's
    unsafe fix (fp16 -> bf16 on an A100) would leave the DeepSpeed JSON at fp16, and
    accelerate would stop at Accelerator()."""
    write_project(in_tmp, {
        "train.py": SCRIPT,
        "configs/train.yaml": TRAIN_YAML,
        "configs/accel_ds.yaml": ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                  "deepspeed_config:\n  deepspeed_config_file: configs/ds.json\nnum_processes: 4\n"),
        "configs/ds.json": '{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n',
        "launch_ds.sh": "accelerate launch --config_file configs/accel_ds.yaml train.py --config configs/train.yaml\n",
        "launch_plain.sh": "accelerate launch --num_processes 1 train.py --config configs/train.yaml\n",
        "cfgfix.toml": 'gpu = "A100 80GB"\n',
    })
    code, out = run("check", "--no-cache")
    assert "configs/train.yaml:1:18: CFX602" in out and "CFX604" not in out
    code, out = run("fix", "--unsafe-fixes", "--no-cache")
    assert "warning: configs/train.yaml: fixes not applied: together they would introduce CFX604" in out
    assert (in_tmp / "configs/train.yaml").read_text() == TRAIN_YAML
    code, out = run("check", "--no-cache")
    assert "CFX604" not in out
    # a user who writes the conflict by hand is told
    (in_tmp / "configs/train.yaml").write_text(TRAIN_YAML.replace("fp16", "bf16"))
    code, out = run("check", "--no-cache")
    assert code == 1 and "configs/train.yaml:1:18: CFX604" in out


def _findings(folder: Path) -> Counter:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        _, out = run("check", "--no-cache", "--output-format", "json")
    finally:
        os.chdir(cwd)
    return Counter((f["code"], f["filename"]) for f in json.loads(out))


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (REPO / "fixtures").glob("*/project")))
def test_fix_then_check_adds_no_finding_on_the_fixtures(tmp_path, name):
    folder = tmp_path / name
    shutil.copytree(REPO / "fixtures" / name / "project", folder)
    before = _findings(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        run("fix", "--unsafe-fixes", "--no-cache")
    finally:
        os.chdir(cwd)
    after = _findings(folder)
    assert not (after - before), after - before


def test_removing_a_move_names_the_print_that_now_lies(in_tmp):
    write_project(in_tmp, {"train.py": (
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained('x', device_map='auto')\n"
        "model.to(device)\n"
        "print('Model moved to GPU')\n"
        "model.train()\n")})
    code, out = run("check", "--no-cache")
    assert "help: Remove `.to(device)`; `device_map` already placed the model (line 4 still announces the move" in out
    write_project(in_tmp, {"train.py": (
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained('x', device_map='auto')\n"
        "model.to(device)\n"
        "print('loaded')\n")})
    code, out = run("check", "--no-cache")
    assert "help: Remove `.to(device)`; `device_map` already placed the model\n" in out
