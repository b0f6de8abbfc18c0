"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` line per finding,
which the runner turns into annotations on the pull request's diff."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cfgfix.core import Finding, Severity
from cfgfix.report import sorted_findings, span_in_cell

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
        span = finding.span
        cell, line, column, end_line, end_column = span_in_cell(ctx, span)
        props = {
            "file": span.path,
            "line": line,
            "col": column,
            "endLine": end_line,
            "endColumn": end_column,
            "title": f"{finding.code} {finding.name}" + (f" (cell {cell})" if cell is not None else ""),
        }
        joined = ",".join(f"{key}={escape_property(str(value))}" for key, value in props.items())
        lines.append(f"::{_COMMAND[finding.severity]} {joined}::{escape_data(finding.message)}")
    return "".join(line + "\n" for line in lines)
