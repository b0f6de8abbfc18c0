"""A project with several independent mistakes gets all of them in the first run, from
`check` and from `review` (issue 25): a device_map="auto" model moved to CUDA under a
4-process torchrun, and a DeepSpeed JSON whose batch and precision disagree with the
launch's TrainingArguments. The script's `device_map="auto"` once made CFX511 believe the
script fills the JSON's "auto" values itself, hiding both of its errors until train.py
was fixed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from tests.conftest import lint_project, write_project

TRAIN = '''import torch
from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments

parser = HfArgumentParser(TrainingArguments)
(args,) = parser.parse_args_into_dataclasses()
model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype=torch.bfloat16, device_map="auto")
model.to("cuda")
trainer = Trainer(model=model, args=args, train_dataset=None)
trainer.train()
'''
DS = '''{
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 4,
  "fp16": {"enabled": true},
  "zero_optimization": {"stage": 2}
}
'''
RUN = ("#!/bin/bash\ntorchrun --nproc_per_node 4 train.py --deepspeed ds.json --per_device_train_batch_size 4 "
       "--gradient_accumulation_steps 4 --bf16 True --output_dir out\n")
EXPECTED = {("train.py", 6, "CFX105"), ("train.py", 7, "CFX103"), ("ds.json", 2, "CFX502"),
            ("ds.json", 2, "CFX511"), ("ds.json", 5, "CFX511")}


@pytest.mark.parametrize("load", [
    'device_map="auto"',
    'device_map="auto", attn_implementation="sdpa"',
    'device_map=("auto")',
])
def test_check_reports_every_mistake_in_one_run(tmp_path, load):
    write_project(tmp_path, {"train.py": TRAIN.replace('device_map="auto"', load), "ds.json": DS, "run.sh": RUN})
    _, _, result = lint_project(tmp_path)
    found = {(f.path, f.span.line, f.code) for f in result.findings}
    assert EXPECTED - {("train.py", 7, "CFX103")} <= found, found


def test_a_script_that_fills_auto_itself_keeps_cfx511_silent(tmp_path):
    filler = TRAIN.replace("trainer = ", 'import json\nds = json.load(open("ds.json"))\n'
                           'for key, value in ds.items():\n    if value == "auto":\n        ds[key] = 1\ntrainer = ')
    write_project(tmp_path, {"train.py": filler, "ds.json": DS, "run.sh": RUN})
    _, _, result = lint_project(tmp_path)
    assert not [f for f in result.findings if f.code == "CFX511"]


def _git(root, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull)
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


def test_review_reports_every_mistake_the_branch_adds(tmp_path, monkeypatch):
    from cfgfix.commands import cli

    write_project(tmp_path, {"train.py": "print('start')\n", "README.md": "# project\n"})
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    _git(tmp_path, "checkout", "-qb", "feature")
    write_project(tmp_path, {"train.py": TRAIN, "ds.json": DS, "run.sh": RUN})
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "pr")
    monkeypatch.chdir(tmp_path)
    for name in ("GITHUB_BASE_REF", "GITHUB_EVENT_PATH", "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", "--output-format", "json"])
    data = json.loads(result.output)
    comments = data["comments"] if isinstance(data, dict) else data
    found = set()
    for comment in comments:
        finding = comment.get("finding", comment)
        span = finding.get("span", {})
        found.add((finding.get("path") or span.get("path"), span.get("line"), finding.get("code")))
    assert EXPECTED <= found, (found, result.output[:2000])
