"""Jupyter notebooks as one Python document, and fixes written back into their cells.

The code cells are joined into one text (a newline added after a cell that lacks one), the
way the kernel runs them top to bottom, so every rule sees a notebook exactly as it sees its
flattened `.py` twin. IPython syntax that `ast` rejects (`!pip install ...`, `%matplotlib`,
`x = !ls`, `obj?`, cell magics) is masked *with the same length*: the escape becomes `0`, the
rest a comment (`!pip install x` -> `0#ip install x`), so every offset, line and column of
the masked text is the offset, line and column of the original; a cell whose cell magic
makes it another language (`%%bash`, `%%writefile`) is commented out whole.

Positions are reported the way ruff reports them: `nb.ipynb:cell 3:2:5`, with the 1-based
index of the cell among all cells (markdown cells count, as Jupyter numbers them).

Fixes are edits on the joined text. Each edit must fall inside one cell; the edited cells'
`source` values are re-rendered in the style the file already uses (a list of one JSON
string per line, or one string; the element indentation; `\\u` escapes or raw UTF-8), and
everything else in the JSON (outputs, metadata, key order, indentation, the final newline)
is kept byte for byte. nbformat was measured and not used: importing it costs ~104 ms, and
`nbformat.writes` re-indents the file and adds cell ids, so it cannot keep the bytes.
"""

from __future__ import annotations

import json
import re

from cfgfix.core import Edit
from cfgfix.documents.text import DecodeError, SourceText
from cfgfix.records import dataclass, field

# Cell magics whose body is still Python run by the kernel (IPython's own list of the ones
# that execute their cell); any other cell magic (%%bash, %%writefile, %%html) makes the
# cell another language.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "pypy", "python", "python3", "memit"})

# An escape at the start of a statement line: `!cmd`, `%magic`, `%%magic`, `??obj`, `?obj`.
_LINE_ESCAPE = re.compile(r"^([ \t]*)([!%?]|\?\?|(?=(?:pip3?|conda|mamba)[ \t]+(?:install|uninstall)\b))")
# (the last: IPython's automagic runs `pip install x` as `%pip install x`)
# `x = !ls` / `files = %sx ls`: the value is a shell or magic command.
_ASSIGN_ESCAPE = re.compile(r"^([ \t]*[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*)([!%])")
# `obj?` / `obj.method??`: IPython help.
_HELP_SUFFIX = re.compile(r"^[ \t]*[A-Za-z_][\w.]*\?\??[ \t]*$")


class NotebookError(ValueError):
    """The file is not a notebook we can read."""


@dataclass(frozen=True)
class Cell:
    index: int  # 0-based among all cells of the notebook
    start: int  # offset of the cell's first character in the joined text
    text: str  # the cell's source as the notebook holds it


