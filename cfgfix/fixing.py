"""Applying fixes: the only code that writes user files.

Per file: pick non-overlapping fixes (in position order, deterministic), apply their edits,
check that the result still parses, re-lint, and repeat until nothing applies (bounded).
Then write atomically (temporary file in the same folder, fsync, rename), keeping the
mode, the BOM and the line endings (edits never touch text outside their ranges). A file
that failed to parse, or whose fixed text would not parse, is never written.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import tempfile
from pathlib import Path

from cfgfix.core import Applicability, Edit, Finding
from cfgfix.documents.text import SourceText, file_newline_edit
from cfgfix.records import dataclass, field

MAX_ROUNDS = 10


@dataclass
class FileFix:
    display: str
    original: str
    fixed: str
    source: SourceText
    applied: list[Finding] = field(default_factory=list)
    remaining: list[Finding] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # fixes that failed the re-parse check

    @property
    def changed(self) -> bool:
        return self.fixed != self.original

    def diff(self) -> str:
        if self.display.endswith(".ipynb"):
            return self._cell_diffs()
        return _unified(self.original, self.fixed, f"a/{self.display}", f"b/{self.display}")

    def _cell_diffs(self) -> str:
        """A notebook's diff per changed code cell (`a/nb.ipynb:cell 3`), as ruff shows it:
        the JSON around the cells is unchanged, and its escaped lines are hard to read."""
        from cfgfix.documents.notebook import Notebook, NotebookError

        try:
            before = Notebook.from_text(SourceText(self.display, self.original)).cells
            after = Notebook.from_text(SourceText(self.display, self.fixed)).cells
        except NotebookError:
            return _unified(self.original, self.fixed, f"a/{self.display}", f"b/{self.display}")
        out = []
        for old, new in zip(before, after):
            if old.text != new.text:
                where = f"{self.display}:cell {old.index + 1}"
                out.append(_unified(old.text, new.text, f"a/{where}", f"b/{where}"))
        return "".join(out)


def _unified(old: str, new: str, fromfile: str, tofile: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=fromfile, tofile=tofile)
    return "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines)


def wanted(finding: Finding, unsafe: bool) -> bool:
    fix = finding.fix
    return fix is not None and (fix.applicability is Applicability.SAFE or unsafe)


def apply_edits(text: str, edits: list[Edit]) -> str:
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        text = text[: edit.start] + edit.content + text[edit.end :]
    return text


def select_fixes(findings: list[Finding]) -> list[Finding]:
    """Non-overlapping fixes, first by position. Identical edits from two findings (two
    rules removing the same call) are applied once."""
    taken: list[Edit] = []
    chosen = []
    for finding in sorted(findings, key=Finding.sort_key):
        edits = finding.fix.edits
        new = [e for e in edits if e not in taken]
        if any(_overlaps(e, t) for e in new for t in taken):
            continue
        taken.extend(new)
        chosen.append(finding)
    return chosen


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.path != b.path:
        return False
    if a.start == a.end == b.start == b.end:
        return True  # two insertions at one point: their order would be arbitrary
    return a.start < b.end and b.start < a.end


def still_parses(kind: str, text: str) -> bool:
    try:
        if kind == "python":
            from cfgfix.documents.python import parse_python

            parse_python(text)
        elif kind == "json":
            json.loads(text)
        elif kind == "yaml":
            import yaml

            # libyaml's loader when installed, as the config reader uses: the pure-Python one
            # took 0.2 s per 16 KB, and a file with 200 fixes that fail tries each one (issue 24)
            list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader))
    except (SyntaxError, ValueError, RecursionError):
        return False
    except Exception:  # yaml.YAMLError and friends
        return False
    return True


def sound(kind: str, old: str, new: str, edits) -> bool:
    """The fixed text still parses, and for a YAML/JSON config, loading it changes only the
    values under the edited nodes (the data changed as the fix said, nothing else moved)."""
    if not still_parses(kind, new):
        return False
    if kind in ("yaml", "json"):
        from cfgfix.documents.config_edits import change_is_local

        return change_is_local(kind, old, new, edits)
    return True


def fix_file(engine, sf, data: bytes, unsafe: bool) -> FileFix | None:
    """Fix one file in memory; None when it cannot be decoded (nothing to fix)."""
    if sf.kind == "notebook":
        return _fix_notebook(engine, sf, data, unsafe)
    try:
        source = SourceText.from_bytes(sf.display, data)
    except ValueError:
        return None
    original = source.text
    text = original
    result = FileFix(sf.display, original, original, source)
    for _ in range(MAX_ROUNDS):
        current = SourceText(sf.display, text, source.bom)
        sources: dict = {}
        findings = engine.lint_one(sf, current.to_bytes(), sources)
        if any(f.code == "CFX901" for f in findings):
            return result if text == original else None  # never write a file that failed to parse
        fixable = select_fixes([f for f in findings if wanted(f, unsafe)])
        applied = []
        # Two fixes may share an edit (two rules deleting the same call): apply it once.
        edits = _native(dict.fromkeys(e for f in fixable for e in f.fix.edits), data)
        candidate = apply_edits(text, edits)
        if fixable and sound(sf.kind, text, candidate, edits):
            applied = fixable
        else:  # find the fix that breaks the file: apply them one at a time
            candidate = text
            for finding in fixable:
                attempt = apply_edits(candidate, _native(finding.fix.edits, data))
                if sound(sf.kind, candidate, attempt, finding.fix.edits):
                    candidate, applied = attempt, applied + [finding]
                    break  # positions of the others are stale now; next round re-lints
                result.dropped.append(f"{finding.code} at line {finding.span.line}")
        if not applied:
            break
        result.applied.extend(applied)
        text = candidate
    result.fixed = text
    result.source = SourceText(sf.display, text, source.bom)
    result.remaining = engine.lint_one(sf, result.source.to_bytes(), {})
    return result


def keep_launchable(engine, outcomes) -> dict[str, str]:
    """The files whose fixes must not be written, with why: with every fixed file's new text
    in place, the project stage (launches, their configs, the rules across files) is run
    again; a finding it did not report before (CFX604: a `mixed_precision` the DeepSpeed
    JSON now contradicts; CFX502: a batch that no longer adds up) blocks the fixed files it
    names, and the check repeats with the rest until nothing new appears."""
    from collections import Counter

    project = getattr(engine, "project", None)
    if project is None or not outcomes or not getattr(engine, "project_rules", None):
        return {}

    def counted(model):
        by_file, _ = engine._project_findings(model)
        found = [f for fs in by_file.values() for f in fs if f.code in engine.codes]
        return Counter((f.code, f.path) for f in found), found

    before, _ = counted(project)
    blocked: dict[str, str] = {}
    for _ in range(len(outcomes)):
        live = [(sf, o) for sf, o in outcomes if sf.display not in blocked]
        if not live:
            break
        model = project
        for sf, outcome in live:
            model = model.with_override(sf.path, outcome.source.to_bytes())
        after, found = counted(model)
        new = [f for f in found if after[(f.code, f.path)] > before[(f.code, f.path)]]
        if not new:
            break
        shown = {sf.display for sf, _ in live}
        for finding in new:
            involved = {finding.path, *(r.span.path for r in finding.related)} & shown or shown
            why = (f"together they would introduce {finding.code} at {finding.path}:{finding.span.line} "
                   f"({finding.message.split(': ')[0][:200]})")
            for display in involved:
                blocked.setdefault(display, why)
    return blocked


def _native(edits, data: bytes) -> list[Edit]:
    """The edits with their inserted lines in the file's own line ending (a CR-only file is
    linted as LF, see `lone_cr_as_lf`, and must be written back with CRs)."""
    from cfgfix.records import replace

    return [replace(e, content=file_newline_edit(e.content, data)) for e in edits]


def _fix_notebook(engine, sf, data: bytes, unsafe: bool) -> FileFix | None:
    """Fix a notebook: findings point into its joined code cells; their edits go back into
    the cells (documents/notebook.py), the rest of the JSON is kept byte for byte. A round's
    result must still be the same notebook (only code cells' sources changed) whose cells
    still parse."""
    from cfgfix.documents.notebook import Notebook, NotebookError

    try:
        notebook = Notebook.from_bytes(sf.display, data)
    except NotebookError:
        return None
    original = notebook.file.text
    result = FileFix(sf.display, original, original, notebook.file)
    for _ in range(MAX_ROUNDS):
        findings = engine.lint_one(sf, notebook.file.to_bytes(), {})
        if any(f.code == "CFX901" for f in findings):
            break
        fixable = select_fixes([f for f in findings if wanted(f, unsafe)])
        applied, candidate = [], None
        edits = list(dict.fromkeys(e for f in fixable for e in f.fix.edits))
        if fixable:
            candidate = _notebook_candidate(notebook, edits)
        if candidate is not None:
            applied = fixable
        else:
            for finding in fixable:
                candidate = _notebook_candidate(notebook, list(finding.fix.edits))
                if candidate is not None:
                    applied = [finding]
                    break
                result.dropped.append(f"{finding.code} at line {finding.span.line}")
        if not applied:
            break
        result.applied.extend(applied)
        notebook = candidate
    result.fixed = notebook.file.text
    result.source = notebook.file
    result.remaining = engine.lint_one(sf, notebook.file.to_bytes(), {})
    return result


def _notebook_candidate(notebook, edits):
    """The notebook with `edits` applied, or None when they cross a cell, break its code,
    or would change anything but code cells' sources."""
    from cfgfix.documents.notebook import Notebook, NotebookError

    try:
        text = notebook.apply(edits)
        new = Notebook.from_text(SourceText(notebook.file.path, text, notebook.file.bom))
    except NotebookError:
        return None
    if not still_parses("python", new.masked):
        return None
    old_data, new_data = json.loads(notebook.file.text), json.loads(text)
    return new if _without_code_sources(old_data) == _without_code_sources(new_data) else None


def _without_code_sources(data):
    """The notebook's JSON with code cells' sources dropped; any other shape (a cell that is
    not an object, `cells` that is not a list) is kept as it is and so must stay unchanged."""
    if isinstance(data, dict) and isinstance(data.get("cells"), list):
        for cell in data["cells"]:
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                cell.pop("source", None)
    return data


class WriteError(Exception):
    pass


def write_atomically(path: Path, data: bytes, root: Path) -> None:
    """Replace `path` with `data` without a moment where it is half-written.
    Writes through a link only when the target stays inside the project."""
    real = Path(os.path.realpath(path))
    if path.is_symlink() and not _inside(real, Path(os.path.realpath(root))):
        raise WriteError(f"{path} links outside the project ({real}); not written")
    try:
        mode = stat.S_IMODE(real.stat().st_mode)
    except OSError as exc:
        raise WriteError(f"cannot stat {path}: {exc.strerror}") from None
    if not os.access(real, os.W_OK):
        raise WriteError(f"{path} is read-only; not written")
    _remove_stale_temporaries(real)
    tmp = _temporary_copy(path, real, data, mode)
    try:
        os.replace(tmp, real)
    except BaseException as exc:  # an error, or Ctrl-C / SIGTERM (see commands._fix): no leftover
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {path}: {exc.strerror}") from None
        raise


def create_atomically(path: Path, data: bytes, root: Path) -> None:
    """Create a new file (never replacing one): written to a temporary name beside it,
    then linked into place, so it appears whole or not at all."""
    real = Path(os.path.realpath(path))
    if not _inside(real, Path(os.path.realpath(root))):
        raise WriteError(f"{path} is outside the project; not created")
    tmp = _temporary_copy(path, real, data, 0o644)
    try:
        os.link(tmp, real)  # fails when the file appeared meanwhile: never overwrite
    except FileExistsError:
        raise WriteError(f"{path} already exists; not overwritten") from None
    except OSError as exc:
        raise WriteError(f"cannot create {path}: {exc.strerror}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _temporary_copy(path: Path, real: Path, data: bytes, mode: int) -> str:
    """`data` written and fsynced to a temporary file beside `real`, with `mode`."""
    try:
        handle, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".cfgfix")
    except OSError as exc:
        raise WriteError(f"cannot write next to {path}: {exc.strerror}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
    except BaseException as exc:  # a full disk, `ulimit -f`, Ctrl-C, SIGTERM: leave nothing behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write next to {path}: {exc.strerror}") from None
        raise
    return tmp


# A temporary file this old beside a file cfgfix writes was left by a run killed with SIGKILL
# between creating it and renaming it (nothing else can stop the cleanup above); no live
# run holds one for more than a moment.
STALE_SECONDS = 600


def _remove_stale_temporaries(real: Path) -> None:
    """Remove `.<name>.<random>.cfgfix` files that an earlier, killed run left beside `real`."""
    import time

    prefix = f".{real.name}."
    now = time.time()
    try:
        with os.scandir(real.parent) as entries:
            for entry in entries:
                name = entry.name
                if (name.startswith(prefix) and name.endswith(".cfgfix")
                        and len(name) == len(prefix) + 8 + len(".cfgfix")  # mkstemp's 8 random characters
                        and entry.is_file(follow_symlinks=False)
                        and now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS):
                    os.unlink(entry.path)
    except OSError:
        pass


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False
