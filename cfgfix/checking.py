"""The `check` command and the plumbing every command shares (settings, discovery, the
engine, rendering), without click.

`cfgfix check` with the common options is parsed in `cli.py` and runs here directly, so a
pre-commit run does not import click (~30 ms); the click command line (`commands.py`)
calls the same functions, so both give the same output and exit codes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cfgfix import __version__
from cfgfix.core import LazyRegex

_ANSI = LazyRegex(r"\033\[[;?0-9]*[a-zA-Z]")  # click's strip_ansi


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    """`click.echo` when click is loaded (the click command line), else what it does on a
    UTF-8 stream (the fast path checks the encoding): write, flush, and strip ANSI escapes
    when the stream is not a terminal."""
    click = sys.modules.get("click")
    if click is not None:
        click.echo(message, err=err, nl=nl)
        return
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    text = message + "\n" if nl else message
    if text and "\033" in text and not stream.isatty():
        text = _ANSI.sub("", text)
    if text:
        stream.write(text)
    stream.flush()


def escape_unwritable_output() -> None:
    """Let stdout and stderr write any file name: a name that is not UTF-8 reaches us with its
    bytes as lone surrogates, which a strict stream (`PYTHONIOENCODING=utf-8`, common in CI
    images, or a UTF-8 locale) refuses with a traceback. A character the stream cannot encode
    is written as an escape instead: `\\xe9` for such a byte, `\\uXXXX` for any other (valid
    inside JSON strings too). Streams that already choose (surrogateescape writes the name's
    own bytes, like `ls`) are left alone."""
    import codecs

    try:
        codecs.lookup_error(_ESCAPE)
    except LookupError:
        codecs.register_error(_ESCAPE, _escape_unencodable)
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=_ESCAPE)


_ESCAPE = "cfgfix-escape"


def _escape_unencodable(exc: UnicodeError):
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    parts = []
    for char in exc.object[exc.start:exc.end]:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not UTF-8
            parts.append(f"\\x{code - 0xDC00:02x}")
        elif code > 0xFFFF:  # as a UTF-16 pair, the one form JSON reads
            code -= 0x10000
            parts.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            parts.append(f"\\u{code:04x}")
    return "".join(parts), exc.end


def codes(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [c.strip() for c in value.split(",") if c.strip()]


class Run:
    """One command's files, grouped by the settings each uses (the closest config file above
    it, as in ruff), each group with its own engine: its project, launches and cache."""

    def __init__(self, groups: list, tree) -> None:
        self.groups = groups  # [(settings, engine, files)], in the order their first file sorts
        self.tree = tree
        self.files = [sf for _, _, files in groups for sf in files]
        if len(groups) > 1:
            self.files.sort(key=lambda f: f.display)
        self._engines = {sf.path: engine for _, engine, files in groups for sf in files}

    @property
    def settings(self):
        """The current folder's settings (the first group's when --config or --isolated)."""
        return self.tree.fallback

    @property
    def engines(self) -> list:
        return [engine for _, engine, _ in self.groups]

    def engine_for(self, sf):
        """The engine of the group `sf` belongs to (its settings, project and root)."""
        return self._engines[sf.path]

    def run(self):
        """Each group's engine on its files, the results merged as one run's."""
        from cfgfix.engine import RunResult

        return RunResult.merged([engine.run(files) for _, engine, files in self.groups])


def settings_tree(config_file, isolated=False, select=None, ignore=None, extend_select=None, gpu=None,
                  simulate=False):
    """Which settings each file uses, with the command line's overrides applied to each."""
    from cfgfix.records import replace
    from cfgfix.settings import check_gpu, with_gpu, with_overrides
    from cfgfix.settings_tree import SettingsTree

    selected = {name: _codes_flag(flag, value) for name, flag, value in (
        ("select", "--select", select), ("ignore", "--ignore", ignore), ("extend_select", "--extend-select", extend_select))}
    if gpu is not None:
        check_gpu(gpu, "--gpu")  # an unknown --gpu is an error even where no file is checked

    def adjust(settings):
        settings = with_gpu(with_overrides(settings, **selected), gpu)
        return replace(settings, simulate=True) if simulate else settings

    return SettingsTree(Path.cwd(), config_file, isolated, adjust)


def _codes_flag(flag: str, value: str | None) -> list[str] | None:
    from cfgfix.settings import SettingsError

    found = codes(value)
    if found == []:
        raise SettingsError(f"{flag}: no rule code given (codes or prefixes, comma-separated, such as CFX1,CFX203)")
    return found


def prepare(paths, select, ignore, extend_select, config_file, no_cache, discover_files=True, gpu=None,
            isolated=False, simulate=False) -> Run:
    """Settings, files and engines for a command: the files under `paths` (default: the
    current folder) grouped by the config file each uses, one engine per group."""
    from cfgfix.engine import Engine

    _fewer_collections()
    from cfgfix.settings import SettingsError
    from cfgfix.workspace import discover_groups

    try:
        tree = settings_tree(config_file, isolated, select, ignore, extend_select, gpu, simulate)
        if not discover_files:  # `review` finds its own files through git
            settings = tree.fallback
            return Run([(settings, Engine(settings, use_cache=not no_cache, tree=tree), [])], tree)
        # A typo'd path must not pass CI green: it is an error, as for `explain` and `estimate`.
        missing = [str(p) for p in paths if not os.path.lexists(p)]
        if missing:
            fail(f"{', '.join(missing)}: no such file or folder")
        roots = list(paths) or [Path(".")]
        found, warnings = discover_groups(roots, tree)
        groups = []
        for settings, files in found:
            engine = Engine(settings, use_cache=not no_cache, tree=tree)
            engine.discovered(roots, files)
            groups.append((settings, engine, files))
        if not groups:  # nothing to check: the current folder's settings still say what is wrong
            settings = tree.fallback
            groups.append((settings, Engine(settings, use_cache=not no_cache, tree=tree), []))
    except SettingsError as exc:
        fail(str(exc))
    for warning in warnings:
        echo(f"warning: {warning}", err=True)
    return Run(groups, tree)


