"""The command line, shaped like ruff's: `check`, `fix`, `rule`, and `review` (pull requests).

Exit codes: 0 clean, 1 findings remain (or `--diff` would change something), 2 usage,
settings or internal error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from cfgfix import __version__
from cfgfix.checking import check as _check
from cfgfix.checking import fail as _fail
from cfgfix.checking import no_files as _no_files
from cfgfix.checking import prepare as _prepare
from cfgfix.checking import render_findings as _render

FORMATS = ("text", "concise", "json", "sarif", "github")


def _apply(func, options):
    for option in reversed(options):
        func = option(func)
    return func


def settings_options(rules: bool = True):
    """The options every command that reads a project shares, spelled and checked the same
    way everywhere: where settings come from (--config, --isolated), the cache, the target
    GPU, and (`rules`) which rules run."""
    options = [
        click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Use this pyproject.toml or cfgfix.toml for every file (default: the closest one above each file)."),
        click.option("--isolated", is_flag=True, help="Read no config file: the defaults and the flags only."),
        click.option("--no-cache", is_flag=True, help="Read and parse every file; do not use .cfgfix_cache/."),
        click.option("--gpu", metavar="NAME", help='The target GPU ("RTX 4090", "A100 80GB", ...), over the settings\' gpu.'),
    ]
    if rules:
        options += [
            click.option("--select", metavar="CODES", help="Rules to enable (codes or prefixes, comma-separated), replacing the defaults."),
            click.option("--ignore", metavar="CODES", help="Rules to disable."),
            click.option("--extend-select", metavar="CODES", help="Rules to enable in addition to the selected ones."),
        ]
    return lambda func: _apply(func, options)


def _selection_options(func):
    return _apply(func, [
        settings_options(rules=True),
        click.option("--output-format", type=click.Choice(FORMATS), default=None, help="How to print findings [default: text]."),
        click.option("-q", "--quiet", is_flag=True, help="Print findings only, no summary."),
        click.option("--statistics", is_flag=True, help="Print a count per rule instead of each finding."),
        click.argument("paths", nargs=-1, type=click.Path(path_type=Path)),
    ])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="cfgfix")
def cli() -> None:
    """cfgfix: find and fix memory, precision and placement mistakes in ML training repos."""


@cli.command()
@_selection_options
@click.option("--fix", "apply_fix", is_flag=True, help="Apply safe fixes (like `cfgfix fix`).")
@click.option("--unsafe-fixes", is_flag=True, help="Offer unsafe fixes too ([*], SARIF fixes); with --fix: apply them.")
@click.option("--diff", is_flag=True, help="With --fix: print the diff, write nothing.")
@click.option("--simulate", is_flag=True, help="CFX701: measure each launch's step with the FakeTensor simulator (needs the verify extra) instead of the analytic model alone.")
def check(apply_fix, unsafe_fixes, diff, simulate, **options) -> None:
    """Report findings in PATHS (default: the current folder)."""
    if apply_fix or diff:
        _fix(unsafe_fixes, diff, **options)
    else:
        _check(**options, simulate=simulate, unsafe_fixes=unsafe_fixes)


@cli.command()
@_selection_options
@click.option("--unsafe-fixes", is_flag=True, help="Apply unsafe fixes too (numerics or semantics change).")
@click.option("--diff", is_flag=True, help="Print a unified diff of the fixes and write nothing (exit 1 when it would change something).")
@click.option("--fit", is_flag=True, help="Make each launch fit its target GPU: write the cheapest ladder of config changes (mixed precision, checkpointing, micro batch, 8-bit optimizer, ZeRO, offload) that fits.")
def fix(unsafe_fixes, diff, fit, **options) -> None:
    """Apply fixes to PATHS (default: the current folder); report what remains."""
    if fit:
        _fit(diff, options)
        return
    _fix(unsafe_fixes, diff, **options)


def _fit(diff, options) -> None:
    from cfgfix.training.fit_command import apply_plans, plan_launches

    groups = _project_setups(options["paths"], **_project_options(options))
    if not any(setups for _, setups in groups):
        # the user asked for a plan and none can be made: a CI step must not pass green
        _fail("no training launch found: nothing to fit (`cfgfix explain` shows what cfgfix reads)")
    status, estimated = 0, False
    for project, setups in groups:  # each project with its own settings (its target GPU)
        if not setups:
            continue
        plans = plan_launches(project, setups)
        status = max(status, apply_plans(project, plans, diff, click.echo))
        estimated = estimated or any(plan.estimated for plan in plans)
    if not estimated:
        _fail("no launch could be estimated (see `not estimated` above): no plan was made")
    raise SystemExit(status)


def _project_options(options: dict) -> dict:
    """The settings options `_project_setups` takes, from a command's options."""
    keys = ("config_file", "isolated", "no_cache", "gpu", "select", "ignore", "extend_select")
    return {key: options.get(key) for key in keys}


