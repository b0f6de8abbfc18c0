"""Issue 21, items 1 and 2: one memory answer per launch (training/memory_answer.py), the
same in `estimate`, `check` (CFX701/CFX702), `fix --fit` and `explain`; inputs the files
leave open are ranges, and a verdict between the ends is conditional, solved for its threshold."""

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import lint_project, write_project

from cfgfix.commands import cli
from cfgfix.memory.gpus import find_gpu
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.training.fit import gib

REPO = Path(__file__).resolve().parents[1]
PROJECTS = sorted(p for p in (REPO / "fixtures").glob("*/project")) + sorted(
    p for p in (REPO / "fixtures").glob("*/fixed"))


def _run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _rule_example_projects(tmp_path):
    """CFX701/CFX702's own examples, written out as projects."""
    from cfgfix.rules.memory.cfx701_does_not_fit import DoesNotFit
    from cfgfix.rules.memory.cfx702_cannot_fit_any_setting import CannotFitAnySetting

    out = []
    for rule in (DoesNotFit, CannotFitAnySetting):
        for index, example in enumerate(rule.VALID + rule.INVALID):
            root = tmp_path / f"{rule.code}-{index}"
            write_project(root, {example.path: example.code, **example.files})
            out.append(root)
    return out


def _commands(root: Path, tmp_path: Path) -> dict:
    """What every command says about each launch's memory: {launch: {command: (peak, verdict)}}."""
    said: dict = {}
    _, out = _run("estimate", "--no-cache", "--output-format", "json", str(root))
    for entry in json.loads(out):
        answer = entry.get("answer")
        if answer is None or answer["verdict"] is None:
            continue
        key = (entry["launch"]["path"].rsplit("/", 1)[-1], entry["launch"]["line"])
        said.setdefault(key, {})["estimate"] = (gib(answer["peak_bytes"]), answer["text"])
        said[key]["trains"] = entry["script_trains"] is not False
    _, out = _run("explain", "--no-cache", "--output-format", "json", str(root))
    for entry in json.loads(out):
        memory = entry.get("memory") or {}
        key = (entry["launch"]["path"].rsplit("/", 1)[-1], entry["launch"]["line"])
        if key in said:
            said[key]["explain"] = (gib(memory["peak_bytes"]), memory["text"])
    copy = tmp_path / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".cfgfix_cache"))
    _, out = _run("fix", "--no-cache", "--fit", "--diff", str(copy))
    for block in out.split("\n\n"):
        head = re.match(r"(\S+):(\d+): ", block)
        now = re.search(r"  now: ([\d.]+ GiB) per GPU \(range [^)]*\); (.*)", block)
        if head and now:
            key = (head.group(1).rsplit("/", 1)[-1], int(head.group(2)))
            if key in said:
                said[key]["fix --fit"] = (now.group(1), now.group(2))
    _, out = _run("check", "--no-cache", "--select", "CFX7", "--output-format", "json", str(root))
    for finding in json.loads(out):
        key = (finding["filename"].rsplit("/", 1)[-1], finding["location"]["row"])
        if key in said:
            said[key].setdefault("check", []).append(finding["message"])
    return said


def _agree(said: dict, where) -> None:
    for key, by_command in said.items():
        peak, text = by_command["estimate"]
        for command in ("explain", "fix --fit"):
            if command in by_command:
                assert by_command[command] == (peak, text), (where, key, command, by_command)
        for message in by_command.get("check", []):
            assert f"about {peak} per GPU" in message or f"{peak}" in message or "with any config change" in message, (
                where, key, message, peak)
            assert "does not fit" in text or "only if" in text or "probably" in text, (where, key, text, message)
        if text.startswith("does not fit") and by_command["trains"]:
            assert by_command.get("check"), (where, key, "does not fit, but check is silent", by_command)


