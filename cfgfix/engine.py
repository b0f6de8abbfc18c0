"""The engine: files in, findings out.

    read bytes -> prefilter -> parse once -> rules (per file)       [cached by content hash]
    -> project stage (launch scripts decide cross-file conditions)
    -> suppressions, per-file ignores -> findings

Per-file work is pure and cacheable: a file's result depends only on its bytes, the
settings, the enabled rules and the project's library versions. Cross-file facts (which
script a launch script starts, with how many processes) are kept as plain data in the
per-file result and combined afterwards, so a warm run parses nothing.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path

from cfgfix.analysis.versions import ProjectVersions
from cfgfix.core import Finding, LazyRegex, Severity, Span, is_huge_number_error, well_typed
from cfgfix.documents.files import MAX_PYTHON_BYTES, MAX_SCRIPT_BYTES, FileTooLarge, read_file
from cfgfix.documents.text import DecodeError, SourceText, lone_cr_as_lf
from cfgfix.project import LaunchFacts, ProjectModel
from cfgfix.records import dataclass, field, replace
from cfgfix.settings import Settings, enabled_codes, ignored_codes_for
from cfgfix.suppressions import is_suppressed, parse_directives, removal_edit
from cfgfix.workspace import SourceFile, link_leaving


@lru_cache(maxsize=1)
def _code_stamp() -> str:
    """Size and mtime of cfgfix's own modules: an editable install (or a checkout being
    developed) never reads results that older code wrote under the same version. One
    `os.walk` and ~200 stat calls (plain strings: `Path.rglob` cost ~10 ms here)."""
    import hashlib  # the cache's key only: a --no-cache run never hashes

    package = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.blake2b(digest_size=8)
    for folder, subfolders, names in os.walk(package):
        subfolders.sort()
        relative = os.path.relpath(folder, package)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            digest.update(f"{relative}/{name}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()


# Bumped whenever FileResult's cached shape changes (a new LaunchFacts field), so that a
# development checkout never reads results written by older code of the same version.
RESULT_SCHEMA = "9"

# Launch-script kinds a command line may name: then checked by the shell rules whether or
# not they start a training run (`cfgfix check OPTIMIZE_MEMORY.sh`, a pre-commit hook's files)
_NAMED_SCRIPT_KINDS = frozenset({"shell", "makefile", "dockerfile"})

LAUNCH_TOKENS = (b"torchrun", b"accelerate", b"deepspeed", b"torch.distributed", b"python", b"llamafactory-cli",
                 b"lmf", b"axolotl", b"trl ")
SHELL_KINDS = ("shell", "dockerfile", "makefile", "env", "markdown")
POOL_MIN_FILES = 200  # below this a process pool costs more than it saves
HUGE_NUMBER = ("holds a number with more than 4,300 digits, which Python (and so the tool that reads "
               "this file) cannot convert")


@dataclass
class FileResult:
    """What one file yields on its own (cacheable, JSON-serialisable)."""

    findings: list[Finding] = field(default_factory=list)
    conditional: list[tuple[str, Finding]] = field(default_factory=list)
    launches: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # internal errors (bugs), never user errors
    configs: list[str] = field(default_factory=list)  # config kinds ("accelerate", "deepspeed")
    # Other project files the result depends on (a loader module the analysis followed):
    # path relative to the project root -> content hash; a cached result whose dependency
    # changed is computed again.
    deps: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "conditional": [[c, f.to_dict()] for c, f in self.conditional],
            "launches": self.launches,
            "errors": self.errors,
            "configs": self.configs,
            "deps": self.deps,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "FileResult":
        return cls(
            findings=[Finding.from_dict(f) for f in data["findings"]],
            conditional=[(c, Finding.from_dict(f)) for c, f in data["conditional"]],
            launches=data["launches"],
            errors=data["errors"],
            configs=data.get("configs", []),
            deps=data.get("deps", {}),
        )


def _dependency_hashes(paths: list[str], root) -> dict[str, str]:
    from cfgfix.cache import content_hash

    out = {}
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        key = os.path.relpath(path, root) if root is not None else path
        out[Path(key).as_posix()] = content_hash(data)
    return out


def dependencies_unchanged(deps: dict[str, str], root, seen: dict[str, str | None] | None = None) -> bool:
    """Whether every file a cached result depends on still has the same content (`seen`:
    hashes already computed in this run; many files follow the same loader module)."""
    from cfgfix.cache import content_hash

    seen = {} if seen is None else seen
    for key, digest in deps.items():
        if key not in seen:
            path = Path(root, key) if root is not None else Path(key)
            try:
                seen[key] = content_hash(path.read_bytes())
            except OSError:
                seen[key] = None
        if seen[key] != digest:
            return False
    return True


def parse_error(path: str, message: str, line: int = 1, column: int = 1, severity: Severity = Severity.ERROR) -> Finding:
    span = Span(path, line, column, line, column)
    return Finding("CFX901", "parse-error", message, severity, span)


class Linter:
    """Runs the enabled per-file rules on one file's bytes."""

    def __init__(self, codes: frozenset[str], versions: ProjectVersions, record_deps: bool = True) -> None:
        from cfgfix.rules.manifest import entries

        enabled = [entry for entry in entries() if entry.code in codes]
        # Per-file rules come from the manifest; a rule's module is imported the first time
        # a file holds its triggers, so a run pays only for the rules its files may match.
        self._entries = [entry for entry in enabled if entry.triggers]
        self._prefilters: dict = {}  # file kind -> Prefilter
        self._instances: dict = {}  # code -> rule instance
        # Project rules need to know which files are accelerate / DeepSpeed configs.
        self.wants_config_kinds = any(entry.scope == "project" for entry in enabled)
        self.versions = versions
        self.report_parse_errors = "CFX901" in codes
        # A result's followed modules (with content hashes) only serve the cache: a run
        # without one neither reads nor hashes them.
        self.record_deps = record_deps
        from cfgfix.analysis.project_modules import ProjectModules

        self.modules = ProjectModules(getattr(versions, "root", None))

    def _has_rules(self, kind: str) -> bool:
        return any(kind in entry.kinds for entry in self._entries)

    def _matching(self, kind: str, data: bytes) -> list:
        """The enabled rules for files of `kind` whose triggers `data` holds."""
        prefilter = self._prefilters.get(kind)
        if prefilter is None:
            from cfgfix.rules.prefilter import Prefilter

            prefilter = Prefilter([entry for entry in self._entries if kind in entry.kinds])
            self._prefilters[kind] = prefilter
        rules = []
        for entry in prefilter.candidates(data):
            rule = self._instances.get(entry.code)
            if rule is None:
                rule = self._instances[entry.code] = entry.load()()
            check = type(rule).trigger_check
            if check is None or check(data):
                rules.append(rule)
        return rules

    def lint(self, sf: SourceFile, data: bytes, config_kinds: frozenset[str] | None = None) -> FileResult:
        """One file's result. `config_kinds` reads a YAML/JSON file as those configs whatever
        its content says (a launch passes it as its DeepSpeed or accelerate config)."""
        data = lone_cr_as_lf(data)  # CR-only files: the same lines, the same findings as LF
        try:
            if sf.kind == "python":
                return self._python(sf, data)
            if sf.kind == "notebook":
                return self._notebook(sf, data)
            if sf.kind in SHELL_KINDS:
                return self._shell(sf, data)
            if sf.kind in ("yaml", "json"):
                return self._config(sf, data, config_kinds)
        except Exception as exc:  # a bug in a reader must cost one file, never the run
            if is_huge_number_error(exc):  # ordinary (if absurd) input, not our bug
                return self._unparsable(sf, f"{sf.display} {HUGE_NUMBER}; the file was skipped")
            result = FileResult()
            result.errors.append(f"internal error reading {sf.display}: {exc!r}; the file was skipped")
            return result
        return FileResult()

    def _python(self, sf: SourceFile, data: bytes) -> FileResult:
        rules = self._matching("python", data)
        if not rules:
            return FileResult()
        if len(data) > MAX_PYTHON_BYTES:
            return self._unparsable(
                sf, f"{sf.display} is larger than {MAX_PYTHON_BYTES / 1e6:g} MB ({len(data) / 1e6:.1f} MB): "
                f"not analysed (a training script is far smaller; a generated file is not one)",
                severity=Severity.WARNING)
        try:
            source = SourceText.from_bytes(sf.display, data)
        except DecodeError as exc:
            return self._unparsable(sf, f"cannot read {sf.display}: {exc}")
        return self._python_rules(sf, rules, source, self.versions.for_file(sf.path))

    def _notebook(self, sf: SourceFile, data: bytes) -> FileResult:
        """A notebook's code cells, joined and masked (documents/notebook.py), through the
        Python rules; findings keep the joined text's positions (reports map them to cells)."""
        if not self._has_rules("python"):
            return FileResult()
        from cfgfix.documents.notebook import Notebook, NotebookError

        if not data.strip():
            return FileResult()  # an empty file holds no code (as an empty .py)
        try:
            notebook = Notebook.from_bytes(sf.display, data)
        except NotebookError as exc:
            return self._unparsable(sf, f"cannot read {sf.display}: {exc}")
        if notebook.language != "python":  # an R or Julia notebook
            return FileResult()
        masked = notebook.masked.encode("utf-8")
        rules = self._matching("python", masked)
        if not rules:
            return FileResult()
        if len(masked) > MAX_PYTHON_BYTES:
            return self._unparsable(
                sf, f"the code cells of {sf.display} are larger than {MAX_PYTHON_BYTES / 1e6:g} MB: not analysed",
                severity=Severity.WARNING)
        versions = self.versions.for_file(sf.path)
        installs = notebook.install_lines()
        if installs:  # the notebook's own `%pip install x==1.2` is what its kernel runs
            versions = versions.with_requirements(installs, f"{sf.display} (pip install)")
        result = self._python_rules(sf, rules, notebook.python_source(), versions)
        if notebook.left_out and self.report_parse_errors:
            source = notebook.python_source()
            for index, message, line in notebook.left_out:
                cell = next(c for c in notebook.cells if c.index == index)
                first = source.position(cell.start)[0]
                result.findings.append(parse_error(
                    sf.display, f"syntax error in this cell: {message}; the cell was left out, the other cells "
                    f"were checked", first + line - 1, 1, Severity.WARNING))
        return result

    def _python_rules(self, sf: SourceFile, rules, source: SourceText, versions) -> FileResult:
        from cfgfix.documents.python import NewerSyntaxError, PythonDocument
        from cfgfix.rules.context import PythonContext

        try:
            document = PythonDocument.parse(source)
        except NewerSyntaxError as exc:  # valid Python of a later version than ours
            return self._unparsable(
                sf, f"valid syntax of a newer Python that cfgfix running on Python "
                f"{sys.version_info.major}.{sys.version_info.minor} cannot read ({exc.msg}); the file was skipped: "
                f"run cfgfix on a newer Python", exc.lineno or 1, exc.offset or 1, Severity.WARNING)
        except SyntaxError as exc:
            return self._unparsable(
                sf, f"syntax error: {exc.msg}; the file was skipped", exc.lineno or 1, (exc.offset or 1)
            )
        except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
            return self._unparsable(sf, f"cannot parse {sf.display}: {exc}")
        from cfgfix.analysis.version_idioms import code_bounds

        # APIs that date the code (`dtype=` in from_pretrained: transformers >= 4.56;
        # `Trainer(tokenizer=...)`: < 5) are version evidence (docs/versions.md).
        ctx = PythonContext(document, versions, path=sf.path, project=self.modules)
        # read when a rule first asks a version question (most files ask none)
        ctx.versions = versions.with_code_bounds(lambda: code_bounds(document.tree, source.text, ctx.imports))
        result = FileResult()
        self._run(rules, ctx, sf, result)
        if self.record_deps and "functions" in ctx.__dict__ and ctx.functions.deps:  # an analysis followed imports
            result.deps = _dependency_hashes(sorted(ctx.functions.deps), self.modules.root)
        # Drop the file's tree and analyses now: the versions' closure refers back to the
        # context (a cycle), and while the collector is paused (a few files) a cycle kept
        # every file's tree, so each parse touched fresh memory (issue 15).
        ctx.__dict__.clear()
        return result

    def _unparsable(self, sf: SourceFile, message: str, line: int = 1, column: int = 1,
                    severity: Severity = Severity.ERROR) -> FileResult:
        if not self.report_parse_errors:
            return FileResult()
        return FileResult(findings=[parse_error(sf.display, message, line, column, severity)])

    def _shell(self, sf: SourceFile, data: bytes) -> FileResult:
        rules = self._matching(sf.kind, data)
        wants_launches = any(token in data for token in LAUNCH_TOKENS)
        if not rules and not wants_launches:
            return FileResult()
        if len(data) > MAX_SCRIPT_BYTES and sf.kind != "markdown":  # a README's shell blocks are read, not its prose
            return self._unparsable(
                sf, f"{sf.display} is larger than {MAX_SCRIPT_BYTES / 1e6:g} MB ({len(data) / 1e6:.1f} MB): "
                f"not read as a launch script (a launch script is far smaller; a generated file is not one)",
                severity=Severity.WARNING)
        from cfgfix.documents.shell import parse_shell
        from cfgfix.rules.context import ShellContext

        try:
            source = SourceText.from_bytes(sf.display, data)
        except DecodeError:
            return FileResult()  # not a script we can read; launch scripts are optional input
        if sf.kind == "markdown":  # a README: only its fenced shell blocks, read for launches
            from cfgfix.documents.markdown import shell_blocks_only

            source = shell_blocks_only(source)
        result = FileResult()
        try:
            document = parse_shell(source, {"shell": "sh", "markdown": "sh"}.get(sf.kind, sf.kind))
            ctx = ShellContext(document, sf.kind, self.versions.for_file(sf.path), sf.path, self.modules.root,
                               named=sf.named and sf.kind in _NAMED_SCRIPT_KINDS)
            if wants_launches:
                result.launches = [LaunchFacts.from_launch(launch).to_dict() for launch in ctx.launches]
        except Exception as exc:  # the shell reader is lenient by design; a crash is our bug
            if is_huge_number_error(exc):
                return self._unparsable(sf, f"{sf.display} {HUGE_NUMBER}; the file was skipped", severity=Severity.WARNING)
            result.errors.append(f"internal error reading {sf.display}: {exc!r}")
            return result
        self._run(rules, ctx, sf, result)
        if self.record_deps and ctx.deps:  # a rule read the helper scripts it runs
            result.deps = _dependency_hashes(sorted(ctx.deps), self.modules.root)
        return result

    def _config(self, sf: SourceFile, data: bytes, used_as: frozenset[str] | None = None) -> FileResult:
        """accelerate / DeepSpeed configs, recognised by content (or by use, `used_as`): a
        YAML or JSON file that is not one (a Helm chart, a data file) is never reported, even
        when it cannot be parsed."""
        from cfgfix.analysis.config_kinds import looks_like_config

        has_rules = self._has_rules(sf.kind)
        if (not has_rules and not self.wants_config_kinds) or not (used_as or looks_like_config(data)):
            return FileResult()
        from cfgfix.analysis.config_kinds import config_kinds
        from cfgfix.documents.config import ConfigError, parse_config
        from cfgfix.rules.context import ConfigContext

        try:
            source = SourceText.from_bytes(sf.display, data)
            # JSON with comments or trailing commas is read as DeepSpeed's hjson loader reads it
            document = parse_config(source, sf.kind, lenient=True)
        except DecodeError as exc:
            return self._unparsable(sf, f"cannot read {sf.display}: {exc}")
        except ConfigError as exc:
            return self._unparsable(sf, f"{exc.message}; the config was skipped", exc.line, exc.column)
        kinds = config_kinds(document) or used_as
        if not kinds or document.root is None or document.root.kind != "mapping":
            return FileResult()
        ctx = ConfigContext(document, kinds, self.versions.for_file(sf.path))
        result = FileResult(configs=sorted(kinds))
        strict = document.lenient_error
        if strict is not None:
            result = self._unparsable(
                sf, f"{strict.message}: JSON with comments or trailing commas. json.load (the HF Trainer's and "
                f"accelerate's loaders) rejects it; only DeepSpeed's own hjson-based loader (deepspeed.initialize) "
                f"reads it, and cfgfix checks it as that loader reads it", strict.line, strict.column, Severity.WARNING)
            result.configs = sorted(kinds)
        if has_rules:
            # a config by use may hold none of the byte triggers (`{"amp": {...}}`): every rule reads it
            rules = self._matching(sf.kind, data) if not used_as else self._all(sf.kind)
            self._run(rules, ctx, sf, result)
        return result

    def _all(self, kind: str) -> list:
        """Every enabled rule for files of `kind`, triggers or not."""
        rules = []
        for entry in self._entries:
            if kind in entry.kinds:
                rule = self._instances.get(entry.code)
                if rule is None:
                    rule = self._instances[entry.code] = entry.load()()
                rules.append(rule)
        return rules

    def _run(self, rules, ctx, sf: SourceFile, result: FileResult) -> None:
        from cfgfix.rules.base import Conditioned  # loaded with the rules themselves

        for rule in rules:
            try:
                for finding in rule.check(ctx):
                    if rule.condition:
                        if isinstance(finding, Conditioned):  # the rule's condition, narrowed for this finding
                            result.conditional.append((finding.condition, finding.finding))
                        else:
                            result.conditional.append((rule.condition, finding))
                    else:
                        result.findings.append(finding)
            except Exception as exc:  # a bug in a rule must not stop the other files
                if is_huge_number_error(exc):
                    if self.report_parse_errors:
                        result.findings.append(parse_error(
                            sf.display, f"{sf.display} {HUGE_NUMBER}; {rule.code} was skipped", severity=Severity.WARNING))
                    continue
                result.errors.append(f"internal error in {rule.code} on {sf.display}: {exc!r}")


