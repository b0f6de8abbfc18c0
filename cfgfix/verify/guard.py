"""When `cfgfix verify` must not run: it executes the repository's code, so never for a
pull request from an untrusted fork (GitHub's own warning about `pull_request_target`:
workflows there run with the base repository's secrets)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping

INSTALL_HINT = "pip install 'cfgfix[verify]'"


def untrusted_event(environ: Mapping[str, str]) -> str | None:
    """Why this GitHub Actions event is untrusted, or None."""
    event = environ.get("GITHUB_EVENT_NAME", "")
    if event == "pull_request_target":
        return "GITHUB_EVENT_NAME is pull_request_target: the workflow runs a pull request's code with the base repository's secrets"
    path = environ.get("GITHUB_EVENT_PATH")
    if not path or not event.startswith("pull_request"):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError) as exc:
        return f"cannot read the event payload {path} to check the pull request's origin ({exc})"
    pr = payload.get("pull_request") or {}
    head = (pr.get("head") or {}).get("repo") or {}
    base = (pr.get("base") or {}).get("repo") or {}
    if head.get("fork"):
        return f"the pull request comes from a fork ({head.get('full_name', 'unknown')})"
    if head.get("full_name") and base.get("full_name") and head["full_name"] != base["full_name"]:
        return f"the pull request comes from another repository ({head['full_name']}, not {base['full_name']})"
    if not head:
        return "the pull request's head repository is unknown (deleted fork?)"
    return None


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
