"""The real pre-commit runs the hooks from this checkout (`pre-commit try-repo`) in a
temporary git repository that holds a known anti-pattern."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from test_cli import BROKEN, FIXED

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _try_repo(cwd, hook, env):
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), hook, "--all-files"],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=600,
    )


def test_pre_commit_round_trip(tmp_path):
    pytest.importorskip("pre_commit")
    repo = tmp_path / "user-repo"
    repo.mkdir()
    (repo / "train.py").write_text(BROKEN)
    _git(repo, "init", "-q")
    _git(repo, "add", "train.py")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    env.setdefault("GIT_AUTHOR_NAME", "t")

    failed = _try_repo(repo, "cfgfix", env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "train.py:4:9: CFX101" in failed.stdout
    assert "train.py:5:1: CFX103" in failed.stdout

    fixed = _try_repo(repo, "cfgfix-fix", env)
    assert fixed.returncode == 1  # pre-commit fails a hook that modified files
    assert "files were modified by this hook" in fixed.stdout
    # the hook applies safe fixes only: CFX103's move goes, CFX101's (unsafe) cast stays
    assert (repo / "train.py").read_text() == BROKEN.replace("model.to(device)\n", "")

    again = _try_repo(repo, "cfgfix", env)
    assert again.returncode == 1 and "CFX101" in again.stdout and "CFX103" not in again.stdout
    (repo / "train.py").write_text(FIXED)
    passed = _try_repo(repo, "cfgfix", env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