def _unreadable(sf: SourceFile, exc: OSError) -> FileResult:
    """A file that is gone, unreadable, a FIFO or device, or over the size bound."""
    severity = Severity.WARNING if isinstance(exc, FileTooLarge) else Severity.ERROR
    return FileResult(findings=[parse_error(sf.display, f"cannot read {sf.display}: {exc.strerror or exc}",
                                            severity=severity)])


def _restore(cached: dict | None) -> FileResult | None:
    """A cached result, or None (a miss) when it is absent or not of the shape we write."""
    if cached is None:
        return None
    try:
        result = FileResult.from_dict(cached)
        for launch in result.launches:
            LaunchFacts.from_dict(launch)  # the project stage reads them back: they must load
        if (all(well_typed(f) for f in result.findings + [f for _, f in result.conditional])
                and all(isinstance(c, str) for c, _ in result.conditional)
                and all(isinstance(e, str) for e in result.errors + result.configs)
                and isinstance(result.deps, dict) and all(isinstance(v, str) for v in result.deps.values())):
            return result
    except Exception:  # edited by hand, written by other code, truncated: recompute
        pass
    return None


def display_source(sf: SourceFile, data: bytes) -> SourceText | None:
    """The text findings of `sf` point into: the file's own, or a notebook's joined cells
    (which map lines to cells for the reports)."""
    try:
        if sf.kind == "notebook":
            from cfgfix.documents.notebook import Notebook, NotebookError

            try:
                return Notebook.from_bytes(sf.display, data).python_source(masked=False)
            except NotebookError:
                return None
        return SourceText.from_bytes(sf.display, data)
    except DecodeError:
        return None


