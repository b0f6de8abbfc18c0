"""Which files to check, and what kind each one is.

The walk is os.scandir with an explicit stack (no directory symlinks followed), so a large
tree costs one scandir per folder and one regex check per entry and ignore file in scope.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path

from cfgfix.records import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (issue 15)

from .documents.files import is_regular_file, read_file
from .settings import DEFAULT_EXCLUDE, Settings
from .settings_tree import SettingsTree

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec


@dataclass(frozen=True)
class SourceFile:
    """A file the run reads, with its paths and its kind."""

    path: Path  # absolute
    display: str  # posix, relative to the cwd when under it, else absolute
    relpath: str  # posix, relative to settings.root (for per-file-ignores), else display
    kind: str  # "python" | "notebook" | "shell" | "yaml" | "json" | "dockerfile" | "makefile" | "env" | "markdown"
    # named on the command line (or passed by a pre-commit hook), not found by walking a
    # folder: a shell script named so is checked by the shell rules whether or not it launches
    named: bool = False


# ---------------------------------------------------------------------- classification

_BY_SUFFIX = {
    ".py": "python", ".pyi": "python",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell",
    ".yaml": "yaml", ".yml": "yaml",
    ".json": "json",
    ".ipynb": "notebook",
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
        ".dylib", ".dll", ".pyc", ".pyd", ".o", ".a", ".toml", ".cfg", ".ini", ".lock",
        ".log", ".html", ".css", ".js", ".ts", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".rs",
        ".go", ".java", ".tokenizer", ".spm", ".vocab", ".idx", ".db", ".sqlite",
    }
)


def classify(path: Path, head: bytes) -> str | None:
    """The file's kind from its name, else (for shell scripts) from a shebang in `head`."""
    return _kind_from_name(path.name) or ("shell" if _shebang_shell(head) else None)


def _kind_from_name(name: str) -> str | None:
    kind = _BY_NAME.get(name) or _BY_SUFFIX.get(os.path.splitext(name)[1].lower())
    if kind:
        return kind
    if name.startswith(("Dockerfile.", "Containerfile.")):
        return "dockerfile"
    if name.startswith(".env."):
        return "env"
    if name.lower().startswith("readme") and name.lower().endswith((".md", ".markdown")):
        return "markdown"  # read only for the launch commands in its fenced shell blocks
    return None


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
    kind = _kind_from_name(name)
    if kind is None and _needs_head(name):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block
            try:
                kind = "shell" if _shebang_shell(os.read(fd, 128)) else None
            finally:
                os.close(fd)
        except OSError:
            return None
    return kind


# -------------------------------------------------------------------------- exclusion


def _spec(lines: list[str]) -> GitIgnoreSpec:
    # Imported on first use: a pre-commit run on named files with no excludes never needs it.
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines(lines)


class _Patterns:
    """gitignore-style patterns; plain names (the common case) are a set lookup."""

    def __init__(self, patterns):
        plain = [p for p in patterns if not re.search(r"[/*?\[\]!\\]", p)]  # "build/" is for folders only
        self.names = frozenset(plain)
        self._globs = [p for p in patterns if p not in self.names]
        self._patterns = list(patterns)

    # Built on first use: pathspec costs ~10 ms to import and the default excludes to
    # compile, which a run on named files (pre-commit) never needs.
    @cached_property
    def spec(self):
        return _spec(self._globs) if self._globs else None

    @cached_property
    def full(self):
        return _spec(self._patterns) if self._patterns else None

    def hit(self, name: str, rel: str, is_dir: bool) -> bool:
        if name in self.names:
            return True
        return bool(self.spec and self.spec.match_file(rel + "/" if is_dir else rel))


