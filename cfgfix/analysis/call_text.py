"""Where a module's text may call a name: the lines on which `name` stands as a whole word
followed by `(` (spaces, line breaks, backslash continuations and comments allowed in
between, as Python allows them inside brackets).

A superset, never less: every call `name(...)` or `x.name(...)` of the tree is on such a
line or on a line where some identifier is not spelled as `ast` names it (`_odd_lines`),
and so are words in strings and comments that look like calls. The module index uses it
to walk only the function bodies that can answer a query (issue 15).
"""

from __future__ import annotations

import bisect
import unicodedata

from cfgfix.core import LazyRegex

_NEWLINE = LazyRegex(r"\r\n|\r|\n")
_SPACE = " \t\f\r\n"
_MAY_PRECEDE_PAREN = frozenset(_SPACE + "\\#")
_DEF = LazyRegex(r"def[ \t\f\r\n\\]+(\w+)")  # `def`, spaces (or a continuation), the name


class CallText:
    def __init__(self, text: str, line_starts: list[int] | None = None) -> None:
        self.text = text
        self._line_starts = line_starts
        self._lines: dict[str, list[int]] = {}
        self._found: dict[str, list[tuple[int, int]]] = {}
        self._seen: dict[str, list[int]] = {}
        self._odd: list[tuple[int, str]] | None = None

    def lines_calling(self, name: str) -> list[int]:
        """Line numbers (1-based, repeats possible) where `name(` may be a call."""
        lines = self._lines.get(name)
        if lines is None:
            lines = self._lines[name] = [line for _, line in self._calls(name)] + [
                number for number, line in self._odd_lines() if _calls_in_line(line, name)]
        return lines

    def lines_calling_on(self, method: str, receiver: str) -> list[int]:
        """The lines of `lines_calling(method)` where the call may be `receiver.method(`:
        the name before the `.` is `receiver`'s last name, or cannot be read on the line
        (for `receiver` "", where it may be a plain call `method(`)."""
        key = method + " on " + receiver
        lines = self._lines.get(key)
        if lines is None:
            last = receiver.rsplit(".", 1)[-1]
            text = self.text
            lines = self._lines[key] = [line for pos, line in self._calls(method) if _may_be_on(text, pos, last)] + [
                number for number, line in self._odd_lines() if _calls_in_line(line, method)]
        return lines

    def lines_defining(self, accept) -> list[int]:
        """Line numbers of the `def NAME` whose name `accept(NAME)` takes (`async def` too),
        and of every line where a name may be spelled otherwise than `ast` names it."""
        text = self.text
        lines = []
        for match in _DEF.finditer(text):
            pos = match.start()
            if (pos == 0 or not _identifier_char(text[pos - 1])) and accept(match.group(1)):
                lines.append(bisect.bisect_right(self.line_starts, pos))
        return lines + [number for number, _ in self._odd_lines()]

    @property
    def line_starts(self) -> list[int]:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in _NEWLINE.finditer(self.text)]
        return self._line_starts

    def _calls(self, name: str) -> list[tuple[int, int]]:
        """(offset, line) of every `name` in the text that may be called, whatever the
        receiver: one scan per name, shared by `lines_calling` and every receiver that
        `lines_calling_on` is asked about (several per method: `model.eval()`,
        `self.model.eval()`, ...; scanning the text again for each was ~half of the finds
        on five trl trainers, issue 15)."""
        found = self._found.get(name)
        if found is not None:
            return found
        text, size = self.text, len(name)
        found = self._found[name] = []
        for pos in self._occurrences(name):
            end = pos + size
            after = text[end:end + 1]  # most hits go on with a name (`train_dataset`): no call
            if (after == "(" or (after in _MAY_PRECEDE_PAREN and _paren_follows(text, end))) \
                    and (pos == 0 or not _identifier_char(text[pos - 1])):
                found.append((pos, bisect.bisect_right(self.line_starts, pos)))
        return found

    def _occurrences(self, name: str) -> list[int]:
        """Every offset where `name` stands in the text (overlaps included), ascending. A name
        that holds one found before stands only where that one does: its hits are tested
        instead of the text scanned again (`evaluate` after `eval`, `_set_grad_enabled`
        after `set_grad_enabled`, `named_parameters` after `parameters`)."""
        found = self._seen.get(name)
        if found is None:
            text = self.text
            part = max((seen for seen in self._seen if seen in name), key=len, default=None)
            if part is not None:
                offset = name.find(part)
                starts = text.startswith
                found = [pos - offset for pos in self._seen[part] if pos >= offset and starts(name, pos - offset)]
            else:
                found = []
                find = text.find
                pos = find(name)
                while pos >= 0:
                    found.append(pos)
                    pos = find(name, pos + 1)
            self._seen[name] = found
        return found

    def _odd_lines(self) -> list[tuple[int, str]]:
        """(number, NFKC form) of the lines where an identifier may be spelled otherwise
        than `ast` names it, by its NFKC form (`ｅval` is `eval`): they hold an identifier
        character that NFKC changes, or a combining mark. Names are looked for in their
        NFKC form too. (Normalising the whole text instead cost ~9 ms on trl's GRPO
        trainer, for one `𝜇` in a comment.)"""
        if self._odd is None:
            self._odd = []
            text = self.text
            if not text.isascii() and not unicodedata.is_normalized("NFKC", text):
                normal, combining = unicodedata.is_normalized, unicodedata.combining
                lines = text.split("\n") if "\r" not in text else _NEWLINE.split(text)
                for number, line in enumerate(lines, 1):
                    if line.isascii():
                        continue
                    if normal("NFKC", line):  # CJK text, dashes, arrows: only a mark may compose
                        odd = any(ord(char) > 127 and combining(char) for char in line)
                    else:
                        odd = any(ord(char) > 127 and (combining(char) or not normal("NFKC", char))
                                  and ("_" + char).isidentifier() for char in line)
                    if odd:
                        self._odd.append((number, unicodedata.normalize("NFKC", line)))
        return self._odd


