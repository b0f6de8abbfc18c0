"""Two throw-away copies of the user's workspace: as it is and with cfgfix's fixes applied,
or the files of two git revisions.

What is copied: everything under the folder except version-control and tool folders
(SKIP_NAMES), virtual environments (a folder holding `pyvenv.cfg`), any file larger than
MAX_FILE_BYTES and any folder whose kept files add up to more than MAX_FOLDER_BYTES
(datasets, checkpoints). What was left out is listed in the report, since a script that
reads it will fail in both copies. Symbolic links are copied as links.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from cfgfix import git_command
from cfgfix.records import dataclass, field

SKIP_NAMES = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".cfgfix_cache", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".tox", ".nox", "node_modules", ".ipynb_checkpoints",
    "wandb", "mlruns",
})
MAX_FILE_BYTES = 64 * 2**20
MAX_FOLDER_BYTES = 256 * 2**20


class WorkspaceError(Exception):
    pass


@dataclass
class Copy:
    root: Path  # the copy of the folder the command runs in
    left_out: list[str] = field(default_factory=list)  # "data/ (1.2 GiB)"
    tree: Path | None = None  # a revision's copy: the repository's top (root is a folder in it)


@dataclass(frozen=True)
class AppliedFix:
    path: str
    line: int
    code: str
    safe: bool


def copy_workspace(source: Path, dest: Path, exclude: frozenset[str] = frozenset()) -> Copy:
    """Copy `source` into `dest` (created) under the rules above; `exclude` holds posix
    paths relative to `source` that are not copied (a revision's tracked files)."""
    files, _size, left_out = _plan(source, "", exclude)
    dest.mkdir(parents=True, exist_ok=True)
    for rel, is_link in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_link:
            os.symlink(os.readlink(source / rel), target)
        else:
            shutil.copy2(source / rel, target)
    return Copy(dest, left_out)


def _plan(folder: Path, prefix: str, exclude: frozenset[str]):
    """(files to copy as (relative path, is_link), their bytes, left-out notes)."""
    files, size, left_out = [], 0, []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        return [], 0, [f"{prefix or '.'} (unreadable: {exc.strerror})"]
    if any(e.name == "pyvenv.cfg" for e in entries) and prefix:
        return [], 0, [f"{prefix}/ (a virtual environment)"]
    for entry in entries:
        rel = f"{prefix}/{entry.name}" if prefix else entry.name
        if entry.name in SKIP_NAMES or rel in exclude:
            continue
        if entry.is_symlink():
            files.append((rel, True))
        elif entry.is_dir():
            sub_files, sub_size, sub_left = _plan(Path(entry.path), rel, exclude)
            left_out.extend(sub_left)
            if sub_size > MAX_FOLDER_BYTES:
                left_out.append(f"{rel}/ ({_size(sub_size)})")
                continue
            files.extend(sub_files)
            size += sub_size
        elif entry.is_file():
            nbytes = entry.stat().st_size
            if nbytes > MAX_FILE_BYTES:
                left_out.append(f"{rel} ({_size(nbytes)})")
                continue
            files.append((rel, False))
            size += nbytes
    return files, size, left_out


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def apply_fixes(root: Path, unsafe: bool, selection: dict | None = None, config_file: Path | None = None,
                isolated: bool = False) -> list[AppliedFix]:
    """Apply cfgfix's fixes inside the copy at `root`, as `cfgfix fix` would there: each file
    with its closest settings file in the copy (or `config_file` / `isolated`, as the
    command line says), `selection` ({"select": [...], "ignore": [...], "extend_select":
    [...]}) over them; safe fixes, plus unsafe ones when asked. Returns what changed."""
    from cfgfix.core import Applicability
    from cfgfix.engine import Engine
    from cfgfix.fixing import WriteError, fix_file, wanted, write_atomically
    from cfgfix.settings import SettingsError, with_overrides
    from cfgfix.settings_tree import SettingsTree
    from cfgfix.workspace import discover_groups

    try:
        tree = SettingsTree(root, config_file, isolated, lambda s: with_overrides(s, **(selection or {})))
        groups, _warnings = discover_groups([root], tree)
    except SettingsError as exc:
        raise WorkspaceError(str(exc)) from None
    applied = []
    for settings, files in groups:
        engine = Engine(settings, use_cache=False, tree=tree)  # never write a cache into the copy
        result = engine.run(files)
        for sf in files:
            if not any(f.path == sf.display and wanted(f, unsafe) for f in result.findings):
                continue
            outcome = fix_file(engine, sf, sf.path.read_bytes(), unsafe)
            if outcome is None or not outcome.changed:
                continue
            try:
                write_atomically(sf.path, outcome.source.to_bytes(), settings.root)
            except WriteError as exc:
                raise WorkspaceError(str(exc)) from None
            rel = sf.path.relative_to(root).as_posix()
            for finding in outcome.applied:
                applied.append(AppliedFix(rel, finding.span.line, finding.code,
                                          finding.fix.applicability is Applicability.SAFE))
    return applied


# -- git revisions ------------------------------------------------------------------------
def _git(folder: Path, *args: str) -> bytes:
    try:
        # the checked repository's config runs nothing (cfgfix/git_command.py): `git archive`
        # would run its smudge filters
        done = git_command.run(folder, *args, timeout=None)
    except FileNotFoundError:
        raise WorkspaceError("git is not installed") from None
    if done.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def export_revision(folder: Path, ref: str, dest: Path) -> Copy:
    """The files of revision `ref` (read with `git archive`, which changes no git state),
    plus the folder's untracked and ignored files (data, local configs) under the copy
    rules. The command then runs in the same sub-folder of the copy as `folder` is."""
    top = Path(_git(folder, "rev-parse", "--show-toplevel").decode().strip())
    prefix = _git(folder, "rev-parse", "--show-prefix").decode().strip()
    commit = _git(folder, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()
    archive = _git(top, "archive", "--format=tar", commit)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python without extraction filters (< 3.10.12 / 3.11.4)
            tar.extractall(dest)
    tracked = frozenset(p for p in _git(folder, "ls-files", "-z").decode().split("\0") if p)
    run_root = dest / prefix if prefix else dest
    extra = copy_workspace(folder, run_root, exclude=tracked)
    return Copy(run_root, extra.left_out, dest)


def revision_top(folder: Path) -> Path:
    return Path(_git(folder, "rev-parse", "--show-toplevel").decode().strip())


def revision_commit(folder: Path, ref: str) -> str:
    return _git(folder, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()
