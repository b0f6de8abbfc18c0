"""`cfgfix review`: a temporary git repository with a base commit and a pull-request
commit; the payloads are checked field by field, and --post runs against a local server."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.review.gitdiff import parse_diff
from cfgfix.review.review import MARKER

BASE_TRAIN = '''import torch
from transformers import AutoModelForCausalLM, Trainer

model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16, device_map="auto")
trainer = Trainer(model=model)
trainer.train()
'''
PR_TRAIN = BASE_TRAIN.replace("trainer = ", "model = model.to(torch.bfloat16)\ntrainer = ", 1)
BASE_SH = "#!/bin/bash\npython train.py\n"
PR_SH = "#!/bin/bash\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:Ture\ntorchrun --nproc_per_node 2 train.py\n"


def _git(root: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull)
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "train.py").write_text(BASE_TRAIN)
    (root / "train.sh").write_text(BASE_SH)
    (root / "old_name.py").write_text("x = 1\n")
    (root / "gone.py").write_text("y = 2\n")
    (root / "blob.bin").write_bytes(b"\x00\x01")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "checkout", "-qb", "feature")
    (root / "train.py").write_text(PR_TRAIN)
    (root / "train.sh").write_text(PR_SH)
    _git(root, "mv", "old_name.py", "new_name.py")
    _git(root, "rm", "-q", "gone.py")
    (root / "blob.bin").write_bytes(b"\x00\x02\x03")
    (root / "added.py").write_text("import torch\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "pr")
    monkeypatch.chdir(root)
    for name in ("GITHUB_BASE_REF", "GITHUB_EVENT_PATH", "GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    return root


def _review(*args):
    return CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", *args], catch_exceptions=False)


def test_changed_files_renames_deletions_binaries_new(repo):
    from cfgfix.review.gitdiff import changed_files

    files = {f.path: f for f in changed_files(repo, "main", "HEAD")}
    assert set(files) == {"train.py", "train.sh", "new_name.py", "added.py"}  # no gone.py, no blob.bin
    assert files["train.py"].lines == {5}
    assert files["train.sh"].lines == {2, 3}
    assert files["new_name.py"].status == "renamed" and files["new_name.py"].old_path == "old_name.py"
    assert files["new_name.py"].lines == set()
    assert files["added.py"].lines is None  # every line of a new file is changed


def test_working_tree_head_includes_untracked(repo):
    from cfgfix.review.gitdiff import changed_files

    (repo / "fresh.py").write_text("a = 1\n")
    (repo / "train.py").write_text(PR_TRAIN + "print(1)\n")
    files = {f.path: f for f in changed_files(repo, "main", None)}
    assert files["fresh.py"].lines is None
    assert files["train.py"].lines == {5, 8}


def test_parse_diff_quoted_and_multi_hunk():
    text = (
        'diff --git "a/sp ace.py" "b/sp ace.py"\nindex 1..2 100644\n--- "a/sp ace.py"\n+++ "b/sp ace.py"\n'
        "@@ -1 +1,2 @@\n-a\n+b\n+c\n@@ -10,0 +12 @@\n+d\n"
    )
    [changed] = parse_diff(text)
    assert changed.path == "sp ace.py" and changed.lines == {1, 2, 12}


def test_github_review_payload(repo):
    result = _review("--output-format", "github-review")
    assert result.exit_code == 1, result.output
    body = json.loads(result.output)
    assert set(body) == {"commit_id", "body", "event", "comments"}
    assert body["commit_id"] == _git(repo, "rev-parse", "HEAD").strip()
    assert body["event"] == "COMMENT"
    assert body["body"].startswith(MARKER)
    for code in ("CFX101", "CFX105", "CFX305"):
        assert f"| [{code}](https://github.com/cfgfix/cfgfix/blob/main/rules/{code}.md) |" in body["body"]
    where = [(c["path"], c["line"], c.get("start_line")) for c in body["comments"]]
    assert where == [("train.py", 5, None), ("train.sh", 2, None), ("train.sh", 3, None)]
    for comment in body["comments"]:
        assert comment["side"] == "RIGHT" and "start_side" not in comment
        assert comment["body"].startswith(MARKER)
    cast, alloc, launch = body["comments"]
    assert "**[CFX101]" in cast["body"] and "Remove the no-op" in cast["body"]
    # CFX101's fix is unsafe (float32 buffers): named, never a one-click suggestion by default
    assert "```suggestion" not in cast["body"]
    assert cast["body"].endswith("`cfgfix fix --unsafe-fixes` can apply this: Remove the no-op `.to(torch.bfloat16)`")
    assert "(0 with a suggested change)" in body["body"]
    assert "**[CFX305]" in alloc["body"]
    assert "**[CFX105]" in launch["body"]
    assert "Reported at `train.py:4` because of this change: launched here with 2 processes." in launch["body"]
    assert "```suggestion" not in launch["body"]  # the fix edits train.py, not this line
    assert "`cfgfix fix --unsafe-fixes` can apply this" in launch["body"]


def test_unsafe_suggestions_only_with_unsafe_fixes(repo):
    body = json.loads(_review("--output-format", "github-review", "--unsafe-fixes").output)
    cast = body["comments"][0]
    assert "changes numerics or semantics" in cast["body"]  # marked **Unsafe fix**
    assert cast["body"].endswith("```suggestion\n```")  # the suggestion deletes line 5
    assert "(1 with a suggested change)" in body["body"]
    [text_line] = [line for line in _review("--unsafe-fixes").output.splitlines() if "suggestion" in line]
    assert text_line == "  suggestion (unsafe fix): Remove the no-op `.to(torch.bfloat16)`"
    assert "suggestion" not in _review().output


def test_suggestion_matches_cfgfix_fix(repo):
    from cfgfix.review.review import Comment, apply_suggestion

    data = json.loads(_review("--output-format", "json", "--unsafe-fixes").output)
    [cast] = [c for c in data if c["code"] == "CFX101"]
    assert cast["unsafe_fix"] is True
    from cfgfix.core import Finding

    comment = Comment(Finding.from_dict(cast["finding"]), cast["path"], cast["start_line"], cast["line"],
                      Finding.from_dict(cast["finding"]).span, suggestion=cast["suggestion"])
    suggested = apply_suggestion(PR_TRAIN, comment)
    CliRunner().invoke(cli, ["fix", "--no-cache", "--unsafe-fixes", "--select", "CFX101", "train.py"], catch_exceptions=False)
    assert suggested == (repo / "train.py").read_text() == BASE_TRAIN


def test_multi_line_span_and_suggestion_text():
    from cfgfix.core import Applicability, Edit, Finding, Fix, Severity, Span
    from cfgfix.review.gitdiff import ChangedFile
    from cfgfix.review.review import place

    text = "a = 1\nb = f(\n    x,\n)\nc = 3\n"
    start = text.index("f(")
    end = text.index(")") + 1
    fix = Fix((Edit("m.py", start, end, "g(x)"),), "use g", Applicability.UNSAFE)
    finding = Finding("CFX999", "demo", "msg", Severity.WARNING, Span("m.py", 2, 5, 4, 2, start, end), fix=fix)
    [comment] = place([finding], {"m.py": ChangedFile("m.py", lines={3})}, lambda p: p, lambda p: text)
    assert comment.suggestion is None  # an unsafe fix: suggested only with --unsafe-fixes
    [comment] = place([finding], {"m.py": ChangedFile("m.py", lines={3})}, lambda p: p, lambda p: text, True)
    assert (comment.start_line, comment.line) == (2, 4)
    assert comment.suggestion == "b = g(x)" and comment.unsafe
    from cfgfix.report.github_review import review_comment

    entry = review_comment(comment, [])
    assert entry["start_line"] == 2 and entry["start_side"] == "RIGHT" and entry["line"] == 4
    assert "**Unsafe fix**" in entry["body"] and "```suggestion\nb = g(x)\n```" in entry["body"]


def test_rdjson_payload(repo):
    result = _review("--output-format", "rdjson")
    data = json.loads(result.output)
    assert data["source"] == {"name": "cfgfix", "url": "https://github.com/cfgfix/cfgfix"}
    by_code = {d["code"]["value"]: d for d in data["diagnostics"]}
    assert set(by_code) == {"CFX101", "CFX105", "CFX305"}
    cast = by_code["CFX101"]
    assert cast["severity"] == "INFO"
    assert cast["code"]["url"].endswith("/rules/CFX101.md")
    assert cast["location"] == {"path": "train.py", "range": {"start": {"line": 5, "column": 9}, "end": {"line": 5, "column": 33}}}
    assert "suggestions" not in cast  # CFX101's fix is unsafe: reviewdog would offer it in one click
    unsafe = {d["code"]["value"]: d for d in json.loads(_review("--output-format", "rdjson", "--unsafe-fixes").output)["diagnostics"]}
    assert unsafe["CFX101"]["suggestions"] == [{"range": {"start": {"line": 5, "column": 1}, "end": {"line": 6, "column": 1}}, "text": ""}]
    assert by_code["CFX305"]["severity"] == "ERROR"
    launch = by_code["CFX105"]
    assert launch["location"]["path"] == "train.sh" and launch["location"]["range"]["start"]["line"] == 3
    assert "suggestions" not in launch  # the fix edits another file
    assert launch["related_locations"][0]["location"]["path"] == "train.py"
    for d in data["diagnostics"]:
        assert set(d) <= {"message", "location", "severity", "code", "suggestions", "related_locations"}


def test_paths_limit_and_clean(repo):
    result = _review("new_name.py", "added.py")
    assert result.exit_code == 0
    assert "No findings on changed lines (2 changed files)." in result.output


def test_each_changed_file_is_reviewed_with_its_closest_settings(repo):
    """As `check`: a subproject's cfgfix.toml replaces the repository's for its files."""
    _git(repo, "checkout", "-q", "main")
    (repo / "cfgfix.toml").write_text('ignore = ["CFX101"]\n')
    (repo / "sub").mkdir()
    (repo / "sub" / "cfgfix.toml").write_text('ignore = ["CFX9"]\n')
    (repo / "sub" / "train.py").write_text(BASE_TRAIN)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "configs")
    _git(repo, "checkout", "-q", "feature")
    _git(repo, "rebase", "-q", "main")
    (repo / "sub" / "train.py").write_text(PR_TRAIN)
    result = _review("--output-format", "json", "--fail-on", "none")
    assert result.exit_code == 0, result.output
    codes = {(c["path"], c["code"]) for c in json.loads(result.output)}
    assert ("sub/train.py", "CFX101") in codes  # sub/cfgfix.toml: not the root's ignore
    assert ("train.py", "CFX101") not in codes and ("train.sh", "CFX105") in codes  # the root's


# -- posting ----------------------------------------------------------------------------------
class FakeGitHub:
    """A tiny threaded stand-in for the endpoints `--post` calls; answers from a script."""

    def __init__(self, comments=(), reviews=(), script=None):
        self.requests = []
        self.comments = list(comments)
        self.reviews = list(reviews)
        self.script = dict(script or {})  # (method, path-prefix) -> [(status, headers, body), ...]
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, headers, answer = fake.answer(self.command, self.path, body)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 5
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, method, path, body):
        for (m, prefix), queue in self.script.items():
            if m == method and path.startswith(prefix) and queue:
                return queue.pop(0)
        if method == "GET" and "/comments" in path:
            return 200, {}, self.comments
        if method == "GET" and "/reviews" in path:
            return 200, {}, self.reviews
        if method == "POST":
            return 200, {}, {"id": 99}
        if method == "DELETE":
            return 204, {}, None
        return 200, {}, {"id": 1}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def env(repo, monkeypatch, tmp_path):
    event = tmp_path / "event.json"
    head = _git(repo, "rev-parse", "HEAD").strip()
    event.write_text(json.dumps({"pull_request": {"number": 7, "head": {"sha": head}}}))
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_secret_token_value")
    monkeypatch.setenv("GITHUB_REPOSITORY", "octo/proj")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    sleeps = []
    monkeypatch.setattr("cfgfix.review.post._sleep", sleeps.append)
    return sleeps


def _post(server, monkeypatch, *extra):
    monkeypatch.setenv("GITHUB_API_URL", server.url)
    return CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", "--post", "--output-format", "github-review", *extra])


def _check_headers(server):
    for method, path, headers, body in server.requests:
        assert headers["authorization"] == "Bearer ghs_secret_token_value"
        assert headers["accept"] == "application/vnd.github+json"
        assert headers["x-github-api-version"] == "2022-11-28"
        if body is not None:
            assert headers["content-type"] == "application/json"


def test_post_creates_review_and_replaces_own_earlier_comments(env, monkeypatch):
    ours = {"id": 11, "path": "train.py", "line": 2, "body": MARKER + "\nold finding"}
    theirs = {"id": 12, "path": "train.py", "line": 5, "body": "a human's comment"}
    review = {"id": 5, "body": MARKER + "\nold summary"}
    with FakeGitHub(comments=[ours, theirs], reviews=[review, {"id": 6, "body": "LGTM"}]) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 1, result.output
    assert "ghs_secret_token_value" not in result.output
    _check_headers(server)
    calls = [(m, p) for m, p, _, _ in server.requests]
    assert calls == [
        ("GET", "/repos/octo/proj/pulls/7/comments?per_page=100&page=1"),
        ("GET", "/repos/octo/proj/pulls/7/reviews?per_page=100&page=1"),
        ("DELETE", "/repos/octo/proj/pulls/comments/11"),
        ("POST", "/repos/octo/proj/pulls/7/reviews"),
        ("PUT", "/repos/octo/proj/pulls/7/reviews/5"),
    ]
    posted = server.requests[3][3]
    assert posted["event"] == "COMMENT" and len(posted["comments"]) == 3
    assert posted["commit_id"] == _git(Path.cwd(), "rev-parse", "HEAD").strip()
    assert server.requests[4][3]["body"].startswith(MARKER)


def test_post_second_run_posts_nothing_new(env, monkeypatch):
    first = json.loads(_review("--output-format", "github-review").output)
    existing = [dict(c, id=100 + i) for i, c in enumerate(first["comments"])]
    with FakeGitHub(comments=existing, reviews=[{"id": 5, "body": first["body"]}]) as server:
        result = _post(server, monkeypatch)
    assert [(m) for m, *_ in server.requests] == ["GET", "GET"]
    assert "nothing to post" in result.output


def test_post_retries_5xx_and_rate_limit(env, monkeypatch):
    script = {
        ("GET", "/repos/octo/proj/pulls/7/comments"): [(502, {}, {"message": "bad gateway"})],
        ("POST", "/repos/octo/proj/pulls/7/reviews"): [(429, {"Retry-After": "3"}, {"message": "slow down"})],
    }
    with FakeGitHub(script=script) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 1, result.output
    assert env == [1.0, 3.0]
    assert [m for m, *_ in server.requests] == ["GET", "GET", "GET", "POST", "POST"]


def test_post_rate_limit_reset_header(env, monkeypatch):
    import time

    reset = str(int(time.time()) + 5)
    script = {("GET", "/repos/octo/proj/pulls/7/comments"): [(403, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset}, {"message": "API rate limit exceeded"})]}
    with FakeGitHub(script=script) as server:
        _post(server, monkeypatch)
    assert len(env) == 1 and 3 <= env[0] <= 7


@pytest.mark.parametrize("status,needle", [(403, "pull-requests: write"), (422, "outside the pull request's diff"),
                                           (401, "rejected the token"), (404, "GITHUB_REPOSITORY")])
def test_post_errors_exit_2(env, monkeypatch, status, needle):
    script = {("POST", "/repos/octo/proj/pulls/7/reviews"): [(status, {}, {"message": "nope", "errors": ["Line could not be resolved"]})]}
    with FakeGitHub(script=script) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 2
    assert needle in result.output and "ghs_secret_token_value" not in result.output
    assert env == []  # client errors are not retried


def test_post_clean_posts_nothing_or_approval(env, monkeypatch, repo):
    with FakeGitHub() as server:
        result = _post(server, monkeypatch, "added.py")
    assert result.exit_code == 0 and [m for m, *_ in server.requests] == ["GET", "GET"]
    with FakeGitHub() as server:
        result = _post(server, monkeypatch, "--approve-when-clean", "added.py")
    method, path, _, body = server.requests[-1]
    assert (method, body["event"], body["comments"]) == ("POST", "APPROVE", [])
    assert "no findings" in body["body"]


def test_post_without_token_fails_cleanly(env, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN")
    result = CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", "--post"])
    assert result.exit_code == 2 and "GITHUB_TOKEN is not set" in result.output


def test_a_conflicting_config_value_is_reviewed_with_its_fix(tmp_path, monkeypatch):
    """The issue's config case: a pull request changes `train_batch_size` in a DeepSpeed
    JSON that a launch script runs on 2 GPUs; the comment sits on the changed value with a
    suggestion that writes the product, and applying it gives what `cfgfix fix` writes."""
    root = tmp_path / "cfg"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    base = '{\n  "train_batch_size": 16,\n  "train_micro_batch_size_per_gpu": 4,\n  "gradient_accumulation_steps": 2\n}\n'
    (root / "ds.json").write_text(base)
    (root / "train.py").write_text("import deepspeed\n")
    (root / "run.sh").write_text("deepspeed --num_gpus 2 train.py --deepspeed ds.json\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "checkout", "-qb", "feature")
    (root / "ds.json").write_text(base.replace('"train_batch_size": 16', '"train_batch_size": 32'))
    _git(root, "commit", "-qam", "pr")
    monkeypatch.chdir(root)
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    result = _review("--output-format", "github-review")
    assert result.exit_code == 1, result.output
    (comment,) = json.loads(result.output)["comments"]
    assert (comment["path"], comment["line"]) == ("ds.json", 2)
    assert "**[CFX502]" in comment["body"]
    assert '```suggestion\n  "train_batch_size": 16,\n```' in comment["body"]
    fixed = CliRunner().invoke(cli, ["fix", "--no-cache", "ds.json"], catch_exceptions=False)
    assert fixed.exit_code == 0, fixed.output
    assert (root / "ds.json").read_text() == base


# -- posting against a hostile or broken API (issue 14) ----------------------------------------
def test_post_never_sends_the_token_to_another_origin(env, monkeypatch):
    with FakeGitHub() as other:
        script = {("GET", "/repos/octo/proj/pulls/7/comments"): [(302, {"Location": other.url + "/steal"}, None)]}
        with FakeGitHub(script=script) as server:
            result = _post(server, monkeypatch)
    assert result.exit_code == 2, result.output
    assert "another origin" in result.output and "ghs_secret_token_value" not in result.output
    assert other.requests == []  # not even a request without the token


def test_post_follows_a_read_redirect_on_the_api_origin(env, monkeypatch):
    script = {("GET", "/repos/octo/proj/pulls/7/comments"): [(301, {"Location": "/moved/comments"}, None)]}
    with FakeGitHub(script=script) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 1, result.output
    assert [(m, p) for m, p, *_ in server.requests][:2] == [
        ("GET", "/repos/octo/proj/pulls/7/comments?per_page=100&page=1"), ("GET", "/moved/comments")]
    _check_headers(server)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirected_write_is_a_failure(env, monkeypatch, status):
    script = {("POST", "/repos/octo/proj/pulls/7/reviews"): [(status, {"Location": "/elsewhere"}, None)]}
    with FakeGitHub(script=script) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 2, result.output
    assert "nothing was written" in result.output
    assert [m for m, p, *_ in server.requests if p == "/elsewhere"] == []  # never re-sent as a GET


@pytest.mark.parametrize("retry_after", ["nan", "-5", "inf", "Wed, 21 Oct 2015 07:28:00 GMT", "1e400"])
def test_odd_retry_after_values_back_off(env, monkeypatch, retry_after):
    script = {("POST", "/repos/octo/proj/pulls/7/reviews"): [(429, {"Retry-After": retry_after}, {"message": "slow"})]}
    with FakeGitHub(script=script) as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 1, result.output  # retried once after a plain back-off, then posted
    assert env == [1.0]


class _RawServer:
    """Answers every request with the same raw status and body (not JSON, wrong shapes)."""

    def __init__(self, status, body: bytes):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status, body, needle", [
    (200, b"<html>proxy login</html>", "not JSON"),
    (200, b'{"message": "not a list"}', "not a list of objects"),
    (200, b'["a", "b"]', "not a list of objects"),
    (200, b'[{"id": "x"}]', "not a list of objects"),
    (500, b"<html>oops</html>", "HTTP 500"),
    (422, b"[" * 100000, "422"),
])
def test_malformed_api_answers_are_a_clear_error(env, monkeypatch, status, body, needle):
    with _RawServer(status, body) as server:
        monkeypatch.setenv("GITHUB_API_URL", server.url)
        result = CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", "--post"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert needle in result.output and "ghs_secret_token_value" not in result.output


@pytest.mark.parametrize("event", [{"pull_request": "x"}, {"pull_request": {"number": "7; rm"}}, [1], {"number": True}])
def test_malformed_event_payloads_are_a_clear_error(env, monkeypatch, tmp_path, event):
    path = tmp_path / "odd-event.json"
    path.write_text(json.dumps(event))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(path))
    with FakeGitHub() as server:
        result = _post(server, monkeypatch)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "pull request number" in result.output