@dataclass
class Notebook:
    file: SourceText  # the .ipynb as decoded text (JSON)
    cells: list[Cell]  # code cells, in order
    code: str  # the code cells joined: what the kernel runs
    masked: str  # `code` with IPython syntax masked (same length, same lines)
    language: str  # the kernel's language ("python" when unsaid)
    # cells that are not Python even masked (a fragment, a cell IPython dedents, a shell
    # alias): (cell index, the syntax error, its line in the cell); they are commented out
    # in `masked` so the other cells are still read, as Jupyter runs each cell on its own
    left_out: list = field(default_factory=list)

    @classmethod
    def from_bytes(cls, path: str, data: bytes) -> Notebook:
        try:
            file = SourceText.from_bytes(path, data)
        except DecodeError as exc:
            raise NotebookError(str(exc)) from None
        return cls.from_text(file)

    @classmethod
    def from_text(cls, file: SourceText) -> Notebook:
        try:
            data = json.loads(file.text)
        except (ValueError, RecursionError) as exc:
            raise NotebookError(f"not a notebook: invalid JSON ({exc})") from None
        raw_cells = data.get("cells") if isinstance(data, dict) else None
        if not isinstance(raw_cells, list):
            raise NotebookError("not a notebook: no \"cells\" list (nbformat 4 is read; nbformat 3 is not)")
        metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        language = _language(metadata)
        cells: list[Cell] = []
        parts: list[str] = []
        offset = 0
        for index, cell in enumerate(raw_cells):
            if not isinstance(cell, dict) or cell.get("cell_type") != "code":
                continue
            text = _joined(cell.get("source", ""))
            cells.append(Cell(index, offset, text))
            parts.append(text)
            offset += len(text)
            if not text.endswith("\n"):
                parts.append("\n")  # the next cell starts on its own line
                offset += 1
        code = "".join(parts)
        masked, left_out = _leave_out_broken_cells(mask(code, cells), cells)
        return cls(file, cells, code, masked, language, left_out)

    # -- positions ------------------------------------------------------------------------
    def python_source(self, masked: bool = True) -> NotebookSource:
        return NotebookSource(self.file.path, self.masked if masked else self.code, cells=self.cells, notebook=self)

    def cell_at(self, offset: int) -> Cell | None:
        """The cell holding `offset` of the joined text (its end counts as inside)."""
        found = None
        for cell in self.cells:
            if cell.start > offset:
                break
            found = cell
        return found

    # -- versions -------------------------------------------------------------------------
    def install_lines(self) -> list[str]:
        """The requirement arguments of the cells' `%pip install` / `!pip install` lines."""
        from cfgfix.documents.installs import pip_install_requirements

        lines = [line for line in self.code.splitlines() if line.lstrip()[:1] in ("!", "%")]
        return pip_install_requirements("\n".join(lines))

    # -- fixes ----------------------------------------------------------------------------
    def apply(self, edits) -> str:
        """The notebook file's text with `edits` (offsets into the joined code) applied inside
        their cells. Raises NotebookError for an edit that crosses a cell boundary."""
        by_cell: dict[int, list[Edit]] = {}
        for edit in edits:
            cell = self.cell_at(edit.start)
            if cell is None or edit.end > cell.start + len(cell.text):
                raise NotebookError("a fix spans two cells")
            by_cell.setdefault(cell.index, []).append(edit)
        if not by_cell:
            return self.file.text
        nodes = _source_nodes(self.file)
        replacements = []
        for cell in self.cells:
            if cell.index not in by_cell:
                continue
            text = cell.text
            for edit in sorted(by_cell[cell.index], key=lambda e: (e.start, e.end), reverse=True):
                start, end = edit.start - cell.start, edit.end - cell.start
                text = text[:start] + unmask(edit.content, self) + text[end:]
            node = nodes.get(cell.index)
            if node is None:
                raise NotebookError(f"cell {cell.index + 1} has no source to edit")
            replacements.append((node.start, node.end, _render_source(self.file, node, text)))
        out = self.file.text
        for start, end, new in sorted(replacements, reverse=True):
            out = out[:start] + new + out[end:]
        return out


