"""One HTTP exchange with a deadline on the whole of it and a bound on the answer's size.

urllib's `timeout` bounds each socket operation, not the request: a server that sends a
byte every few seconds kept `review --post` waiting forever, and a 4 GiB answer was read
whole (a MemoryError). Here a timer shuts the request's socket down when the deadline
passes, wherever the exchange is (connecting, the status line, the headers, the body), and
the body is read in chunks up to a limit. Redirects are never followed by urllib (see
`Client.request`)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request

DEADLINE_SECONDS = 60.0  # connect + send + the whole answer
SOCKET_TIMEOUT = 30.0  # any one socket operation
MAX_BODY_BYTES = 32 * 1024 * 1024  # a page of 100 review comments is well under 1 MiB
_CHUNK = 64 * 1024


class TransportError(Exception):
    """The exchange ran past its deadline or its answer past the size bound."""


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> _Deadline:
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._timer.cancel()

    def watch(self, sock) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def check(self) -> None:
        if self.expired or time.monotonic() > self.at:
            raise TransportError(f"no complete answer within {self.seconds:g} s")


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watched(base: type, deadline: _Deadline) -> type:
    class Connection(base):
        def connect(self):
            super().connect()
            deadline.watch(self.sock)

    return Connection


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req, context=self._context)


def read_bounded(response, deadline: _Deadline | None = None, limit: int | None = None) -> bytes:
    """The whole body of a response (or an HTTPError), or TransportError past the limit."""
    limit = MAX_BODY_BYTES if limit is None else limit
    declared = response.headers.get("Content-Length") if getattr(response, "headers", None) else None
    if declared and declared.strip().isdigit() and int(declared) > limit:
        raise TransportError(f"the answer is {int(declared):,} bytes, over the {limit:,}-byte limit")
    parts, size = [], 0
    while True:
        if deadline is not None:
            deadline.check()
        chunk = response.read(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise TransportError(f"the answer is over the {limit:,}-byte limit")
        parts.append(chunk)
    if deadline is not None and deadline.expired:
        raise TransportError(f"no complete answer within {deadline.seconds:g} s")
    if declared and declared.strip().isdigit() and size < int(declared):
        # http.client's read(n) returns what came before the connection closed, without a word
        raise TransportError(f"the answer was cut off after {size:,} of its {int(declared):,} bytes")
    return b"".join(parts)


def exchange(request: urllib.request.Request, redirect_handler, deadline_seconds: float | None = None):
    """Send `request`; return (status, headers, body) for a 2xx answer. An HTTP error status
    raises urllib.error.HTTPError with its body already read (bounded) into `.body`; a network
    failure raises what urllib raises; the deadline or the size bound, TransportError."""
    import urllib.error

    deadline = _Deadline(DEADLINE_SECONDS if deadline_seconds is None else deadline_seconds).start()
    opener = urllib.request.build_opener(redirect_handler, _HTTP(deadline), _HTTPS(deadline))
    try:
        try:
            with opener.open(request, timeout=min(SOCKET_TIMEOUT, deadline.seconds)) as response:
                return response.status, response.headers, read_bounded(response, deadline)
        except urllib.error.HTTPError as exc:
            try:
                exc.body = read_bounded(exc, deadline)
            except (OSError, http.client.HTTPException):
                exc.body = b""
            raise
        except (OSError, http.client.HTTPException):
            if deadline.expired:
                raise TransportError(f"no complete answer within {deadline.seconds:g} s") from None
            raise
    finally:
        deadline.cancel()
