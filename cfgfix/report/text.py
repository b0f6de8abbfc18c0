"""The human format, modelled on ruff's full output: a header line per finding, a code
frame with a caret underline, the fix and related notes, then a one-line summary."""

from __future__ import annotations

import unicodedata
from collections import Counter

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (issue 15)

from cfgfix.core import Finding, Severity, Span
from cfgfix.report import offered_fix, sorted_findings, span_in_cell

if TYPE_CHECKING:
    from cfgfix.report import ReportContext

TAB_WIDTH = 4
MAX_EXTRA_LINES = 3  # lines shown after the first line of a multi-line span

_RESET = "\x1b[0m"
_BOLD, _RED, _YELLOW, _BLUE, _CYAN, _GREEN = "1", "31", "33", "34", "36", "32"
_SEVERITY_COLOR = {Severity.ERROR: _RED, Severity.WARNING: _YELLOW, Severity.INFO: _CYAN}


class Painter:
    """Wraps text in ANSI codes only when colour is on, so plain output stays byte-clean."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str, *codes: str) -> str:
        if not self.enabled or not text:
            return text
        return f"\x1b[{';'.join(codes)}m{text}{_RESET}"


def render(findings: list[Finding], ctx: ReportContext) -> str:
    paint = Painter(ctx.color)
    findings = sorted_findings(findings)
    if ctx.statistics:
        return statistics(findings, ctx, paint)
    blocks = [_finding_block(f, ctx, paint) for f in findings]
    return "\n\n".join(blocks + [summary(findings, ctx, paint)]) + "\n"


def fixable(finding: Finding, ctx: ReportContext) -> bool:
    """`[*]`: `cfgfix fix` applies this finding's fix under the run's fix safety."""
    return offered_fix(finding, ctx.unsafe_fixes) is not None


def fix_marker(finding: Finding, ctx: ReportContext, paint: Painter) -> str:
    return f" {paint('[*]', _CYAN)}" if fixable(finding, ctx) else ""


def location(span: Span, paint: Painter, ctx: ReportContext) -> str:
    colon = paint(":", _CYAN)
    cell, line, column, _, _ = span_in_cell(ctx, span)
    where = f"{colon}cell {cell}" if cell is not None else ""  # ruff's `nb.ipynb:cell 3:2:5`
    return f"{paint(span.path, _BOLD)}{where}{colon}{line}{colon}{column}{colon}"


def _finding_block(finding: Finding, ctx: ReportContext, paint: Painter) -> str:
    color = code_color(finding)
    code = paint(finding.code, _BOLD, color)
    lines = [f"{location(finding.span, paint, ctx)} {code}{fix_marker(finding, ctx, paint)} {finding.message}"]
    source = ctx.sources.get(finding.span.path)
    if source is not None and 1 <= finding.span.line <= len(source.line_starts):
        shift = finding.span.line - span_in_cell(ctx, finding.span)[1]  # a notebook numbers lines per cell
        lines += _frame(source, finding.span, paint, color, shift)
    if ctx.show_fixes and finding.fix is not None:
        lines.append(f"  {paint('help', _BOLD, _CYAN)}: {finding.fix.description}")
    for related in finding.related:
        lines.append(
            f"  {paint('note', _BOLD, _GREEN)}: {location(related.span, paint, ctx)} {related.message}"
        )
    return "\n".join(lines)


def _frame(source, span: Span, paint: Painter, color: str, shift: int = 0) -> list[str]:
    """The span's lines under a number gutter (numbered `shift` lower: per cell in a
    notebook), with carets under the first line (to its end when the span goes on)."""
    last = min(span.end_line, span.line + MAX_EXTRA_LINES, len(source.line_starts))
    numbers = range(span.line, last + 1)
    width = len(str(last - shift))
    pad = " " * width
    bar = paint("|", _BLUE)

    def row(number: int | None, text: str) -> str:
        label = paint(str(number - shift).rjust(width), _BLUE) if number else pad
        return f"{label} {bar} {text}".rstrip()

    first = source.line_text(span.line)
    start = max(span.column - 1, 0)
    stop = span.end_column - 1 if span.end_line == span.line else len(first)
    lead = _display_width(first[:start])
    carets = "^" * max(_display_width(first[start:stop]), 1)  # an empty span still gets one

    out = [
        row(None, ""),
        row(span.line, _expand(first)),
        row(None, " " * lead + paint(carets, _BOLD, color)),
    ]
    out += [row(n, _expand(source.line_text(n))) for n in numbers[1:]]
    if span.end_line > last:
        out.append(f"{pad} {paint(':', _BLUE)}")  # more span lines than we show
    out.append(row(None, ""))
    return out


def _expand(text: str) -> str:
    return text.replace("\t", " " * TAB_WIDTH)


def _display_width(text: str) -> int:
    """Terminal cells: wide East Asian characters take two, combining marks none, tabs four."""
    width = 0
    for char in text:
        if char == "\t":
            width += TAB_WIDTH
        elif unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        elif unicodedata.east_asian_width(char) in ("W", "F"):
            width += 2
        else:
            width += 1
    return width


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith('x') else 's'}"


def code_color(finding: Finding) -> str:
    return _SEVERITY_COLOR.get(finding.severity, _RED)


def summary(findings: list[Finding], ctx: ReportContext, paint: Painter) -> str:
    remaining = len(findings)
    if ctx.fixed:
        total = _plural(remaining + ctx.fixed, "finding")
        line = f"Found {total} ({ctx.fixed} fixed, {remaining} remaining)."
    elif not remaining:
        line = "All checks passed!"
    else:
        count = sum(fixable(f, ctx) for f in findings)
        command = "cfgfix fix --unsafe-fixes" if ctx.unsafe_fixes else "cfgfix fix"
        tail = f" ({count} fixable with {command})" if count else ""
        line = f"Found {_plural(remaining, 'finding')}{tail}."
    lines = [paint(line, _BOLD)]
    if ctx.unsafe_hidden:
        hidden = _plural(ctx.unsafe_hidden, "hidden fix")
        lines.append(f"{hidden} can be enabled with the --unsafe-fixes option.")
    return "\n".join(lines)


def statistics(findings: list[Finding], ctx: ReportContext, paint: Painter) -> str:
    """Like `ruff --statistics`: count, code, fixability and name per rule."""
    if not findings:
        return "All checks passed!\n"
    counts = Counter(f.code for f in findings)
    names = {f.code: f.name for f in findings}
    with_fix = {f.code for f in findings if fixable(f, ctx)}
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    width = max(4, len(str(rows[0][1])))
    code_width = max(len(code) for code in counts)
    lines = [
        f"{str(count).rjust(width)}\t{paint(code.ljust(code_width), _BOLD, _RED)}\t"
        f"{'[*]' if code in with_fix else '[ ]'} {names[code]}"
        for code, count in rows
    ]
    return "\n".join(lines) + "\n"