_TUNED = False  # the collector is tuned once per process


def _fewer_collections() -> None:
    """A run allocates hundreds of thousands of AST nodes and analysis records that live
    until their file is done; the cyclic collector's default (a pass every 700 allocations,
    and full passes over everything alive) re-traversed them over and over: ~8% of a
    pre-commit run's CPU. What is loaded so far (modules, settings) is never garbage: it is
    frozen out of every pass (once per process: a process that runs many commands, such as a
    test session, would otherwise freeze each run's uncollected garbage for good), and passes
    come every 10,000 allocations."""
    import gc

    global _TUNED
    if _TUNED:
        return
    _TUNED = True
    gc.freeze()
    if gc.get_threshold()[0] < 10_000:
        gc.set_threshold(10_000, 10, 10)


# A pre-commit run names the changed files; a whole tree is usually many more.
FEW_FILES = 64


def _run_without_collections_if_few(run: Run, exiting: bool = False):
    """`run.run()`; over a few files without the cyclic collector. Such a run
    allocates a few syntax trees and their analyses, then reports: collecting cycles among
    them frees little, and the passes still cost ~10 ms of a 5-file pre-commit run (issue
    15). Larger runs keep the tuned collector, so memory stays bounded over thousands of
    files. The collector is back on afterwards (a test session runs many checks in one
    process), unless the process is `exiting` once it has reported: turned back on, its
    first pass walks every object the run made (19 ms on five trainer files) to free
    memory the process is about to hand back anyway."""
    import gc

    pause = len(run.files) <= FEW_FILES and gc.isenabled()
    if pause:
        gc.disable()
    try:
        return run.run()
    finally:
        if pause and not exiting:
            gc.enable()


def fail(message: str) -> None:
    echo(f"cfgfix: error: {message}", err=True)
    raise SystemExit(2)


def no_files(files, output_format, quiet) -> None:
    """A folder with nothing cfgfix reads is not "All checks passed!": say so and stop (exit 0,
    like ruff's "No Python files found"; machine formats still get their empty document)."""
    if files:
        return
    if not quiet:
        echo("warning: no files checked: nothing under the given paths is a file cfgfix reads "
                   "(Python, shell, YAML, JSON, Makefile, Dockerfile, .env)", err=True)
    if (output_format or "text") == "text":
        if not quiet:
            echo("No files checked.")
        raise SystemExit(0)


def use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def render_findings(findings, sources, output_format, quiet, statistics, fixed=0, unsafe_hidden=0,
                    unsafe_fixes=False) -> None:
    from cfgfix.report import ReportContext, render

    fmt = output_format or "text"
    # SARIF describes every rule (their docs); the other formats only link a finding's page,
    # which needs no rule class: they do not import the rules the run did not use.
    if fmt == "sarif":
        from cfgfix.rules.base import all_rules

        rules = all_rules()
    else:
        rules = []
    ctx = ReportContext(
        sources=sources,
        rules=rules,
        color=use_color(),
        statistics=statistics,
        fixed=fixed,
        unsafe_hidden=unsafe_hidden,
        unsafe_fixes=unsafe_fixes,
        tool_version=__version__,
    )
    text = render(fmt, findings, ctx)
    if fmt in ("text", "concise") and quiet:
        text = strip_summary(text, findings)
    echo(text, nl=False)


def strip_summary(text: str, findings) -> str:
    """--quiet: the findings without the closing summary lines."""
    if not findings:
        return ""
    lines = text.rstrip("\n").split("\n")
    while lines and (lines[-1].startswith(("Found ", "All checks", "No fixes")) or "--unsafe-fixes" in lines[-1] or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines) + "\n"


def check(paths, select, ignore, extend_select, output_format, config_file, no_cache, quiet, statistics, simulate=False,
          exiting=False, unsafe_fixes=False, isolated=False, gpu=None):
    """`cfgfix check`. `exiting`: the process ends once the report is written (the CLI's
    fast exit), so it need not tidy its memory first. `unsafe_fixes`: unsafe fixes are
    offered as available (ruff's `check --unsafe-fixes`), not hidden."""
    from cfgfix.core import Applicability

    run = prepare(paths, select, ignore, extend_select, config_file, no_cache, gpu=gpu, isolated=isolated,
                  simulate=simulate)
    no_files(run.files, output_format, quiet)
    result = _run_without_collections_if_few(run, exiting)
    hidden = 0 if unsafe_fixes else sum(1 for f in result.findings if f.fix and f.fix.applicability is Applicability.UNSAFE)
    render_findings(result.findings, result.sources, output_format, quiet, statistics, unsafe_hidden=hidden,
                    unsafe_fixes=unsafe_fixes)
    for error in result.errors:
        echo(f"cfgfix: {error}", err=True)
    raise SystemExit(2 if result.errors else (1 if result.findings else 0))
