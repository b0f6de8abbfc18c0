"""The project stage: rules over several files (CFX402, CFX502) run on every run, after the
cached per-file stage, so a change in a linked file is seen even when every per-file result
comes from the cache; a run that names only some files still finds their launches."""

import os
from pathlib import Path

from cfgfix.engine import Engine
from cfgfix.fixing import fix_file
from cfgfix.settings import load_settings
from cfgfix.workspace import discover
from conftest import lint_project, write_project

ACC = (
    "compute_environment: LOCAL_MACHINE\n"
    "distributed_type: DEEPSPEED\n"
    "deepspeed_config:\n"
    "  deepspeed_config_file: configs/ds.json\n"
    "mixed_precision: {precision}\n"
    "num_processes: {n}\n"
)
DS = (
    '{{\n  "train_batch_size": {total},\n  "train_micro_batch_size_per_gpu": 2,\n'
    '  "gradient_accumulation_steps": 4,\n  "{dtype}": {{"enabled": true}},\n'
    '  "zero_optimization": {{"stage": 2}}\n}}\n'
)
LAUNCH = "accelerate launch --config_file configs/accelerate.yaml train.py\n"


def _project(tmp_path, precision="bf16", n=4, total=32, dtype="bf16"):
    write_project(tmp_path, {
        "configs/accelerate.yaml": ACC.format(precision=precision, n=n),
        "configs/ds.json": DS.format(total=total, dtype=dtype),
        "train.sh": LAUNCH,
    })


def _codes(result, code):
    return sorted((f.path, f.span.line) for f in result.findings if f.code == code)


def test_editing_the_deepspeed_json_changes_the_finding_on_the_cached_yaml(tmp_path):
    _project(tmp_path)
    _, _, cold = lint_project(tmp_path, use_cache=True)
    assert _codes(cold, "CFX402") == []
    (tmp_path / "configs/ds.json").write_text(DS.format(total=32, dtype="fp16"))
    _, _, warm = lint_project(tmp_path, use_cache=True)
    assert _codes(warm, "CFX402") == [("configs/accelerate.yaml", 5)]
    (tmp_path / "configs/ds.json").write_text(DS.format(total=32, dtype="bf16"))
    _, _, again = lint_project(tmp_path, use_cache=True)
    assert _codes(again, "CFX402") == []


def test_editing_the_world_size_changes_the_finding_on_the_cached_json(tmp_path):
    _project(tmp_path, n=4, total=32)
    _, _, cold = lint_project(tmp_path, use_cache=True)
    assert _codes(cold, "CFX502") == []
    (tmp_path / "configs/accelerate.yaml").write_text(ACC.format(precision="bf16", n=8))
    _, _, warm = lint_project(tmp_path, use_cache=True)
    assert _codes(warm, "CFX502") == [("configs/ds.json", 2)]
    finding = next(f for f in warm.findings if f.code == "CFX502")
    assert "= 64" in finding.message
    assert any(r.span.path == "configs/accelerate.yaml" for r in finding.related)


def test_the_launch_overrides_the_yaml_world_size(tmp_path):
    _project(tmp_path, n=4, total=32)
    (tmp_path / "train.sh").write_text(LAUNCH.replace("launch ", "launch --num_processes 2 "))
    _, _, result = lint_project(tmp_path)
    assert _codes(result, "CFX502") == [("configs/ds.json", 2)]


def test_a_run_naming_only_the_json_finds_the_launch(tmp_path):
    """pre-commit passes just the changed file; the launch script is found in the project."""
    _project(tmp_path, n=4, total=16)
    (tmp_path / "configs/accelerate.yaml").write_text(ACC.format(precision="bf16", n=4).replace(
        "num_processes: 4\n", ""))
    (tmp_path / "train.sh").write_text(LAUNCH.replace("launch ", "launch --num_processes 4 "))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        settings = load_settings(tmp_path)
        files, _ = discover([Path("configs/ds.json")], settings)
        result = Engine(settings, use_cache=False).run(files)
    finally:
        os.chdir(cwd)
    assert _codes(result, "CFX502") == [("configs/ds.json", 2)]


def test_fixing_the_yaml_reads_the_json_once_more(tmp_path):
    _project(tmp_path, precision="fp16")
    engine, files, result = lint_project(tmp_path)
    assert _codes(result, "CFX402") == [("configs/accelerate.yaml", 5)]
    sf = next(f for f in files if f.display == "configs/accelerate.yaml")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        outcome = fix_file(engine, sf, sf.path.read_bytes(), unsafe=False)
    finally:
        os.chdir(cwd)
    assert "mixed_precision: bf16\n" in outcome.fixed
    assert not [f for f in outcome.remaining if f.code == "CFX402"]


def test_cfx404_follows_the_json_on_a_warm_run(tmp_path):
    """The launch script's result comes from the cache; the JSON it reaches is read again."""
    _project(tmp_path)
    (tmp_path / "train.sh").write_text(LAUNCH.replace("train.py", "train.py --gradient_accumulation_steps 4"))
    _, _, cold = lint_project(tmp_path, use_cache=True)
    assert _codes(cold, "CFX404") == []
    (tmp_path / "configs/ds.json").write_text(DS.format(total=32, dtype="bf16").replace(
        '"gradient_accumulation_steps": 4', '"gradient_accumulation_steps": 2'))
    _, _, warm = lint_project(tmp_path, use_cache=True)
    assert _codes(warm, "CFX404") == [("train.sh", 1)]
