"""The request body of GitHub's "create a review for a pull request" endpoint
(`POST /repos/{owner}/{repo}/pulls/{pull_number}/reviews`): a summary body with a table of
findings per rule, and one comment per finding on the right side of the diff, with a
```suggestion block when the finding's fix lies inside the commented lines."""

from __future__ import annotations

import re
from collections import Counter

from cfgfix.core import Applicability
from cfgfix.report.review_comments import MARKER, Comment, Review
from cfgfix.rules.base import DOCS_URL


def _url(rules, code: str) -> str:
    for rule in rules:
        if rule.code == code:
            return rule.url()
    return DOCS_URL.format(code=code)


def _fence(text: str) -> str:
    # A fence longer than any backtick run inside, so the suggestion cannot close it early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def comment_body(comment: Comment, rules, cell: str | None = None) -> str:
    finding = comment.finding
    parts = [
        MARKER,
        f"**[{finding.code}]({_url(rules, finding.code)}) {finding.name}** ({finding.severity.value})"
        + (f" in notebook {cell}" if cell else ""),
        "",
        finding.message,
    ]
    if comment.related_note:
        parts += ["", comment.related_note]
    fix = finding.fix
    if comment.suggestion is not None:
        fence = _fence(comment.suggestion)
        if comment.unsafe:
            parts += ["", f"**Unsafe fix** (it changes numerics or semantics; check before committing): {fix.description}"]
        else:
            parts += ["", f"Safe fix: {fix.description}"]
        parts += ["", f"{fence}suggestion", *([comment.suggestion] if comment.suggestion else []), fence]
    elif fix is not None:
        flag = " --unsafe-fixes" if fix.applicability is Applicability.UNSAFE else ""
        parts += ["", f"`cfgfix fix{flag}` can apply this: {fix.description}"]
    return "\n".join(parts)


def _unplaced_lines(review: Review, rules) -> list[str]:
    """Findings in changed notebooks that no diff line can show, as a list in the body."""
    unplaced = getattr(review, "unplaced", [])
    if not unplaced:
        return []
    lines = ["", "Findings in changed notebooks that no line of the diff shows:", ""]
    sources = review.sources
    for finding in unplaced:
        source = sources.get(finding.path)
        where = f"line {finding.span.line}"
        if hasattr(source, "cell_position"):
            cell, line, column = source.cell_position(finding.span.line, finding.span.column)
            where = f"cell {cell}:{line}:{column}"
        lines.append(f"- `{finding.path}` {where}: [{finding.code}]({_url(rules, finding.code)}) {finding.message}")
    return lines


def summary_body(review: Review, rules) -> str:
    comments = review.comments
    if not comments:
        head = f"{MARKER}\n### cfgfix review\n\ncfgfix found no findings on the lines this pull request changes."
        return "\n".join([head, *_unplaced_lines(review, rules)])
    counts = Counter(c.finding.code for c in comments)
    names = {c.finding.code: (c.finding.name, c.finding.severity.value) for c in comments}
    suggested = sum(1 for c in comments if c.suggestion is not None)
    noun = "finding" if len(comments) == 1 else "findings"
    lines = [
        MARKER,
        "### cfgfix review",
        "",
        f"cfgfix found **{len(comments)}** {noun} on the lines this pull request changes"
        f" ({suggested} with a suggested change).",
        "",
        "| Rule | Name | Severity | Findings |",
        "| --- | --- | --- | ---: |",
    ]
    for code in sorted(counts):
        name, severity = names[code]
        lines.append(f"| [{code}]({_url(rules, code)}) | {name} | {severity} | {counts[code]} |")
    return "\n".join(lines + _unplaced_lines(review, rules))


def review_comment(comment: Comment, rules, cell: str | None = None) -> dict:
    entry = {"path": comment.path, "line": comment.line, "side": "RIGHT", "body": comment_body(comment, rules, cell)}
    if comment.start_line != comment.line:
        entry["start_line"] = comment.start_line
        entry["start_side"] = "RIGHT"
    return entry


def payload(review: Review, rules, event: str = "COMMENT") -> dict:
    return {
        "commit_id": review.commit_id,
        "body": summary_body(review, rules),
        "event": event,
        "comments": [review_comment(c, rules, getattr(review, "cells", {}).get(id(c.finding))) for c in review.comments],
    }