class NotebookSource(SourceText):
    """The joined code of a notebook, with the cells that hold each line, so reports can say
    `cell 3:2:5` and suppression comments and code frames read the cells' own lines."""

    def __init__(self, path: str, text: str, cells: list[Cell], notebook: Notebook | None = None):
        super().__init__(path, text)
        self.cells = cells
        self._cell_lines = [(self.position(c.start)[0], c) for c in cells]
        self.notebook = notebook  # the file itself, for positions in its JSON (file_span)
        self._file_offsets: dict[int, list[int]] | None = None

    # -- the .ipynb file's own positions ----------------------------------------------------
    def file_offset(self, offset: int) -> int | None:
        """The offset in the .ipynb file's text of the joined code's `offset`: the character
        inside the JSON string that holds it (escapes decoded), or None when the file is
        unknown or its cell cannot be mapped. SARIF viewers, GitHub annotations and review
        comments address the file as it is stored, whose lines are JSON lines."""
        if self.notebook is None:
            return None
        if self._file_offsets is None:
            self._file_offsets = _cell_file_offsets(self.notebook)
        cell = self.notebook.cell_at(offset)
        offsets = self._file_offsets.get(cell.index) if cell is not None else None
        if offsets is None:
            return None
        at = offset - cell.start
        if at >= len(offsets):
            return None  # the newline the join added after a cell without one: not in the file
        return offsets[at]

    def file_span(self, span):
        """`span` (joined-code positions) as a span of the .ipynb file, or None when a cell
        cannot be mapped. An end on the join's added newline maps to the end of the cell's
        last string."""
        if not (1 <= span.line <= len(self.line_starts) and 1 <= span.end_line <= len(self.line_starts)):
            return None
        # From lines and columns (a cached finding's span keeps them; they are the truth).
        begin, finish = self.offset(span.line, span.column - 1), self.offset(span.end_line, span.end_column - 1)
        start = self.file_offset(begin)
        end = self.file_offset(finish) if finish > begin else start
        if end is None and finish > begin:
            last = self.file_offset(finish - 1)
            end = None if last is None else last + 1
        if start is None or end is None or end < start:
            return None
        return self.notebook.file.span(start, end)

    def cell_span(self, line: int):
        """The `source` value of the cell holding the joined `line`, as a span of the file:
        where a position that cannot be mapped still points (the right cell, never a wrong
        line)."""
        if self.notebook is None:
            return None
        cell = self.notebook.cell_at(self.offset(line, 0)) if 1 <= line <= len(self.line_starts) else None
        try:
            node = _source_nodes(self.notebook.file).get(cell.index) if cell is not None else None
        except NotebookError:
            return None
        return None if node is None else self.notebook.file.span(node.start, node.start)

    def file_edit(self, edits) -> Edit | None:
        """`edits` (offsets into the joined code) as one edit of the .ipynb file's text: the
        smallest stretch of JSON that applying them into their cells changes. None when they
        cannot be applied (an edit across two cells)."""
        try:
            new = self.notebook.apply(edits) if self.notebook is not None else None
        except NotebookError:
            return None
        if new is None:
            return None
        old = self.notebook.file.text
        start = 0
        limit = min(len(old), len(new))
        while start < limit and old[start] == new[start]:
            start += 1
        end_old, end_new = len(old), len(new)
        while end_old > start and end_new > start and old[end_old - 1] == new[end_new - 1]:
            end_old -= 1
            end_new -= 1
        return Edit(self.path, start, end_old, new[start:end_new])

    def file_finding(self, finding):
        """`finding` with its spans in the .ipynb file's own positions (related spans in this
        notebook that cannot be mapped are dropped) and its fix as one edit of the file's
        JSON; None when its own span cannot be mapped."""
        from cfgfix.records import replace

        span = self.file_span(finding.span)
        if span is None:
            return None
        related = []
        for item in finding.related:
            if item.span.path != self.path:
                related.append(item)
                continue
            mapped = self.file_span(item.span)
            if mapped is not None:
                related.append(replace(item, span=mapped))
        fix = finding.fix
        if fix is not None:
            own = [e for e in fix.edits if e.path == self.path]
            edit = self.file_edit(own) if own else None
            others = tuple(e for e in fix.edits if e.path != self.path)
            fix = replace(fix, edits=(*others, edit)) if edit is not None or not own else None
            if fix is not None and not fix.edits:
                fix = None
        return replace(finding, span=span, related=tuple(related), fix=fix)

    def cell_position(self, line: int, column: int) -> tuple[int, int, int]:
        """(1-based cell number among all cells, line in the cell, column) of a joined line."""
        found = None
        for first, cell in self._cell_lines:
            if first > line:
                break
            found = (first, cell)
        if found is None:
            return 1, line, column
        first, cell = found
        return cell.index + 1, line - first + 1, column


