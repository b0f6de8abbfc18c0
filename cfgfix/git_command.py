"""git, run so that the repository it reads cannot make it run code.

`cfgfix review` (and `verify --before/--after`, to export a revision) read a repository
that may come from anyone. Its `.git/config` can name programs git runs on its own: a
file-system monitor (`core.fsmonitor`, run by `git diff` against the working tree), clean
and smudge filters (run on working-tree files and by `git archive`), diff drivers and
textconv, a pager, an ssh command, credential helpers, hooks. Command-line `-c` beats every
config file (git-config(1), "CONFIGURATION FILE"), so each call:
- sets the keys git always consults to harmless values (fsmonitor off, hooks from
  /dev/null, no transport at all: a partial clone's lazy fetch would run `core.sshCommand`);
- blanks every command-bearing key the repository's config (includes followed) holds, found
  by `git config --list --name-only`, which reads config and runs nothing (an empty filter
  or driver command is no command);
- runs with `--no-pager` in an environment without the GIT_* variables that name programs or
  extra config, prompts off.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# Keys git reads for every command that could reach them.
ALWAYS = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", os.devnull),
    ("core.pager", "cat"),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("core.gitProxy", ""),
    ("core.alternateRefsCommand", ""),
    ("diff.external", ""),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
)

# Command-bearing keys with a subsection (a driver or remote name), and their harmless value.
_PER_NAME = re.compile(
    r"^(?:filter\.(?P<filter>.+)\.(?:clean|smudge|process)"
    r"|filter\.(?P<required>.+)\.required"
    r"|diff\.(?P<diff>.+)\.(?:command|textconv)"
    r"|merge\.(?P<merge>.+)\.driver"
    r"|credential\..+\.helper"
    r"|pager\..+"
    r"|gpg(?:\..+)?\.program"
    r"|remote\..+\.(?:uploadpack|receivepack|vcs|proxy)"
    r"|(?:sequence|core)\.editor"
    r"|uploadpack\.packobjectshook"
    r"|include(?:if)?\..*)$",
    re.IGNORECASE,
)

# Environment variables that name programs or bring in config; never passed to git.
_DROPPED_ENV = re.compile(
    r"^GIT_(?:EXTERNAL_DIFF|PAGER|EDITOR|SEQUENCE_EDITOR|SSH|SSH_COMMAND|SSH_VARIANT|ASKPASS|PROXY_COMMAND"
    r"|CONFIG_COUNT|CONFIG_KEY_\d+|CONFIG_VALUE_\d+|CONFIG_PARAMETERS|EXEC_PATH|TRACE\w*|DIR|WORK_TREE"
    r"|INDEX_FILE|OBJECT_DIRECTORY|ALTERNATE_OBJECT_DIRECTORIES|CEILING_DIRECTORIES|NAMESPACE|COMMON_DIR)$"
)

_overrides_by_root: dict[str, list[str]] = {}


def environment(base=None) -> dict:
    env = {k: v for k, v in (os.environ if base is None else base).items() if not _DROPPED_ENV.match(k)}
    env.update(GIT_PAGER="cat", GIT_TERMINAL_PROMPT="0", GIT_NO_LAZY_FETCH="1", GIT_OPTIONAL_LOCKS="0")
    env.pop("SSH_ASKPASS", None)
    return env


def neutral_value(key: str) -> str | None:
    """The value that makes a config key run nothing, or None for a key that runs nothing."""
    match = _PER_NAME.match(key)
    if match is None:
        return None
    if match.group("required") is not None:
        return "false"
    if key.lower().startswith("include"):
        return None  # includes are followed by the listing; their keys are overridden one by one
    return ""


def overrides(cwd: Path, timeout: float = 60) -> list[str]:
    """The `-c key=value` arguments for git calls in `cwd`'s repository (memoised per folder)."""
    root = str(Path(cwd).resolve())
    if root in _overrides_by_root:
        return _overrides_by_root[root]
    args: list[str] = []
    for key, value in ALWAYS:
        args += ["-c", f"{key}={value}"]
    base = ["git", "--no-pager", *args]
    try:
        done = subprocess.run([*base, "config", "--list", "--name-only", "-z"], cwd=root, env=environment(),
                              capture_output=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        names = done.stdout.decode("utf-8", "surrogateescape").split("\0") if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    for name in dict.fromkeys(n.strip() for n in names if n.strip()):
        value = neutral_value(name)
        if value is not None and "=" not in name:
            args += ["-c", f"{name}={value}"]
    _overrides_by_root[root] = args
    return args


def command(cwd: Path, *args: str) -> list[str]:
    """The argv of a safe `git ARGS` in `cwd`."""
    return ["git", "--no-pager", *overrides(cwd), *args]


def run(cwd: Path, *args: str, timeout: float | None = 120) -> subprocess.CompletedProcess:
    """Run a safe `git ARGS` in `cwd`, output captured, stdin closed. FileNotFoundError when
    git is missing and subprocess.TimeoutExpired pass to the caller."""
    return subprocess.run(command(cwd, *args), cwd=cwd, env=environment(), capture_output=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