_LINE_REF = LazyRegex(r"(?<![\w.:])line (\d+)\b")


def _lines_to_cells(finding: Finding, source) -> Finding:
    """Rules name other lines in their messages ("loaded on line 76"); in a notebook those
    are lines of the joined cells, which the user never sees: say `cell 3, line 2`."""

    def cell_line(match: re.Match) -> str:
        line = int(match.group(1))
        if not 1 <= line <= len(source.line_starts):
            return match.group(0)
        cell, in_cell, _ = source.cell_position(line, 1)
        return f"cell {cell}, line {in_cell}"

    message = _LINE_REF.sub(cell_line, finding.message)
    return finding if message == finding.message else replace(finding, message=message)


# A process pool needs the linter in each worker: set once by the initializer.
_WORKER: Linter | None = None


def _init_worker(codes, versions, record_deps) -> None:
    global _WORKER
    _WORKER = Linter(codes, versions, record_deps)


def _lint_in_worker(job):
    sf, data = job
    return _WORKER.lint(sf, data).to_dict()


@dataclass
class RunResult:
    """What a run found, in which files, and what failed."""

    findings: list[Finding]
    sources: dict[str, SourceText]
    errors: list[str]
    files: int

    @classmethod
    def merged(cls, results: list[RunResult]) -> RunResult:
        """Several engines' runs (one per settings file) as one run's result."""
        if len(results) == 1:
            return results[0]
        findings = sorted((f for r in results for f in r.findings), key=Finding.sort_key)
        sources = {k: v for r in results for k, v in r.sources.items()}
        return cls(findings, sources, [e for r in results for e in r.errors], sum(r.files for r in results))