class _IgnoreFile:
    """One .gitignore (or .git/info/exclude) and the folder its patterns are relative to."""

    def __init__(self, base: str, spec: GitIgnoreSpec):
        self.base = base.rstrip(os.sep)
        self.spec = spec
        # Most paths match no pattern: two combined regexes say so in one call each instead
        # of one call per pattern; pathspec still decides whenever anything matches.
        # Patterns without a slash ("*.pyc", "build/") are tried on the name only: the walk
        # never reaches a path whose parent folder such a pattern already matched.
        names, paths = [], []
        for p in spec.patterns:
            if p.include is not None:
                r = p.regex.pattern.replace("(?P<ps_d>", "(?:")
                if r.startswith(_ANY_FOLDER):
                    names.append("^" + r[len(_ANY_FOLDER) :])
                else:
                    paths.append(r)
        self.by_name = _any_of(names)
        self.by_path = _any_of(paths)

    def check(self, path: str, name: str, is_dir: bool) -> bool | None:
        rel = path[len(self.base) + 1 :].replace(os.sep, "/")  # paths are joined onto base
        if is_dir:
            rel += "/"
            name += "/"
        if self.by_name(name) or self.by_path(rel):
            return self.spec.check_file(rel).include
        return None


_ANY_FOLDER = "^(?:.+/)?"  # how pathspec starts a pattern that matches at any depth


def _any_of(regexes: list[str]):
    if not regexes:
        return lambda _: None
    return re.compile("|".join(f"(?:{r})" for r in regexes)).match


def _read_ignore(folder: str, path: str) -> _IgnoreFile | None:
    try:
        spec = _spec(read_file(path).decode("utf-8", errors="replace").splitlines())
    except (OSError, ValueError):  # unreadable (a FIFO, a device), or a pattern pathspec rejects
        return None
    return _IgnoreFile(folder, spec) if any(p.include is not None for p in spec.patterns) else None


def _ignores_in(folder: str, names) -> list[_IgnoreFile]:
    # .git/info/exclude ranks below the folder's .gitignore, so it goes first on the stack
    # (the stack is read from the top: the deepest, last-pushed file decides).
    candidates = []
    if ".git" in names:
        candidates.append(os.path.join(folder, ".git", "info", "exclude"))
    if ".gitignore" in names:
        candidates.append(os.path.join(folder, ".gitignore"))
    return [f for f in (_read_ignore(folder, c) for c in candidates) if f is not None]


def _gitignored(ignores: list[_IgnoreFile], path: str, is_dir: bool) -> bool:
    name = os.path.basename(path)
    for ignore in reversed(ignores):
        include = ignore.check(path, name, is_dir)
        if include is not None:
            return include
    return False


def _ancestor_ignores(folder: str, root: str) -> list[_IgnoreFile]:
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


def link_leaving(path, root) -> str | None:
    """Where `path` points when it is a symbolic link to a file outside `root`, else None."""
    if not os.path.islink(path):
        return None
    real = os.path.realpath(path)
    return None if _is_under(real, os.path.realpath(root)) else real


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


def _join(base: str, sub: str) -> str:
    if not sub:
        return base
    return sub if base == "." else f"{base}/{sub}"


def discover(paths: list[Path], settings: Settings | SettingsTree) -> tuple[list[SourceFile], list[str]]:
    """The files to check under `paths`, sorted by display path, and warnings."""
    groups, warnings = discover_groups(paths, settings)
    files = [sf for _, group in groups for sf in group]
    if len(groups) > 1:
        files.sort(key=lambda f: f.display)
    return files, warnings


