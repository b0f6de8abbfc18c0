"""Output formats: turn findings into text for people (full or concise), JSON, SARIF or GitHub
annotations.

Formatters only read findings and sources; they never re-run rules or touch files. Each
format lives in its own module and is imported on demand, so `cfgfix check` pays only for
the one it prints.
"""

from __future__ import annotations

from importlib import import_module

from cfgfix.core import Applicability, Edit, Finding, Fix, LazyRegex
from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass
from cfgfix.rules.base import DOCS_URL, Rule

_SURROGATE = LazyRegex("[\ud800-\udfff]")
FORMATS = ("text", "concise", "json", "sarif", "github")
_MODULES = {"text": "text", "concise": "concise", "json": "json_format", "sarif": "sarif", "github": "github"}


@dataclass
class ReportContext:
    """What a report needs besides the findings: sources, rules, display options."""

    sources: dict[str, SourceText]  # display path -> text; a missing path means no code frame
    rules: list[type[Rule]]  # every rule, for SARIF (it describes them all); may be empty for the others
    color: bool = False
    show_fixes: bool = True
    statistics: bool = False
    fixed: int = 0  # findings that `fix` already fixed
    unsafe_hidden: int = 0  # findings an --unsafe-fixes run could fix
    # --unsafe-fixes: unsafe fixes count as available ([*], SARIF `fixes`, rdjson suggestions);
    # without it only safe fixes are offered where a fix is one click away
    unsafe_fixes: bool = False
    tool_version: str = ""


def render(fmt: str, findings: list[Finding], ctx: ReportContext) -> str:
    """The whole report in format `fmt` (one of FORMATS), ending in a newline when non-empty."""
    if fmt not in _MODULES:
        raise ValueError(f"unknown output format {fmt!r}; choose from {', '.join(FORMATS)}")
    module = import_module(f"{__name__}.{_MODULES[fmt]}")
    return module.render(findings, ctx)


def json_text(value) -> str:
    """`value` as indented JSON that any UTF-8 reader accepts: a file name that is not UTF-8
    reaches us with its bytes as lone surrogates (U+DC80-U+DCFF), which no UTF-8 stream can
    write, so they are written as `\\udcXX` escapes (Python's json.loads gives the name back)."""
    import json

    text = json.dumps(value, indent=2, ensure_ascii=False)
    if not text.isascii():
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text + "\n"


# -- helpers shared by the formats ---------------------------------------------------------
def sorted_findings(findings: list[Finding]) -> list[Finding]:
    # Every format sorts the same way, so reruns and formats agree line for line.
    return sorted(findings, key=Finding.sort_key)


def offered_fix(finding: Finding, unsafe_fixes: bool) -> Fix | None:
    """The finding's fix when the run's fix safety allows it (safe, or any with
    --unsafe-fixes), else None: what a `[*]`, a SARIF fix or a one-click suggestion offers."""
    fix = finding.fix
    if fix is None or (fix.applicability is not Applicability.SAFE and not unsafe_fixes):
        return None
    return fix


def rule_url(ctx: ReportContext, code: str) -> str:
    for rule in ctx.rules:
        if rule.code == code:
            return rule.url()
    return DOCS_URL.format(code=code)


def edit_region(ctx: ReportContext, edit: Edit, stored: bool = False) -> tuple[int, int, int, int] | None:
    """1-based (line, column, end line, end column) of an edit, or None when its file's
    text is unknown (offsets alone cannot be turned into lines). In a notebook the lines
    count from the start of the edit's cell, as ruff reports them; with `stored`, the edit
    is one of `stored_finding`'s (offsets into the .ipynb file's text) and so are the lines."""
    source = ctx.sources.get(edit.path)
    if source is None:
        return None
    if stored and getattr(source, "notebook", None) is not None:
        file = source.notebook.file
        return (*file.position(edit.start), *file.position(edit.end))
    line, column = source.position(edit.start)
    end_line, end_column = source.position(edit.end)
    _, line, column, end_line, end_column = in_cell(ctx, edit.path, line, column, end_line, end_column)
    return line, column, end_line, end_column


def in_cell(ctx: ReportContext, path: str, line: int, column: int, end_line: int, end_column: int):
    """(cell, line, column, end line, end column): for a notebook, the 1-based cell (among all
    cells) and positions inside that cell; for any other file (None, the same positions)."""
    source = ctx.sources.get(path)
    if not hasattr(source, "cell_position"):  # not a NotebookSource (whose module stays unloaded)
        return None, line, column, end_line, end_column
    cell, line_in_cell, column = source.cell_position(line, column)
    return cell, line_in_cell, column, end_line - line + line_in_cell, end_column


def span_in_cell(ctx: ReportContext, span):
    return in_cell(ctx, span.path, span.line, span.column, span.end_line, span.end_column)


def stored_finding(ctx: ReportContext, finding: Finding) -> Finding:
    return stored_in(ctx.sources, finding)


def stored_sources(sources: dict) -> dict:
    """`sources` with each notebook's joined cells replaced by the .ipynb file's own text:
    the text that `stored_in`'s positions and edits point into."""
    return {path: (source.notebook.file if getattr(source, "notebook", None) is not None else source)
            for path, source in sources.items()}


def stored_in(sources: dict, finding: Finding) -> Finding:
    """`finding` in the positions of the file as stored, which is what SARIF viewers, GitHub
    annotations and review comments address: for a notebook, the lines and columns of its
    JSON (`NotebookSource.file_finding`), its fix as one edit of that JSON. A notebook
    finding whose cell cannot be mapped points at the start of its cell's `source`, without
    related spans or fix: the right cell, never a wrong line. Other files: unchanged."""
    source = sources.get(finding.path)
    if getattr(source, "notebook", None) is None:
        return finding
    mapped = source.file_finding(finding)
    if mapped is not None:
        return mapped
    from cfgfix.core import Span
    from cfgfix.records import replace

    span = source.cell_span(finding.span.line) or Span(finding.path, 1, 1, 1, 1)
    return replace(finding, span=span, related=(), fix=None)