class Engine:
    """Lints a set of files with the project's settings; the one entry point for commands."""

    def __init__(self, settings: Settings, use_cache: bool = True, jobs: int | None = None, tree=None) -> None:
        from cfgfix.rules.manifest import entries

        self.settings = settings
        # The run's SettingsTree, when files may use other settings than these: a search for
        # this project's launch scripts then stays out of folders with their own config.
        self.tree = tree
        table = entries()
        self.codes = enabled_codes(
            settings, [entry.code for entry in table], {entry.code for entry in table if entry.default_enabled}
        )
        self.versions = ProjectVersions(settings.root)
        self.linter = Linter(self.codes, self.versions, record_deps=use_cache)
        self.jobs = jobs if jobs is not None else (os.cpu_count() or 1)
        self.cache = None
        if use_cache:
            from cfgfix.cache import Cache

            self.cache = Cache(settings.root, self._fingerprint())
        self.project: ProjectModel | None = None
        self._launch_files: list[SourceFile] = []
        self._tree_files: list[SourceFile] | None = None  # the whole project, when already walked
        # Project rules are imported on the first project that has launches or configs:
        # without either they have nothing to read (a pre-commit run on a few scripts).
        self._project_entries = [entry for entry in table if entry.code in self.codes and entry.scope == "project"]
        self._project_rules: list | None = None
        # Per-file config rules also read a config that only a launch names as one (an
        # accelerate YAML saved as `config.sh`): the project stage runs them on it.
        self._config_rules = self.linter._has_rules("yaml") or self.linter._has_rules("json")

    @property
    def project_rules(self) -> list:
        if self._project_rules is None:
            self._project_rules = [entry.load()() for entry in self._project_entries]
        return self._project_rules

    def _fingerprint(self) -> str:
        from cfgfix import __version__

        return "|".join([__version__, RESULT_SCHEMA, _code_stamp(), self.settings.fingerprint(), ",".join(sorted(self.codes))])

    def _file_key(self, sf: SourceFile) -> str:
        """What besides its bytes a file's result depends on: its project's versions, and the
        path its findings name (relative to the cwd: a run from another folder, such as the
        repository above a project with its own config, must not print the other's paths)."""
        key = self.versions.for_file(sf.path).fingerprint()
        if sf.named and sf.kind in _NAMED_SCRIPT_KINDS:
            key += "#named"  # a named script's result holds the shell rules' findings a walk's does not
        return key if sf.display == sf.relpath else f"{key}@{sf.display}"

    # -- the whole run ---------------------------------------------------------------------
    def run(self, files: list[SourceFile]) -> RunResult:
        results: dict[str, FileResult] = {}
        self._launch_files = list(files)
        datas: dict[str, bytes] = {}
        pending: list[tuple[SourceFile, bytes]] = []
        dep_hashes: dict[str, str | None] = {}  # loader modules hashed once per run
        unread: set[str] = set()  # restored by their stat signature: bytes read only if needed
        stat_keys: dict[str, list[int] | None] = {}
        if self.cache is not None:
            from cfgfix.cache import stat_key
        for sf in files:
            key = None
            if self.cache is not None:
                # Stat before reading: a file that changes after this stat gets a newer one.
                key = stat_keys[sf.display] = stat_key(sf.path)
                restored = self._unchanged(sf, key, dep_hashes)
                if restored is not None:
                    results[sf.display] = restored
                    unread.add(sf.display)
                    continue
            try:
                data = read_file(sf.path)
            except OSError as exc:  # gone, unreadable, a FIFO or device, over the size bound
                results[sf.display] = _unreadable(sf, exc)
                continue
            datas[sf.display] = data
            cached = self.cache.get(sf.relpath, data, self._file_key(sf), key) if self.cache else None
            restored = _restore(cached)
            if restored is not None and restored.deps and not dependencies_unchanged(
                    restored.deps, self.versions.root, dep_hashes):
                restored = None  # a module it follows changed
            if restored is not None:
                results[sf.display] = restored
            else:
                pending.append((sf, data))
        for (sf, data), result in zip(pending, self._lint_many(pending)):
            results[sf.display] = result
            if self.cache is not None:
                self.cache.put(sf.relpath, data, self._file_key(sf), result.to_dict(), stat_keys.get(sf.display))
        if self.cache is not None:
            self.cache.save()
        # Cross-file conditions and project rules need the project's launch scripts even when
        # only some files were named (a pre-commit run passes just the changed ones).
        added = any(r.conditional for r in results.values())
        if added:
            self._add_launch_scripts(files, results)
        self.project = ProjectModel.build(self._launch_files, results, self.settings.root, self.settings)
        if not added and self._project_entries and self.project.wants_launch_scripts():
            # A DeepSpeed config of this run that no launch of this run uses: look for the
            # project's launch scripts (rare in a whole-tree run, usual in a pre-commit run).
            self._add_launch_scripts(files, results)
            self.project = ProjectModel.build(self._launch_files, results, self.settings.root, self.settings)
        findings: list[Finding] = []
        sources: dict[str, SourceText] = {}
        errors: list[str] = []
        by_file, project_errors = self._project_findings(self.project)
        errors.extend(project_errors)
        for sf in files:
            result = results.get(sf.display)
            if result is None:
                continue
            errors.extend(result.errors)
            extra = by_file.get(sf.display) if sf.kind != "markdown" else None  # READMEs are never reported
            if extra:
                result = replace(result, findings=result.findings + extra)
            if sf.display in unread and (result.findings or result.conditional or self.cache.may_hold_directive(sf.relpath)):
                try:  # findings to suppress or show, or a directive to check: the bytes are needed
                    datas[sf.display] = read_file(sf.path)
                except OSError as exc:  # gone since it was stat'ed
                    result = _unreadable(sf, exc)
            findings.extend(self.finalize(sf, datas.get(sf.display), result, sources))
        findings.sort(key=Finding.sort_key)
        return RunResult(findings, sources, errors, len(files))

    def _unchanged(self, sf: SourceFile, key: list[int] | None, dep_hashes: dict) -> FileResult | None:
        """The cached result of a file whose stat signature is the recorded one (and whose
        followed modules are unchanged), without reading it; None otherwise."""
        restored = _restore(self.cache.get_unchanged(sf.relpath, key, self._file_key(sf)))
        if restored is not None and restored.deps and not dependencies_unchanged(
                restored.deps, self.versions.root, dep_hashes):
            return None
        return restored

    def _project_findings(self, project: ProjectModel) -> tuple[dict[str, list[Finding]], list[str]]:
        """The project rules' findings, by the display path of the file they are on. Not
        cached: they depend on several files, and reading the few linked configs is cheap."""
        by_file: dict[str, list[Finding]] = {}
        errors: list[str] = []
        if not (self._project_entries or self._config_rules) or not (project.launches or project.configs):
            return by_file, errors  # nothing for a project rule to read
        for rule in self.project_rules:
            try:
                for finding in rule.check_project(project):
                    by_file.setdefault(finding.span.path, []).append(finding)
            except Exception as exc:  # a bug in a rule must not stop the run
                if is_huge_number_error(exc):
                    continue  # a config with an absurd number: the file itself gets its CFX901
                errors.append(f"internal error in {rule.code} (project stage): {exc!r}")
        if self._config_rules and project.launches:
            for sf, data, fmt, kinds in project.configs_by_use():
                result = self.linter.lint(replace(sf, kind=fmt), data, kinds)
                for finding in result.findings:
                    by_file.setdefault(finding.span.path, []).append(finding)
                errors.extend(result.errors)
        return by_file, errors

    def discovered(self, paths: list[Path], files: list[SourceFile]) -> None:
        """The files `discover(paths)` found. When `paths` include the project root (or a
        folder above it), they hold every file a search for launch scripts would find: the
        tree is walked once."""
        root = os.path.abspath(self.settings.root)
        for path in paths:
            path = os.path.abspath(path)
            if path == root or root.startswith(path.rstrip(os.sep) + os.sep):
                self._tree_files = files
                return

    def _add_launch_scripts(self, files: list[SourceFile], results: dict[str, FileResult]) -> None:
        """Cross-file conditions need the project's launch scripts even when only some
        files were named (a pre-commit run passes just the changed ones)."""
        self._launch_files = list(files)
        named = {os.path.abspath(sf.path) for sf in files}
        if self._tree_files is not None:
            return  # the run's own files are the whole project: every launch script is named
        from cfgfix.workspace import discover_groups

        groups, _ = discover_groups([self.settings.root], self.tree or self.settings, only=self.settings)
        project_files = [sf for _, group in groups for sf in group]
        for sf in project_files:
            if sf.kind not in SHELL_KINDS or os.path.abspath(sf.path) in named:
                continue
            result = None
            if self.cache is not None:
                from cfgfix.cache import stat_key

                key = stat_key(sf.path)
                result = _restore(self.cache.get_unchanged(sf.relpath, key, self._file_key(sf)))
            if result is None:
                try:
                    data = read_file(sf.path)
                except OSError:
                    continue
                cached = self.cache.get(sf.relpath, data, self._file_key(sf)) if self.cache else None
                result = _restore(cached) or self.linter.lint(sf, data)
            results[sf.display] = FileResult(launches=result.launches)
            self._launch_files.append(sf)

    def _lint_many(self, jobs: list[tuple[SourceFile, bytes]]) -> list[FileResult]:
        """Large trees go to a process pool whole (the prefilter itself is a third of the
        work there); small runs, such as a pre-commit hook's, stay in this process."""
        python_files = sum(1 for sf, _ in jobs if sf.kind in ("python", "notebook"))
        if self.jobs > 1 and python_files >= POOL_MIN_FILES:
            return self._lint_pool(jobs)
        return [self.linter.lint(sf, data) for sf, data in jobs]

    def _lint_pool(self, jobs) -> list[FileResult]:
        import multiprocessing

        method = "fork" if sys.platform.startswith("linux") else "spawn"
        context = multiprocessing.get_context(method)
        workers = min(self.jobs, 8)
        from cfgfix.pool import map_in_pool

        # the workers die with this process, however it ends (cfgfix/pool.py)
        chunk = max(1, len(jobs) // (workers * 8))
        init = (self.codes, self.versions, self.linter.record_deps)
        return [FileResult.from_dict(d)
                for d in map_in_pool(context, workers, _init_worker, init, _lint_in_worker, jobs, chunk)]

    # -- one file, with the project in view ---------------------------------------------------
    def lint_one(self, sf: SourceFile, data: bytes, sources: dict[str, SourceText]) -> list[Finding]:
        """Findings for one file's (possibly edited) bytes, as `run` would report them.
        Used by the fixer after each round of edits."""
        result = self.linter.lint(sf, data)
        if (self._project_entries or self._config_rules) and self.project is not None:
            # only what can put a finding on this file, then its edited bytes (issue 14: judging
            # the whole tree after each edit made `fix` quadratic in the size of the tree)
            project = self.project.around(sf.path, self._files_by_launch()).with_override(sf.path, data)
            by_file, _ = self._project_findings(project)
            extra = by_file.get(sf.display) if sf.kind != "markdown" else None
            if extra:
                result = replace(result, findings=result.findings + extra)
        return self.finalize(sf, data, result, sources)

    def _files_by_launch(self) -> list[set[Path]]:
        """What each launch of the run's project reads (its links, and every file its training
        setup took a value from), worked out once per project for `lint_one`."""
        project = self.project
        if getattr(self, "_launch_files_of", (None,))[0] is project:
            return self._launch_files_of[1]
        files = project.files_by_launch()
        try:
            from cfgfix.training.resolve import training_setups

            index = {id(launch): i for i, (launch, _) in enumerate(project.launches)}
            for setup in training_setups(project):
                i = index.get(id(setup.launch))
                if i is None:
                    continue
                files[i].update(setup.files.values())
                if setup.script is not None:
                    files[i].add(setup.script)
                for value in setup.values.values():
                    span = getattr(value, "span", None)
                    if span is not None:
                        files[i].add(project.real_path(span.path))
        except Exception:  # noqa: BLE001 - a resolver bug must not stop a fix; its rules report it
            pass
        self._launch_files_of = (project, files)
        return files

    def finalize(self, sf: SourceFile, data: bytes | None, result: FileResult, sources) -> list[Finding]:
        findings = list(result.findings)
        for condition, finding in result.conditional:
            related = self.project.condition_holds(condition, sf) if self.project else None
            if related is not None:
                findings.append(replace(finding, related=finding.related + tuple(related)))
        ignored = ignored_codes_for(self.settings, sf.relpath, self.codes)
        findings = [f for f in findings if f.code in self.codes and f.code not in ignored]
        if data is None:
            return findings
        data = lone_cr_as_lf(data)
        if not findings and b"cfgfix:" not in data:
            return findings
        source = display_source(sf, data)
        if source is None:
            return findings
        outside = findings and link_leaving(sf.path, self.settings.root)
        if outside:
            # a link to a file outside the project (`.env -> ../secret.txt`): its lines stay
            # out of every report; the findings say where the link goes instead
            findings = [replace(f, message=f"{f.message} ({sf.display} links to {outside}, outside the "
                                            f"project: its lines are not shown)") for f in findings]
        elif findings:
            sources[sf.display] = source
            if sf.kind == "notebook":
                findings = [_lines_to_cells(f, source) for f in findings]
        if b"cfgfix:" not in data:
            return findings
        directives = parse_directives(source)
        kept = [f for f in findings if f.code == "CFX901" or not is_suppressed(f, directives)]
        if "CFX902" in self.codes and "CFX902" not in ignored:
            kept.extend(self._unused(source, directives))
            if not link_leaving(sf.path, self.settings.root):
                sources[sf.display] = source
        return kept

    def _unused(self, source: SourceText, directives) -> list[Finding]:
        from cfgfix.core import Fix

        unused = []
        for directive in directives:
            if directive.codes is None:
                if directive.used:
                    continue
                what = "`cfgfix: ignore`"
            else:
                stale = sorted(c for c in directive.codes - directive.used if c in self.codes)
                if not stale or directive.used:
                    continue
                what = "`cfgfix: ignore[" + ", ".join(stale) + "]`"
            unused.append(
                Finding(
                    "CFX902",
                    "unused-suppression",
                    f"{what} suppresses nothing on this line",
                    Severity.INFO,
                    directive.span,
                    fix=Fix((removal_edit(source, directive),), "Remove the unused suppression"),
                )
            )
        return unused
