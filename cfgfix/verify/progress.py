"""What `cfgfix verify` shows while it works, on stderr: a spinner line on a terminal,
plain lines (one per change) otherwise, so CI logs stay readable."""

from __future__ import annotations

import sys

SPINNER = "|/-\\"


class Progress:
    def __init__(self, stream=None, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last: tuple | None = None
        self.ticks = 0

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(f"cfgfix verify: {text}\n")
        self.stream.flush()

    def update(self, label: str, step: int, steps: int, elapsed: float) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.ticks += 1
            spin = SPINNER[self.ticks % len(SPINNER)]
            self.stream.write(f"\r\033[K{spin} {label}: step {step}/{steps} ({elapsed:.0f} s)")
            self.stream.flush()
        elif (label, step) != self.last:
            self.last = (label, step)
            self.line(f"{label}: step {step}/{steps} after {elapsed:.1f} s")

    def finished(self, label: str, status: str, wall_s: float) -> None:
        self.line(f"{label}: {status} in {wall_s:.1f} s")