def discover_groups(paths: list[Path], settings: Settings | SettingsTree, only: Settings | None = None
                    ) -> tuple[list[tuple[Settings, list[SourceFile]]], list[str]]:
    """The files to check under `paths`, grouped by the settings each one uses (each group
    sorted by display path, the groups in the order their first file sorts), and warnings.
    `only`: walk no folder that uses other settings (a project's own files)."""
    tree = settings if isinstance(settings, SettingsTree) else SettingsTree.single(settings)
    cwd = os.path.abspath(os.getcwd())
    found: dict[str, tuple[SourceFile, Settings]] = {}
    warnings: list[str] = []
    scopes: dict[int, _Scope] = {}

    def scope_of(s: Settings) -> _Scope:
        scope = scopes.get(id(s))
        if scope is None:
            scope = scopes[id(s)] = _Scope(s)
        return scope

    def add(path: str, sub: str, kind: str, top_display: str | None, scope: _Scope, relpath: str | None,
            named: bool = False) -> None:
        display = _join(top_display, sub) if top_display is not None else path.replace(os.sep, "/")
        found[path] = (SourceFile(Path(path), display, relpath if relpath is not None else display, kind, named),
                       scope.settings)

    for arg in paths:
        top = os.path.abspath(arg)
        if not os.path.exists(top):
            warnings.append(f"{arg}: path does not exist")
            continue
        is_dir = os.path.isdir(top)
        scope = scope_of(tree.for_folder(top if is_dir else os.path.dirname(top)))
        if only is not None and scope.settings is not only:
            continue
        # Paths below `top` are relative to these, worked out once per argument (and again
        # below a folder with its own config, whose root they are relative to).
        top_display = _rel(top, cwd)
        top_root = _rel(top, scope.root)
        top_match = top_root if top_root is not None else os.path.basename(top)  # excludes: root-relative

        # Named explicitly: defaults and .gitignore do not apply, the user's excludes do.
        if top_match != "." and scope.user.full and scope.user.full.match_file(top_match + "/" if is_dir else top_match):
            continue
        if not is_dir:
            if not is_regular_file(top):  # a FIFO would block the read, /dev/zero fill memory
                warnings.append(f"{arg}: not a regular file; skipped")
                continue
            kind = _kind_of(top, os.path.basename(top))
            if kind:
                add(top, "", kind, top_display, scope, top_root, named=True)
            continue
        above = _ancestor_ignores(top, scope.root)
        if above and _gitignored(above, top, True):
            above = []  # a folder named explicitly is checked even when .gitignore skips it
        # (folder, path below top, ignore files in force, scope, the folder relative to its
        # root, whether it is under that root: else relpaths are display paths, as before)
        stack = [(top, "", above, scope, top_match, top_root is not None)]
        while stack:
            folder, sub, ignores, scope, match, under = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                warnings.append(f"{folder}: cannot read folder: {exc.strerror}")
                continue
            names = {e.name for e in entries}
            if folder != top:
                if "pyvenv.cfg" in names or "conda-meta" in names:
                    continue  # a virtualenv or conda env: someone else's code
                own = tree.inside(folder, names, scope.settings)
                if own is not scope.settings:  # a folder with its own config: its own root
                    if only is not None and own is not only:
                        continue
                    scope, match, under = scope_of(own), ".", True
            ignores = ignores + _ignores_in(folder, names)
            for e in entries:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    if not is_dir and not e.is_file():
                        continue  # directory symlinks, sockets, dangling links
                except OSError:
                    continue
                child = sub + e.name
                rel = _join(match, e.name)
                if scope.defaults.hit(e.name, rel, is_dir) or scope.user.hit(e.name, rel, is_dir):
                    continue
                if ignores and _gitignored(ignores, e.path, is_dir):
                    continue
                if is_dir:
                    stack.append((e.path, child + "/", ignores, scope, rel, under))
                elif e.path not in found:
                    kind = _kind_of(e.path, e.name)
                    if kind:
                        add(e.path, child, kind, top_display, scope, rel if under else None)
    return _grouped(found.values()), warnings


class _Scope:
    """One settings object's exclusions, compiled once per walk."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = os.path.abspath(settings.root)
        self.defaults = _Patterns(DEFAULT_EXCLUDE if settings.exclude is None else ())
        self.user = _Patterns((settings.exclude or ()) + settings.extend_exclude)


def _grouped(found) -> list[tuple[Settings, list[SourceFile]]]:
    by_settings: dict[int, tuple[Settings, list[SourceFile]]] = {}
    for sf, settings in sorted(found, key=lambda item: item[0].display):
        by_settings.setdefault(id(settings), (settings, []))[1].append(sf)
    return list(by_settings.values())
