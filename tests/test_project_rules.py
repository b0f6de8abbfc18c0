"""The project stage: rules over several files (CFX402, CFX502) run on every run, after the
cached per-file stage, so a change in a linked file is seen even when every per-file result
comes from the cache; a run that names only some files still finds their launches."""

import os
from pathlib import Path

import pytest

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
    # round 1: CFX402 writes the JSON's bf16; round 2 re-reads the JSON, and CFX403 removes the
    # key accelerate rejects next to deepspeed_config_file, now that it agrees
    assert [f.code for f in outcome.applied] == ["CFX402", "CFX403"]
    assert "mixed_precision" not in outcome.fixed
    assert not [f for f in outcome.remaining if f.code in ("CFX402", "CFX403")]


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


# -- CFX403's fix: remove an inline key only when the DeepSpeed JSON already says the same ---------
_DS403 = {"gradient_accumulation_steps": 4, "gradient_clipping": 1.0, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                "stage3_gather_16bit_weights_on_model_save": True}}


@pytest.mark.parametrize("inline, ds_changes, fixable", [
    ("  zero_stage: 3\n", {}, True),
    ("  zero_stage: 2\n", {}, False),  # the JSON says 3: which was meant is the author's call
    ("  gradient_accumulation_steps: 4\n", {}, True),
    ("  gradient_accumulation_steps: 4\n", {"gradient_accumulation_steps": "auto"}, False),  # filled later
    ("  gradient_clipping: 1\n", {}, True),  # 1 and 1.0 are the same number
    ("  gradient_clipping: true\n", {"gradient_clipping": 1}, False),  # a boolean is not a number
    ("  offload_optimizer_device: none\n", {}, True),  # no offload_optimizer block: nothing offloaded
    ("  offload_optimizer_device: cpu\n", {}, False),
    ("  offload_param_device: cpu\n", {}, True),
    ("  offload_param_nvme_path: none\n", {}, True),
    ("  offload_param_nvme_path: /nvme\n", {}, False),
    ("  zero3_save_16bit_model: true\n", {}, True),
    ("  zero3_save_16bit_model: false\n", {"zero_optimization": {"stage": 3}}, True),  # DeepSpeed's default
    ("  zero3_save_16bit_model: true\n", {"zero_optimization": {"stage": 3}}, False),
    ("  zero3_save_16bit_model: true\n", {"zero_optimization": {"stage": 3,
                                          "stage3_gather_fp16_weights_on_model_save": True}}, True),
    ("mixed_precision: bf16\n", {}, True),
    ("mixed_precision: fp16\n", {}, False),  # CFX402's clash; its fix comes first
    ("mixed_precision: 'no'\n", {"bf16": {"enabled": False}}, True),
    ("mixed_precision: no\n", {"bf16": {"enabled": False}}, True),  # unquoted: YAML reads False
    ("mixed_precision: 'no'\n", {"bf16": {"enabled": "auto"}}, False),  # "auto" follows mixed_precision
    ("mixed_precision: bf16\n", {"fp16": {"enabled": True}}, False),  # both on: CFX501's problem
])
def test_cfx403_fix_only_when_the_json_agrees(tmp_path, inline, ds_changes, fixable):
    import json

    ds = {**_DS403, **ds_changes}
    block, top = (inline, "") if inline.startswith("  ") else ("", inline)
    write_project(tmp_path, {
        "configs/accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                   "deepspeed_config:\n  deepspeed_config_file: configs/ds.json\n" + block
                                   + top + "num_processes: 2\n",
        "configs/ds.json": json.dumps(ds, indent=2) + "\n",
    })
    _, _, result = lint_project(tmp_path)
    found = [f for f in result.findings if f.code == "CFX403"]
    assert [f.span.line for f in found] == [5]
    assert (found[0].fix is not None) is fixable, found[0].message
    assert ("already says the same" in found[0].message) is fixable


def test_cfx403_no_fix_in_a_yaml_flow_mapping(tmp_path):
    """Deleting the first entry of `{a: 1, b: 2}` line-wise would leave `{, b: 2}`."""
    write_project(tmp_path, {
        "accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                           "deepspeed_config: {zero_stage: 3, deepspeed_config_file: ds.json}\nnum_processes: 2\n",
        "ds.json": '{"zero_optimization": {"stage": 3}, "train_batch_size": "auto"}\n',
    })
    _, _, result = lint_project(tmp_path)
    found = [f for f in result.findings if f.code == "CFX403"]
    assert len(found) == 1 and found[0].fix is None


def test_cfx403_silent_on_a_deepspeed_block_that_is_never_read(tmp_path):
    """accelerate's own fixture (tests/test_configs/validate_launch_cmd.yaml): distributed_type
    NO next to a deepspeed_config block; checked with accelerate 1.15: `accelerate launch`
    starts, no DeepSpeed plugin is built."""
    write_project(tmp_path, {
        "accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\n"
                           "distributed_type: 'NO'\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"
                           "  zero_stage: 2\nmixed_precision: 'no'\n",
        "ds.json": '{"zero_optimization": {"stage": 3}, "train_batch_size": "auto"}\n',
    })
    _, _, result = lint_project(tmp_path)
    assert [f for f in result.findings if f.code == "CFX403"] == []


MODULE_SCRIPT = (
    "from transformers import AutoModelForCausalLM, Trainer\n"
    'model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto")\n'
    "Trainer(model=model).train()\n"
)


@pytest.mark.parametrize("launch", [
    "accelerate launch --num_processes 2 -m pkg.train\n",
    "python -m torch.distributed.run --nproc_per_node 2 -m pkg.train\n",
    "deepspeed --num_gpus 2 --module pkg.train\n",
    "torchrun --nproc_per_node=2 -m pkg.train.__main__\n",
])
def test_module_launches_link_their_script(tmp_path, launch):
    """`-m pkg.train` is the project's pkg/train.py (or pkg/train/__main__.py, or under src/)."""
    write_project(tmp_path, {"run.sh": launch, "src/pkg/__init__.py": "", "src/pkg/train.py": MODULE_SCRIPT,
                             "src/pkg/train/__main__.py": MODULE_SCRIPT})
    if "__main__" not in launch:
        (tmp_path / "src/pkg/train/__main__.py").unlink()
        (tmp_path / "src/pkg/train").rmdir()
    _, _, result = lint_project(tmp_path)
    found = [(f.path, f.code) for f in result.findings if f.code == "CFX105"]
    assert len(found) == 1 and found[0][0].startswith("src/pkg/train")


def test_module_launch_of_an_outside_module_links_nothing(tmp_path):
    """Near miss: a module that is not in the project (`-m other.train`) is no local script."""
    write_project(tmp_path, {"run.sh": "accelerate launch --num_processes 2 -m other.train\n",
                             "pkg/train.py": MODULE_SCRIPT})
    _, _, result = lint_project(tmp_path)
    assert [f.code for f in result.findings if f.code == "CFX105"] == []
