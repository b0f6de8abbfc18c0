"""The command line end to end: exit codes, formats, fix safety, settings, cache."""

import json
import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from conftest import REPO, write_project

BROKEN = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model = model.to(torch.bfloat16)\n"
    "model.to(device)\n"
    "model.train()\n"
)
FIXED = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.train()\n"
)


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_check_reports_and_exits_1(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("check", "--no-cache")
    assert code == 1
    assert "train.py:4:9: CFX101 `model`" in out  # an unsafe fix: no [*]
    assert "train.py:5:1: CFX103 [*]" in out
    assert "Found 2 findings (1 fixable with cfgfix fix)." in out
    assert "1 hidden fix can be enabled with the --unsafe-fixes option." in out


def test_concise_output_and_fix_safety(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("check", "--no-cache", "--output-format", "concise")
    assert code == 1
    assert out.splitlines()[:3] == [
        "train.py:4:9: CFX101 `model` already holds bfloat16 weights " + out.splitlines()[0].split(" weights ", 1)[1],
        "train.py:5:1: CFX103 [*] " + out.splitlines()[1].split(" [*] ", 1)[1],
        "Found 2 findings (1 fixable with cfgfix fix).",
    ]
    assert out.splitlines()[3] == "1 hidden fix can be enabled with the --unsafe-fixes option."
    # --unsafe-fixes without --fix: the unsafe fix counts as available ([*]), nothing is written
    code, out = run("check", "--no-cache", "--output-format", "concise", "--unsafe-fixes")
    assert out.splitlines()[0].startswith("train.py:4:9: CFX101 [*] `model`")
    assert "Found 2 findings (2 fixable with cfgfix fix --unsafe-fixes)." in out and "hidden" not in out
    assert (in_tmp / "train.py").read_text() == BROKEN
    code, out = run("fix", "--no-cache", "--output-format", "concise")
    assert out.splitlines() == [out.splitlines()[0], "Found 2 findings (1 fixed, 1 remaining).",
                                "1 hidden fix can be enabled with the --unsafe-fixes option."]
    assert out.startswith("train.py:4:9: CFX101 `model`")
    # SARIF carries a fix a viewer can apply only under the run's fix safety
    sarif = json.loads(run("check", "--no-cache", "--output-format", "sarif")[1])
    assert [r.get("fixes") for r in sarif["runs"][0]["results"]] == [None]
    sarif = json.loads(run("check", "--no-cache", "--output-format", "sarif", "--unsafe-fixes")[1])
    [result] = sarif["runs"][0]["results"]
    assert result["fixes"][0]["properties"] == {"applicability": "unsafe"}


def test_clean_tree_exits_0(in_tmp):
    write_project(in_tmp, {"train.py": FIXED})
    code, out = run("check", "--no-cache")
    assert code == 0
    assert "All checks passed!" in out


def test_diff_writes_nothing_and_exits_1(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("fix", "--diff", "--no-cache", "--unsafe-fixes")
    assert code == 1
    assert "-model = model.to(torch.bfloat16)\n" in out and "-model.to(device)\n" in out
    assert (in_tmp / "train.py").read_text() == BROKEN


def test_fix_writes_and_second_fix_changes_nothing(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("fix", "--no-cache")
    assert code == 1, out  # the unsafe CFX101 fix stays behind --unsafe-fixes
    assert "Found 2 findings (1 fixed, 1 remaining)." in out
    code, out = run("fix", "--no-cache", "--unsafe-fixes")
    assert code == 0, out
    assert (in_tmp / "train.py").read_text() == FIXED
    assert "Found 1 finding (1 fixed, 0 remaining)." in out
    code, out = run("check", "--fix", "--unsafe-fixes", "--no-cache")
    assert code == 0
    assert (in_tmp / "train.py").read_text() == FIXED


def test_fix_keeps_crlf_bom_and_mode(in_tmp):
    data = b"\xef\xbb\xbf" + BROKEN.replace("\n", "\r\n").encode()
    path = in_tmp / "train.py"
    path.write_bytes(data)
    path.chmod(0o754)
    code, _ = run("fix", "--no-cache", "--unsafe-fixes")
    assert code == 0
    assert path.read_bytes() == b"\xef\xbb\xbf" + FIXED.replace("\n", "\r\n").encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o754


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else False, reason="root ignores permissions")
def test_read_only_file_is_left_alone(in_tmp):
    path = in_tmp / "train.py"
    path.write_text(BROKEN)
    path.chmod(0o444)
    code, out = run("fix", "--no-cache")
    assert code == 2
    assert path.read_text() == BROKEN


def test_read_only_file_is_left_alone_even_as_root(in_tmp, monkeypatch):
    """Root may write anything, so the fixer checks permissions itself."""
    path = in_tmp / "train.py"
    path.write_text(BROKEN)
    path.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real_access(p, mode))
    code, out = run("fix", "--no-cache")
    assert code == 2
    assert "read-only" in out
    assert path.read_text() == BROKEN


def test_syntax_error_is_a_finding_and_never_written(in_tmp):
    broken = "import torch\nmodel = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16\nmodel.to(torch.bfloat16)\n"
    write_project(in_tmp, {"bad.py": broken, "train.py": BROKEN})
    code, out = run("check", "--no-cache")
    assert code == 1
    assert "bad.py:" in out and "CFX901" in out
    assert "train.py:4:9: CFX101" in out  # the other files go on
    code, out = run("fix", "--no-cache", "--unsafe-fixes")
    assert (in_tmp / "bad.py").read_text() == broken
    assert (in_tmp / "train.py").read_text() == FIXED


def test_invalid_utf8_and_binary_are_findings(in_tmp):
    write_project(in_tmp, {"latin.py": "m = AutoModel.from_pretrained('\xe9').to(d)\n".encode("latin-1"), "blob.py": b"m = AutoModel.from_pretrained(x).to(\x00\x01"})
    code, out = run("check", "--no-cache", "--output-format", "json")
    found = {(f["filename"], f["code"]) for f in json.loads(out)}
    assert found == {("latin.py", "CFX901"), ("blob.py", "CFX901")}


def test_json_output_shape(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("check", "--no-cache", "--output-format", "json")
    data = json.loads(out)
    first = data[0]
    assert first["code"] == "CFX101" and first["name"] == "redundant-dtype-cast"
    assert first["location"] == {"row": 4, "column": 9}
    assert first["fix"]["applicability"] == "unsafe"
    assert first["fix"]["edits"][0]["location"] == {"row": 4, "column": 1}
    assert first["url"].endswith("/rules/CFX101.md")


def test_sarif_output_validates(in_tmp):
    jsonschema = pytest.importorskip("jsonschema")
    # the public OASIS schema ships with the tests, so a fresh clone runs this
    schema_path = REPO / "tests" / "data" / "sarif-schema-2.1.0.json"
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("check", "--no-cache", "--output-format", "sarif")
    sarif = json.loads(out)
    schema = json.loads(schema_path.read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(sarif)
    results = sarif["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["CFX101", "CFX103"]
    assert results[1]["locations"][0]["physicalLocation"]["region"]["startLine"] == 5


def test_github_output(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    code, out = run("check", "--no-cache", "--output-format", "github")
    lines = out.strip().splitlines()
    assert lines[0].startswith("::notice file=train.py,line=4,col=9,endLine=4,endColumn=33,title=CFX101 redundant-dtype-cast::")
    assert lines[1].startswith("::warning file=train.py,line=5,")


def test_select_ignore_and_prefixes(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    assert "CFX103" not in run("check", "--no-cache", "--ignore", "CFX103")[1]
    out = run("check", "--no-cache", "--select", "CFX10", "--ignore", "CFX101")[1]
    assert "CFX103" in out and "CFX101" not in out
    code, out = run("check", "--no-cache", "--select", "CFX1O3")
    assert code == 2 and "CFX1O3" in out


def test_settings_from_pyproject_and_unknown_key(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN, "pyproject.toml": '[tool.cfgfix]\nignore = ["CFX101"]\n'})
    out = run("check", "--no-cache")[1]
    assert "CFX101" not in out and "CFX103" in out
    write_project(in_tmp, {"pyproject.toml": '[tool.cfgfix]\nignores = ["CFX101"]\n'})
    code, out = run("check", "--no-cache")
    assert code == 2 and "ignores" in out


def test_per_file_ignores(in_tmp):
    write_project(in_tmp, {"scripts/train.py": BROKEN, "cfgfix.toml": '[per-file-ignores]\n"scripts/*" = ["CFX1"]\n'})
    code, out = run("check", "--no-cache")
    assert code == 0, out


def test_suppression_comments(in_tmp):
    text = BROKEN.replace("model.to(device)\n", "model.to(device)  # cfgfix: ignore[CFX103]\n")
    write_project(in_tmp, {"train.py": text})
    out = run("check", "--no-cache")[1]
    assert "CFX103" not in out and "CFX101" in out
    write_project(in_tmp, {"train.py": "# cfgfix: ignore-file[CFX101]\n" + text})
    code, out = run("check", "--no-cache")
    assert code == 0, out


def test_unused_suppression_is_opt_in(in_tmp):
    write_project(in_tmp, {"train.py": FIXED.replace("model.train()\n", "model.train()  # cfgfix: ignore[CFX103]\n")})
    assert run("check", "--no-cache")[0] == 0
    code, out = run("check", "--no-cache", "--extend-select", "CFX902")
    assert code == 1 and "CFX902" in out
    run("fix", "--no-cache", "--extend-select", "CFX902")
    assert (in_tmp / "train.py").read_text() == FIXED


def test_statistics_and_quiet(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    out = run("check", "--no-cache", "--statistics")[1]
    assert "CFX101" in out and "CFX103" in out and "|" not in out
    out = run("check", "--no-cache", "--quiet")[1]
    assert "Found" not in out and "CFX101" in out


def test_warm_run_parses_nothing(in_tmp, monkeypatch):
    write_project(in_tmp, {"train.py": BROKEN})
    first = run("check")[1]
    from cfgfix.documents import python

    calls = []
    real = python.PythonDocument.parse
    monkeypatch.setattr(python.PythonDocument, "parse", classmethod(lambda cls, s: calls.append(s) or real(s)))
    second = run("check")[1]
    assert second == first
    assert calls == []
    assert (in_tmp / ".cfgfix_cache" / ".gitignore").exists()
    (in_tmp / "train.py").write_text(FIXED)
    assert run("check")[0] == 0
    assert len(calls) == 1


def test_default_excludes_and_gitignore(in_tmp):
    write_project(
        in_tmp,
        {
            ".venv/lib/train.py": BROKEN,
            "node_modules/x/train.py": BROKEN,
            "build_out/train.py": BROKEN,
            ".gitignore": "build_out/\n",
        },
    )
    assert run("check", "--no-cache")[0] == 0
    code, out = run("check", "--no-cache", "build_out/train.py")  # named explicitly
    assert code == 1


def test_rule_command():
    code, out = run("rule", "CFX103")
    assert code == 0
    assert out.startswith("# CFX103 move-dispatched-model")
    for section in ("## What it does", "## Why is this bad?", "## Fix safety"):
        assert section in out
    code, out = run("rule", "--all")
    assert "CFX101" in out and "redundant-dtype-cast" in out
    assert run("rule", "CFX999")[0] == 2


def test_version_is_fast_path():
    out = subprocess.run([sys.executable, "-m", "cfgfix", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("cfgfix ")
    probe = "import sys; from cfgfix.cli import main\ntry:\n main(['--version'])\nexcept SystemExit: pass\nprint('click' in sys.modules, 'cfgfix.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False False")


def test_check_imports_no_ml_libraries(in_tmp):
    write_project(in_tmp, {"train.py": BROKEN})
    probe = (
        "import sys\nfrom cfgfix.cli import main\n"
        "try:\n main(['check', '--no-cache', '-q'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'deepspeed', 'libcst') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=in_tmp, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip().splitlines()[-1] == "[]"
