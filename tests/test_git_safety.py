"""`cfgfix review` and `verify --before/--after` never run code the checked repository's git
config or hooks name (issue 24): every program a planted config can make git start writes a
marker file, and no marker may appear."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix import git_command
from cfgfix.commands import cli

pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
                                reason="needs git")

TRAIN = '''import torch
from transformers import AutoModelForCausalLM, Trainer

model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
trainer = Trainer(model=model)
trainer.train()
'''


def _git(root: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull)
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


def _plant(root: Path, marks: Path) -> list[str]:
    """Every way a repository's own files can name a program for git to run."""
    def program(name: str) -> str:
        script = marks / f"{name}.sh"
        script.write_text(f"#!/bin/sh\ntouch '{marks}/{name}.ran'\ncat\n")
        script.chmod(0o755)
        return str(script)

    names = []
    config = {
        "core.fsmonitor": "fsmonitor", "core.pager": "pager", "pager.diff": "pager_diff",
        "core.sshCommand": "ssh", "core.askPass": "askpass", "core.editor": "editor",
        "diff.external": "external_diff", "diff.evil.textconv": "textconv", "diff.evil.command": "diff_command",
        "filter.evil.clean": "clean", "filter.evil.smudge": "smudge", "filter.evil.process": "filter_process",
        "credential.helper": "credential", "gpg.program": "gpg", "core.alternateRefsCommand": "alternate_refs",
    }
    for key, name in config.items():
        _git(root, "config", key, program(name))
        names.append(name)
    _git(root, "config", "filter.evil.required", "true")
    # an included file, as `[include] path = ...` in .git/config
    included = marks / "included.gitconfig"
    included.write_text(f"[merge \"evil\"]\n\tdriver = {program('merge_driver')}\n"
                        f"[diff \"other\"]\n\ttextconv = {program('included_textconv')}\n")
    names += ["merge_driver", "included_textconv"]
    _git(root, "config", "include.path", str(included))
    (root / ".gitattributes").write_text("*.py filter=evil diff=evil merge=evil\n*.sh diff=other\n")
    hooks = root / ".git" / "hooks"
    for hook in ("pre-commit", "post-checkout", "reference-transaction", "fsmonitor-watchman", "post-index-change"):
        path = hooks / hook
        path.write_text(f"#!/bin/sh\ntouch '{marks}/hook-{hook}.ran'\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return names


@pytest.fixture
def hostile_repo(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    marks = tmp_path / "marks"
    root.mkdir()
    marks.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "train.py").write_text(TRAIN)
    (root / "run.sh").write_text("#!/bin/bash\npython train.py\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "checkout", "-qb", "feature")
    (root / "train.py").write_text(TRAIN.replace("trainer = ", "model = model.to(torch.bfloat16)\ntrainer = "))
    (root / "run.sh").write_text("#!/bin/bash\ntorchrun --nproc_per_node 2 train.py\n")
    _git(root, "commit", "-qam", "pr")
    names = _plant(root, marks)
    (root / "train.py").write_text((root / "train.py").read_text() + "# working tree edit\n")
    os.utime(root / "train.py", (1, 1))  # an old mtime: git must look at the content (and would filter it)
    (root / "new_file.py").write_text(TRAIN)
    monkeypatch.chdir(root)
    for name in ("GITHUB_BASE_REF", "GITHUB_EVENT_PATH", "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    git_command._overrides_by_root.clear()
    return root, marks, names


def test_the_plants_do_run_under_plain_git(hostile_repo):
    """The control: the same repository makes a plain `git diff` run the planted programs."""
    root, marks, _ = hostile_repo
    subprocess.run(["git", "diff", "main"], cwd=root, capture_output=True, check=False)
    subprocess.run(["git", "archive", "HEAD"], cwd=root, capture_output=True, check=False)
    ran = sorted(p.name for p in marks.glob("*.ran"))
    assert {"fsmonitor.ran", "filter_process.ran"} <= set(ran), ran


def test_review_runs_nothing_the_repository_names(hostile_repo):
    root, marks, _ = hostile_repo
    for args in (["--base", "main"], ["--base", "main", "--head", "HEAD"], ["--base", "main", "--output-format", "rdjson"]):
        result = CliRunner().invoke(cli, ["review", "--no-cache", *args])
        assert result.exit_code in (0, 1), result.output
        assert "CFX101" in result.output or "redundant-dtype-cast" in result.output
    assert sorted(p.name for p in marks.glob("*.ran")) == []


def test_verify_export_runs_nothing_the_repository_names(hostile_repo, tmp_path):
    from cfgfix.verify.workspace import export_revision

    root, marks, _ = hostile_repo
    export_revision(root, "main", tmp_path / "copy")
    assert (tmp_path / "copy" / "train.py").is_file()
    assert sorted(p.name for p in marks.glob("*.ran")) == []


def test_every_planted_key_is_overridden(hostile_repo):
    root, _, _ = hostile_repo
    args = git_command.overrides(root)
    given = {args[i + 1].split("=", 1)[0].lower() for i in range(0, len(args), 2)}
    for key in ("core.fsmonitor", "core.pager", "pager.diff", "core.sshcommand", "diff.external",
                "diff.evil.textconv", "diff.evil.command", "filter.evil.clean", "filter.evil.smudge",
                "filter.evil.process", "filter.evil.required", "merge.evil.driver", "diff.other.textconv",
                "credential.helper", "gpg.program", "core.hookspath"):
        assert key in given, key


def test_the_environment_names_no_program(monkeypatch):
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", "touch /tmp/x")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_SSH_COMMAND", "touch /tmp/y")
    env = git_command.environment()
    for name in ("GIT_EXTERNAL_DIFF", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_SSH_COMMAND"):
        assert name not in env
    assert env["GIT_PAGER"] == "cat" and env["GIT_TERMINAL_PROMPT"] == "0"
