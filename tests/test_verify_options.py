"""`verify` takes the options every command shares (issue 23): which fixes the patched copy
gets is chosen as in `cfgfix fix` (--select/--ignore/--extend-select, --config,
--isolated, --unsafe-fixes, each file's closest settings file); no training runs here."""

from __future__ import annotations

from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.verify.workspace import apply_fixes
from tests.conftest import write_project

TRAIN = '''import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
model = model.to(torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters())
for step, batch in enumerate(loader):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    torch.cuda.empty_cache()
'''


def _codes(fixes):
    return sorted({f.code for f in fixes})


def test_selection_chooses_the_fixes(tmp_path):
    write_project(tmp_path / "a", {"train.py": TRAIN})
    assert _codes(apply_fixes(tmp_path / "a", unsafe=True)) == ["CFX101", "CFX301"]
    write_project(tmp_path / "b", {"train.py": TRAIN})
    assert _codes(apply_fixes(tmp_path / "b", unsafe=True, selection={"select": ["CFX3"]})) == ["CFX301"]
    write_project(tmp_path / "c", {"train.py": TRAIN})
    assert _codes(apply_fixes(tmp_path / "c", unsafe=True, selection={"ignore": ["CFX301"]})) == ["CFX101"]
    write_project(tmp_path / "d", {"train.py": TRAIN})
    assert _codes(apply_fixes(tmp_path / "d", unsafe=False)) == ["CFX301"]  # CFX101's fix is unsafe


def test_each_file_uses_its_closest_settings_unless_isolated(tmp_path):
    files = {"cfgfix.toml": 'ignore = ["CFX101"]\n', "train.py": TRAIN,
             "sub/cfgfix.toml": 'ignore = ["CFX301"]\n', "sub/train.py": TRAIN}
    write_project(tmp_path / "a", files)
    fixes = apply_fixes(tmp_path / "a", unsafe=True)
    assert sorted((f.path, f.code) for f in fixes) == [("sub/train.py", "CFX101"), ("train.py", "CFX301")]
    write_project(tmp_path / "b", files)
    assert len(apply_fixes(tmp_path / "b", unsafe=True, isolated=True)) == 4
    write_project(tmp_path / "c", files)
    only = apply_fixes(tmp_path / "c", unsafe=True, config_file=tmp_path / "c" / "sub" / "cfgfix.toml")
    assert sorted((f.path, f.code) for f in only) == [("sub/train.py", "CFX101"), ("train.py", "CFX101")]


def test_bad_option_values_are_errors_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfgfix.toml").write_text("")
    for args in (["--select", ""], ["--ignore", ","], ["--config", "cfgfix.toml", "--isolated"]):
        result = CliRunner().invoke(cli, ["verify", *args, "--", "python", "train.py"])
        assert result.exit_code == 2, (args, result.output)
    result = CliRunner().invoke(cli, ["verify", "--help"])
    for option in ("--unsafe-fixes", "--select", "--ignore", "--extend-select", "--config", "--isolated", "--no-cache"):
        assert option in result.output
