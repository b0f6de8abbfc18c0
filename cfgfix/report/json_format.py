"""Machine-readable JSON, shaped like ruff's `--output-format json` so the same scripts and
editor integrations can read it; cfgfix adds `name`, `severity` and `related`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cfgfix.core import Finding, Span
from cfgfix.report import edit_region, json_text, rule_url, sorted_findings, span_in_cell

if TYPE_CHECKING:
    from cfgfix.report import ReportContext


def render(findings: list[Finding], ctx: ReportContext) -> str:
    items = [_finding(f, ctx) for f in sorted_findings(findings)]
    return json_text(items)


def _point(line: int, column: int) -> dict:
    return {"row": line, "column": column}


def _span_fields(span: Span, ctx: ReportContext, always_cell: bool = True) -> dict:
    # Like ruff: `cell` is the notebook cell (1-based, among all cells) and the rows count
    # from that cell's first line; null for every other file (related spans leave it out).
    cell, line, column, end_line, end_column = span_in_cell(ctx, span)
    return {
        **({"cell": cell} if always_cell or cell is not None else {}),
        "filename": span.path,
        "location": _point(line, column),
        "end_location": _point(end_line, end_column),
    }


def _finding(finding: Finding, ctx: ReportContext) -> dict:
    fix = None
    if finding.fix is not None:
        edits = []
        for edit in sorted(finding.fix.edits, key=lambda e: (e.path, e.start, e.end)):
            region = edit_region(ctx, edit)  # None when the edited file's text is unknown
            edits.append(
                {
                    "filename": edit.path,  # a fix may edit another file than the finding's
                    "content": edit.content,
                    "location": _point(*region[:2]) if region else None,
                    "end_location": _point(*region[2:]) if region else None,
                }
            )
        fix = {
            "applicability": finding.fix.applicability.value,
            "message": finding.fix.description,
            "edits": edits,
        }
    return {
        "code": finding.code,
        "name": finding.name,
        "message": finding.message,
        "severity": finding.severity.value,
        **_span_fields(finding.span, ctx),
        "fix": fix,
        "url": rule_url(ctx, finding.code),
        "related": [{**_span_fields(r.span, ctx, False), "message": r.message} for r in finding.related],
    }