@cli.command()
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="List every rule.")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text")
def rule(code, show_all, output_format) -> None:
    """Print the documentation of rule CODE, or list all rules."""
    from cfgfix.rulepages import rule_page, rules_table
    from cfgfix.rules.base import all_rules, rule_by_code

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
        import difflib

        close = difflib.get_close_matches(code.strip().upper(), [r.code for r in all_rules()], n=1, cutoff=0.75)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise click.UsageError(f"unknown rule code {code!r}; {hint}`cfgfix rule --all` lists them")
    if output_format == "json":
        import json

        click.echo(json.dumps(_rule_json(found) | {"explanation": found.doc()}, indent=2))
    else:
        click.echo(rule_page(found))


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--output-format", type=click.Choice(("text", "json")), default="text", help="What to print [default: text].")
@settings_options(rules=False)
def explain(paths, output_format, **options) -> None:
    """Show each launch's resolved training setup and where every value comes from."""
    from cfgfix.training.estimate_project import project_answers
    from cfgfix.training.explain import render_json, render_text

    groups = _project_setups(paths, **_project_options(options))
    render = render_json if output_format == "json" else render_text
    click.echo(render(*_all_setups(groups), project_answers(groups)), nl=False)


def _all_setups(groups):
    """Every project's setups as one list, and a display function that knows every project."""
    setups = [setup for _, project_setups in groups for setup in project_setups]
    projects = [project for project, _ in groups]

    def display(path: Path) -> str:
        for project in projects:
            if path in project.displays:
                return project.displays[path]
        return projects[0].display(path)

    return setups, display


def _project_setups(paths, config_file=None, isolated=False, no_cache=False, gpu=None, select=None, ignore=None,
                    extend_select=None) -> list:
    """Lint `paths` (to build each project's model) and return [(project, the training
    setups of its launches inside `paths`)], one per settings file the files use (a project
    is the folder of its cfgfix.toml, with that file's GPU)."""
    from cfgfix.training.resolve import training_setups

    for path in paths:
        if not path.exists():
            _fail(f"{path}: no such file or folder")
    run = _prepare(paths, select, ignore, extend_select, config_file, no_cache, gpu=gpu, isolated=isolated)
    groups = []
    roots = [Path(os.path.realpath(p)) for p in paths]
    for _, engine, files in run.groups:
        result = engine.run(files)
        for error in result.errors:
            click.echo(f"cfgfix: {error}", err=True)
        setups = training_setups(engine.project)
        if paths:  # launch scripts outside the named paths were read only to link files
            setups = [s for s in setups if any(s.launch_file == r or r in s.launch_file.parents for r in roots)]
        groups.append((engine.project, setups))
    return groups


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


