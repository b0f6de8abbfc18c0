"""`# cfgfix: ignore[CFX103]` comments: on the reported line, or `ignore-file` at the top.

The same comment syntax works in Python, shell, YAML, Dockerfiles and Makefiles (all use
`#`). A directive is recognised only inside a comment: after a `#` that is not part of
a quoted string on that line (good enough for a marker this specific)."""

from __future__ import annotations

from cfgfix.core import Edit, Finding, LazyRegex, Span
from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass, field

_DIRECTIVE = LazyRegex(r"#\s*cfgfix:\s*(ignore-file|ignore)\b(?:\[([A-Za-z0-9,\s]*)\])?")
ALL = None  # a directive without a code list covers every code


@dataclass
class Directive:
    """One `# cfgfix: ignore[...]` (or `ignore-file`) comment: the lines and codes it silences."""

    line: int
    codes: frozenset[str] | None  # None = all
    span: Span  # the comment itself, for CFX902 and its fix
    file_level: bool
    used: set[str] = field(default_factory=set)


def parse_directives(source: SourceText) -> list[Directive]:
    directives = []
    in_header = True
    for number in range(1, len(source.line_starts) + 1):
        line = source.line_text(number)
        stripped = line.strip()
        if in_header and stripped and not stripped.startswith("#"):
            in_header = False
        for match in _DIRECTIVE.finditer(line):
            if _inside_quotes(line, match.start()):
                continue
            codes = None
            if match.group(2) is not None:
                codes = frozenset(c.strip().upper() for c in match.group(2).split(",") if c.strip())
            file_level = match.group(1) == "ignore-file"
            if file_level and not in_header:
                continue  # ignore-file only counts in the leading comment block
            start = source.line_starts[number - 1] + match.start()
            directives.append(
                Directive(number, codes, source.span(start, start + len(match.group(0))), file_level)
            )
    return directives


def _inside_quotes(line: str, index: int) -> bool:
    before = line[:index]
    return before.count('"') % 2 == 1 or before.count("'") % 2 == 1


def is_suppressed(finding: Finding, directives: list[Directive]) -> bool:
    for directive in directives:
        if directive.file_level or directive.line == finding.span.line:
            if directive.codes is None or finding.code in directive.codes:
                directive.used.add(finding.code)
                return True
    return False


def removal_edit(source: SourceText, directive: Directive) -> Edit:
    """Remove the comment and the spaces before it (the whole line when it is only that)."""
    line_start = source.line_starts[directive.line - 1]
    line = source.line_text(directive.line)
    col = directive.span.start - line_start
    if not line[:col].strip():
        end = source.line_starts[directive.line] if directive.line < len(source.line_starts) else len(source.text)
        return Edit(source.path, line_start, end, "")
    start = line_start + len(line[:col].rstrip())
    return Edit(source.path, start, directive.span.end, "")
