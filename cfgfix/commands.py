"""The command line, shaped like ruff's: `check`, `fix`, `rule`, and `review` (pull requests).

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


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--output-format", type=click.Choice(("text", "json")), default="text", help="What to print [default: text].")
@click.option("--gpu", metavar="NAME", help="The target GPU (overrides [tool.cfgfix] gpu).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), help="Use this pyproject.toml or cfgfix.toml.")
def explain(paths, output_format, gpu, config_file) -> None:
    """Show each launch's resolved training setup and where every value comes from."""
    from dataclasses import replace

    from cfgfix.training.explain import render_json, render_text
    from cfgfix.training.resolve import training_setups

    engine, files, settings = _prepare(paths, None, None, None, config_file, False)
    if gpu:
        engine.settings = replace(engine.settings, gpu=gpu)
    result = engine.run(files)
    for error in result.errors:
        click.echo(f"cfgfix: {error}", err=True)
    project = engine.project
    setups = training_setups(project)
    if paths:  # launch scripts outside the named paths were read only to link files
        roots = [Path(os.path.realpath(p)) for p in paths]
        setups = [s for s in setups if any(s.launch_file == r or r in s.launch_file.parents for r in roots)]
    render = render_json if output_format == "json" else render_text
    click.echo(render(setups, project.display), nl=False)


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
def _prepare(paths, select, ignore, extend_select, config_file, no_cache, discover_files=True):
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
    if not discover_files:  # `review` finds its own files through git
        return engine, [], settings
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


# -- review -----------------------------------------------------------------------------------
REVIEW_FORMATS = ("github-review", "rdjson", "text", "json")
_SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


@cli.command()
@click.option("--base", metavar="REF", help="Compare with the merge base of REF [default: $GITHUB_BASE_REF, else origin/HEAD, main or master].")
@click.option("--head", metavar="REF", help="The reviewed commit (must be checked out) [default: the working tree].")
@click.option("--select", metavar="CODES", help="Rules to enable, replacing the defaults.")
@click.option("--ignore", metavar="CODES", help="Rules to disable.")
@click.option("--extend-select", metavar="CODES", help="Rules to enable in addition.")
@click.option("--output-format", type=click.Choice(REVIEW_FORMATS), default="text", help="What to print [default: text].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), help="Use this pyproject.toml or cfgfix.toml.")
@click.option("--no-cache", is_flag=True, help="Do not use .cfgfix_cache/.")
@click.option("--post", is_flag=True, help="Post the review to the pull request (GITHUB_TOKEN, GITHUB_REPOSITORY).")
@click.option("--pr", type=int, help="Pull request number [default: from $GITHUB_EVENT_PATH].")
@click.option("--approve-when-clean/--no-approve-when-clean", default=False, help="With --post and no findings: post a short approval note instead of nothing.")
@click.option("--fail-on", type=click.Choice(("info", "warning", "error", "none")), default="info", help="Exit 1 when a finding on a changed line has at least this severity [default: info].")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
def review(base, head, select, ignore, extend_select, output_format, config_file, no_cache, post, pr,
           approve_when_clean, fail_on, paths) -> None:
    """Review the lines a pull request changes: findings on changed lines, with suggestions."""
    import json

    from cfgfix.report.github_review import payload as review_payload
    from cfgfix.review.gitdiff import GitError
    from cfgfix.review.run import build_review
    from cfgfix.rules.base import all_rules

    engine, _, settings = _prepare((), select, ignore, extend_select, config_file, no_cache, discover_files=False)
    try:
        result = build_review(engine, settings, base, head, list(paths), Path.cwd())
    except (GitError, ValueError) as exc:
        _fail(str(exc))
    rules = all_rules()
    body = review_payload(result, rules)
    if post:
        from cfgfix.review.post import event_head_sha

        body["commit_id"] = event_head_sha() or body["commit_id"]
    if output_format == "github-review":
        click.echo(json.dumps(body, indent=2))
    elif output_format == "rdjson":
        from cfgfix.report.rdjson import render_review

        click.echo(render_review(result, rules), nl=False)
    elif output_format == "json":
        click.echo(json.dumps([
            {"path": c.path, "line": c.line, "start_line": c.start_line, "code": c.finding.code,
             "severity": c.finding.severity.value, "message": c.finding.message,
             "related_note": c.related_note, "suggestion": c.suggestion, "unsafe_fix": c.unsafe,
             "finding": c.finding.to_dict()} for c in result.comments], indent=2))
    else:
        for c in result.comments:
            where = f"{c.path}:{c.line}" if c.start_line == c.line else f"{c.path}:{c.start_line}-{c.line}"
            click.echo(f"{where}: {c.finding.code} {c.finding.message}")
            if c.related_note:
                click.echo(f"  note: {c.related_note}")
            if c.suggestion is not None:
                click.echo(f"  suggestion{' (unsafe fix)' if c.unsafe else ''}: {c.finding.fix.description}")
        files = len(result.changed)
        if result.comments:
            click.echo(f"Found {len(result.comments)} finding{'s' if len(result.comments) != 1 else ''} on changed lines ({files} changed file{'s' if files != 1 else ''}).")
        else:
            click.echo(f"No findings on changed lines ({files} changed file{'s' if files != 1 else ''}).")
    for error in result.errors:
        click.echo(f"cfgfix: {error}", err=True)
    if post:
        from cfgfix.review.post import Client, PostError, post_review, target_from_env

        try:
            client = Client(target_from_env(pr), log=lambda m: click.echo(f"cfgfix: {m}", err=True))
            done = post_review(client, body, approve_when_clean)
        except PostError as exc:
            click.echo(f"cfgfix: error: posting the review failed: {exc}", err=True)
            raise SystemExit(2)
        click.echo(f"cfgfix: {done}", err=True)
    if result.errors:
        raise SystemExit(2)
    threshold = _SEVERITY_RANK.get(fail_on)
    failing = threshold is not None and any(_SEVERITY_RANK[c.finding.severity.value] >= threshold for c in result.comments)
    raise SystemExit(1 if failing else 0)
