"""When `cfgfix verify` must not run: it executes the repository's code, so never for a
pull request from an untrusted fork (GitHub's own warning about `pull_request_target`:
workflows there run with the base repository's secrets)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping

INSTALL_HINT = "pip install 'cfgfix[verify]'"


# Events whose workflow may run code that a pull request wrote: trusted only when the
# payload proves the code comes from this repository itself.
_PULL_REQUEST_EVENTS = ("pull_request", "pull_request_review", "pull_request_review_comment")
_CHECKED_EVENTS = (*_PULL_REQUEST_EVENTS, "workflow_run", "issue_comment")

# Events whose workflow runs the repository's own code (a pushed ref, the default branch),
# exactly as GitHub names them (lower case). Any other name, an empty one, or one in another
# case is refused: GitHub sends none of those, and a guard that lets through what it does
# not know fails open (`workflow_call` is never an event name: a called workflow sees its
# caller's event; `merge_group` and the check events can carry a pull request's commits).
TRUSTED_EVENTS = frozenset({
    "push", "schedule", "workflow_dispatch", "repository_dispatch", "release", "create", "delete",
    "deployment", "deployment_status", "issues", "label", "milestone", "discussion", "discussion_comment",
    "gollum", "page_build", "public", "watch", "fork", "registry_package", "branch_protection_rule",
    "project", "project_card", "project_column",
})


def untrusted_event(environ: Mapping[str, str]) -> str | None:
    """Why this GitHub Actions event is untrusted, or None. Untrusted unless proven trusted:
    an event that can carry a pull request's code needs a readable payload that shows the
    code comes from this repository; a missing or malformed payload is a refusal, and so is
    an event name GitHub does not send."""
    event = environ.get("GITHUB_EVENT_NAME")
    if event is None:
        if environ.get("GITHUB_ACTIONS") == "true":
            return "GITHUB_ACTIONS is true but GITHUB_EVENT_NAME is unset: nothing shows where the code comes from"
        return None  # a local run: the user's own code
    if event == "pull_request_target":
        return "GITHUB_EVENT_NAME is pull_request_target: the workflow runs a pull request's code with the base repository's secrets"
    if event in TRUSTED_EVENTS:
        return None
    if event not in _CHECKED_EVENTS:
        shown = event[:60] if event.isprintable() else repr(event[:60])
        return (f"GITHUB_EVENT_NAME is {shown!r}, not an event GitHub sends (names are exact, in lower case): "
                f"verify runs only where it can tell whose code it runs")
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
    texts = [("the command", shlex.join(command) + "\n"), *_named_scripts(command, folder)]
    linter = Linter(frozenset({"CFX308"}), ProjectVersions(folder))
    for name, text in texts:
        source = SourceFile(path=folder / "train.sh", display=name, relpath=name, kind="shell")
        for finding in linter.lint(source, text.encode("utf-8")).findings:
            line = f":{finding.span.line}" if name != "the command" else ""
            return f"{name}{line} would run a destructive command ({finding.message.split(':')[0]}); " \
                   f"pass the training command itself after `--` instead"
    return None


def _named_scripts(command: list[str], folder) -> list[tuple[str, str]]:
    """(word, text) of each shell script of the folder that the command names."""
    from cfgfix.documents.files import is_regular_file

    found = []
    for word in command:
        path = folder / word
        if word.endswith((".sh", ".bash")) and is_regular_file(path):  # False for a name over 255 bytes
            try:
                found.append((word, path.read_text(encoding="utf-8", errors="replace")))
            except OSError:
                continue
    return found


# -- effects the copies cannot contain -------------------------------------------------------------
_OUTPUT_OPTIONS = frozenset({
    "--output_dir", "--output-dir", "--out_dir", "--out-dir", "--outdir", "--output", "-o", "--save_dir",
    "--save-dir", "--save_path", "--save-path", "--logging_dir", "--logging-dir", "--log_dir", "--log-dir",
    "--checkpoint_dir", "--checkpoint-dir", "--ckpt_dir", "--ckpt-dir", "--cache_dir", "--cache-dir",
    "--project_dir", "--project-dir", "--run_dir", "--run-dir",
})
_WRITERS_ALL = frozenset({"mkdir", "rm", "touch", "rmdir", "truncate"})  # every path argument is written
_WRITERS_LAST = frozenset({"cp", "mv", "ln", "rsync", "install"})  # the destination is the last one
_REDIRECTS = frozenset({">", ">>", "&>", "&>>", ">|", "1>", "2>", "1>>", "2>>"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n"})
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def uncontained_command(command: list[str], folder) -> str | None:
    """Why the launch's effects would escape the two copies, or None. verify runs the launch
    twice, each in a throw-away copy; a launch that changes to an absolute folder (`cd
    /home/u/sdxl`), or writes to a path outside its folder (`--output_dir /data/ckpt`, `>
    ~/log.txt`, `mkdir -p ../runs`), would run the original and the patched code against
    the user's real files, and the patched run would find what the original wrote. Read from
    the command and the shell scripts it names; variables assigned in the script are
    followed, other variables (and `cd "$(dirname "$0")"`) are taken to stay inside."""
    import shlex
    from pathlib import Path

    folder = Path(folder)
    texts = [("the command", shlex.join(command))]
    if len(command) > 2 and command[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and command[1] == "-c":
        texts.append(("the command", command[2]))  # `bash -c "cd /x && python train.py"`
    texts += _named_scripts(command, folder)
    for name, text in texts:
        variables: dict[str, str] = {}
        for number, line in _logical_lines(text):
            problem = _line_escapes(line, variables)
            if problem:
                where = name if name == "the command" else f"{name}:{number}"
                return (f"{where} {problem}: both runs would act on the same files outside the copies "
                        f"(the patched run would see what the original left). Make the path relative to "
                        f"the project, or pass a training command that stays inside it after `--`")
    return None


def _logical_lines(text: str):
    """(line number, text) with backslash continuations joined."""
    pending, start = "", None
    for number, line in enumerate(text.splitlines(), start=1):
        if start is None:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, pending + line
        pending, start = "", None
    if pending:
        yield start, pending


def _words(line: str) -> list[str]:
    import shlex

    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: not this guard's business
        return []


def _outside(path: str) -> bool:
    """Whether a path written in the script leaves the folder it runs in."""
    import posixpath

    if path.startswith(("$HOME", "${HOME}")):
        return True
    if not path or path.startswith(("$(", "`")) or "$" in path:
        return False  # a command substitution or an unknown variable
    if path.startswith("/dev/"):
        return False
    if path.startswith(("/", "~")):
        return True
    return posixpath.normpath(path).startswith("..")


def _expand(word: str, variables: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), word)


def _line_escapes(line: str, variables: dict[str, str]) -> str | None:
    words = _words(line)
    i, at_start = 0, True
    while i < len(words):
        word = words[i]
        if word in _SEPARATORS:
            at_start = True
            i += 1
            continue
        if at_start:
            if word == "export" and i + 1 < len(words):
                i += 1
                word = words[i]
            assignment = _ASSIGNMENT.match(word)
            if assignment:
                variables[assignment.group(1)] = _expand(assignment.group(2), variables)
                i += 1
                continue  # `VAR=x cmd` keeps at_start for the command after it
            at_start = False
            args = _command_words(words, i)
            expanded = [_expand(a, variables) for a in args]
            problem = _command_escapes(word, expanded[1:])
            if problem:
                return problem
        if word in _REDIRECTS and i + 1 < len(words):
            target = _expand(words[i + 1], variables)
            if _outside(target):
                return f"writes to {target} (`{word} {words[i + 1]}`)"
        i += 1
    return None


def _command_words(words: list[str], start: int) -> list[str]:
    out = []
    for word in words[start:]:
        if word in _SEPARATORS:
            break
        out.append(word)
    return out


def _command_escapes(name: str, args: list[str]) -> str | None:
    base = name.rsplit("/", 1)[-1]
    if base in ("cd", "pushd"):
        target = next((a for a in args if not a.startswith("-")), "~")
        if _outside(target):
            return f"changes to a folder outside the copy (`{base} {target}`)"
        return None
    paths = [a for a in args if not a.startswith("-")]
    if base in _WRITERS_ALL:
        bad = next((p for p in paths if _outside(p)), None)
        return f"writes to {bad} (`{base}`)" if bad else None
    if base in _WRITERS_LAST and len(paths) >= 2 and _outside(paths[-1]):
        return f"writes to {paths[-1]} (`{base}`)"
    if base == "tee":
        bad = next((p for p in paths if _outside(p)), None)
        return f"writes to {bad} (`tee`)" if bad else None
    for j, arg in enumerate(args):
        option, eq, value = arg.partition("=")
        if option in _OUTPUT_OPTIONS:
            value = value if eq else (args[j + 1] if j + 1 < len(args) else "")
            if _outside(value):
                return f"writes to {value} (`{option} {value}`)"
    return None
