"""`cfgfix verify`, start to end: refuse untrusted events and launches that escape the
copies, prepare the two copies, run the launch in each (recording which changed lines run),
judge, print, and optionally write or post the pull-request comment. Returns the exit code
(0 holds, 1 does not, 2 could not run, 3 not exercised: the changed lines did not run)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from cfgfix import interrupts
from cfgfix.interrupts import Interrupted
from cfgfix.records import asdict, dataclass
from cfgfix.review.gitdiff import GitError

from . import coverage, guard
from .progress import Progress
from .report import to_json, to_text
from .verdict import LOSS_RTOL, cannot_run, judge
from .workspace import WorkspaceError, apply_fixes, copy_workspace, export_revision, revision_commit, revision_top


@dataclass
class Options:
    command: list[str]
    steps: int = 2
    fix_unsafe: bool = False
    timeout: float = 600.0
    device: str = "auto"
    output_format: str = "text"
    before: str | None = None
    after: str | None = None
    loss_rtol: float = LOSS_RTOL
    folder: Path | None = None  # default: the current folder
    post: bool = False  # post or update the pull request's verification comment
    pr: int | None = None
    comment_file: Path | None = None  # write the comment's markdown here (a dry run without --post)
    selection: dict | None = None  # --select / --ignore / --extend-select: which rules' fixes
    config_file: Path | None = None  # --config: the settings the copy is fixed with
    isolated: bool = False  # --isolated: the defaults and the flags only


def launch_command(args: list[str]) -> list[str]:
    """The command as given; a bare script gets its interpreter (`train.py` → python)."""
    if len(args) == 1 and " " in args[0]:
        args = shlex.split(args[0])  # `cfgfix verify "torchrun ... train.py"`
    if args and args[0].endswith(".py"):
        return [sys.executable, *args]
    if args and args[0].endswith(".sh"):
        return ["bash", *args]
    return list(args)


def project_launch(folder: Path) -> tuple[list[str] | None, str]:
    """With no command: the project's one launch script that starts training, run with bash
    (`cfgfix verify` in a repository whose `train.sh` is the way to train), and why it was
    picked. None and why not when there is none, or more than one to choose from."""
    from cfgfix.engine import Engine
    from cfgfix.settings import load_settings
    from cfgfix.training.resolve import training_setups
    from cfgfix.workspace import discover

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        settings = load_settings(folder)
        engine = Engine(settings, use_cache=False)
        files, _ = discover([Path(".")], settings)
        engine.run(files)
        setups = [s for s in training_setups(engine.project) if s.trains and s.launch_file.suffix in (".sh", ".bash")]
        scripts = sorted({s.launch_file for s in setups})
    finally:
        os.chdir(cwd)
    usage = "cfgfix verify [OPTIONS] -- python train.py ..."
    if not scripts:
        return None, f"no launch command, and no launch script here starts a training script: {usage}"
    if len(scripts) > 1:
        names = ", ".join(os.path.relpath(s, folder) for s in scripts)
        return None, f"no launch command, and several launch scripts start training ({names}): name one, or {usage}"
    started = sorted({os.path.relpath(s.script, folder) for s in setups if s.script is not None})
    why = ("the only launch script here that starts a training script"
           + (f" ({', '.join(started)}, which runs a training step)" if started else ""))
    return ["bash", os.path.relpath(scripts[0], folder)], why


def run(options: Options, out=None, err=None) -> int:
    """`verify`, with SIGTERM and SIGHUP turned into a clean stop: the launch (its whole
    process group) is killed, its folders removed, and the exit code is the signal's (128+N),
    as a shell reports a process the signal killed."""
    import signal
    import threading

    err = err or sys.stderr
    if threading.current_thread() is not threading.main_thread():
        return _verify(options, out, err)
    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {n: signal.signal(getattr(signal, n), interrupts.handler) for n in names}
    try:
        return _verify(options, out, err)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP as Interrupted
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        err.write(f"cfgfix verify: stopped by {name}: the launch was killed and its temporary folders removed\n")
        return 128 + signum
    finally:
        for n, handler in previous.items():
            signal.signal(getattr(signal, n), handler)


def _verify(options: Options, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr

    def fail(message: str) -> int:
        err.write(f"cfgfix: error: {message}\n")
        return 2

    reason = guard.untrusted_event(os.environ)
    if reason:
        return fail(f"verify runs the repository's code and refuses to here: {reason}")
    missing = guard.missing_dependency()
    if missing:
        return fail(missing)
    picked = None
    if not options.command:
        found, why = project_launch((options.folder or Path.cwd()).resolve())
        if found is None:
            return fail(why)
        options.command = found
        picked = f"{shlex.join(found)}: {why}"
        err.write(f"cfgfix verify: no command given; running {picked}\n")
    if (options.before is None) != (options.after is None):
        return fail("--before and --after go together")
    if options.post:  # before minutes of training, not after
        from cfgfix.review.post import PostError, target_from_env

        try:
            target_from_env(options.pr)
        except PostError as exc:
            return fail(f"--post: {exc}")
    if options.device == "cuda" and not _cuda_available():
        return fail("--device cuda: torch sees no CUDA device here")
    command = launch_command(options.command)
    folder = (options.folder or Path.cwd()).resolve()
    harmful = guard.destructive_command(command, folder)
    if harmful:
        return fail(f"verify refuses to run this: {harmful}")
    escaping = guard.uncontained_command(command, folder)
    if escaping:
        return fail(f"verify refuses to run this: {escaping}")
    progress = Progress(err)
    tmp = Path(tempfile.mkdtemp(prefix="cfgfix-verify-"))
    try:
        context = {"command": command, "steps": options.steps, "device": options.device, "folder": str(folder)}
        if picked:
            context["picked"] = picked
        try:
            copies = _prepare(options, folder, tmp, context, progress)
        except WorkspaceError as exc:
            return fail(str(exc))
        if copies is None:
            message = "nothing to verify: cfgfix has no fix to apply here" + ("" if options.fix_unsafe else " (unsafe fixes need --unsafe-fixes)")
            if options.output_format == "json":
                out.write(json.dumps(context | {"runs": None, "verdict": {
                    "could_run": True, "holds": True, "state": "nothing to verify", "exit_code": 0,
                    "reason": message, "checks": []}}, indent=2) + "\n")
            else:
                out.write(f"cfgfix verify: {message}\n")
            return 0 if _comment(options, context, None, None, None, err, message) else 2
        labels = ("original", "patched") if options.before is None else ("before", "after")
        change = copies.change
        before = _run(command, copies.before, options, labels[0], progress, change.spec(copies.before_tree, "before"))
        after = None
        verdict = judge(before, None, options.steps, copies.safe_only) if before.status != "completed" else None
        if verdict is None:  # the original completed: worth running the patched copy
            after = _run(command, copies.after, options, labels[1], progress, change.spec(copies.after_tree, "after"))
            coverage.mark(change, copies.before_tree, copies.after_tree, before, after, command)
            verdict = judge(before, after, options.steps, copies.safe_only, options.loss_rtol, change)
        elif before.launch_error:
            verdict = cannot_run(f"the command could not start: {before.launch_error}")
        context["coverage"] = change.to_dict()
        prediction = _prediction(folder, command, options.device)
        if prediction is not None:
            context["predicted"] = prediction
        render = to_json if options.output_format == "json" else to_text
        out.write(render(context, before, after, verdict))
        posted = _comment(options, context, before, after, verdict, err)
        return verdict.exit_code if posted else 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _prediction(folder: Path, command: list[str], device: str) -> dict | None:
    """The memory answer's figures for this launch (verify/predicted.py); a project cfgfix
    cannot read is no reason to fail the measured comparison."""
    from .predicted import predicted

    try:
        return predicted(folder, command, device)
    except Exception:  # noqa: BLE001 - the prediction is a column, never the verdict
        return None


@dataclass
class Copies:
    before: Path  # where the launch runs, in each copy
    after: Path
    before_tree: Path  # each copy's top: the paths of `change` are relative to it
    after_tree: Path
    safe_only: bool  # every change is a safe fix
    change: coverage.Change


def _prepare(options: Options, folder: Path, tmp: Path, context: dict, progress: Progress) -> Copies | None:
    """The two copies and what differs between them; None when no fix applies."""
    if options.before is not None:
        progress.line(f"exporting {options.before} and {options.after}")
        before = export_revision(folder, options.before, tmp / "before")
        after = export_revision(folder, options.after, tmp / "after")
        context.update(before_ref=options.before, after_ref=options.after, fixes=None, left_out=before.left_out,
                       before_commit=revision_commit(folder, options.before),
                       after_commit=revision_commit(folder, options.after))
        try:
            pairs = coverage.git_pairs(revision_top(folder), options.before, options.after)
        except GitError as exc:
            raise WorkspaceError(str(exc)) from None
        change = coverage.build(pairs, before.tree, after.tree)
        return Copies(before.root, after.root, before.tree, after.tree, False, change)
    progress.line(f"copying {folder}")
    before = copy_workspace(folder, tmp / "original")
    after = copy_workspace(folder, tmp / "patched")
    config = options.config_file
    if config is not None:
        config = Path(os.path.abspath(config))
        inside = os.path.relpath(config, os.path.abspath(folder))
        if not inside.startswith(".."):
            config = after.root / inside  # the copy's own settings file, not the original's
    fixes = apply_fixes(after.root, options.fix_unsafe, options.selection, config, options.isolated)
    context.update(fixes=[asdict(f) for f in fixes], left_out=before.left_out)
    if not fixes:
        return None
    paths = sorted({f.path for f in fixes})
    change = coverage.build([(p, p) for p in paths], before.root, after.root)
    return Copies(before.root, after.root, before.root, after.root, all(f.safe for f in fixes), change)


def _run(command, root: Path, options: Options, label: str, progress, cover: dict):
    from .runner import run_launch

    progress.line(f"{label}: {' '.join(command)}")
    result = run_launch(command, root, options.steps, options.timeout, options.device, label, progress, cover)
    progress.finished(label, result.status, result.wall_s)
    return result


def _comment(options: Options, context: dict, before, after, verdict, err, nothing: str = "") -> bool:
    """The pull-request comment: written to --comment-file, posted with --post. False when
    posting failed (the exit code is then 2)."""
    if not options.post and options.comment_file is None:
        return True
    from .comment import publish

    return publish(options, context, before, after, verdict, err, nothing)


def _cuda_available() -> bool:
    import subprocess

    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, check=False)
    return probe.stdout.strip() == "True"
