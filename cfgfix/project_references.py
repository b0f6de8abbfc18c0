"""Files a launch names that are not there: the training script, the accelerate config, the
DeepSpeed config and the script's own `--config` file, as a launch script wrote them.

A reference counts as missing only when nothing says where else it may come from: the path
is literal (no `$VAR`, `~`, glob or URL), relative (an absolute path is a mount of the
machine that runs it), resolved against every folder the launch may run from (the script's
folder and those above it, the project root, and each literal `cd` before the launch: a
`cd $DIR`, a `cd` to an absolute folder (another machine's) or to a folder the project lacks
makes the launch unreadable), and not mentioned before the launch in its script
(a `cat > ds.json <<EOF`, `cp`, `wget` or generator may make it). README blocks, notebooks
and Dockerfiles are left alone: their paths belong to another machine or to a reader who
is told to make the file first.

Where a file of that name (or stem: `ds_config.json` committed as `ds_config.sh`) exists
elsewhere in the project, it is named: the file may have moved."""

from __future__ import annotations

import os
import re
from pathlib import Path

from cfgfix.core import Span
from cfgfix.documents.files import read_file
from cfgfix.project import _launch_folders, _resolve_in
from cfgfix.records import dataclass

_SKIPPED_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", "site-packages", ".venv", "venv", ".tox",
                 ".mypy_cache", ".pytest_cache", ".cfgfix_cache", "wandb", "outputs", "output", "checkpoints"}
_MAX_WALKED = 50_000
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".py")
_CD = re.compile(r"(?m)^[ \t]*(?:cd|pushd)[ \t]+([^\s;&|]+)")


@dataclass(frozen=True)
class Missing:
    launch: object  # LaunchFacts
    launch_file: Path
    what: str  # "training script" | "accelerate config" | "DeepSpeed config" | "training config"
    written: str
    span: Span
    elsewhere: tuple[str, ...]  # root-relative posix paths of files that may be it


def missing_references(project) -> list[Missing]:
    found = []
    texts: dict[Path, str | None] = {}
    for launch, launch_file in project.launches:
        name = launch_file.name.lower()
        if launch_file.suffix.lower() in (".md", ".ipynb", ".rst") or "dockerfile" in name or "containerfile" in name:
            continue
        if launch_file not in texts:
            texts[launch_file] = _text(launch_file)
        text = texts[launch_file]
        if text is None:
            continue
        before = text[:launch.span.start]
        folders = _cd_folders(before, launch_file, project.root)
        if folders is None:
            continue  # a `cd` to a place the script computes: nothing here can be resolved
        for what, written in _references(launch):
            if not _checkable(written, what):
                continue
            bases = [*folders, *_launch_folders(launch_file, project.root), Path(project.root), Path.cwd()]
            if _resolve_in(written, bases) is not None:
                continue
            if os.path.basename(written.rstrip("/")) in before:
                continue  # named before the launch: the script may make, copy or fetch it
            found.append(Missing(launch, launch_file, what, written, _span_of(launch, written),
                                 _elsewhere(project, written)))
    return found


def _references(launch):
    if launch.script and not launch.module:
        yield "training script", launch.script
    if launch.accelerate_config:
        yield "accelerate config", launch.accelerate_config
    if launch.deepspeed_config:
        yield "DeepSpeed config", launch.deepspeed_config
    if launch.training_config:
        yield "training config", launch.training_config


def _checkable(written: str | None, what: str) -> bool:
    if not written or any(c in written for c in "$`*?{}[]~<>|;") or "://" in written:
        return False
    if os.path.isabs(written) or written.startswith("-") or written in (".", ".."):
        return False
    if what == "training script":
        return written.endswith(".py")
    if what == "training config":
        return written.endswith(_CONFIG_SUFFIXES)  # `--config base` may be a name the script knows
    return True


def _text(path: Path) -> str | None:
    try:
        return read_file(path).decode("utf-8", "replace")
    except OSError:
        return None


def _cd_folders(before: str, launch_file: Path, root) -> list[Path] | None:
    """The folders literal `cd`s before the launch lead to (from the script's folder or the
    root); None when one of them goes somewhere computed, to an absolute folder or to a folder
    the project lacks."""
    folders = []
    for match in _CD.finditer(before):
        target = match.group(1).strip("'\"")
        if target in ("-", "~") or any(c in target for c in "$`*~"):
            return None
        if os.path.isabs(target):
            return None  # a folder of the machine that runs it (`cd /root/autodl-tmp`): its files are unknown here
        here = [base / target for base in (launch_file.parent, Path(root)) if os.path.isdir(base / target)]  # not Path.is_dir: a name over 255 bytes raises there
        if not here:
            return None  # a folder the project does not hold (data fetched later): paths there are unknown
        folders.extend(here)
    return folders


def _span_of(launch, written: str) -> Span:
    for text, span in launch.args:
        if text == written or text.endswith("=" + written):
            return span
    return launch.span


def _elsewhere(project, written: str) -> tuple[str, ...]:
    index = getattr(project, "_files_by_name", None)
    if index is None:
        index = project._files_by_name = _index(Path(project.root))
    name = os.path.basename(written)
    hits = index.get(name, [])
    if not hits:
        stem = os.path.splitext(name)[0]
        hits = [p for n, paths in index.items() if os.path.splitext(n)[0] == stem for p in paths]
    return tuple(sorted(hits)[:3])


def _index(root: Path) -> dict[str, list[str]]:
    """The project's files by name (root-relative posix paths), bounded."""
    index: dict[str, list[str]] = {}
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in files:
            seen += 1
            if seen > _MAX_WALKED:
                return index
            rel = Path(os.path.relpath(os.path.join(folder, name), root)).as_posix()
            index.setdefault(name, []).append(rel)
    return index
