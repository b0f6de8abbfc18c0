"""Posting the review through the GitHub REST API with urllib (no extra dependency).

A second run on the same pull request finds its own earlier comments and reviews by the
hidden marker: comments that still apply are left as they are (not posted again), stale
ones are deleted, the earlier summary is updated; nothing without the marker is touched.
`upsert_comment` keeps one marked pull-request comment (`cfgfix verify --post`).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from cfgfix.records import dataclass
from cfgfix.report.review_comments import MARKER
from cfgfix.review import transport
from cfgfix.review.scrub import Scrubber

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
        event = _event(environ)
        pr = _get(event, "pull_request", "number") or event.get("number")
    if isinstance(pr, bool) or not isinstance(pr, int) or pr < 1:
        if pr:
            raise PostError(f"the event's pull request number is not a number ({str(pr)[:40]!r}): pass --pr N")
        raise PostError("no pull request number: pass --pr N or run on a pull_request event")
    api = (environ.get("GITHUB_API_URL") or DEFAULT_API).rstrip("/")
    if urllib.parse.urlsplit(api).scheme not in ("http", "https"):
        raise PostError(f"GITHUB_API_URL is not an http(s) URL: {api[:80]!r}")
    return Target(api, repository, pr, token)


def _get(data, *keys):
    """data[k1][k2]... or None when any level is missing or not an object (a payload of
    the wrong shape is no payload)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _event(environ) -> dict:
    path = environ.get("GITHUB_EVENT_PATH")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def event_head_sha(environ=os.environ) -> str | None:
    sha = _get(_event(environ), "pull_request", "head", "sha")
    return sha if isinstance(sha, str) else None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are never followed by urllib: its handler would resend the Authorization
    header to whatever host the answer names, and turn a POST into a GET. `Client.request`
    decides instead (a read may follow one on the API's own origin; a write never)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_WRITES = ("POST", "PUT", "PATCH", "DELETE")
MAX_REDIRECTS = 3


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class Client:
    """Every string this client raises or logs passes `self.scrub` whole, before any cut
    (cfgfix/review/scrub.py); each exchange has a deadline and a size bound
    (cfgfix/review/transport.py)."""

    def __init__(self, target: Target, sleep=None, clock=time.time, log=None) -> None:
        self.target = target
        self.scrub = Scrubber(target.token)
        # Looked up at call time, so tests can replace the module's `_sleep`.
        self.sleep = sleep or (lambda seconds: _sleep(seconds))
        self.clock = clock
        log = log or (lambda message: None)
        self.log = lambda message: log(self.scrub(message))

    def _error(self, message: str) -> PostError:
        return PostError(self.scrub(message))

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
        redirects = 0
        attempt = 1
        while attempt <= MAX_ATTEMPTS:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                _, _, body = transport.exchange(request, _NoRedirect())
                return self._decode(method, path, body)
            except transport.TransportError as exc:  # a drip or a flood: another try would be the same
                raise self._error(f"GitHub's answer to {method} {path}: {exc}") from None
            except MemoryError:
                raise self._error(f"GitHub's answer to {method} {path} does not fit in memory") from None
            except urllib.error.HTTPError as exc:
                body = getattr(exc, "body", b"").decode("utf-8", "replace")
                if 300 <= exc.code < 400:
                    url = self._follow(method, path, url, exc.code, exc.headers.get("Location"))
                    redirects += 1
                    if redirects > MAX_REDIRECTS:
                        raise self._error(f"GitHub redirected {method} {path} more than {MAX_REDIRECTS} times")
                    continue
                wait = self._retry_wait(exc.code, exc.headers, body, attempt)
                if wait is None or attempt == MAX_ATTEMPTS:
                    raise self._error(self._explain(method, path, exc.code, body)) from None
                self.log(f"{method} {path}: HTTP {exc.code}, retrying in {wait:g} s")
                self.sleep(wait)
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError) as exc:
                if attempt == MAX_ATTEMPTS:
                    reason = getattr(exc, "reason", exc)
                    raise self._error(f"cannot reach {self.target.api_url}: {reason}") from None
                self.sleep(min(MAX_WAIT, 2.0 ** (attempt - 1)))
            attempt += 1
        raise self._error(f"gave up on {method} {path} after {MAX_ATTEMPTS} attempts")

    def _follow(self, method: str, path: str, url: str, status: int, location: str | None) -> str:
        """Where a redirected read goes next; a PostError for anything else. A write that is
        redirected did not happen (urllib would have re-sent it as a GET and reported
        success), and the token never leaves the API's origin."""
        if method in _WRITES:
            where = self.scrub.excerpt(location, 200) if location else "nowhere"
            raise self._error(f"GitHub answered {method} {path} with a redirect (HTTP {status}) "
                              f"to {where}: nothing was written; check GITHUB_API_URL")
        if not location:
            raise self._error(f"GitHub answered {method} {path} with HTTP {status} and no Location")
        target = urllib.parse.urljoin(url, location)
        if _origin(target) != _origin(self.target.api_url):
            where = self.scrub.excerpt(target, 120)
            raise self._error(f"GitHub redirected {method} {path} to another origin ({where}); "
                              f"the token is not sent there: check GITHUB_API_URL")
        return target

    def _decode(self, method: str, path: str, body: bytes):
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            text = self.scrub.excerpt(body.decode("utf-8", "replace"), 120)
            raise self._error(f"GitHub's answer to {method} {path} is not JSON: {text!r}") from None

    def _retry_wait(self, status: int, headers, body: str, attempt: int) -> float | None:
        limited = status == 429 or (status == 403 and (
            headers.get("Retry-After") is not None or headers.get("X-RateLimit-Remaining") == "0"
            or "rate limit" in body.lower()))
        if not limited and status < 500:
            return None
        backoff = 2.0 ** (attempt - 1)
        wait = None
        if headers.get("Retry-After"):
            wait = _seconds(headers["Retry-After"])  # "nan", "-5", an HTTP date: back off instead
        elif limited and headers.get("X-RateLimit-Reset"):
            reset = _seconds(headers["X-RateLimit-Reset"])
            wait = max(0.0, reset - self.clock()) + 1 if reset is not None else None
        wait = backoff if wait is None else wait
        return None if wait > MAX_WAIT else wait

    def _explain(self, method: str, path: str, status: int, body: str) -> str:
        detail = ""
        try:
            data = json.loads(body)
            detail = str(data.get("message", ""))
            errors = data.get("errors")
            if errors:
                detail += ": " + "; ".join(e if isinstance(e, str) else json.dumps(e) for e in errors)
        except (ValueError, AttributeError, TypeError, RecursionError):  # not JSON, or not an object
            detail = body
        base = _STATUS_HELP.get(status, f"GitHub answered HTTP {status}")
        detail = self.scrub.excerpt(detail, 400) if detail else ""
        return f"{base} [{method} {path}]" + (f" ({detail})" if detail else "")

    def pages(self, path: str) -> list:
        items, page = [], 1
        while page <= 50:
            batch = self.request("GET", f"{path}?per_page=100&page={page}") or []
            if not isinstance(batch, list) or not all(isinstance(i, dict) and isinstance(i.get("id"), int) for i in batch):
                raise self._error(f"GitHub's answer to GET {path} is not a list of objects with ids: "
                                  f"{self.scrub.excerpt(batch, 120)}")
            items.extend(batch)
            if len(batch) < 100:
                break
            page += 1
        return items


def _seconds(text: str) -> float | None:
    """A finite, non-negative number of seconds, or None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


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


def upsert_comment(client: Client, marker: str, build) -> str:
    """Keep one pull-request comment holding `marker`: `build(earlier body or None)` gives its
    body; it is created once, then edited in place, and any later duplicate (two jobs that
    raced) is deleted. Comments without the marker are never touched."""
    t = client.target
    comments = client.pages(f"/repos/{t.repository}/issues/{t.pull}/comments")
    ours = [c for c in comments if marker in (c.get("body") or "")]
    if not ours:
        client.request("POST", f"/repos/{t.repository}/issues/{t.pull}/comments", {"body": build(None)})
        return "posted the verification comment"
    first, *duplicates = ours
    for extra in duplicates:
        client.request("DELETE", f"/repos/{t.repository}/issues/comments/{extra['id']}")
    body = build(first.get("body"))
    if body == first.get("body"):
        return "the verification comment is up to date"
    client.request("PATCH", f"/repos/{t.repository}/issues/comments/{first['id']}", {"body": body})
    return "updated the verification comment"