@pytest.mark.parametrize("root", PROJECTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_gets_one_answer_from_every_command(root, tmp_path):
    said = _commands(root, tmp_path)
    assert said, f"{root}: no launch was estimated against a GPU"
    _agree(said, root)


def test_the_rules_own_examples_get_one_answer_from_every_command(tmp_path):
    for root in _rule_example_projects(tmp_path):
        _agree(_commands(root, tmp_path), root)


def test_a_launch_that_does_not_fit_is_reported_by_check_with_the_same_peak(tmp_path):
    said = _commands(REPO / "fixtures" / "flan-t5-xl-trainer" / "project", tmp_path)
    run = said[("run.sh", 9)]
    assert run["estimate"][1].startswith("does not fit") and run["check"], run


PHI3_TRAIN = (
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('microsoft/Phi-3-mini-4k-instruct')\n"
    "Trainer(model=model, args=args).train()\n"
)


def test_three_answers_phi3_mini_full_fine_tune_on_an_a100_40gb(tmp_path):
    """The issue's case: `estimate` said 20 GiB over, `fix --fit` "fits, 10.1 GiB to spare;
    nothing to change" (1 token, bf16 weights), `check` nothing. Now one answer: the dtype
    and the sequence length are open, so it fits only under a stated condition, and CFX701
    speaks because the most-memory end is over even at its band's bottom."""
    write_project(tmp_path / "p", {
        "train.py": PHI3_TRAIN, "cfgfix.toml": 'gpu = "A100 40GB"\n',
        "run.sh": "python train.py --output_dir out --per_device_train_batch_size 4 --bf16 True "
                  "--gradient_checkpointing True\n"})
    said = _commands(tmp_path / "p", tmp_path)[("run.sh", 1)]
    _agree({("run.sh", 1): said}, "phi-3")
    peak, text = said["estimate"]
    assert peak == "59.3 GiB"
    assert text.startswith("fits A100 40GB only if the weights' dtype is bf16 and the sequence length is ≤ "), text
    assert said["check"] and said["fix --fit"] == said["estimate"]
    code, _ = _run("estimate", "--no-cache", str(tmp_path / "p"))
    assert code == 1  # a conditional answer is not "fits"


def test_three_answers_custom_8b_model_without_a_transformers_pin(tmp_path):
    """The 8B composite of the mm-encoder story with no transformers pin (the weights' dtype
    is open): `estimate` said 198.6 GiB while CFX701 and `fix --fit` said 104.5 (bf16 taken).
    Now all three show 198.9 GiB (fp32, the most-memory end; the CLIP tower's quick_gelu keeps
    its sigmoid too, memory/families.py) and the bound 97.9 GiB."""
    root = tmp_path / "p"
    shutil.copytree(REPO / "fixtures" / "mm-encoder-8b" / "project", root,
                    ignore=shutil.ignore_patterns(".cfgfix_cache"))
    requirements = root / "requirements.txt"
    requirements.write_text("".join(line for line in requirements.read_text().splitlines(True)
                                    if not line.startswith("transformers")))
    said = _commands(root, tmp_path)[("train.sh", 4)]
    _agree({("train.sh", 4): said}, "mm-encoder without a pin")
    assert said["estimate"][0] == "198.9 GiB" and said["estimate"][1].startswith(
        "does not fit RTX A6000: at least 97.9 GiB even at the least-memory end")
    assert "198.9 GiB per GPU" in said["check"][0]


def test_a_transformers_4_pin_resolves_the_dtype_to_fp32(tmp_path):
    """With transformers 4.x pinned, a load without torch_dtype is fp32 (what the code path
    uses), not a range."""
    from cfgfix.training.memory_answer import answers

    root = tmp_path / "p"
    shutil.copytree(REPO / "fixtures" / "mm-encoder-8b" / "project", root,
                    ignore=shutil.ignore_patterns(".cfgfix_cache"))
    engine, _, _ = lint_project(root)
    found = answers(engine.project)[0]
    assert not [o for o in found.open if o.setting == "weights"]
    assert any("transformers 4.46.3 loads in torch's default float32" in a for a in found.inputs.assumptions)


def test_conditional_verdict_solves_the_sequence_length(tmp_path):
    from cfgfix.memory.setup import MemorySetup
    from cfgfix.training.memory_answer import CONDITIONAL, OpenInput, judge

    shape = shape_from_catalog("Qwen/Qwen2.5-1.5B")
    gpu = find_gpu("RTX 4090")
    setup = MemorySetup(params=shape.params, weights="bf16", micro_batch=4, seq_len=None)
    opened = [OpenInput("seq_len", 1, 32768, True, "test range")]
    verdict, condition, _ = judge(setup.with_(seq_len=1), setup.with_(seq_len=32768), opened, (), shape, gpu)
    assert verdict == CONDITIONAL and condition.startswith("the sequence length is ≤ ")
    limit = int(condition.split("≤ ")[1].split()[0].replace(",", ""))
    from cfgfix.memory.estimator import estimate

    assert estimate(setup.with_(seq_len=limit), shape).high <= gpu.usable_bytes
    assert estimate(setup.with_(seq_len=limit + 64), shape).high > gpu.usable_bytes