def _signals_exit() -> None:
    """SIGTERM and SIGHUP (a CI timeout, a closed terminal) raise SystemExit with the signal's
    exit code, as Ctrl-C raises KeyboardInterrupt: `finally` blocks run, so a write in progress
    removes its temporary file instead of leaving it in the project."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), leave)


def _fix(unsafe_fixes, diff, paths, select, ignore, extend_select, output_format, config_file, no_cache, quiet, statistics,
         isolated=False, gpu=None):
    from cfgfix.core import Applicability
    from cfgfix.documents.files import read_file
    from cfgfix.fixing import WriteError, fix_file, keep_launchable, wanted, write_atomically

    run = _prepare(paths, select, ignore, extend_select, config_file, no_cache, gpu=gpu, isolated=isolated)
    files = run.files
    _no_files(files, output_format, quiet)
    result = run.run()
    by_file = {sf.display: sf for sf in files}
    fixable_files = sorted({f.path for f in result.findings if wanted(f, unsafe_fixes)})
    remaining = [f for f in result.findings if f.path not in fixable_files]
    sources = dict(result.sources)
    fixed_count, failures, changed = 0, [], []
    _signals_exit()  # SIGTERM/SIGHUP mid-write unwind through the writer's cleanup
    outcomes = []  # (sf, FileFix), every file fixed in memory before anything is written
    for display in fixable_files:
        sf = by_file[display]
        try:
            data = read_file(sf.path)
        except OSError as exc:  # deleted (or replaced by something odd) since it was checked
            failures.append(f"cannot read {display}: {exc.strerror or exc}; not fixed")
            continue
        outcome = fix_file(run.engine_for(sf), sf, data, unsafe_fixes)
        if outcome is None:
            remaining.extend(f for f in result.findings if f.path == display)
            continue
        for note in outcome.dropped:
            click.echo(f"warning: {display}: a fix for {note} was dropped: the result would not parse", err=True)
        outcomes.append((sf, outcome))
    # The fixed project must still launch: fixes that together add a project finding (a
    # precision the DeepSpeed JSON contradicts, a batch that no longer adds up) stay unapplied.
    for engine in run.engines:  # each project judged with its own settings
        ours = [(sf, o) for sf, o in outcomes if o.changed and run.engine_for(sf) is engine]
        for display, why in (keep_launchable(engine, ours) if ours else {}).items():
            click.echo(f"warning: {display}: fixes not applied: {why}", err=True)
            outcomes = [(sf, o) for sf, o in outcomes if sf.display != display]
            remaining.extend(f for f in result.findings if f.path == display)
    for sf, outcome in outcomes:
        display = sf.display
        if outcome.changed and not diff:
            try:
                write_atomically(sf.path, outcome.source.to_bytes(), run.engine_for(sf).settings.root)
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
    _render(remaining, sources, output_format, quiet, statistics, fixed=fixed_count, unsafe_hidden=hidden,
            unsafe_fixes=unsafe_fixes)
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
@settings_options(rules=True)
@click.option("--output-format", type=click.Choice(REVIEW_FORMATS), default="text", help="What to print [default: text].")
@click.option("--post", is_flag=True, help="Post the review to the pull request (GITHUB_TOKEN, GITHUB_REPOSITORY).")
@click.option("--pr", type=int, help="Pull request number [default: from $GITHUB_EVENT_PATH].")
@click.option("--approve-when-clean/--no-approve-when-clean", default=False, help="With --post and no findings: post a short approval note instead of nothing.")
@click.option("--fail-on", type=click.Choice(("info", "warning", "error", "none")), default="info", help="Exit 1 when a finding on a changed line has at least this severity [default: info].")
@click.option("--unsafe-fixes", is_flag=True, help="Suggest unsafe fixes too (numerics or semantics change); by default suggestions carry safe fixes only.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
def review(base, head, select, ignore, extend_select, output_format, config_file, no_cache, post, pr,
           approve_when_clean, fail_on, unsafe_fixes, paths, isolated, gpu) -> None:
    """Review the lines a pull request changes: findings on changed lines, with suggestions."""
    import json

    from cfgfix.report.github_review import payload as review_payload
    from cfgfix.review.gitdiff import GitError
    from cfgfix.review.run import build_review
    from cfgfix.rules.base import all_rules

    run = _prepare((), select, ignore, extend_select, config_file, no_cache, discover_files=False, gpu=gpu,
                   isolated=isolated)
    engine, settings = run.engines[0], run.settings
    try:
        result = build_review(engine, settings, base, head, list(paths), Path.cwd(), unsafe_fixes, run.tree)
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

        click.echo(render_review(result, rules, unsafe_fixes), nl=False)
    elif output_format == "json":
        click.echo(json.dumps([
            {"path": c.path, "line": c.line, "start_line": c.start_line, "code": c.finding.code,
             "severity": c.finding.severity.value, "message": c.finding.message,
             "related_note": c.related_note, "suggestion": c.suggestion, "unsafe_fix": c.unsafe,
             "finding": c.finding.to_dict()} for c in result.comments], indent=2))
    else:
        for c in result.comments:
            where = f"{c.path}:{c.line}" if c.start_line == c.line else f"{c.path}:{c.start_line}-{c.line}"
            cell = result.cells.get(id(c.finding))
            where += f" ({cell})" if cell else ""  # a notebook: the JSON line and the cell position
            click.echo(f"{where}: {c.finding.code} {c.finding.message}")
            if c.related_note:
                click.echo(f"  note: {c.related_note}")
            if c.suggestion is not None:
                click.echo(f"  suggestion{' (unsafe fix)' if c.unsafe else ''}: {c.finding.fix.description}")
        for finding in result.unplaced:
            click.echo(f"{finding.path}: {finding.code} {finding.message} (in a notebook cell no diff line shows)")
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


def _finite(value, flag: str):
    """A number click let through that is no number of things (nan)."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param_hint=flag)
    return value


