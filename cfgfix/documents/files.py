"""Reading a user's file: regular files only, never blocking, never unbounded.

A FIFO named on the command line (or put where a cache or ignore file should be) would block
`open()` forever, and `/dev/zero` or a symlink to it would fill memory; a 50 MB generated
Python file costs minutes and gigabytes to analyse. Every read of a file cfgfix did not
write itself goes through `read_file`, which opens without blocking, refuses anything that
is not a regular file, and stops at a size bound. Failures are `OSError`s, so callers that
already handle an unreadable file handle these too.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_BYTES = 10 * 1024 * 1024  # the same bound as configs (documents/config.py)
# Python files are analysed to a smaller bound: analysis costs ~8 CPU-seconds and 250 MB
# per MB of source (a 50 MB generated file cost minutes and gigabytes), and a training
# script is tens of kB (the largest we know of are a few hundred).
MAX_PYTHON_BYTES = 1_000_000
# Launch scripts (shell, Makefile, Dockerfile, .env) likewise: reading one costs ~2.5 s and
# ~100 MB per MB (a launch line of 400,000 arguments), and `fix` reads a fixed one again
# each round; a real launch script is a few kB (issue 24: 6 MB took 27 s to check, 2 min to fix).
MAX_SCRIPT_BYTES = 1_000_000


class NotRegularFile(OSError):
    """A FIFO, a device, a socket or a folder where a file was expected."""


class FileTooLarge(OSError):
    """Larger than the bound: not read."""

    def __init__(self, path, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit // (1024 * 1024)} MB ({size / (1024 * 1024):.1f} MB); not read")
        self.filename = os.fspath(path)
        self.size, self.limit = size, limit


def read_file(path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file `path` (links followed), at most `limit` of them."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # non-blocking: opening a FIFO with no writer returns at once
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        if info.st_size > limit:
            raise FileTooLarge(path, info.st_size, limit)
        chunks, total = [], 0
        while True:  # the file may grow while it is read: the bound still holds
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileTooLarge(path, total, limit)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path, limit: int = MAX_BYTES, errors: str = "strict") -> str:
    return read_file(path, limit).decode("utf-8", errors=errors)


def is_regular_file(path) -> bool:
    """Like os.path.isfile (links followed, every OSError is False: a name over 255 bytes, a
    loop), but a FIFO or device is never one."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
