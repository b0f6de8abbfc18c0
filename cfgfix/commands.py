"""The command line, shaped like ruff's: `check`, `fix`, `rule`.

Exit codes: 0 clean, 1 findings remain (or `--diff` would change something), 2 usage,
settings or internal error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from cfgfix import __version__

FORMATS = ("text", "json", "sarif", "github")


def _selection_options(func):
    options = [
        click.option("--select", metavar="CODES", help="Rules to enable (codes or prefixes, comma-separated), replacing the defaults."),
        click.option("--ignore", metavar="CODES", help="Rules to disable."),
        click.option("--extend-select", metavar="CODES", help="Rules to enable in addition to the selected ones."),
        click.option("--output-format", type=click.Choice(FORMATS), default=None, help="How to print findings [default: text]."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), help="Use this pyproject.toml or cfgfix.toml."),
        click.option("--no-cache", is_flag=True, help="Read and parse every file; do not use .cfgfix_cache/."),
        click.option("-q", "--quiet", is_flag=True, help="Print findings only, no summary."),
        click.option("--statistics", is_flag=True, help="Print a count per rule instead of each finding."),
        click.argument("paths", nargs=-1, type=click.Path(path_type=Path)),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _codes(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [c.strip() for c in value.split(",") if c.strip()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="cfgfix")
def cli() -> None:
    """cfgfix: find and fix memory, precision and placement mistakes in ML training repos."""


@cli.command()
@_selection_options
@click.option("--fix", "apply_fix", is_flag=True, help="Apply safe fixes (like `cfgfix fix`).")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix: apply unsafe fixes too.")
@click.option("--diff", is_flag=True, help="With --fix: print the diff, write nothing.")
def check(apply_fix, unsafe_fixes, diff, **options) -> None:
    """Report findings in PATHS (default: the current folder)."""
    if apply_fix or diff:
        _fix(unsafe_fixes, diff, **options)
    else:
        _check(**options)


@cli.command()
@_selection_options
@click.option("--unsafe-fixes", is_flag=True, help="Apply unsafe fixes too (numerics or semantics change).")
@click.option("--diff", is_flag=True, help="Print a unified diff of the fixes and write nothing (exit 1 when it would change something).")
def fix(unsafe_fixes, diff, **options) -> None:
    """Apply fixes to PATHS (default: the current folder); report what remains."""
    _fix(unsafe_fixes, diff, **options)


@cli.command()
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="List every rule.")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text")
def rule(code, show_all, output_format) -> None:
    """Print the documentation of rule CODE, or list all rules."""
    from cfgfix.rules.base import all_rules, rule_by_code
    from cfgfix.rulepages import rule_page, rules_table

    if show_all or not code:
        rules = all_rules()
        if output_format == "json":
            import json

            click.echo(json.dumps([_rule_json(r) for r in rules], indent=2))
        else:
            click.echo(rules_table(rules, markdown=False))
        return
    found = rule_by_code(code)
    if found is None:
        raise click.UsageError(f"unknown rule code {code!r}; `cfgfix rule --all` lists them")
    if output_format == "json":
        import json

        click.echo(json.dumps(_rule_json(found) | {"explanation": found.doc()}, indent=2))
    else:
        click.echo(rule_page(found))


def _rule_json(rule) -> dict:
    return {
        "code": rule.code,
        "name": rule.name,
        "severity": rule.severity.value,
        "fix": rule.fix_availability,
        "default": rule.default_enabled,
        "summary": rule.summary(),
        "url": rule.url(),
    }


# -- shared plumbing ------------------------------------------------------------------------
def _prepare(paths, select, ignore, extend_select, config_file, no_cache):
    from cfgfix.engine import Engine
    from cfgfix.settings import SettingsError, load_settings, with_overrides
    from cfgfix.workspace import discover

    try:
        settings = load_settings(Path.cwd(), config_file)
        settings = with_overrides(
            settings, select=_codes(select), ignore=_codes(ignore), extend_select=_codes(extend_select)
        )
        engine = Engine(settings, use_cache=not no_cache)
    except SettingsError as exc:
        _fail(str(exc))
    files, warnings = discover(list(paths) or [Path(".")], settings)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    return engine, files, settings


def _fail(message: str) -> None:
    click.echo(f"cfgfix: error: {message}", err=True)
    raise SystemExit(2)


def _use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def _render(findings, sources, output_format, quiet, statistics, fixed=0, unsafe_hidden=0) -> None:
    from cfgfix.report import ReportContext, render
    from cfgfix.rules.base import all_rules

    ctx = ReportContext(
        sources=sources,
        rules=all_rules(),
        color=_use_color(),
        statistics=statistics,
        fixed=fixed,
        unsafe_hidden=unsafe_hidden,
        tool_version=__version__,
    )
    fmt = output_format or "text"
    text = render(fmt, findings, ctx)
    if fmt == "text" and quiet:
        text = _strip_summary(text, findings)
    click.echo(text, nl=False)


def _strip_summary(text: str, findings) -> str:
    """--quiet: the findings without the closing summary lines."""
    if not findings:
        return ""
    lines = text.rstrip("\n").split("\n")
    while lines and (lines[-1].startswith(("Found ", "All checks", "No fixes")) or "--unsafe-fixes" in lines[-1] or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines) + "\n"


def _check(paths, select, ignore, extend_select, output_format, config_file, no_cache, quiet, statistics):
    from cfgfix.core import Applicability

    engine, files, _ = _prepare(paths, select, ignore, extend_select, config_file, no_cache)
    result = engine.run(files)
    hidden = sum(1 for f in result.findings if f.fix and f.fix.applicability is Applicability.UNSAFE)
    _render(result.findings, result.sources, output_format, quiet, statistics, unsafe_hidden=hidden)
    for error in result.errors:
        click.echo(f"cfgfix: {error}", err=True)
    raise SystemExit(2 if result.errors else (1 if result.findings else 0))


def _fix(unsafe_fixes, diff, paths, select, ignore, extend_select, output_format, config_file, no_cache, quiet, statistics):
    from cfgfix.core import Applicability
    from cfgfix.fixing import WriteError, fix_file, wanted, write_atomically

    engine, files, settings = _prepare(paths, select, ignore, extend_select, config_file, no_cache)
    result = engine.run(files)
    by_file = {sf.display: sf for sf in files}
    fixable_files = sorted({f.path for f in result.findings if wanted(f, unsafe_fixes)})
    remaining = [f for f in result.findings if f.path not in fixable_files]
    sources = dict(result.sources)
    fixed_count, failures, changed = 0, [], []
    for display in fixable_files:
        sf = by_file[display]
        outcome = fix_file(engine, sf, sf.path.read_bytes(), unsafe_fixes)
        if outcome is None:
            remaining.extend(f for f in result.findings if f.path == display)
            continue
        for note in outcome.dropped:
            click.echo(f"warning: {display}: a fix for {note} was dropped: the result would not parse", err=True)
        if outcome.changed and not diff:
            try:
                write_atomically(sf.path, outcome.source.to_bytes(), settings.root)
                fixed_count += len(outcome.applied)
            except WriteError as exc:  # the file is as it was: so are its findings
                failures.append(str(exc))
                remaining.extend(f for f in result.findings if f.path == display)
                continue
        remaining.extend(outcome.remaining)
        sources[display] = outcome.source
        if outcome.changed:
            changed.append(outcome)
    remaining.sort(key=lambda f: f.sort_key())
    if diff:
        for outcome in changed:
            click.echo(outcome.diff(), nl=False)
        count = sum(len(o.applied) for o in changed)
        if not quiet:
            click.echo(f"Would fix {count} finding{'s' if count != 1 else ''} in {len(changed)} file{'s' if len(changed) != 1 else ''}.", err=True)
        raise SystemExit(1 if changed else 0)
    hidden = 0 if unsafe_fixes else sum(1 for f in remaining if f.fix and f.fix.applicability is Applicability.UNSAFE)
    _render(remaining, sources, output_format, quiet, statistics, fixed=fixed_count, unsafe_hidden=hidden)
    for failure in failures:
        click.echo(f"cfgfix: error: {failure}", err=True)
    for error in result.errors:
        click.echo(f"cfgfix: {error}", err=True)
    if failures or result.errors:
        raise SystemExit(2)
    raise SystemExit(1 if remaining else 0)
