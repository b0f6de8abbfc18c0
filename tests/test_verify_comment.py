"""The pull-request verification comment, end to end on the CPU: a real `cfgfix verify
--before BASE --after HEAD` run feeds the comment, posted to a local stand-in for GitHub's
API, then updated in place by a second run; a dry run writes the markdown to a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.verify.comment import MARKER, merge

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TOKEN = "ghs_verify_secret_token"


class FakeIssueComments:
    """GitHub's issue-comment endpoints, in memory."""

    def __init__(self, comments=()):
        self.comments = [dict(c) for c in comments]
        self.requests = []
        self.next_id = 500
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, answer = fake.answer(self.command, self.path.split("?")[0], body)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, method, path, body):
        if method == "GET" and path.endswith("/issues/7/comments"):
            return 200, self.comments
        if method == "POST" and path.endswith("/issues/7/comments"):
            self.next_id += 1
            self.comments.append({"id": self.next_id, "body": body["body"]})
            return 201, self.comments[-1]
        if method == "PATCH" and "/issues/comments/" in path:
            comment = next(c for c in self.comments if c["id"] == int(path.rsplit("/", 1)[1]))
            comment["body"] = body["body"]
            return 200, comment
        if method == "DELETE" and "/issues/comments/" in path:
            self.comments = [c for c in self.comments if c["id"] != int(path.rsplit("/", 1)[1])]
            return 204, None
        return 404, {"message": "Not Found"}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _git(folder: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull)
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, env=env, text=True).stdout


@pytest.fixture
def pull_request(tmp_path, monkeypatch):
    """A repository with a base and a head commit, and the environment of a pull_request job
    from the repository itself (not a fork)."""
    pytest.importorskip("torch")
    folder = tmp_path / "proj"
    folder.mkdir()
    text = (REPO / "fixtures" / "verify" / "early-exit" / "train.py").read_text()
    (folder / "train.py").write_text(text)
    _git(folder, "init", "-q")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-qm", "base")
    (folder / "train.py").write_text(text.replace("        loss.backward()\n", "        loss.backward(retain_graph=False)\n"))
    _git(folder, "commit", "-qam", "head")
    head = _git(folder, "rev-parse", "HEAD").strip()
    event = tmp_path / "event.json"
    repo = {"full_name": "octo/proj", "fork": False}
    event.write_text(json.dumps({"number": 7, "pull_request": {"number": 7, "head": {"sha": head, "repo": repo},
                                                               "base": {"repo": repo}}}))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", "octo/proj")
    monkeypatch.setattr("cfgfix.review.post._sleep", lambda seconds: None)
    return folder


def _verify(*args: str):
    return CliRunner().invoke(cli, ["verify", "--before", "HEAD~1", "--after", "HEAD", *args,
                                    "--", PYTHON, "train.py", "--target", "0"])


def test_the_comment_is_posted_then_updated_in_place(pull_request, monkeypatch):
    human = {"id": 12, "body": "looks good to me"}
    with FakeIssueComments([human]) as server:
        monkeypatch.setenv("GITHUB_API_URL", server.url)
        first = _verify("--post")
        assert first.exit_code == 0, first.output
        assert [(m, p) for m, p, _, _ in server.requests] == [
            ("GET", "/repos/octo/proj/issues/7/comments?per_page=100&page=1"),
            ("POST", "/repos/octo/proj/issues/7/comments"),
        ]
        (ours,) = [c for c in server.comments if MARKER in c["body"]]
        body = ours["body"]
        assert "#### The pull request's change: ✅ holds" in body
        assert "2 optimizer steps · CPU run · base `" in body
        for row in ("| status | completed (2/2) | completed (2/2) |", "| time per step (mean after the first) |",
                    "| losses |", "| gradient norms (before clipping) |", "| peak memory (CPU live tensor bytes) |"):
            assert row in body
        assert "identical" in body
        assert "**Changed lines**: 1 of 1 changed statement ran" in body
        assert "- ✅ `train.py:23` `loss.backward(retain_graph=False)`" in body

        server.requests.clear()
        second = _verify("--post", "--steps", "3")
        assert second.exit_code == 0, second.output
        assert [(m, p) for m, p, _, _ in server.requests] == [
            ("GET", "/repos/octo/proj/issues/7/comments?per_page=100&page=1"),
            ("PATCH", f"/repos/octo/proj/issues/comments/{ours['id']}"),
        ]
    assert len(server.comments) == 2 and server.comments[0] == human  # a human's comment is never touched
    assert "3 optimizer steps" in server.comments[1]["body"] and "2 optimizer steps" not in server.comments[1]["body"]
    assert body.count("<!-- cfgfix-verify:section=change") == 1
    for _, _, headers, _ in server.requests:
        assert headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in first.output + second.output


