"""From changed lines to placed review comments.

A finding is kept when its primary span touches a changed line (the comment goes on the
span), or else when one of its related spans does (a cross-file finding caused by the
change: the comment goes on the related span's changed lines and says where the finding
itself is). A comment carries a suggestion when the finding's fix edits lie inside the
commented lines of the commented file, and the fix is safe (any fix with `--unsafe-fixes`):
a suggestion is committed in one click, so an unsafe one is only named in the comment.
"""

from __future__ import annotations

import os
from pathlib import Path

from cfgfix.core import Applicability, Finding, Span
from cfgfix.fixing import apply_edits
from cfgfix.report.review_comments import MARKER, Comment, Review
from cfgfix.review.gitdiff import ChangedFile

# MARKER, Comment and Review live with the reporters (report/review_comments.py); importable here too.
__all__ = ["MARKER", "Comment", "Review", "apply_suggestion", "place", "real"]


def _last_line(span: Span) -> int:
    # A span ending at column 1 of the next line (a whole-line span) ends on the line before.
    if span.end_line > span.line and span.end_column == 1:
        return span.end_line - 1
    return max(span.line, span.end_line)


def place(findings: list[Finding], changed: dict[str, ChangedFile], to_repo, texts,
          unsafe_fixes: bool = False) -> list[Comment]:
    """`to_repo(display_path)` gives the repository path (or None outside the repo);
    `texts(display_path)` gives a file's current text (or None); `unsafe_fixes`: unsafe
    fixes become suggestions too."""
    comments = []
    for finding in findings:
        comment = _place_primary(finding, changed, to_repo) or _place_related(finding, changed, to_repo)
        if comment is None:
            continue
        _attach_suggestion(comment, texts(comment.span.path), changed[comment.path], unsafe_fixes)
        comments.append(comment)
    comments.sort(key=lambda c: (c.path, c.line, c.start_line, c.finding.code, c.finding.span.column))
    return comments


def _range(span: Span, cf: ChangedFile) -> tuple[int, int] | None:
    first, last = span.line, _last_line(span)
    if not cf.touches(first, last):
        return None
    lines = range(first, last + 1)
    if all(cf.commentable(line) for line in lines):
        return first, last
    # Keep the run of lines GitHub shows around the first changed line in the span.
    anchor = next(line for line in lines if cf.lines is None or line in cf.lines)
    start = anchor
    while start - 1 >= first and cf.commentable(start - 1):
        start -= 1
    end = anchor
    while end + 1 <= last and cf.commentable(end + 1):
        end += 1
    return start, end


def _place_primary(finding, changed, to_repo) -> Comment | None:
    path = to_repo(finding.span.path)
    cf = changed.get(path) if path else None
    if cf is None:
        return None
    found = _range(finding.span, cf)
    if found is None:
        return None
    return Comment(finding, path, found[0], found[1], finding.span)


def _place_related(finding, changed, to_repo) -> Comment | None:
    for related in finding.related:
        path = to_repo(related.span.path)
        cf = changed.get(path) if path else None
        if cf is None:
            continue
        found = _range(related.span, cf)
        if found is None:
            continue
        where = f"{to_repo(finding.span.path) or finding.span.path}:{finding.span.line}"
        note = f"Reported at `{where}` because of this change: {related.message}."
        return Comment(finding, path, found[0], found[1], related.span, related_note=note)
    return None


def _attach_suggestion(comment: Comment, text: str | None, cf: ChangedFile, unsafe_fixes: bool = False) -> None:
    fix = comment.finding.fix
    if fix is None or text is None or not fix.edits:
        return
    if fix.applicability is not Applicability.SAFE and not unsafe_fixes:
        return
    if any(edit.path != comment.span.path for edit in fix.edits):
        return
    starts = _line_starts(text)
    first = min(_line_of(starts, e.start) for e in fix.edits)
    last = max(_line_of(starts, max(e.end - 1, e.start)) for e in fix.edits)
    start_line, end_line = min(first, comment.start_line), max(last, comment.line)
    if (start_line, end_line) != (comment.start_line, comment.line):
        # Widen the comment to the fix's lines only when GitHub shows all of them.
        if not all(cf.commentable(line) for line in range(start_line, end_line + 1)):
            return
    if end_line > len(starts) or (end_line == len(starts) and not text):
        return
    begin = starts[start_line - 1]
    end = starts[end_line] if end_line < len(starts) else len(text)
    if any(e.start < begin or e.end > end for e in fix.edits):
        return
    fixed = apply_edits(text, list(fix.edits))
    block = fixed[begin:end + len(fixed) - len(text)]
    comment.start_line, comment.line = start_line, end_line
    comment.suggestion = block[:-1] if block.endswith("\n") else block
    if comment.suggestion.endswith("\r"):
        comment.suggestion = comment.suggestion[:-1]
    comment.unsafe = fix.applicability is Applicability.UNSAFE


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    if starts[-1] == len(text) and len(starts) > 1:
        starts.pop()  # the text ends in a newline: no empty last line to comment on
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    import bisect

    return bisect.bisect_right(starts, offset)


def apply_suggestion(text: str, comment: Comment) -> str:
    """What GitHub's "Commit suggestion" does: replace the commented lines with the block."""
    lines = text.split("\n")
    trailing = text.endswith("\n")
    if trailing:
        lines = lines[:-1]
    new = [] if comment.suggestion == "" and comment.suggestion is not None else comment.suggestion.split("\n")
    lines[comment.start_line - 1:comment.line] = new
    return "\n".join(lines) + ("\n" if trailing else "")


def real(path: Path | str) -> str:
    return os.path.realpath(path)
