"""`review --post` against a hostile or broken GitHub API (issue 24): no token character in
any output, a deadline on the whole exchange, a bound on the answer, exit 2 and no
traceback for every answer a fake server can send."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.review import transport
from cfgfix.review.scrub import Scrubber

TOKEN = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"  # 40 characters, GitHub's format


class RawServer:
    """A TCP server that answers each connection with `respond(conn, request_bytes)`."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn) -> None:
        try:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.respond(conn, data, self.stop)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()


def _answer(status: int, body: bytes, headers: dict | None = None, length: int | None = None):
    def respond(conn, request, stop):
        head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body) if length is None else length}",
                "Connection: close"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return respond


def _echo(status: int, shape: str):
    """Answers that echo the request's Authorization header (as a misconfigured proxy or a
    debugging endpoint does) in several shapes."""
    def respond(conn, request, stop):
        auth = next((line.split(b":", 1)[1].strip().decode() for line in request.split(b"\r\n")
                     if line.lower().startswith(b"authorization:")), "")
        if shape == "list":
            body = json.dumps([{"id": "x", "headers": {"Authorization": auth}}])
        elif shape == "object":
            body = json.dumps({"message": f"Bad credentials: {auth}", "errors": [{"auth": auth}]})
        elif shape == "long-object":  # the token straddles any cut at 120 or 200 characters
            body = json.dumps({"message": "x" * 90 + auth + "y" * 300})
        elif shape == "html":
            body = "<html>" + "z" * 100 + f"<pre>Authorization: {auth}</pre></html>"
        elif shape == "bare":
            body = auth.split()[-1] * 3
        else:
            raise AssertionError(shape)
        _answer(status, body.encode())(conn, request, stop)
    return respond


def _drip(conn, request, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n[")
    while not stop.is_set():
        time.sleep(0.2)
        conn.sendall(b" ")


def _drip_headers(conn, request, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.is_set():
        time.sleep(0.2)
        conn.sendall(b"X-Slow: 1\r\n")


def _huge(conn, request, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n[")
    chunk = b'{"id": 1},' * 10000
    try:
        while not stop.is_set():
            conn.sendall(chunk)
    except OSError:
        pass


def _redirect_loop(conn, request, stop):
    path = request.split(b" ")[1].decode()
    _answer(302, b"", {"Location": path + "&again=1"})(conn, request, stop)


@pytest.fixture
def pr(tmp_path, monkeypatch):
    from tests.test_review import BASE_TRAIN, PR_TRAIN, _git

    root = tmp_path / "proj"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "train.py").write_text(BASE_TRAIN)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "checkout", "-qb", "feature")
    (root / "train.py").write_text(PR_TRAIN)
    _git(root, "commit", "-qam", "pr")
    monkeypatch.chdir(root)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 7, "head": {"sha": _git(root, "rev-parse", "HEAD").strip()}}}))
    for name in ("GITHUB_BASE_REF", "GITHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", "octo/proj")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    monkeypatch.setattr("cfgfix.review.post._sleep", lambda s: None)
    monkeypatch.setattr(transport, "DEADLINE_SECONDS", 1.5)
    monkeypatch.setattr(transport, "SOCKET_TIMEOUT", 1.0)
    monkeypatch.setattr(transport, "MAX_BODY_BYTES", 1 << 20)
    return root


def _post(url, monkeypatch):
    monkeypatch.setenv("GITHUB_API_URL", url)
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", "--post",
                                      "--output-format", "github-review"])
    return result, time.monotonic() - start


def _leaks(text: str) -> list[str]:
    """Every run of 6 or more of the token's characters found in `text`."""
    return [TOKEN[i:i + 6] for i in range(len(TOKEN) - 5) if TOKEN[i:i + 6] in text]


@pytest.mark.parametrize("status", [200, 401, 422, 500])
@pytest.mark.parametrize("shape", ["list", "object", "long-object", "html", "bare"])
def test_no_token_character_in_any_output(pr, monkeypatch, status, shape):
    with RawServer(_echo(status, shape)) as server:
        result, _ = _post(server.url, monkeypatch)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert not _leaks(result.output), result.output


@pytest.mark.parametrize("respond, needle", [
    (_drip, "within 1.5 s"),
    (_drip_headers, "within 1.5 s"),
    (_huge, "limit"),
    (_answer(200, b"[]", length=4096), "cut off after 2 of its 4,096 bytes"),  # the connection closes early
    (_answer(200, b'"a string"'), "not a list of objects"),
    (_answer(200, b"\xff\xfe{"), "not JSON"),
    (_redirect_loop, "redirected"),
    (_answer(200, b"[]", length=10 ** 12), "over the 1,048,576-byte limit"),  # refused before it is read
])
def test_every_broken_answer_is_a_clear_error(pr, monkeypatch, respond, needle):
    with RawServer(respond) as server:
        result, seconds = _post(server.url, monkeypatch)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "posting the review failed" in result.output and needle in result.output
    assert seconds < 15, seconds


def test_a_declared_huge_answer_is_refused_before_it_is_read(monkeypatch):
    class Response:
        headers = {"Content-Length": str(4 << 30)}

        def read(self, n):
            raise AssertionError("read a 4 GiB answer")

    with pytest.raises(transport.TransportError, match="over the"):
        transport.read_bounded(Response())


def test_the_scrubber_runs_before_the_cut():
    scrub = Scrubber(TOKEN)
    text = "a" * 100 + TOKEN + "b" * 50
    assert not _leaks(scrub.excerpt(text, 120))
    for form in (TOKEN, f"Bearer {TOKEN}", json.dumps({"Authorization": f"token {TOKEN}"}),
                 repr(TOKEN.encode())):
        assert not _leaks(scrub(form)), form
    # a header value that is not this run's token is scrubbed too
    assert "hunter2hunter2" not in scrub('{"authorization": "Basic hunter2hunter2"}')
    assert "ghp_" + "A" * 36 not in scrub("ghp_" + "A" * 36)
    assert scrub("the token lacks pull-requests: write") == "the token lacks pull-requests: write"
