"""Commands a launch script runs somewhere else than on its own lines: another script of the
project it runs (`bash kill_all.sh`, `sh x.sh`, `source x.sh`, `. x.sh`, `./x.sh`, also in
a function), the action of a `trap`, and the remote command of `ssh host "..."`. Each
comes back as the commands it holds, parsed with the same shell reader, so a rule asks the
same questions of them as of the script's own lines (CFX308: `pkill -f python` hidden in
a helper).

Helper scripts are followed up to three deep, each once, only inside the project root and
within the reader's size bound; a path with a variable in it is not guessed."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from cfgfix.documents.files import is_regular_file
from cfgfix.records import dataclass

# Run the command that follows their own options.
WRAPPERS = {"sudo", "doas", "nohup", "exec", "command", "time", "nice", "timeout", "env", "setsid", "stdbuf"}
WRAPPER_VALUE_OPTIONS = {
    "sudo": {"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "--user", "--group", "--prompt"},
    "nice": {"-n", "--adjustment"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "stdbuf": {"-i", "-o", "-e"},
}

MAX_DEPTH = 3
_SHELLS = {"bash", "sh", "dash", "zsh", "ksh"}
_SOURCE = {"source", "."}
# ssh options that take a value (OpenSSH's ssh(1) synopsis)
_SSH_VALUE = set("-B -b -c -D -E -e -F -I -i -J -L -l -m -O -o -P -p -Q -R -S -W -w".split())


@dataclass(frozen=True)
class Inner:
    """Commands that run when `command` of the launch script runs."""

    command: object  # the launch script's Command that runs them
    how: str  # "script" | "trap" | "ssh"
    label: str  # the helper's display path, "the trap action", "the ssh command"
    document: object  # ShellDocument of what runs
    path: Path | None = None  # the helper script's file


def inner_commands(document, script: Path | None, display: str, root: Path | None,
                   read=None, deps: set | None = None) -> list[Inner]:
    """Every Inner of `document` (a launch script at `script`, shown as `display`)."""
    found: list[Inner] = []
    seen = {os.path.realpath(script)} if script is not None else set()
    _collect(document, document.commands, script, display, root, read, deps, seen, found, 0, None)
    return found


def _collect(document, commands, script, display, root, read, deps, seen, found, depth, outer) -> None:
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText

    for command in commands:
        argv = [w.text for w in command.words]
        anchor = outer if outer is not None else command
        if not argv:
            continue
        program = argv[0].rsplit("/", 1)[-1]
        text, how, label, path, shown = None, None, None, None, None
        if program == "trap" and len(argv) >= 3 and argv[1] not in ("-", "-p", "-l", ""):
            text, how, label = argv[1], "trap", "the trap action"
        elif program == "ssh":
            remote = _ssh_remote(argv[1:])
            if remote:
                text, how, label = remote, "ssh", "the ssh command"
        elif script is not None and depth < MAX_DEPTH:
            written = _helper_argument(argv)
            if written is not None:
                path, shown = _resolve(written, script, display, root)
        if text is not None:
            try:
                inner = parse_shell(SourceText.from_bytes(label, text.encode("utf-8", "surrogateescape")), "sh")
            except Exception:  # noqa: BLE001 - a string we cannot read is not a command we can judge
                continue
            found.append(Inner(anchor, how, label, inner))
            _collect(inner, inner.commands, script, display, root, read, deps, seen, found, depth, anchor)
        elif path is not None:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            data = _read(path, read)
            if data is None:
                continue
            if deps is not None:
                deps.add(str(path))
            try:
                inner = parse_shell(SourceText.from_bytes(shown, data), "sh")
            except Exception:  # noqa: BLE001 - not a script we can read (binary, bad encoding)
                continue
            found.append(Inner(anchor, "script", shown, inner, path))
            _collect(inner, inner.commands, path, shown, root, read, deps, seen, found, depth + 1, anchor)


def _helper_argument(argv: list[str]) -> str | None:
    """The script path `bash x.sh` / `source x.sh` / `./x.sh` runs (behind `sudo` and the
    like), or None."""
    argv = unwrap(argv)
    if not argv:
        return None
    program = argv[0].rsplit("/", 1)[-1]
    if program in _SHELLS:
        for word in argv[1:]:
            if word in ("-c", "-s"):
                return None  # an inline script or stdin: read elsewhere (documents/shell.py)
            if word.startswith("-") or word.startswith("+"):
                continue
            return word
        return None
    if program in _SOURCE:
        return argv[1] if len(argv) > 1 else None
    if argv[0].endswith((".sh", ".bash")) and ("/" in argv[0]):
        return argv[0]
    return None


def _resolve(written: str, script: Path, display: str, root: Path | None) -> tuple[Path | None, str | None]:
    if root is None or not written or "$" in written or "`" in written or "*" in written or written.startswith("~"):
        return None, None  # no project to stay inside, or a path the file does not spell out
    if os.path.isabs(written):
        candidates = [Path(written)]
    else:
        candidates = [script.parent / written, Path(root) / written]
    for candidate in candidates:
        if not is_regular_file(candidate):  # Path.is_file raises on a name over 255 bytes (fuzz-found)
            continue
        if not _inside(os.path.realpath(candidate), os.path.realpath(root)):
            return None, None  # never read outside the project
        base = posixpath.dirname(display)
        if candidate == script.parent / written:
            shown = posixpath.normpath(posixpath.join(base, written)) if not os.path.isabs(written) else written
        else:
            shown = Path(os.path.relpath(candidate, root)).as_posix()
        return candidate, shown
    return None, None


def _inside(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def _read(path: Path, read) -> bytes | None:
    if read is not None:
        return read(path)
    from cfgfix.documents.files import read_file

    try:
        return read_file(path)
    except OSError:  # FileTooLarge is one
        return None


def _ssh_remote(args: list[str]) -> str | None:
    """The command `ssh [options] host command...` runs on the host, or None."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        option = args[i]
        i += 2 if option in _SSH_VALUE else 1
    if i >= len(args) - 1:
        return None  # no host, or a login shell
    return " ".join(args[i + 1:])


def unwrap(argv: list[str]) -> list[str]:
    """The command behind `sudo`, `nohup`, `timeout 10`, `env A=B` and the like."""
    i = 0
    while i < len(argv):
        wrapper = _program_name(argv[i])
        if wrapper not in WRAPPERS:
            return argv[i:]
        i += 1
        takes_value = WRAPPER_VALUE_OPTIONS.get(wrapper, set())
        while i < len(argv) and argv[i].startswith("-"):
            if wrapper == "command" and argv[i] in ("-v", "-V"):
                return []  # `command -v pkill` only looks the program up
            i += 2 if argv[i] in takes_value else 1
        if wrapper == "timeout":
            i += 1  # the duration
        elif wrapper == "env":
            while i < len(argv) and "=" in argv[i]:
                i += 1
    return []


def _program_name(word: str) -> str:
    return word.rsplit("/", 1)[-1]
