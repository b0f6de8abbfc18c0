"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` line per finding,
which the runner turns into annotations on the pull request's diff.

GitHub anchors an annotation to a line of the file as stored; for a notebook that is a line
of its JSON (shown in the source diff and the file's plain view), so a notebook finding is
placed on the JSON line that holds its code, and its title says `cell N:line:column`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cfgfix.core import Finding, Severity
from cfgfix.report import sorted_findings, span_in_cell, stored_finding

if TYPE_CHECKING:
    from cfgfix.report import ReportContext

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    # The runner's own escaping (actions/toolkit `escapeData`): `%` first, so it is not doubled.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    # Property values also end at `,` (next property) and `:` (the `::` before the message).
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(findings: list[Finding], ctx: ReportContext) -> str:
    lines = []
    for finding in sorted_findings(findings):
        span = stored_finding(ctx, finding).span  # a notebook: the line of its JSON that holds the code
        cell, line, column, _, _ = span_in_cell(ctx, finding.span)
        props = {
            "file": span.path,
            "line": span.line,
            "col": span.column,
            "endLine": span.end_line,
            "endColumn": span.end_column,
            "title": f"{finding.code} {finding.name}" + (f" (cell {cell}:{line}:{column})" if cell is not None else ""),
        }
        joined = ",".join(f"{key}={escape_property(str(value))}" for key, value in props.items())
        lines.append(f"::{_COMMAND[finding.severity]} {joined}::{escape_data(finding.message)}")
    return "".join(line + "\n" for line in lines)