# -- verify -----------------------------------------------------------------------------------
@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--steps", type=click.IntRange(min=1), default=2, show_default=True, help="Optimizer steps to run in each copy.")
@click.option("--unsafe-fixes", "--fix-unsafe", "fix_unsafe", is_flag=True, help="Apply unsafe fixes too in the patched copy.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Fix the copy with this pyproject.toml or cfgfix.toml (default: the closest one above each file).")
@click.option("--isolated", is_flag=True, help="Fix the copy with the defaults and the flags only.")
@click.option("--no-cache", is_flag=True, help="Accepted as by every command; verify never uses .cfgfix_cache/.")
@click.option("--select", metavar="CODES", help="Apply the fixes of these rules only (codes or prefixes, comma-separated).")
@click.option("--ignore", metavar="CODES", help="Do not apply these rules' fixes.")
@click.option("--extend-select", metavar="CODES", help="Also apply these rules' fixes.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True, help="Seconds each run may take.")
@click.option("--device", type=click.Choice(("auto", "cuda", "cpu")), default="auto", show_default=True, help="cpu hides the GPUs (CUDA_VISIBLE_DEVICES=''); cuda requires one.")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--before", metavar="REF", help="Compare two git revisions instead of applying fixes (with --after).")
@click.option("--after", metavar="REF", help="The revision to compare against --before.")
@click.option("--loss-rtol", type=click.FloatRange(min=0), default=0.02, show_default=True, help="Relative tolerance of losses and gradient norms when they need not be identical.")
@click.option("--post", is_flag=True, help="Post (or update in place) the pull request's verification comment (GITHUB_TOKEN, GITHUB_REPOSITORY).")
@click.option("--pr", type=int, metavar="N", help="Pull request number for --post [default: from the event].")
@click.option("--comment-file", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH", help="Write the verification comment's markdown here (a dry run of --post).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def verify(command, **options) -> None:
    """Run a launch COMMAND for a few steps as it is and with cfgfix's fixes, and compare.

    Usage: cfgfix verify [OPTIONS] -- python train.py ... (no command: the project's one
    launch script that starts training). Exit 0 when the fix holds (same steps, finite and
    matching losses and gradient norms, peak memory not higher, and the changed lines ran),
    1 when it does not, 2 when it could not run, 3 when the runs agree but a changed line
    did not run (not exercised).
    """
    from cfgfix.checking import _codes_flag, fail
    from cfgfix.settings import SettingsError
    from cfgfix.verify.command import Options, run

    options.pop("no_cache")
    try:
        selection = {name: _codes_flag(flag, options.pop(name)) for name, flag in (
            ("select", "--select"), ("ignore", "--ignore"), ("extend_select", "--extend-select"))}
    except SettingsError as exc:
        fail(str(exc))
    if options["config_file"] is not None and options["isolated"]:
        fail("--config and --isolated cannot be used together")
    selection = {k: v for k, v in selection.items() if v is not None}
    raise SystemExit(run(Options(command=list(command), selection=selection, **options)))


# -- estimate ---------------------------------------------------------------------------------
# The flags that describe a run by hand; the project mode reads them from each launch instead.
_RUN_FLAGS = ("num_gpus", "precision", "optimizer", "zero", "fsdp", "offload", "batch", "seq", "target_seq",
              "resolution", "lora_rank", "lora_targets", "quantize", "checkpointing", "device", "attention",
              "optimizer_impl", "head", "grad_accum", "task", "no_reference", "deepspeed_config", "torch_version",
              "transformers_version", "variable_length")


def _given_run_flags(names: bool = False) -> list[str]:
    """The run-describing flags given on the command line (not left at their defaults), as
    spelled (`--lora-rank`) or, with `names`, as parameter names (`lora_rank`)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = []
    for param in ctx.command.params:
        if param.name in _RUN_FLAGS and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
            given.append(param.name if names else max(param.opts, key=len))
    return given


_PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16", "fp16", "ds-bf16", "ds-fp16")


@cli.command()
@click.option("--model", metavar="ID|PATH", help="A catalog model id or a local folder / config.json.")
@click.option("--params", type=click.FloatRange(min=1, max=1e14), callback=lambda _c, _p, v: _finite(v, "--params"), metavar="N", help="Parameter count (e.g. 7.6e9) when no model is given, or to override it.")
@settings_options(rules=False)
@click.option("--num-gpus", type=click.IntRange(min=1, max=1_000_000), default=1, show_default=True, help="Data-parallel world size.")
@click.option("--precision", type=click.Choice(_PRECISIONS), default="fp32", show_default=True,
              help="fp32; amp-*: fp32 weights + autocast; bf16/fp16: pure 16-bit weights; ds-*: DeepSpeed's 16-bit engine.")
@click.option("--optimizer", type=click.Choice(("adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor")), default="adamw", show_default=True)
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="DeepSpeed ZeRO stage.")
@click.option("--fsdp", type=click.Choice(("full", "grad-op")), default=None, help="FSDP sharding instead of ZeRO.")
@click.option("--offload", type=click.Choice(("none", "optimizer", "optimizer+params")), default="none", show_default=True)
@click.option("--batch", type=click.IntRange(min=1, max=1_000_000), default=1, show_default=True, help="Micro batch per GPU.")
@click.option("--seq", type=click.IntRange(min=1, max=100_000_000), default=None, help="Tokens per sample (T5: source tokens).")
@click.option("--target-seq", type=click.IntRange(min=1, max=100_000_000), default=None, help="T5: target tokens.")
@click.option("--resolution", type=click.IntRange(min=8, max=65_536), default=None, help="Image side in pixels (diffusion UNets).")
@click.option("--lora-rank", type=click.IntRange(min=1, max=65_536), default=None, help="LoRA rank (frozen base); omit for a full fine-tune.")
@click.option("--lora-targets", metavar="NAMES", default=None,
              help="The Linear layers LoRA adapts, as PEFT's target_modules (q_proj,v_proj), roles (q,k,v,o,gate,up,down) or all-linear [default: all-linear].")
@click.option("--quantize", type=click.Choice(("4bit", "8bit")), default=None, help="QLoRA: the frozen base's storage.")
@click.option("--checkpointing/--no-checkpointing", default=False, show_default=True, help="Gradient checkpointing.")
@click.option("--device", type=click.Choice(("cuda", "cpu")), default="cuda", show_default=True,
              help="Whose kernels the activation terms follow: cuda (a GPU run), or cpu (what `verify --device cpu` and --simulate measure; no CUDA context).")
@click.option("--attention", type=click.Choice(("sdpa", "eager", "flash")), default=None,
              help="The load's attn_implementation (default: the family's default in transformers).")
@click.option("--optimizer-impl", type=click.Choice(("foreach", "fused", "for-loop")), default=None,
              help="torch's optimizer implementation (default: torch's for the device; the HF Trainer uses fused).")
@click.option("--head", type=click.Choice(("causal-lm", "masked-lm", "classification")), default=None,
              help="The head the script builds (AutoModelFor...): default causal-lm, BERT classification.")
@click.option("--grad-accum", type=click.IntRange(min=1, max=1_000_000), default=1, show_default=True, help="Gradient accumulation steps.")
@click.option("--variable-length/--fixed-length", default=None,
              help="Whether the batches change shape from step to step (group_by_length, dynamic padding): the band's top then carries the caching allocator's reported 1.6-1.7x [default: not stated].")
@click.option("--task", type=click.Choice(("sft", "dpo")), default="sft", show_default=True,
              help="dpo: TRL's DPOTrainer (chosen and rejected in one batch of twice --batch, and a frozen reference model unless LoRA or --no-reference).")
@click.option("--no-reference", is_flag=True, help="--task dpo with precompute_ref_log_probs: no reference model held during training.")
@click.option("--deepspeed-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="A DeepSpeed JSON: its stage, offload, precision, micro batch, buckets, overlap_comm and ZeRO-3 live/prefetched parameters (a flag given must agree).")
@click.option("--torch-version", metavar="X.Y[.Z][+cuNNN]", default=None,
              help="The torch release: its optimizer implementation and zero_grad defaults (per-parameter loop before 2.0), its CUDA release from +cuNNN.")
@click.option("--transformers-version", metavar="X.Y.Z", default=None,
              help="The transformers release: the family's default attention kernel, T5's tied head.")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--simulate", is_flag=True, help="Also run two real training steps of the full-size model under FakeTensorMode on the CPU and report their peak (needs the verify extra).")
@click.option("--list-models", is_flag=True, help="List the catalog's model ids and exit.")
@click.option("--list-gpus", is_flag=True, help="List the catalog's GPUs and exit.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
def estimate(output_format, simulate, list_models, list_gpus, paths, config_file, isolated, no_cache, **run) -> None:
    """Estimate the GPU memory of a training run: a breakdown per GPU, a bar chart against the
    GPU's memory, and whether it fits. Flags describe the run; without --model/--params every
    launch found in PATHS (default: the current folder) is estimated from its configs."""
    from cfgfix.memory import shapes
    from cfgfix.memory.gpus import all_gpus
    from cfgfix.memory.shapes import catalog_ids

    shapes.COMPLETE_FROM_TRANSFORMERS = True  # estimate may import transformers for a config's missing keys; check never

    if list_models:
        click.echo("\n".join(catalog_ids()))
        return
    if list_gpus:
        for g in all_gpus():
            click.echo(f"{g.name:<16} {g.usable_bytes / 1024**3:7.2f} GiB usable  bf16={'yes' if g.bf16 else 'no'}  fp8={'yes' if g.fp8 else 'no'}")
        return
    model, params, gpu = run["model"], run["params"], run["gpu"]
    if model is not None and not model.strip():
        _fail("--model: empty; give a catalog id (`cfgfix estimate --list-models`) or a local folder with config.json")
    if (model or params) and paths:
        _fail(f"{paths[0]}: PATHS are for the project mode; --model/--params estimate the flags alone")
    from cfgfix.training import estimate_project

    if not (model or params):  # project mode: every launch of PATHS, from its resolved setup
        given = _given_run_flags()
        if given:
            _fail(f"{', '.join(given)}: describe a run for --model/--params; without them each launch of PATHS is "
                  f"estimated from its own setup (`cfgfix explain` shows it)")
        groups = _project_setups(paths, config_file, isolated, no_cache, gpu)
        _, display = _all_setups(groups)
        rows = estimate_project.project_answers(groups)
        render = estimate_project.render_json if output_format == "json" else estimate_project.render_text
        click.echo(render(rows, display, simulate), nl=False)
        raise SystemExit(estimate_project.exit_code(rows))
    if config_file is not None or isolated or no_cache:
        _fail("--config, --isolated and --no-cache are for the project mode (PATHS); --model/--params read no settings")
    # the flags' run: the same answer (training/memory_answer.py) as a launch of a project
    from cfgfix.settings import SettingsError, check_gpu
    from cfgfix.training.estimate_flags import FlagError, RunFlags, flags_answer

    try:
        if gpu is not None:
            run["gpu"] = check_gpu(gpu, "--gpu")
        found, warnings = flags_answer(RunFlags(**run, given=frozenset(_given_run_flags(names=True))))
    except (FlagError, SettingsError) as exc:
        _fail(str(exc))
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if output_format == "json":
        entry = {"assumed": found.assumed, **estimate_project.answer_json(found, simulate)}
        click.echo(json.dumps(entry, indent=2) + "\n", nl=False)
    else:
        click.echo("\n".join(estimate_project.answer_lines(found, "from the flags")
                             + [estimate_project.answer_body(found, simulate)]), nl=False)
    raise SystemExit(estimate_project.exit_code([found]))
