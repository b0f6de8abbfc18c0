"""Signals that stop a command, and the exit codes they leave.

Ctrl-C (SIGINT), SIGTERM (a CI timeout, `timeout`, `kill`) and SIGHUP (a closed terminal)
stop every command the same way: a KeyboardInterrupt unwinds the stack, so each `with` and
`finally` on the way out runs (a fixer's temporary file is removed, a worker pool killed, a
verify run's process group stopped), and the process exits 128 + the signal's number, as a
shell reports a process the signal killed (130, 143, 129). That keeps an interrupted run
apart from exit 1, "findings remain", which is what a CI gate tests for."""

from __future__ import annotations

import sys

# `_signal`, not `signal`: the public module builds its enums on import (~1 ms, and
# `threading` came with the old main-thread test), and every command installs these
import _signal

STOP_SIGNALS = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(_signal, s))


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised where the main thread was. A KeyboardInterrupt, so code that
    cleans up after Ctrl-C cleans up after SIGTERM and SIGHUP too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# The signal that stopped this process, once one did: click turns a KeyboardInterrupt into
# "Aborted!" and exit 1 before `cli.main` sees it, so the exit code is set from here.
received: int | None = None


def handler(signum, _frame) -> None:
    global received
    received = signum
    raise Interrupted(signum)


def install() -> None:
    """Turn the stop signals into Interrupted in this process (main thread only), forgetting
    any signal an earlier command in the same process received."""
    global received
    received = None
    for name in STOP_SIGNALS:
        try:
            _signal.signal(getattr(_signal, name), handler)
        except (OSError, ValueError):  # not the main thread, or a signal this platform will not let us catch
            pass


def signum_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: its own, or SIGINT for a plain Ctrl-C."""
    return getattr(exc, "signum", None) or received or _signal.SIGINT


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def exit_for(exc: BaseException, err=None) -> None:
    """Report a stop on stderr and exit with the signal's code."""
    import signal

    signum = signum_of(exc)
    stream = err or sys.stderr
    try:
        stream.write(f"\ncfgfix: stopped by {signal.Signals(signum).name}\n")
        stream.flush()
    except (OSError, ValueError):
        pass
    raise SystemExit(exit_code(signum)) from None
