"""The concise human format, like ruff's `--output-format concise`: one line per finding,
`path:line:col: CODE [*] message` (`[*]` when `cfgfix fix` applies its fix under the run's
fix safety; a notebook says `nb.ipynb:cell 3:2:5:`), then the same summary as the full
format. No code frame, no help or notes: related places stay in the full, JSON and SARIF
output."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (issue 15)

from cfgfix.core import Finding
from cfgfix.report import sorted_findings
from cfgfix.report.text import Painter, code_color, fix_marker, location, statistics, summary

if TYPE_CHECKING:
    from cfgfix.report import ReportContext

_BOLD = "1"


def render(findings: list[Finding], ctx: ReportContext) -> str:
    paint = Painter(ctx.color)
    findings = sorted_findings(findings)
    if ctx.statistics:
        return statistics(findings, ctx, paint)
    lines = [
        f"{location(f.span, paint, ctx)} {paint(f.code, _BOLD, code_color(f))}{fix_marker(f, ctx, paint)} "
        f"{_one_line(f.message)}"
        for f in findings
    ]
    return "\n".join(lines + [summary(findings, ctx, paint)]) + "\n"


def _one_line(message: str) -> str:
    # a message never holds a line break today; one that did would break "one line per finding"
    return " ".join(message.split("\n"))
