"""reviewdog's Diagnostic Format as JSON (rdjson): `{source, severity, diagnostics[]}`, each
diagnostic with a message, a location (path, range of 1-based lines and UTF-8 byte columns,
end exclusive), a severity, a code with its rule page, and the fix as suggestions: reviewdog
offers those as one-click changes, so they carry safe fixes only unless `--unsafe-fixes`.

`render` (findings, as `check` sees them) puts each diagnostic on its finding's span;
`render_review` puts it where the review comments (a related changed line for a cross-file
finding), so reviewdog's diff filter keeps it."""

from __future__ import annotations

import json

from cfgfix.core import Finding, Severity, Span
from cfgfix.report import offered_fix, sorted_findings, stored_in, stored_sources
from cfgfix.rules.base import DOCS_URL

SOURCE = {"name": "cfgfix", "url": "https://github.com/cfgfix/cfgfix"}
_SEVERITY = {Severity.ERROR: "ERROR", Severity.WARNING: "WARNING", Severity.INFO: "INFO"}


def _byte_column(text: str | None, starts, line: int, column: int) -> int:
    if text is None or starts is None or line > len(starts):
        return column
    begin = starts[line - 1]
    return len(text[begin:begin + column - 1].encode("utf-8")) + 1


def _position(sources, path: str, line: int, column: int) -> dict:
    source = sources.get(path)
    text = source.text if source is not None else None
    starts = source.line_starts if source is not None else None
    return {"line": line, "column": _byte_column(text, starts, line, column)}


def _range(sources, span: Span) -> dict:
    return {
        "start": _position(sources, span.path, span.line, span.column),
        "end": _position(sources, span.path, span.end_line, span.end_column),
    }


def diagnostic(finding: Finding, sources, rules, where: Span | None = None, note: str | None = None, path_of=None,
               unsafe_fixes: bool = False) -> dict:
    where = where or finding.span
    path_of = path_of or (lambda p: p)
    url = next((r.url() for r in rules if r.code == finding.code), DOCS_URL.format(code=finding.code))
    message = finding.message + (f"\n\n{note}" if note else "")
    entry = {
        "message": message,
        "location": {"path": path_of(where.path), "range": _range(sources, where)},
        "severity": _SEVERITY[finding.severity],
        "code": {"value": finding.code, "url": url},
    }
    fix = offered_fix(finding, unsafe_fixes)
    if fix is not None and all(e.path == where.path for e in fix.edits) and where.path in sources:
        source = sources[where.path]
        suggestions = []
        for edit in fix.edits:
            span = source.span(edit.start, edit.end)
            suggestions.append({"range": _range(sources, span), "text": edit.content})
        entry["suggestions"] = suggestions
    related = [r for r in finding.related if r.span != where]
    if where != finding.span:
        related.insert(0, None)
    locations = []
    for r in related:
        span, text = (finding.span, "the finding") if r is None else (r.span, r.message)
        locations.append({"message": text, "location": {"path": path_of(span.path), "range": _range(sources, span)}})
    if locations:
        entry["related_locations"] = locations
    return entry


def document(diagnostics: list[dict]) -> dict:
    return {"source": SOURCE, "diagnostics": diagnostics}


def render(findings: list[Finding], ctx) -> str:
    # reviewdog filters and places diagnostics by lines of the files as stored: a notebook's
    # findings go on the lines of its JSON that hold their code
    sources = stored_sources(ctx.sources)
    diagnostics = [diagnostic(stored_in(ctx.sources, f), sources, ctx.rules, unsafe_fixes=ctx.unsafe_fixes)
                   for f in sorted_findings(findings)]
    return json.dumps(document(diagnostics), indent=2) + "\n"


def render_review(review, rules, unsafe_fixes: bool = False) -> str:
    from cfgfix.documents.text import SourceText

    sources = stored_sources(review.sources)  # the review's findings are in stored positions
    diagnostics = []
    for comment in review.comments:
        path = comment.span.path
        if path not in sources:
            try:
                with open(path, "rb") as handle:
                    sources[path] = SourceText.from_bytes(path, handle.read())
            except (OSError, ValueError):
                pass
        mapping = {path: comment.path}
        diagnostics.append(
            diagnostic(comment.finding, sources, rules, comment.span, comment.related_note,
                       path_of=lambda p, m=mapping: m.get(p, p), unsafe_fixes=unsafe_fixes)
        )
    return json.dumps(document(diagnostics), indent=2) + "\n"
