"""One finding per decision (issue 23): a choice one launch states in several files, or that
several launches read from one file, is reported once, at the place that decides, with the
other places and launches as related locations."""

import json
from collections import Counter

import pytest
from click.testing import CliRunner
from conftest import REPO, write_project

from cfgfix.commands import cli

GPU = '[tool.cfgfix]\ngpu = "A100 80GB"\n'
TRAINER = (
    "from transformers import HfArgumentParser, Trainer, TrainingArguments\n"
    "args = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()[0]\n"
    "Trainer(model=None, args=args).train()\n"
)
ACC = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: fp16\nnum_processes: 2\n"


def _check(*args) -> list[dict]:
    result = CliRunner().invoke(cli, ["check", "--no-cache", "--output-format", "json", *args], catch_exceptions=False)
    return json.loads(result.output)


def _where(item: dict) -> tuple:
    return item["filename"], item["location"]["row"]


def test_fp16_stated_in_four_files_is_one_finding(in_tmp):
    write_project(in_tmp, {
        "pyproject.toml": GPU, "train.py": TRAINER, "acc.yaml": ACC,
        "train.yaml": "per_device_train_batch_size: 4\nfp16: true\nbf16: false\n",
        "ds.json": '{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n',
        "run.sh": "accelerate launch --config_file acc.yaml train.py --config train.yaml --fp16 --deepspeed ds.json\n",
    })
    [finding] = [f for f in _check() if f["code"] == "CFX602"]
    # the DeepSpeed JSON's value is what trains; the other three places are related
    assert _where(finding) == ("ds.json", 1)
    assert finding["message"].startswith(
        "fp16.enabled in ds.json chooses fp16 (so do --fp16 in run.sh, fp16 in train.yaml and mixed_precision in acc.yaml)")
    assert [(r["filename"], r["message"]) for r in finding["related"]] == [
        ("run.sh", "--fp16 in run.sh chooses fp16 too"),
        ("train.yaml", "fp16 in train.yaml chooses fp16 too"),
        ("acc.yaml", "mixed_precision in acc.yaml chooses fp16 too"),
        ("run.sh", "launched here"),
    ]
    assert finding["fix"] is None  # the four files must change together: no one-file fix
    concise = CliRunner().invoke(cli, ["check", "--no-cache", "--output-format", "concise", "--select", "CFX602"]).output
    assert concise.count("CFX602") == 1 and "Found 1 finding." in concise


def test_one_file_read_by_two_launches_is_one_finding(in_tmp):
    acc = ACC.replace("DEEPSPEED", "MULTI_GPU")
    write_project(in_tmp, {
        "pyproject.toml": GPU, "train.py": TRAINER, "acc.yaml": acc,
        "run.sh": "accelerate launch --config_file acc.yaml train.py\n",
        "sweep.sh": "accelerate launch --config_file acc.yaml train.py --seed 2\n",
    })
    [finding] = [f for f in _check() if f["code"] == "CFX602"]
    assert _where(finding) == ("acc.yaml", 3)
    assert sorted((r["filename"], r["message"]) for r in finding["related"]) == [
        ("run.sh", "launched here"), ("sweep.sh", "launched here")]
    # one place decides for both launches: the fix stays, and `fix --unsafe-fixes` applies it
    assert finding["fix"]["applicability"] == "unsafe"
    CliRunner().invoke(cli, ["fix", "--no-cache", "--unsafe-fixes", "--select", "CFX602"], catch_exceptions=False)
    assert (in_tmp / "acc.yaml").read_text() == acc.replace("mixed_precision: fp16", "mixed_precision: bf16")


def test_accelerator_precision_two_launches_two_sources(in_tmp):
    script = ("import yaml\nfrom accelerate import Accelerator\n\ncfg = yaml.safe_load(open('train.yaml'))\n"
              "accelerator = Accelerator(mixed_precision=cfg['mixed_precision'])\n")
    acc = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
           "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n")
    launch = "accelerate launch --config_file acc.yaml train.py --config train.yaml\n"
    write_project(in_tmp, {
        "train.py": script, "acc.yaml": acc, "train.yaml": "mixed_precision: bf16\ngradient_accumulation_steps: 4\n",
        "ds.json": '{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n',
        "run.sh": launch, "again.sh": launch,
    })
    [finding] = [f for f in _check("--select", "CFX604") if f["code"] == "CFX604"]
    assert _where(finding) == ("train.yaml", 1)
    assert sorted(r["filename"] for r in finding["related"] if r["message"] == "the DeepSpeed launch") == [
        "again.sh", "run.sh"]


def test_fp32_config_read_by_two_launches_is_one_finding(in_tmp):
    script = "from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained('org/m')\n"
    write_project(in_tmp, {
        "train.py": script,
        "train.yaml": "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nbf16: false\nfp16: false\n",
        "a.sh": "torchrun --nproc_per_node 4 train.py --config train.yaml\n",
        "b.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n",
    })
    [finding] = [f for f in _check("--select", "CFX601")]
    assert _where(finding) == ("train.yaml", 3)
    assert sorted(r["filename"] for r in finding["related"]) == ["a.sh", "b.sh"]


@pytest.mark.parametrize("project", sorted(p.parent.name for p in (REPO / "fixtures").glob("*/project")))
def test_fixtures_report_each_place_once(project, monkeypatch):
    """The sample projects: no two findings of one rule at one place, and no rule repeats one
    message for the same launch in several files (the per-file repetition this replaced)."""
    monkeypatch.chdir(REPO / "fixtures" / project / "project")
    findings = _check()
    places = Counter((f["code"], f["filename"], f["location"]["row"], f["location"]["column"]) for f in findings)
    assert max(places.values(), default=1) == 1
    for code in ("CFX601", "CFX602", "CFX604"):
        launches = Counter(tuple(sorted(_where(r) for r in f["related"] if r["message"] in ("launched here", "the DeepSpeed launch")))
                           for f in findings if f["code"] == code)
        assert max(launches.values(), default=1) == 1, (code, launches)

