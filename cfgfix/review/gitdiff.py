"""Changed files and changed line ranges, from `git diff --unified=0`.

Only the new side matters: a comment sits on a line of the head version of a file. A
deleted file has nothing to comment on; a binary file has no lines; a renamed file counts
by its new path with just the lines that changed in the rename; a new (or untracked, when
the working tree is the head) file is changed everywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cfgfix import git_command
from cfgfix.records import dataclass, field

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
ALL_LINES = None  # a new file: every line is changed


class GitError(Exception):
    pass


@dataclass
class ChangedFile:
    path: str  # posix, relative to the repository root (the new path of a rename)
    old_path: str | None = None  # set for renames
    status: str = "modified"  # "added" | "modified" | "renamed"
    lines: set[int] | None = field(default_factory=set)  # None: every line (a new file)

    def touches(self, first: int, last: int) -> bool:
        if self.lines is None:
            return True
        return any(line in self.lines for line in range(first, last + 1))

    def commentable(self, line: int, context: int = 3) -> bool:
        """Whether GitHub's diff shows this line (a changed line or its 3 context lines)."""
        if self.lines is None:
            return True
        return any(abs(line - changed) <= context for changed in self.lines)


def git(root: Path, *args: str) -> str:
    # The repository cannot make git run code (cfgfix/git_command.py); diffs also take
    # --no-ext-diff and --no-textconv.
    try:
        done = git_command.run(root, "-c", "core.quotepath=off", *args, timeout=120)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"`git {' '.join(args)}` took longer than 120 s") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"`git {' '.join(args)}` failed: {message[-1] if message else done.returncode}")
    return done.stdout.decode("utf-8", "surrogateescape")


def repo_root(cwd: Path) -> Path:
    return Path(git(cwd, "rev-parse", "--show-toplevel").strip())


def resolves(root: Path, ref: str) -> bool:
    try:
        git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        return True
    except GitError:
        return False


def default_base(root: Path, environ=os.environ) -> str:
    """The pull request's base branch on GitHub, else the remote's default branch, else
    main or master."""
    candidates = []
    base_ref = environ.get("GITHUB_BASE_REF")
    if base_ref:
        candidates += [f"origin/{base_ref}", base_ref]
    candidates += ["origin/HEAD", "origin/main", "origin/master", "main", "master"]
    for ref in candidates:
        if resolves(root, ref):
            return ref
    raise GitError("no base to compare with: pass --base REF (tried " + ", ".join(candidates) + ")")


def changed_files(root: Path, base: str, head: str | None) -> list[ChangedFile]:
    """Files changed between the merge base of `base` and `head` (a ref, or the working
    tree when None), with their changed lines on the head side."""
    common = ["diff", "--unified=0", "--find-renames", "--no-color", "--no-ext-diff", "--no-textconv",
              "--src-prefix=a/", "--dst-prefix=b/"]
    if head is None:
        merge_base = git(root, "merge-base", base, "HEAD").strip()
        files = parse_diff(git(root, *common, merge_base))
        known = {f.path for f in files}
        untracked = git(root, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
        files += [ChangedFile(p, status="added", lines=ALL_LINES) for p in untracked if p and p not in known]
    else:
        files = parse_diff(git(root, *common, f"{base}...{head}"))
    return sorted(files, key=lambda f: f.path)


def _unquote(path: str) -> str:
    """Git quotes paths with odd characters C-style even with core.quotepath off."""
    if not (path.startswith('"') and path.endswith('"')):
        return path
    raw = path[1:-1].encode("utf-8", "surrogateescape").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "replace")


def _strip_prefix(path: str, prefix: str) -> str:
    path = _unquote(path.rstrip("\t"))
    return path[len(prefix):] if path.startswith(prefix) else path


def parse_diff(text: str) -> list[ChangedFile]:
    files: list[ChangedFile] = []
    current: ChangedFile | None = None
    deleted = binary = False

    def close() -> None:
        if current is not None and not deleted and not binary and current.path:
            files.append(current)

    for line in text.splitlines():
        if line.startswith("diff --git "):
            close()
            current, deleted, binary = ChangedFile(path=""), False, False
            # The header names both sides; `+++` or `rename to` below refine the new one.
            match = re.match(r'diff --git (?:"?a/)(.*?)"? (?:"?b/)(.*?)"?$', line)
            if match:
                current.path = match.group(2)
            continue
        if current is None:
            continue
        if line.startswith("new file mode"):
            current.status, current.lines = "added", ALL_LINES
        elif line.startswith("deleted file mode"):
            deleted = True
        elif line.startswith("rename from "):
            current.status, current.old_path = "renamed", _unquote(line[len("rename from "):])
        elif line.startswith("rename to "):
            current.path = _unquote(line[len("rename to "):])
        elif line.startswith("Binary files ") or line == "GIT binary patch":
            binary = True
        elif line.startswith("+++ "):
            target = line[4:]
            if target == "/dev/null":
                deleted = True
            else:
                current.path = _strip_prefix(target, "b/")
        elif line.startswith("@@"):
            match = _HUNK.match(line)
            if match and current.lines is not ALL_LINES:
                start, count = int(match.group(1)), int(match.group(2) or "1")
                current.lines.update(range(start, start + count))
    close()
    return files
