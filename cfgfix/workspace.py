"""Which files to check, and what kind each one is.

The walk is os.scandir with an explicit stack (no directory symlinks followed), so a large
tree costs one scandir per folder and one regex check per entry and ignore file in scope.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

from .settings import DEFAULT_EXCLUDE, Settings


@dataclass(frozen=True)
class SourceFile:
    path: Path  # absolute
    display: str  # posix, relative to the cwd when under it, else absolute
    relpath: str  # posix, relative to settings.root (for per-file-ignores), else display
    kind: str  # "python" | "shell" | "yaml" | "json" | "dockerfile" | "makefile" | "env"


# ---------------------------------------------------------------------- classification

_BY_SUFFIX = {
    ".py": "python", ".pyi": "python",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell",
    ".yaml": "yaml", ".yml": "yaml",
    ".json": "json",
    ".dockerfile": "dockerfile",
    ".mk": "makefile",
    ".env": "env",
}
_BY_NAME = {
    "Dockerfile": "dockerfile", "Containerfile": "dockerfile",
    "Makefile": "makefile", "makefile": "makefile", "GNUmakefile": "makefile",
    ".env": "env",
}
_SHELLS = {"sh", "bash", "zsh", "dash"}
# Launch scripts often carry a shebang and an odd suffix (train.slurm, job.sbatch), so
# unknown suffixes get their first bytes read, except these, which are never scripts and
# are numerous in ML trees (checkpoints, data, docs).
_NO_SHEBANG = frozenset(
    {
        ".txt", ".md", ".rst", ".csv", ".tsv", ".jsonl", ".parquet", ".arrow", ".npy", ".npz", ".pt",
        ".pth", ".bin", ".safetensors", ".ckpt", ".pkl", ".pickle", ".h5", ".hdf5", ".onnx", ".tflite",
        ".msgpack", ".model", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".svg", ".pdf", ".wav",
        ".mp3", ".mp4", ".flac", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".tar", ".whl", ".so",
        ".dylib", ".dll", ".pyc", ".pyd", ".o", ".a", ".ipynb", ".toml", ".cfg", ".ini", ".lock",
        ".log", ".html", ".css", ".js", ".ts", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".rs",
        ".go", ".java", ".tokenizer", ".spm", ".vocab", ".idx", ".db", ".sqlite",
    }
)


def classify(path: Path, head: bytes) -> str | None:
    """The file's kind from its name, else (for shell scripts) from a shebang in `head`."""
    name = path.name
    kind = _BY_NAME.get(name) or _BY_SUFFIX.get(os.path.splitext(name)[1].lower())
    if kind:
        return kind
    if name.startswith(("Dockerfile.", "Containerfile.")):
        return "dockerfile"
    if name.startswith(".env."):
        return "env"
    return "shell" if _shebang_shell(head) else None


def _shebang_shell(head: bytes) -> bool:
    if not head.startswith(b"#!"):
        return False
    words = head[2:].split(b"\n", 1)[0].decode("latin-1").split()
    if words and os.path.basename(words[0]) == "env":  # #!/usr/bin/env [-S] bash
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return bool(words) and os.path.basename(words[0]) in _SHELLS


def _needs_head(name: str) -> bool:
    return os.path.splitext(name)[1].lower() not in _NO_SHEBANG


def _kind_of(path: str, name: str) -> str | None:
    kind = classify(Path(name), b"")
    if kind is None and _needs_head(name):
        try:
            with open(path, "rb") as f:
                kind = classify(Path(name), f.read(128))
        except OSError:
            return None
    return kind


# -------------------------------------------------------------------------- exclusion


class _Patterns:
    """gitignore-style patterns; plain names (the common case) are a set lookup."""

    def __init__(self, patterns):
        self.names = frozenset(p.rstrip("/") for p in patterns if not re.search(r"[/*?\[\]!\\]", p.rstrip("/")))
        globs = [p for p in patterns if p.rstrip("/") not in self.names]
        self.spec = GitIgnoreSpec.from_lines(globs) if globs else None
        self.full = GitIgnoreSpec.from_lines(list(patterns)) if patterns else None

    def hit(self, name: str, rel: str, is_dir: bool) -> bool:
        if name in self.names:
            return True
        return bool(self.spec and self.spec.match_file(rel + "/" if is_dir else rel))


def _read_ignore(path: str) -> GitIgnoreSpec | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return GitIgnoreSpec.from_lines(lines) if any(l.strip() and not l.startswith("#") for l in lines) else None


