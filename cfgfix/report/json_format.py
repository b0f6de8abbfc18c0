"""Machine-readable JSON, shaped like ruff's `--output-format json` so the same scripts and
editor integrations can read it; cfgfix adds `name`, `severity` and `related`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from cfgfix.core import Finding, Span
from cfgfix.report import edit_region, rule_url, sorted_findings

if TYPE_CHECKING:
    from cfgfix.report import ReportContext


def render(findings: list[Finding], ctx: ReportContext) -> str:
    items = [_finding(f, ctx) for f in sorted_findings(findings)]
    return json.dumps(items, indent=2, ensure_ascii=False) + "\n"


def _point(line: int, column: int) -> dict:
    return {"row": line, "column": column}


def _span_fields(span: Span) -> dict:
    return {
        "filename": span.path,
        "location": _point(span.line, span.column),
        "end_location": _point(span.end_line, span.end_column),
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
        **_span_fields(finding.span),
        "fix": fix,
        "url": rule_url(ctx, finding.code),
        "related": [{**_span_fields(r.span), "message": r.message} for r in finding.related],
    }
