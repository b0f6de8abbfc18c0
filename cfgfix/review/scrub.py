"""One scrubber for every string the API client can print or log.

It runs on the whole string before anything cuts it: cut first, and a token that crosses
the cut leaves a prefix behind that no replace finds (33 of 46 characters were seen). It
removes the token itself, in the spellings an answer may echo it in (URL-quoted, JSON- or
repr-escaped), and the value of anything that looks like an Authorization header, whatever
token it holds."""

from __future__ import annotations

import json
import re
import urllib.parse

MASK = "***"

# `Authorization: Bearer x`, `"authorization": "token x"`, `'Authorization': 'x'`, and a bare
# `Bearer x` / `token x` scheme with a credential-looking value.
_AUTH_VALUE = re.compile(
    r"""(?ix)
    (authori[sz]ation\\?["']?\s*[:=]\s*\\?["']?\s*)   # the header's name and separator
    (?:(?:bearer|token|basic)\s+)?                     # its scheme
    [^\s"'\\,;}\]]+                                    # its credential
    """)
_SCHEME_VALUE = re.compile(r"(?i)\b(bearer|token|basic)(\s+)([A-Za-z0-9_\-.=+/]{16,})")
# GitHub's token formats (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_): scrubbed even when
# they are not this run's token
_GITHUB_TOKEN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")


class Scrubber:
    def __init__(self, *secrets: str) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not secret or len(secret) < 4:
                continue
            forms.update({secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret),
                          json.dumps(secret)[1:-1], repr(secret)[1:-1],
                          secret.encode("unicode_escape").decode("ascii")})
        # longest first: a form that holds another is replaced whole
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text) -> str:
        text = text if isinstance(text, str) else str(text)
        for form in self._forms:
            text = text.replace(form, MASK)
        text = _AUTH_VALUE.sub(lambda m: m.group(1) + MASK, text)
        text = _SCHEME_VALUE.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
        return _GITHUB_TOKEN.sub(MASK, text)

    def excerpt(self, text, limit: int) -> str:
        """The scrubbed text, then cut to `limit` characters."""
        clean = self(text)
        return clean if len(clean) <= limit else clean[:limit] + "…"