def _ignores_in(folder: str, names) -> list[tuple[str, GitIgnoreSpec]]:
    # .git/info/exclude ranks below the folder's .gitignore, so it goes first on the stack
    # (the stack is read from the top: the deepest, last-pushed file decides).
    out = []
    candidates = []
    if ".git" in names:
        candidates.append(os.path.join(folder, ".git", "info", "exclude"))
    if ".gitignore" in names:
        candidates.append(os.path.join(folder, ".gitignore"))
    for path in candidates:
        spec = _read_ignore(path)
        if spec is not None:
            out.append((folder, spec))
    return out


def _gitignored(ignores, path: str, is_dir: bool) -> bool:
    for base, spec in reversed(ignores):
        rel = path[len(base.rstrip(os.sep)) + 1 :].replace(os.sep, "/")  # paths are joined onto base
        include = spec.check_file(rel + "/" if is_dir else rel).include
        if include is not None:
            return include
    return False


def _ancestor_ignores(folder: str, root: str) -> list[tuple[str, GitIgnoreSpec]]:
    """.gitignore files above a walked folder: up to the git repository's top, else root."""
    if os.path.isdir(os.path.join(folder, ".git")):
        return []
    chain = []
    d = os.path.dirname(folder)
    while True:
        chain.append(d)
        if os.path.isdir(os.path.join(d, ".git")):
            break
        parent = os.path.dirname(d)
        if parent == d:
            # No repository above: only trust ignore files between root and the folder.
            chain = [c for c in chain if _is_under(c, root)]
            break
        d = parent
    out = []
    for d in reversed(chain):
        names = {n for n in (".git", ".gitignore") if os.path.exists(os.path.join(d, n))}
        out.extend(_ignores_in(d, names))
    return out


# ----------------------------------------------------------------------------- walking


def _is_under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def _rel(path: str, base: str) -> str | None:
    """`path` relative to `base` in posix form ("." for base itself), or None if outside."""
    for p, b in ((path, base), (os.path.realpath(path), os.path.realpath(base))):
        if p == b:
            return "."
        if _is_under(p, b):
            return p[len(b.rstrip(os.sep)) + 1 :].replace(os.sep, "/")
    return None


def discover(paths: list[Path], settings: Settings) -> tuple[list[SourceFile], list[str]]:
    """The files to check under `paths`, sorted by display path, and warnings."""
    cwd = os.path.abspath(os.getcwd())
    root = os.path.abspath(settings.root)
    defaults = _Patterns(DEFAULT_EXCLUDE if settings.exclude is None else ())
    user = _Patterns((settings.exclude or ()) + settings.extend_exclude)
    found: dict[str, SourceFile] = {}
    warnings: list[str] = []

    def add(path: str, kind: str) -> None:
        display = _rel(path, cwd) or Path(path).as_posix()
        found[path] = SourceFile(Path(path), display, _rel(path, root) or display, kind)

    for arg in paths:
        top = os.path.abspath(arg)
        if not os.path.exists(top):
            warnings.append(f"{arg}: path does not exist")
            continue
        # Exclude globs are relative to the settings' root; outside it, to the named path.
        top_rel = _rel(top, root)
        if top_rel is None:
            top_rel = os.path.basename(top)
        is_dir = os.path.isdir(top)
        # Named explicitly: defaults and .gitignore do not apply, the user's excludes do.
        if top_rel != "." and user.full and user.full.match_file(top_rel + "/" if is_dir else top_rel):
            continue
        if not is_dir:
            kind = _kind_of(top, os.path.basename(top))
            if kind:
                add(top, kind)
            continue
        above = _ancestor_ignores(top, root)
        if above and _gitignored(above, top, True):
            above = []  # a folder named explicitly is checked even when .gitignore skips it
        stack = [(top, "" if top_rel == "." else top_rel + "/", above)]
        while stack:
            folder, prefix, ignores = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                warnings.append(f"{folder}: cannot read folder: {exc.strerror}")
                continue
            names = {e.name for e in entries}
            if folder != top and ("pyvenv.cfg" in names or "conda-meta" in names):
                continue  # a virtualenv or conda env: someone else's code
            ignores = ignores + _ignores_in(folder, names)
            for e in entries:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    if not is_dir and not e.is_file():
                        continue  # directory symlinks, sockets, dangling links
                except OSError:
                    continue
                rel = prefix + e.name
                if defaults.hit(e.name, rel, is_dir) or user.hit(e.name, rel, is_dir):
                    continue
                if ignores and _gitignored(ignores, e.path, is_dir):
                    continue
                if is_dir:
                    stack.append((e.path, rel + "/", ignores))
                else:
                    kind = _kind_of(e.path, e.name)
                    if kind:
                        add(e.path, kind)
    return sorted(found.values(), key=lambda f: f.display), warnings
