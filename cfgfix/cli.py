"""Entry point. `cfgfix --version` answers before anything heavy is imported, and
`cfgfix check` with its common options runs without click (the click command tree, the
engine and the rules load only for what a command needs)."""

from __future__ import annotations

import sys

# `check` options the fast path reads; anything else (--fix, --diff, --help, a value that
# looks like an option, ...) goes to click, which parses and reports as always.
_FLAGS = {"--no-cache": "no_cache", "-q": "quiet", "--quiet": "quiet", "--statistics": "statistics",
          "--isolated": "isolated"}
_VALUES = {"--select": "select", "--ignore": "ignore", "--extend-select": "extend_select",
           "--output-format": "output_format", "--config": "config_file", "--gpu": "gpu"}
_FORMATS = ("text", "concise", "json", "sarif", "github")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        from cfgfix import __version__

        print(f"cfgfix {__version__}")
        raise SystemExit(0)
    from cfgfix.checking import escape_unwritable_output

    escape_unwritable_output()  # a file name that is not UTF-8 prints, whatever the stream
    from cfgfix import interrupts

    interrupts.install()
    try:
        _dispatch(args, fast_exit=argv is None)
    except KeyboardInterrupt as stop:
        interrupts.exit_for(stop)
    except SystemExit as done:
        if interrupts.received is None or done.code == interrupts.exit_code(interrupts.received):
            raise
        # click turned the stop into "Aborted!" and exit 1: exit as the signal says
        interrupts.exit_for(interrupts.Interrupted(interrupts.received))


def _dispatch(args: list[str], fast_exit: bool) -> None:
    if args[:1] == ["check"]:
        _collect_less()
        options = _check_options(args[1:])
        if options is not None and _utf8(sys.stdout) and _utf8(sys.stderr):
            _run_check(options, fast_exit=fast_exit)
    from cfgfix.commands import cli

    cli.main(args=args, prog_name="cfgfix")


def _collect_less() -> None:
    """The collector's first threshold as `checking._fewer_collections` sets it, already for
    the imports before that (20 passes at the default threshold, two of them over every
    object loaded so far: ~1.5% of a pre-commit run's CPU)."""
    import gc

    if gc.get_threshold()[0] < 10_000:
        gc.set_threshold(10_000, 10, 10)


def _utf8(stream) -> bool:
    # click.echo writes to a UTF-8 stream as it is; on others it may rewrap the stream.
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding == "utf8"


def _check_options(args: list[str]) -> dict | None:
    """`check`'s options and paths as click would pass them, or None when click must parse."""
    from pathlib import Path

    options: dict = {"select": None, "ignore": None, "extend_select": None, "output_format": None,
                     "config_file": None, "no_cache": False, "quiet": False, "statistics": False,
                     "isolated": False, "gpu": None}
    paths = []
    i = 0
    only_paths = False
    while i < len(args):
        arg = args[i]
        i += 1
        if only_paths or not arg.startswith("-"):
            if not arg:
                return None
            paths.append(Path(arg))
        elif arg == "--":
            only_paths = True
        elif arg in _FLAGS:
            options[_FLAGS[arg]] = True
        else:
            name, eq, value = arg.partition("=")
            if name not in _VALUES:
                return None
            if not eq:
                if i >= len(args) or args[i].startswith("-"):
                    return None
                value = args[i]
                i += 1
            if (name == "--output-format" and value not in _FORMATS) or (name == "--config" and not value):
                return None
            options[_VALUES[name]] = Path(value) if name == "--config" else value
    options["paths"] = tuple(paths)
    return options


def _run_check(options: dict, fast_exit: bool = False) -> None:
    """Run `check` as click's standalone mode would, but for a stop signal: Ctrl-C, SIGTERM
    or SIGHUP exit 128 + the signal (cfgfix.interrupts); a closed pipe exits 1 quietly. With
    `fast_exit` (the process's own entry point, never a caller in the same process), the
    process ends without tearing the interpreter down."""
    import errno

    try:
        from cfgfix.checking import check

        check(**options, exiting=fast_exit)
    except SystemExit as done:
        if fast_exit:
            from cfgfix import interrupts

            stopped = interrupts.received
            _exit_without_teardown(done.code if stopped is None else interrupts.exit_code(stopped))
        raise
    except KeyboardInterrupt as stop:
        from cfgfix import interrupts

        interrupts.exit_for(stop)
    except EOFError:
        sys.stderr.write("\nAborted!\n")
        sys.stderr.flush()
        raise SystemExit(1) from None
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = _Quiet(sys.stdout)
        sys.stderr = _Quiet(sys.stderr)
        raise SystemExit(1) from None


def _exit_without_teardown(code) -> None:
    """End the process once the report is written, as mypy's fast exit does: freeing every
    syntax tree and analysis object one by one at interpreter exit was an eighth of a
    pre-commit run's CPU (37 of 303 ms on five trainer files, issue 15); the OS takes the
    memory back at once. `check` holds no temporary file, pool or open output by then (the
    worker pool and the cache are closed by their `with` blocks), so nothing is lost."""
    import errno
    import os

    status = code if isinstance(code, int) else (0 if code is None else 1)
    if not isinstance(code, (int, type(None))):
        sys.stderr.write(f"{code}\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        status = 1
    os._exit(status)


class _Quiet:
    """A stream whose flush ignores a closed pipe (click's PacifyFlushWrapper)."""

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            import errno

            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name):
        return getattr(self.wrapped, name)
