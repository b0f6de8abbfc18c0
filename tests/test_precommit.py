"""The real pre-commit runs cfgfix's hooks in a temporary git repository that holds a known
anti-pattern: from a clone of this repository tagged by the release process (the README's
snippet as a user's `.pre-commit-config.yaml`, and `pre-commit try-repo --ref`), and from
the working tree itself (`pre-commit try-repo`, uncommitted hook changes included).

pre-commit installs each hook environment with `pip install` of the repository, which needs
PyPI for cfgfix's dependencies; one PRE_COMMIT_HOME per module keeps it to one install per
repository and revision."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO
from test_cli import BROKEN, FIXED

import cfgfix

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
README_URL = "https://github.com/cfgfix/cfgfix"


def _readme_snippet() -> str:
    """The YAML block of the README's pre-commit section, as a user copies it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## pre-commit\n", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_pins_this_version():
    """The snippet pins the tag this version's release creates (docs/releasing.md), and
    names the hooks the repository defines."""
    snippet = _readme_snippet()
    assert re.search(r"^    rev: (\S+)$", snippet, re.MULTILINE).group(1) == f"v{cfgfix.__version__}"
    assert f"  - repo: {README_URL}\n" in snippet
    hooks = (REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    ids = re.findall(r"^- id: (\S+)$", hooks, re.MULTILINE)
    assert ids == ["cfgfix", "cfgfix-fix"]
    assert re.findall(r"- id: (\S+)", snippet) == ids
    assert re.search(r"id: cfgfix\n(?:  .*\n)*?  entry: cfgfix check\n", hooks)
    assert re.search(r"id: cfgfix-fix\n(?:  .*\n)*?  entry: cfgfix fix\n", hooks)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    pytest.importorskip("pre_commit")
    home = tmp_path_factory.mktemp("pre-commit-home")
    # no PYTHONPATH: the hooks must run the cfgfix that pre-commit installed, not this checkout
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PRE_COMMIT_HOME")}
    return {**base, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1", "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
            "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}


def _git(cwd, env, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _pre_commit(cwd, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pre_commit", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=900, check=False)


@pytest.fixture(scope="module")
def release(tmp_path_factory, env):
    """A clone of this repository at the tested commit, tagged as a release is: with
    `make release-tag` (docs/releasing.md). Returns (clone, tag)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    try:
        commit = _git(REPO, env, "rev-parse", "HEAD").strip()
    except subprocess.CalledProcessError:
        pytest.skip("not a git checkout")
    clone = tmp_path_factory.mktemp("release") / "cfgfix"
    _git(clone.parent, env, "clone", "--quiet", "--no-checkout", str(REPO), str(clone))
    _git(clone, env, "checkout", "--quiet", "--detach", commit)
    made = subprocess.run(["make", "release-tag"], cwd=clone, env=env, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    tag = f"v{cfgfix.__version__}"
    assert _git(clone, env, "rev-parse", f"{tag}^{{commit}}").strip() == commit
    return clone, tag


def _user_repo(path, env):
    path.mkdir()
    (path / "train.py").write_text(BROKEN)
    _git(path, env, "init", "-q")
    _git(path, env, "add", "train.py")
    return path


def _use_config(repo, env, text: str) -> None:
    (repo / ".pre-commit-config.yaml").write_text(text)
    _git(repo, env, "add", ".pre-commit-config.yaml")  # pre-commit refuses an unstaged config


def test_readme_snippet_as_written(tmp_path, env, release):
    """The README's snippet, with only `repo:` pointing at the local clone: `rev:` is the
    tag the release made, the `cfgfix` hook fails on the finding, `cfgfix-fix` (the
    snippet's commented alternative) rewrites the file."""
    clone, _ = release
    snippet = _readme_snippet()
    assert README_URL in snippet
    check_config = snippet.replace(README_URL, str(clone))
    fix_config = check_config.replace("      - id: cfgfix        # check\n", "").replace("# - id: cfgfix-fix", "- id: cfgfix-fix")
    assert "- id: cfgfix-fix" in fix_config and "id: cfgfix " not in fix_config
    repo = _user_repo(tmp_path / "user-repo", env)

    _use_config(repo, env, check_config)
    failed = _pre_commit(repo, env, "run", "--all-files")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "train.py:4:9: CFX101" in failed.stdout and "train.py:5:1: CFX103" in failed.stdout
    assert (repo / "train.py").read_text() == BROKEN  # the check hook writes nothing

    _use_config(repo, env, fix_config)
    fixed = _pre_commit(repo, env, "run", "--all-files")
    assert fixed.returncode == 1, fixed.stdout + fixed.stderr  # pre-commit fails a hook that modified files
    assert "files were modified by this hook" in fixed.stdout
    # safe fixes only: CFX103's move goes, CFX101's (unsafe) cast stays and is reported
    assert (repo / "train.py").read_text() == BROKEN.replace("model.to(device)\n", "")
    assert "CFX101" in fixed.stdout

    _use_config(repo, env, check_config)
    (repo / "train.py").write_text(FIXED)
    passed = _pre_commit(repo, env, "run", "--all-files")
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_try_repo_at_the_release_tag(tmp_path, env, release):
    clone, tag = release
    repo = _user_repo(tmp_path / "user-repo", env)
    failed = _pre_commit(repo, env, "try-repo", str(clone), "cfgfix", "--ref", tag, "--all-files")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "train.py:5:1: CFX103 [*]" in failed.stdout


def test_working_tree_round_trip(tmp_path, env):
    """`pre-commit try-repo` of this checkout as it is (uncommitted changes too)."""
    repo = _user_repo(tmp_path / "user-repo", env)

    def try_repo(hook):
        return _pre_commit(repo, env, "try-repo", str(REPO), hook, "--all-files")

    failed = try_repo("cfgfix")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "train.py:4:9: CFX101" in failed.stdout
    assert "train.py:5:1: CFX103" in failed.stdout

    fixed = try_repo("cfgfix-fix")
    assert fixed.returncode == 1  # pre-commit fails a hook that modified files
    assert "files were modified by this hook" in fixed.stdout
    assert (repo / "train.py").read_text() == BROKEN.replace("model.to(device)\n", "")

    again = try_repo("cfgfix")
    assert again.returncode == 1 and "CFX101" in again.stdout and "CFX103" not in again.stdout
    (repo / "train.py").write_text(FIXED)
    passed = try_repo("cfgfix")
    assert passed.returncode == 0, passed.stdout + passed.stderr