def _identifier_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _may_be_on(text: str, pos: int, receiver: str) -> bool:
    """Whether the attribute at `pos` may be read from a name chain ending in `receiver`:
    `x.receiver.name`, or a `.` or the name before it on another line (not read). A call
    `name(` without a `.`, or one on `f().` / `x[0].` (no name chain), is not. With an
    empty `receiver`, whether `name(` may be a plain call: no `.` before it on its line,
    and not the name of a `def` or `class`."""
    pos -= 1
    while pos >= 0 and text[pos] in " \t\f":
        pos -= 1
    if not receiver:  # a plain call `name(`: no `.` before it on the line, nor `def` / `class`
        if pos >= 0 and text[pos] == ".":
            return False
        end = pos + 1
        while pos >= 0 and _identifier_char(text[pos]):
            pos -= 1
        return text[pos + 1:end] not in ("def", "class")
    if pos < 0 or text[pos] != ".":
        return pos >= 0 and text[pos] in "\r\n\\"  # a line break: read no further
    pos -= 1
    while pos >= 0 and text[pos] in " \t\f":
        pos -= 1
    if pos < 0 or text[pos] in "\r\n\\":
        return True
    end = pos + 1
    while pos >= 0 and _identifier_char(text[pos]):
        pos -= 1
    return text[pos + 1:end] == receiver


def _calls_in_line(line: str, name: str) -> bool:
    """`name(` in one line, or `name` at its end (the `(` may follow on the next)."""
    pos = line.find(name)
    while pos >= 0:
        if (pos == 0 or not _identifier_char(line[pos - 1])) and _paren_follows(line, pos + len(name), True):
            return True
        pos = line.find(name, pos + 1)
    return False


def _paren_follows(text: str, pos: int, at_end: bool = False) -> bool:
    """`(` after `pos`, past spaces, line breaks, backslash continuations and comments
    (or, with `at_end`, the end of `text`)."""
    size = len(text)
    while pos < size:
        char = text[pos]
        if char == "(":
            return True
        if char in _SPACE:
            pos += 1
        elif char == "\\":
            pos += 1  # a continuation (anything else after a name is no call anyway)
        elif char == "#":
            while pos < size and text[pos] not in "\r\n":
                pos += 1
        else:
            return False
    return at_end