def _cell_file_offsets(notebook: Notebook) -> dict[int, list[int]]:
    """Cell index -> the file offset of each character of the cell's text, plus one entry for
    the position just past its last character (the closing quote of its last string). A
    cell whose strings do not decode to its text exactly is left out (no position at all
    rather than a wrong one)."""
    try:
        nodes = _source_nodes(notebook.file)
    except NotebookError:
        return {}
    text = notebook.file.text
    out: dict[int, list[int]] = {}
    for cell in notebook.cells:
        node = nodes.get(cell.index)
        if node is None:
            continue
        literals = node.children if node.kind == "sequence" else [node]
        offsets: list[int] = []
        decoded: list[str] = []
        end = None
        for literal in literals:
            if literal.kind != "scalar" or not isinstance(literal.value, str):
                continue
            raw_start, raw_end = literal.start + 1, literal.end - 1  # inside the quotes
            if text[literal.start:literal.start + 1] != '"' or text[raw_end:literal.end] != '"':
                offsets = []
                break
            i = raw_start
            while i < raw_end:
                char = text[i]
                if char != "\\":
                    offsets.append(i)
                    decoded.append(char)
                    i += 1
                    continue
                if text[i + 1:i + 2] == "u":
                    code = text[i + 2:i + 6]
                    width = 6
                    if 0xD800 <= int(code, 16) <= 0xDBFF and text[i + 6:i + 8] == "\\u":
                        width = 12  # a surrogate pair: one character of Python text
                    offsets.append(i)
                    decoded.append(json.loads('"' + text[i:i + width] + '"'))
                    i += width
                else:
                    offsets.append(i)
                    decoded.append(json.loads('"' + text[i:i + 2] + '"'))
                    i += 2
            end = raw_end
        if end is None or "".join(decoded) != cell.text:
            continue
        offsets.append(end)
        out[cell.index] = offsets
    return out


# -------------------------------------------------------------------------- the cells' text


def _joined(source) -> str:
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _language(metadata: dict) -> str:
    info = metadata.get("language_info")
    if isinstance(info, dict) and isinstance(info.get("name"), str):
        return info["name"].lower()
    spec = metadata.get("kernelspec")
    if isinstance(spec, dict) and isinstance(spec.get("language"), str):
        return spec["language"].lower()
    return "python"


def mask(code: str, cells: list[Cell]) -> str:
    """`code` with IPython syntax replaced by Python of the same length (see the module doc)."""
    out = list(code)
    for cell in cells:
        lines = cell.text.splitlines(keepends=True)
        offset = cell.start
        first = lines[0].lstrip() if lines else ""
        if first.startswith("%%"):
            magic = first[2:].split(None, 1)[0] if first[2:].strip() else ""
            if magic not in PYTHON_CELL_MAGICS:  # another language: the whole cell is a comment
                for line in lines:
                    _comment_out(out, offset, line)
                    offset += len(line)
                continue
        continued = False
        state = _LineState()
        for line in lines:
            body = line.rstrip("\r\n")
            if continued:  # the continuation of a masked magic: a comment too
                _comment_out(out, offset, line)
                continued = body.endswith("\\")
            elif not state.at_statement():  # inside brackets or a string: `% b` is Python
                state.feed(body)
            else:
                match = _LINE_ESCAPE.match(body) or _ASSIGN_ESCAPE.match(body)
                if match:
                    at = offset + len(match.group(1))
                    out[at] = "0"
                    if len(body) > len(match.group(1)) + 1:
                        out[at + 1] = "#"
                    continued = body.endswith("\\")
                elif _HELP_SUFFIX.match(body):
                    _comment_out(out, offset, line)
                else:
                    state.feed(body)
            offset += len(line)
    return "".join(out)


