"""Settings like ruff's (issue 23): every file uses the closest config file above it, that
file's folder is its project (launches, GPU, cache), `--config` and `--isolated` override the
search, and every command takes the same settings options, each bad value an error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, write_project

from cfgfix.commands import cli

FLAN = Path("fixtures/flan-t5-xl-trainer/project")
TRAIN = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.to(device)\n"
)


def cfgfix(args, cwd) -> tuple[int, str]:
    """The real command line (`python -m cfgfix`, the fast path for `check`)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1",
           "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "cfgfix", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          check=False)
    return done.returncode, done.stdout + done.stderr


def run(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def findings(out: str, prefix: str = "") -> list[tuple]:
    """(path without `prefix`, line, code, message) of each finding in JSON output."""
    rows = []
    for f in json.loads(out):
        path = f["filename"]
        assert path.startswith(prefix), (path, prefix)
        rows.append((path[len(prefix):], f["location"]["row"], f["code"], f["message"].replace(prefix, "")))
    return sorted(rows)


# ----------------------------------------------------------- a project checked from outside


def test_check_of_a_project_from_the_repository_root_equals_check_from_inside():
    code_in, inside = cfgfix(["check", ".", "--no-cache", "--output-format", "json"], REPO / FLAN)
    code_out, outside = cfgfix(["check", str(FLAN), "--no-cache", "--output-format", "json"], REPO)
    assert code_in == code_out == 1
    from_inside = findings(inside)
    assert from_inside == findings(outside, FLAN.as_posix() + "/")
    assert "CFX701" in {code for _, _, code, _ in from_inside}  # its cfgfix.toml's GPU (RTX 5090)


def test_estimate_and_fit_of_a_path_use_that_paths_gpu(monkeypatch):
    monkeypatch.chdir(REPO)
    code, out = run("estimate", str(FLAN), "--no-cache", "--output-format", "json")
    assert code == 1, out  # the story's run does not fit its RTX 5090
    assert {row["estimate"]["gpu"]["name"] for row in json.loads(out) if row.get("estimate")} == {"RTX 5090"}
    code, out = run("fix", "--fit", "--diff", "--no-cache", str(FLAN))
    assert code == 1, out  # a plan that would change the config
    assert "does not fit RTX 5090" in out and "fits RTX 5090" in out
    code, out = run("explain", str(FLAN), "--no-cache", "--output-format", "json")
    assert code == 0 and json.loads(out)[0]["settings"]["gpu"]["value"] == "RTX 5090"
    code, out = run("explain", str(FLAN), "--isolated", "--no-cache", "--output-format", "json")
    assert code == 0 and json.loads(out)[0]["settings"].get("gpu") is None


# ---------------------------------------------------------------------------- nested configs


@pytest.fixture
def nested(tmp_path):
    """A parent project and a subproject with its own config, each with a per-file ignore
    (and sub/ an exclude) relative to its own folder."""
    write_project(tmp_path, {
        "cfgfix.toml": '[per-file-ignores]\n"/train.py" = ["CFX103"]\n"/sub/other.py" = ["CFX103"]\n',
        "train.py": TRAIN,
        "skipped/train.py": TRAIN,
        "sub/cfgfix.toml": 'extend-exclude = ["/skipped"]\n[per-file-ignores]\n"/quiet.py" = ["CFX103"]\n',
        "sub/train.py": TRAIN,
        "sub/other.py": TRAIN,
        "sub/quiet.py": TRAIN,
        "sub/skipped/train.py": TRAIN,
    })
    return tmp_path


def _codes_by_file(out: str, prefix: str = "") -> dict[str, set[str]]:
    by_file: dict[str, set[str]] = {}
    for path, _, code, _ in findings(out, prefix):
        by_file.setdefault(path, set()).add(code)
    return by_file


def test_a_subfolders_config_replaces_the_parents_for_its_files_only(nested):
    code, out = cfgfix(["check", "--no-cache", "--output-format", "json"], nested)
    assert code == 1, out
    # sub/ uses its own config, not merged with the parent's: the parent's per-file-ignores for
    # sub/other.py do not reach it; sub's own "/quiet.py" and exclude "/skipped" are relative to
    # sub/ (sub/skipped is left out, skipped/ is not); the parent's "/train.py" is its own only
    assert _codes_by_file(out) == {"skipped/train.py": {"CFX103"}, "sub/train.py": {"CFX103"},
                                   "sub/other.py": {"CFX103"}}


def test_nested_config_from_the_parent_equals_from_inside(nested):
    _, inside = cfgfix(["check", "--no-cache", "--output-format", "json"], nested / "sub")
    _, outside = cfgfix(["check", "sub", "--no-cache", "--output-format", "json"], nested)
    assert findings(inside) == findings(outside, "sub/") != []


def test_cached_results_of_one_config_never_serve_another(nested):
    """Each settings file keeps its cache under its own folder, keyed by its settings: a warm
    run gives what a cold one gives, from either folder, and an edited config takes effect."""
    cold = findings(cfgfix(["check", "--no-cache", "--output-format", "json"], nested)[1])
    for _ in range(2):
        assert findings(cfgfix(["check", "--output-format", "json"], nested)[1]) == cold
    assert (nested / "sub" / ".cfgfix_cache").is_dir()
    inside = findings(cfgfix(["check", "--output-format", "json"], nested / "sub")[1])
    assert inside == [(p.removeprefix("sub/"), *rest) for p, *rest in cold if p.startswith("sub/")]
    (nested / "sub" / "cfgfix.toml").write_text('ignore = ["CFX103"]\n')
    code, out = cfgfix(["check", "--output-format", "json"], nested)
    assert code == 1 and set(_codes_by_file(out)) == {"skipped/train.py"}


def test_config_flag_applies_one_file_to_every_file_and_isolated_reads_none(nested):
    code, out = cfgfix(["check", "--no-cache", "--output-format", "json", "--config", "cfgfix.toml"], nested)
    # the parent's settings for sub/ too: its ignore for sub/other.py, and not sub's own
    assert set(_codes_by_file(out)) == {"skipped/train.py", "sub/train.py", "sub/quiet.py", "sub/skipped/train.py"}
    code, out = cfgfix(["check", "--no-cache", "--output-format", "json", "--isolated"], nested)
    every = {"train.py", "skipped/train.py", "sub/train.py", "sub/other.py", "sub/quiet.py", "sub/skipped/train.py"}
    assert code == 1 and set(_codes_by_file(out)) == every
    code, out = run("check", "--config", "cfgfix.toml", "--isolated")
    assert code == 2 and "--config and --isolated cannot be used together" in out


def test_a_config_file_of_each_kind_is_found_and_ruffs_ranking_decides_in_one_folder(tmp_path):
    from cfgfix.settings_tree import SettingsTree

    write_project(tmp_path, {
        "pyproject.toml": '[tool.cfgfix]\nselect = ["CFX1"]\n',
        "a/pyproject.toml": '[project]\nname = "a"\n',  # no [tool.cfgfix]: not a config
        "b/cfgfix.toml": 'select = ["CFX2"]\n',
        "b/pyproject.toml": '[tool.cfgfix]\nselect = ["CFX3"]\n',
        "c/.cfgfix.toml": 'select = ["CFX4"]\n',
        "c/cfgfix.toml": 'select = ["CFX5"]\n',
    })
    tree = SettingsTree(tmp_path)
    assert tree.for_path(tmp_path / "a" / "x.py").select == ("CFX1",)
    assert tree.for_path(tmp_path / "b" / "x.py").select == ("CFX2",)  # cfgfix.toml over pyproject.toml
    assert tree.for_path(tmp_path / "c" / "x.py").select == ("CFX4",)  # .cfgfix.toml over cfgfix.toml
    assert tree.for_path(tmp_path / "c" / "x.py") is tree.for_path(tmp_path / "c")  # one object per file


def test_a_broken_nested_config_is_an_error_naming_it(nested):
    (nested / "sub" / "cfgfix.toml").write_text('slect = ["CFX1"]\n')
    code, out = cfgfix(["check", "--no-cache"], nested)
    assert code == 2 and "sub/cfgfix.toml: unknown key 'slect'" in out and "did you mean 'select'" in out


# ------------------------------------------------------------------------- the same options


@pytest.mark.parametrize("command", ["check", "fix", "explain", "estimate", "review"])
def test_every_command_takes_the_shared_settings_options(command):
    _, out = run(command, "--help")
    for option in ("--config", "--isolated", "--no-cache", "--gpu"):
        assert option in out, (command, option)
    if command not in ("explain", "estimate"):
        for option in ("--select", "--ignore", "--extend-select"):
            assert option in out, (command, option)


def test_explain_and_estimate_accept_config_and_no_cache(in_tmp):
    write_project(in_tmp, {"train.py": TRAIN, "run.sh": "python train.py\n", "conf/gpu.toml": 'gpu = "A100 80GB"\n'})
    # estimate exits 1: the files leave the sequence length and the micro batch open, so the
    # answer is conditional ("fits only if the sequence length is <= ..."), not "fits"
    for command, expected in (("explain", 0), ("estimate", 1)):
        code, out = run(command, "--no-cache", "--config", "conf/gpu.toml")
        assert code == expected and "A100 80GB" in out, (command, out)
    assert not (in_tmp / ".cfgfix_cache").exists()


# ------------------------------------------------------------------- bad values are errors


@pytest.mark.parametrize("args, message", [
    (["check", "--gpu", ""], "--gpu must be a GPU name"),
    (["explain", "--gpu", ""], "--gpu must be a GPU name"),
    (["estimate", "--gpu", ""], "--gpu must be a GPU name"),
    (["estimate", "--params", "1e9", "--gpu", ""], "--gpu must be a GPU name"),
    (["fix", "--fit", "--gpu", ""], "--gpu must be a GPU name"),
    (["check", "--gpu", "RTX 4090 Ti"], "unknown GPU 'RTX 4090 Ti'; did you mean one of 'RTX 4090', "),
    (["estimate", "--model", ""], "--model: empty"),
    (["estimate", "--model", "gpt2", "--target-seq", "128"], "--target-seq: the decoder's length of an encoder-decoder"),
    (["estimate", "--params", "1e9", "--target-seq", "128"], "--target-seq: the decoder's length"),
    (["estimate", "--batch", "4"], "--batch: describe a run for --model/--params"),
    (["estimate", "--model", "gpt2", "."], "PATHS are for the project mode"),
    (["check", "--select", ""], "--select: no rule code given"),
    (["check", "--ignore", ""], "--ignore: no rule code given"),
    (["check", "--select", "CFX1033"], "--select: unknown rule selector 'CFX1033'; did you mean 'CFX103'?"),
    (["check", "--ignore", "cfx103"], "--ignore: unknown rule selector 'cfx103'; did you mean 'CFX103'?"),
    (["review", "--select", "CFX1033"], "did you mean 'CFX103'?"),
    (["check", "--config", "nope.toml"], "--config: "),
])
def test_an_empty_or_unknown_value_is_an_error_naming_the_option(in_tmp, args, message):
    write_project(in_tmp, {"train.py": TRAIN})
    code, out = run(*args)
    assert code == 2, out
    assert message in out
    if args[0] == "check":  # the fast path (no click) says the same
        fast_code, fast_out = cfgfix(args, in_tmp)
        assert (fast_code, message in fast_out) == (2, True), fast_out


def test_target_seq_is_read_for_a_t5_model():
    code, out = run("estimate", "--model", "google/flan-t5-xl", "--seq", "512", "--target-seq", "128")
    assert code == 0 and "T5 target length unknown" not in out


def test_no_config_above_a_file_keeps_the_current_folders_settings(tmp_path, monkeypatch):
    """A file outside every config's folder uses the settings found from the cwd, as before."""
    write_project(tmp_path, {"proj/cfgfix.toml": 'ignore = ["CFX103"]\n', "elsewhere/train.py": TRAIN})
    monkeypatch.chdir(tmp_path / "proj")
    code, out = run("check", "--no-cache", os.path.join("..", "elsewhere", "train.py"))
    assert code == 0, out


def test_fix_applies_each_files_own_settings(nested):
    code, out = run_in(nested, "fix", "--no-cache")
    assert code == 0, out
    unfixed = {"train.py", "sub/quiet.py", "sub/skipped/train.py"}  # ignored where they are, or excluded
    for path in ("skipped/train.py", "sub/train.py", "sub/other.py", *unfixed):
        fixed = "model.to(device)" not in (nested / path).read_text()
        assert fixed == (path not in unfixed), path


def run_in(folder: Path, *args) -> tuple[int, str]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return run(*args)
    finally:
        os.chdir(cwd)


def test_an_unknown_rule_code_says_did_you_mean():
    code, out = run("rule", "CFX1033")
    assert code == 2 and "unknown rule code 'CFX1033'; did you mean 'CFX103'?" in out


def test_another_projects_pyproject_is_not_parsed(tmp_path):
    """A vendored package's pyproject.toml (even an invalid one) is not a cfgfix config."""
    write_project(tmp_path, {"cfgfix.toml": 'ignore = ["CFX103"]\n', "vendor/pkg/pyproject.toml": "[project\nname=",
                             "vendor/pkg/train.py": TRAIN})
    code, out = cfgfix(["check", "--no-cache"], tmp_path)
    assert code == 0, out