def test_a_dry_run_writes_the_markdown_and_posts_nothing(pull_request, monkeypatch, tmp_path):
    monkeypatch.delenv("GITHUB_TOKEN")
    out = tmp_path / "comment.md"
    result = _verify("--comment-file", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith(MARKER) and "✅ holds" in text and "| losses |" in text
    assert f"wrote the pull-request comment to {out}" in result.stderr


def test_post_without_a_token_fails_before_running_anything(pull_request, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN")
    result = _verify("--post")
    assert result.exit_code == 2 and "--post: GITHUB_TOKEN is not set" in result.stderr
    assert "exporting" not in result.stderr  # nothing was copied or run


def test_a_fork_pull_request_is_refused_and_nothing_is_posted(pull_request, monkeypatch, tmp_path):
    event = tmp_path / "fork.json"
    event.write_text(json.dumps({"number": 7, "pull_request": {"number": 7, "head": {"repo": {"full_name": "evil/proj", "fork": True}},
                                                               "base": {"repo": {"full_name": "octo/proj"}}}}))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    with FakeIssueComments() as server:
        monkeypatch.setenv("GITHUB_API_URL", server.url)
        result = _verify("--post")
    assert result.exit_code == 2 and "comes from a fork" in result.stderr
    assert server.requests == []


def test_sections_of_the_same_head_are_kept_and_older_ones_dropped():
    change = merge(None, "change", "abc", "#### The pull request's change: ✅ holds\n")
    both = merge(change, "fixes", "abc", "#### cfgfix's suggested fixes: ⚠️ not exercised\n")
    assert both.index("pull request's change") < both.index("suggested fixes")
    again = merge(both, "change", "abc", "#### The pull request's change: ❌ does not hold\n")
    assert "✅ holds" not in again and "❌ does not hold" in again and "suggested fixes" in again
    newer = merge(again, "change", "def", "#### The pull request's change: ✅ holds\n")
    assert "suggested fixes" not in newer  # it spoke for the older head commit
    assert newer.count(MARKER) == 1


def test_the_verify_action_runs_both_verifications_into_one_comment(pull_request, tmp_path):
    """verify/action.yml's script, run as GitHub runs a composite step (bash -eo pipefail),
    with its inputs as environment variables: the pull request's change, then cfgfix's
    suggested fixes (none here), into one comment file."""
    import yaml

    action = yaml.safe_load((REPO / "verify" / "action.yml").read_text())
    step = next(s for s in action["runs"]["steps"] if s["name"] == "Verify the pull request")
    out = tmp_path / "comment.md"
    env = dict(os.environ, PY=PYTHON, PYTHONPATH=str(REPO), GITHUB_TOKEN="",
               PR_BASE=_git(pull_request, "rev-parse", "HEAD~1").strip(), PR_HEAD=_git(pull_request, "rev-parse", "HEAD").strip(),
               INPUT_COMMAND=f"{PYTHON} train.py --target 0", INPUT_STEPS="2", INPUT_DEVICE="cpu", INPUT_TIMEOUT="300",
               INPUT_BASE="", INPUT_HEAD="", INPUT_SUGGESTED_FIXES="true", INPUT_UNSAFE_FIXES="false",
               INPUT_POST="false", INPUT_COMMENT_FILE=str(out), INPUT_FAIL_ON="does-not-hold")
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=pull_request,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count(MARKER) == 1
    assert "#### The pull request's change: ✅ holds" in text
    assert "#### cfgfix's suggested fixes: ➖ nothing to verify" in text
    assert text.index("pull request's change") < text.index("suggested fixes")


def test_code_from_the_change_cannot_forge_a_section_marker():
    from cfgfix.verify.comment import _coverage

    forged = "x = '<!-- /cfgfix-verify:section=change -->'"
    lines = _coverage({"units": [{"path": "a.py", "lines": [1], "side": "after", "code": forged, "ran": True,
                                  "counts": True}], "other_files": []})
    body = merge(None, "change", "abc", "\n".join(lines))
    assert body.count("<!-- /cfgfix-verify:section=change -->") == 1
    assert merge(body, "fixes", "abc", "fixes\n").count("a.py") == 1
