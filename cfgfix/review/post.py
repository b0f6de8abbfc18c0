"""Posting the review through the GitHub REST API with urllib (no extra dependency).

A second run on the same pull request finds its own earlier comments and reviews by the
hidden marker: comments that still apply are left as they are (not posted again), stale
ones are deleted, the earlier summary is updated; nothing without the marker is touched.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from cfgfix.review.review import MARKER

DEFAULT_API = "https://api.github.com"
API_VERSION = "2022-11-28"
MAX_ATTEMPTS = 5
MAX_WAIT = 60.0  # seconds; a longer rate-limit wait fails instead of hanging the job


class PostError(Exception):
    pass


_STATUS_HELP = {
    401: "GitHub rejected the token (401): GITHUB_TOKEN is missing, expired or malformed",
    403: "GitHub refused (403): the token lacks `pull-requests: write` permission (pull requests "
         "from forks get a read-only token), or approving is not allowed for GitHub Actions",
    404: "GitHub answered 404: check GITHUB_REPOSITORY and the pull request number, and that the "
         "token can see the repository",
    422: "GitHub rejected the review (422): a comment is probably on a line outside the pull "
         "request's diff, or commit_id is not the pull request's head commit",
}


@dataclass
class Target:
    api_url: str
    repository: str  # owner/name
    pull: int
    token: str


def target_from_env(pr: int | None, environ=os.environ) -> Target:
    token = environ.get("GITHUB_TOKEN", "")
    if not token:
        raise PostError("GITHUB_TOKEN is not set")
    repository = environ.get("GITHUB_REPOSITORY", "")
    if "/" not in repository:
        raise PostError("GITHUB_REPOSITORY is not set (owner/name)")
    if pr is None:
        pr = _event(environ).get("pull_request", {}).get("number") or _event(environ).get("number")
    if not pr:
        raise PostError("no pull request number: pass --pr N or run on a pull_request event")
    api = (environ.get("GITHUB_API_URL") or DEFAULT_API).rstrip("/")
    return Target(api, repository, int(pr), token)


def _event(environ) -> dict:
    path = environ.get("GITHUB_EVENT_PATH")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def event_head_sha(environ=os.environ) -> str | None:
    return _event(environ).get("pull_request", {}).get("head", {}).get("sha")


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class Client:
    def __init__(self, target: Target, sleep=None, clock=time.time, log=None) -> None:
        self.target = target
        # Looked up at call time, so tests can replace the module's `_sleep`.
        self.sleep = sleep or (lambda seconds: _sleep(seconds))
        self.clock = clock
        self.log = log or (lambda message: None)

    def _scrub(self, text: str) -> str:
        return text.replace(self.target.token, "***") if self.target.token else text

    def request(self, method: str, path: str, payload=None):
        url = self.target.api_url + path
        data = json.dumps(payload).encode("utf-8") if payload is not None else None
        headers = {
            "Authorization": f"Bearer {self.target.token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "cfgfix-review",
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    body = response.read()
                    return json.loads(body) if body.strip() else None
            except urllib.error.HTTPError as exc:
                body = exc.read().decode("utf-8", "replace")
                wait = self._retry_wait(exc.code, exc.headers, body, attempt)
                if wait is None or attempt == MAX_ATTEMPTS:
                    raise PostError(self._explain(method, path, exc.code, body)) from None
                self.log(f"{method} {path}: HTTP {exc.code}, retrying in {wait:g} s")
                self.sleep(wait)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == MAX_ATTEMPTS:
                    raise PostError(self._scrub(f"cannot reach {self.target.api_url}: {getattr(exc, 'reason', exc)}")) from None
                self.sleep(min(MAX_WAIT, 2.0 ** (attempt - 1)))
        raise PostError("unreachable")  # pragma: no cover

    def _retry_wait(self, status: int, headers, body: str, attempt: int) -> float | None:
        limited = status == 429 or (status == 403 and (
            headers.get("Retry-After") is not None or headers.get("X-RateLimit-Remaining") == "0"
            or "rate limit" in body.lower()))
        if not limited and status < 500:
            return None
        if headers.get("Retry-After"):
            try:
                wait = float(headers["Retry-After"])
            except ValueError:
                wait = 2.0 ** (attempt - 1)
        elif limited and headers.get("X-RateLimit-Reset"):
            try:
                wait = max(0.0, float(headers["X-RateLimit-Reset"]) - self.clock()) + 1
            except ValueError:
                wait = 2.0 ** (attempt - 1)
        else:
            wait = 2.0 ** (attempt - 1)
        return None if wait > MAX_WAIT else wait

    def _explain(self, method: str, path: str, status: int, body: str) -> str:
        detail = ""
        try:
            data = json.loads(body)
            detail = data.get("message", "")
            errors = data.get("errors")
            if errors:
                detail += ": " + "; ".join(e if isinstance(e, str) else json.dumps(e) for e in errors)
        except (ValueError, AttributeError):
            detail = body[:200]
        base = _STATUS_HELP.get(status, f"GitHub answered HTTP {status}")
        return self._scrub(f"{base} [{method} {path}]" + (f" ({detail})" if detail else ""))

    def pages(self, path: str) -> list:
        items, page = [], 1
        while page <= 50:
            batch = self.request("GET", f"{path}?per_page=100&page={page}") or []
            items.extend(batch)
            if len(batch) < 100:
                break
            page += 1
        return items


def _same(old: dict, new: dict) -> bool:
    return (old.get("path") == new["path"] and old.get("line") == new["line"]
            and old.get("body") == new["body"] and old.get("start_line") == new.get("start_line"))


def post_review(client: Client, payload: dict, approve_when_clean: bool) -> str:
    """Sync the pull request with `payload` (a github-review body); returns what was done."""
    t = client.target
    pulls = f"/repos/{t.repository}/pulls/{t.pull}"
    existing = [c for c in client.pages(f"{pulls}/comments") if MARKER in (c.get("body") or "")]
    reviews = [r for r in client.pages(f"{pulls}/reviews") if MARKER in (r.get("body") or "")]
    wanted = payload["comments"]
    kept_ids, fresh = set(), []
    for new in wanted:
        match = next((old for old in existing if old["id"] not in kept_ids and _same(old, new)), None)
        if match is not None:
            kept_ids.add(match["id"])
        else:
            fresh.append(new)
    stale = [old for old in existing if old["id"] not in kept_ids]
    for old in stale:
        client.request("DELETE", f"/repos/{t.repository}/pulls/comments/{old['id']}")
    done = []
    if stale:
        done.append(f"deleted {len(stale)} outdated cfgfix comment{'s' if len(stale) != 1 else ''}")
    if fresh:
        client.request("POST", f"{pulls}/reviews", dict(payload, comments=fresh))
        for old in reviews:
            client.request("PUT", f"{pulls}/reviews/{old['id']}",
                           {"body": f"{MARKER}\n_Superseded by a later cfgfix review._"})
        done.append(f"posted a review with {len(fresh)} comment{'s' if len(fresh) != 1 else ''}")
    elif reviews:
        latest = reviews[-1]
        if latest.get("body") != payload["body"]:
            client.request("PUT", f"{pulls}/reviews/{latest['id']}", {"body": payload["body"]})
            done.append("updated the earlier cfgfix review")
    elif not wanted and approve_when_clean:
        note = dict(payload, event="APPROVE", comments=[])
        try:
            client.request("POST", f"{pulls}/reviews", note)
        except PostError as exc:
            if "(422)" not in str(exc) and "(403)" not in str(exc):
                raise
            client.request("POST", f"{pulls}/reviews", dict(note, event="COMMENT"))
        done.append("posted an approval note")
    return "; ".join(done) or "nothing to post"
