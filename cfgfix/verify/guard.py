"""When `cfgfix verify` must not run: it executes the repository's code, so never for a
pull request from an untrusted fork (GitHub's own warning about `pull_request_target`:
workflows there run with the base repository's secrets)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping

INSTALL_HINT = "pip install 'cfgfix[verify]'"


# Events whose workflow may run code that a pull request wrote: trusted only when the
# payload proves the code comes from this repository itself.
_PULL_REQUEST_EVENTS = ("pull_request", "pull_request_review", "pull_request_review_comment")


def untrusted_event(environ: Mapping[str, str]) -> str | None:
    """Why this GitHub Actions event is untrusted, or None. Untrusted unless proven trusted:
    an event that can carry a pull request's code needs a readable payload that shows the
    code comes from this repository; a missing or malformed payload is a refusal."""
    event = environ.get("GITHUB_EVENT_NAME", "")
    if event == "pull_request_target":
        return "GITHUB_EVENT_NAME is pull_request_target: the workflow runs a pull request's code with the base repository's secrets"
    if event not in (*_PULL_REQUEST_EVENTS, "workflow_run", "issue_comment"):
        return None  # push, schedule, workflow_dispatch, a local run: the repository's own code
    path = environ.get("GITHUB_EVENT_PATH")
    if not path:
        return f"GITHUB_EVENT_NAME is {event} but GITHUB_EVENT_PATH is unset: nothing shows where the code comes from"
    try:
        with open(path, "rb") as f:
            payload = json.loads(f.read(16 * 1024 * 1024))
    except (OSError, ValueError, RecursionError) as exc:
        return f"cannot read the event payload {path} to check the code's origin ({exc})"
    if not isinstance(payload, dict):
        return f"the event payload {path} is not a JSON object"
    if event == "workflow_run":
        return _workflow_run(payload)
    if event == "issue_comment":
        issue = payload.get("issue")
        if not isinstance(issue, dict):
            return "the issue_comment payload has no issue"
        if issue.get("pull_request") is not None:
            return "an issue_comment on a pull request: the workflow may check out the pull request's code"
        return None
    pr = payload.get("pull_request")
    if not isinstance(pr, dict):
        return f"the {event} payload has no pull_request object"
    return _same_repository(_get(pr, "head", "repo"), _get(pr, "base", "repo"), "the pull request")


def _workflow_run(payload: dict) -> str | None:
    run = payload.get("workflow_run")
    if not isinstance(run, dict):
        return "the workflow_run payload has no workflow_run object"
    head = run.get("head_repository")
    base = payload.get("repository") if isinstance(payload.get("repository"), dict) else run.get("repository")
    return _same_repository(head, base, "the triggering workflow run")


def _same_repository(head, base, what: str) -> str | None:
    if not isinstance(head, dict) or not head:
        return f"{what}'s head repository is unknown (a deleted fork?)"
    if head.get("fork") is True:
        return f"{what} comes from a fork ({_name(head)})"
    head_name, base_name = head.get("full_name"), base.get("full_name") if isinstance(base, dict) else None
    if not isinstance(head_name, str) or not isinstance(base_name, str):
        return f"{what}'s head or base repository has no name: its origin cannot be checked"
    if head_name != base_name:
        return f"{what} comes from another repository ({head_name}, not {base_name})"
    return None


def _get(data, *keys):
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _name(repo: dict) -> str:
    name = repo.get("full_name")
    return name if isinstance(name, str) else "unknown"


def missing_dependency() -> str | None:
    """What to install when torch is missing from this environment."""
    if importlib.util.find_spec("torch") is None:
        return f"verify runs real training steps and needs torch: {INSTALL_HINT}"
    return None


def destructive_command(command: list[str], folder) -> str | None:
    """Why running `command` would harm the machine, or None: a launch that runs `pkill -9 -f
    python`, `killall python`, `nvidia-smi --gpu-reset` or a reboot (CFX308) would kill
    cfgfix itself and every other job, copy or not. The command and the shell scripts it
    names are read with cfgfix's own launch-script rule."""
    import shlex
    from pathlib import Path

    from cfgfix.analysis.versions import ProjectVersions
    from cfgfix.engine import Linter
    from cfgfix.workspace import SourceFile

    folder = Path(folder)
    texts = [("the command", shlex.join(command) + "\n")]
    for word in command:
        path = folder / word
        if word.endswith((".sh", ".bash")) and path.is_file():
            try:
                texts.append((word, path.read_text(encoding="utf-8", errors="replace")))
            except OSError:
                continue
    linter = Linter(frozenset({"CFX308"}), ProjectVersions(folder))
    for name, text in texts:
        source = SourceFile(path=folder / "train.sh", display=name, relpath=name, kind="shell")
        for finding in linter.lint(source, text.encode("utf-8")).findings:
            line = f":{finding.span.line}" if name != "the command" else ""
            return f"{name}{line} would run a destructive command ({finding.message.split(':')[0]}); " \
                   f"pass the training command itself after `--` instead"
    return None