class _LineState:
    """Whether the next line starts a statement: no bracket, string or backslash left open
    by the lines before (a rough scan: quotes, brackets and comments, which is all it needs)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the open triple quote, if any
        self.backslash = False

    def at_statement(self) -> bool:
        return self.depth == 0 and not self.quote and not self.backslash

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            if self.quote:
                end = line.find(self.quote, i)
                if end < 0:
                    break
                i, self.quote = end + 3, ""
                continue
            char = line[i]
            if char == "#":
                break
            if char in "\"'":
                if line.startswith(char * 3, i):
                    self.quote = char * 3
                    i += 3
                    continue
                i += 1
                while i < n and line[i] != char:
                    i += 2 if line[i] == "\\" else 1
            elif char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        self.backslash = line.endswith("\\") and not self.quote


def _leave_out_broken_cells(masked: str, cells: list[Cell]) -> tuple[str, list]:
    """`masked` with every cell that does not parse commented out (equal length), one at a
    time from the first error, and the cells left out."""
    from cfgfix.documents.python import parse_python

    left_out: list = []
    for _ in range(len(cells)):
        try:
            parse_python(masked)
            break
        except SyntaxError as exc:
            starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", masked)]
            line = min(max(exc.lineno or 1, 1), len(starts))
            offset = starts[line - 1]
            cell = None
            for candidate in cells:
                if candidate.start <= offset:
                    cell = candidate
            if cell is None or any(index == cell.index for index, _, _ in left_out):
                break  # not inside a cell we can leave out: the notebook stays unparsable
            out = list(masked)
            at = cell.start
            for text in cell.text.splitlines(keepends=True):
                _comment_out(out, at, text)
                at += len(text)
            masked = "".join(out)
            first_line = masked.count("\n", 0, cell.start) + 1
            left_out.append((cell.index, exc.msg, line - first_line + 1))
        except (ValueError, RecursionError, MemoryError):
            break
    return masked, left_out


def _comment_out(out: list[str], offset: int, line: str) -> None:
    body = line.rstrip("\r\n")
    stripped = len(body) - len(body.lstrip(" \t"))
    if stripped < len(body):
        out[offset + stripped] = "#"


def unmask(content: str, notebook: Notebook) -> str:
    """An edit's text built from the masked code (a block re-indented around a `!pip` line)
    with the masked lines put back as the cells hold them."""
    if notebook.masked == notebook.code or content in ("", "\n"):
        return content
    originals = {}
    for m_line, o_line in zip(notebook.masked.splitlines(), notebook.code.splitlines()):
        if m_line != o_line:
            originals[m_line.strip()] = o_line.strip()
    for masked, original in originals.items():
        if masked and masked in content:
            content = content.replace(masked, original)
    return content


# ---------------------------------------------------------------------- writing cells back


def _source_nodes(file: SourceText) -> dict:
    """Cell index -> the `source` value node of that cell, with its span in the file."""
    from cfgfix.documents.config import ConfigError, parse_config

    try:
        root = parse_config(file, "json").root
    except ConfigError as exc:
        raise NotebookError(exc.message) from None
    cells = root.get("cells") if root is not None and root.kind == "mapping" else None
    nodes = {}
    for index, cell in enumerate(cells.children if cells is not None else ()):
        if cell.kind == "mapping":
            source = cell.get("source")
            if source is not None:
                nodes[index] = source
    return nodes


def _render_source(file: SourceText, node, text: str) -> str:
    """`text` as a cell `source` value in the style of the one it replaces."""
    original = file.text[node.start:node.end]
    ascii_only = "\\u" in original  # the writer escaped non-ASCII text: keep doing so
    if node.kind == "scalar":
        return json.dumps(text, ensure_ascii=ascii_only)
    lines = text.splitlines(keepends=True)
    if not lines:
        return "[]"
    if node.children:
        first = node.children[0]
        line_start = file.text.rfind("\n", 0, first.start) + 1
        indent = file.text[line_start:first.start]
        if indent.strip():  # the items share a line with the bracket: `["a\n", "b"]`
            return "[" + ", ".join(json.dumps(s, ensure_ascii=ascii_only) for s in lines) + "]"
        close_start = file.text.rfind("\n", 0, node.end - 1) + 1
        close_indent = file.text[close_start:node.end - 1]
        newline = file.newline
        items = ("," + newline).join(indent + json.dumps(s, ensure_ascii=ascii_only) for s in lines)
        if close_indent.strip():  # `]` right after the last item
            return "[" + newline + items + "]"
        return "[" + newline + items + newline + close_indent + "]"
    return "[" + ", ".join(json.dumps(s, ensure_ascii=ascii_only) for s in lines) + "]"
