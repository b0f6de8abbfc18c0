"""Decoding a file once and mapping between (line, column) and text offsets.

Every document kind sits on a `SourceText`: it keeps the BOM and the line-ending style so
the fixer can write the file back exactly as it found it, and it converts the UTF-8 byte
columns that `ast` reports into character offsets that edits use.
"""

from __future__ import annotations

import bisect
import codecs
import re

from cfgfix.core import LazyRegex, Span
from cfgfix.records import dataclass, field

_NEWLINE = LazyRegex(r"\r\n|\r|\n")


_LONE_CR = LazyRegex(rb"\r(?!\n)")


def lone_cr_as_lf(data: bytes) -> bytes:
    """`data` with every lone CR (classic Mac line endings) made LF, so that every reader
    and rule sees the same lines whatever the line ending. One byte for one byte: offsets,
    lines and columns stay those of the file as written (the fixer writes CRs back)."""
    return _LONE_CR.sub(b"\n", data) if b"\r" in data else data


def file_newline_edit(content: str, data: bytes) -> str:
    """An edit's text (written with LF, as the engine saw the file) in the file's own line
    ending when that is a lone CR (CRLF files are seen as they are)."""
    if "\n" in content and _LONE_CR.search(data) and b"\n" not in data:
        return re.sub(r"(?<!\r)\n", "\r", content)
    return content


class DecodeError(ValueError):
    """The file is binary or not valid UTF-8."""


def line_starts(text: str) -> list[int]:
    """Offsets where lines start, as Python's tokenizer cuts lines (CRLF, CR or LF: `ast`
    line numbers index this list). Text with no CR (nearly all) is cut at LFs by `str.find`,
    twice as fast as the regex that every CR/CRLF text still goes through."""
    if "\r" in text:
        return [0] + [m.end() for m in _NEWLINE.finditer(text)]
    starts = [0]
    find = text.find
    pos = find("\n")
    while pos >= 0:
        starts.append(pos + 1)
        pos = find("\n", pos + 1)
    return starts


@dataclass
class SourceText:
    """A file's decoded text, with its line starts for positions."""

    path: str
    text: str
    bom: bool = False
    line_starts: list[int] = field(default_factory=list)

    @classmethod
    def from_bytes(cls, path: str, data: bytes) -> "SourceText":
        if b"\x00" in data[:8192]:
            raise DecodeError("binary file (contains NUL bytes)")
        bom = data.startswith(codecs.BOM_UTF8)
        if bom:
            data = data[len(codecs.BOM_UTF8):]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
        return cls(path=path, text=text, bom=bom)

    def __post_init__(self) -> None:
        if not self.line_starts:
            self.line_starts = line_starts(self.text)

    def to_bytes(self, text: str | None = None) -> bytes:
        body = (self.text if text is None else text).encode("utf-8")
        return codecs.BOM_UTF8 + body if self.bom else body

    @property
    def newline(self) -> str:
        match = _NEWLINE.search(self.text)
        return match.group(0) if match else "\n"

    def line_text(self, line: int) -> str:
        """Line `line` (1-based) without its line ending."""
        start = self.line_starts[line - 1]
        end = self.line_starts[line] if line < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def offset(self, line: int, char_col: int) -> int:
        """Text offset of a 1-based line and 0-based character column."""
        return self.line_starts[line - 1] + char_col

    def offset_from_utf8(self, line: int, byte_col: int) -> int:
        """Text offset of a 1-based line and 0-based UTF-8 byte column (what `ast` gives)."""
        start = self.line_starts[line - 1]
        prefix = self.text[start:start + byte_col]
        if prefix.isascii():  # the common case: bytes == characters
            return start + byte_col
        encoded = self.line_text(line).encode("utf-8")[:byte_col]
        return start + len(encoded.decode("utf-8", errors="ignore"))

    def position(self, offset: int) -> tuple[int, int]:
        """1-based line and 1-based character column of a text offset."""
        index = bisect.bisect_right(self.line_starts, offset) - 1
        return index + 1, offset - self.line_starts[index] + 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        end_line, end_col = self.position(end)
        return Span(self.path, line, col, end_line, end_col, start, end)

    def span_of_node(self, node) -> Span:
        """Span of an `ast` node (which reports UTF-8 byte columns)."""
        start = self.offset_from_utf8(node.lineno, node.col_offset)
        end = self.offset_from_utf8(node.end_lineno, node.end_col_offset)
        return self.span(start, end)

    def node_text(self, node) -> str:
        span = self.span_of_node(node)
        return self.text[span.start:span.end]
