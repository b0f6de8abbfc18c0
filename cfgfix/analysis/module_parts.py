"""Another module of the project, parsed in parts: its top-level code, and each top-level
`def` or `class` only when a caller asks for that name.

Following `model = create_model_from_path(...)` into a 2,000-line `utils.py` needs one
function of it, yet parsing the whole module was 9 ms of a 5-file pre-commit run (issue 15).
The module's text is cut at its column-0 lines into units: a `def`/`class` block
(decorators included, up to the next column-0 line of code) or other top-level code. The
first parse keeps the top-level code and the blocks that can change what is read about
the whole module; every other block is blank lines (so line numbers stay) until a caller
asks for its name, when that block alone is parsed. Whatever is uncertain parses the whole
module instead (`complete`), keeping the nodes already handed out.

What the model analysis reads from such a module is then the same as from a full parse,
for every name the parsed code mentions (the only names it asks about):
- its imports (`ImportMap`): a block that may import such a name, or assign it in a way
  that `ImportMap` records, is parsed too, until no block left may (`_closure`);
- its module-level names bound once (`single_assignments`): all top-level code is parsed,
  and so is a block that may declare such a name `global` or `nonlocal`;
- `torch.set_default_dtype` anywhere in it: a block that says `set_default_` is parsed;
- its functions and classes by name: a name with a block not parsed yet is parsed first.

Why the parts are the module's own statements: a unit's text parses on its own the way it
parses in the module only if the module's tokenizer is at a clean line start there (not
inside a string, a bracket or a backslash continuation). A column-0 line after a backslash
line is never cut at (`_units`); a cut inside a string or a bracket leaves an unclosed
string or bracket, or a closing one with nothing open, in the parsed text, which then does
not parse, or parses into a statement that runs across a blanked block, which is checked
(`_parse_units`): either way the whole module is parsed. Two limits, both about modules that are
not ordinary Python: a syntax error in a block never parsed goes unseen (the full parse
would have rejected the module), and text crafted to read as valid top-level code both
inside a blanked block's string and on its own could pass the checks.
"""

from __future__ import annotations

import ast
import re
import warnings

from cfgfix.analysis.names import ImportMap, iter_statements, walk
from cfgfix.analysis.project_modules import ParsedModule, _display

# Smaller modules are parsed whole: cutting costs more than it saves there.
MIN_BYTES = 20_000

# A column-0 line of code: not indented, not a comment, not a closing bracket (a
# black-formatted signature ends with `) -> Model:` at column 0, inside its `def`).
_UNIT_START = re.compile(r"^[^\s#)\]}]", re.MULTILINE)
_BLOCK = re.compile(r"(?:async[ \t]+def|def|class)[ \t]+(\w+)")
# Statements that bind names for the whole module: an import, `global`, `nonlocal`. Each
# starts its line or follows a `;` or a `:` (`if x: import y`); a docstring line that starts
# with one of these words counts too (a block parsed for nothing, never one missed).
_BINDING = re.compile(r"(?:import|from|global|nonlocal)(?!\w)")
# Between the tokens of an assignment of a dotted path: blanks, line breaks (in brackets),
# continuations, comments (to the end of their line), and opening brackets before a name or
# closing ones after it (`x = (\n    torch.cuda.amp.autocast)`, `(x) = ...`).
_OPEN = r"(?:[ \t\n\\(]|#[^\n]*(?![^\n]))*"
_CLOSE = r"(?:[ \t\n\\)]|#[^\n]*(?![^\n]))*"
_WORD = re.compile(r"\w+")
_NAME = re.compile(r"(?<![\w.])\w+")


class _Unit:
    __slots__ = ("first", "last", "name", "start", "end")

    def __init__(self, first: int, last: int, name: str | None, start: int, end: int) -> None:
        self.first, self.last = first, last  # 0-based lines, `last` excluded
        self.name = name  # the def/class name; None for other top-level code
        self.start, self.end = start, end  # offsets in the text


class ModuleParts(ParsedModule):
    """A `ParsedModule` whose `tree` holds the top-level code and the blocks parsed so far;
    `pending` names the blocks not parsed yet."""

    def __init__(self, path, display, text, lines, units, tree, parsed: set[int]) -> None:
        super().__init__(path, display, text, tree)
        self.lines = lines
        self.units = units
        self.parsed = parsed  # indexes of the units in `tree`
        self.pending: dict[str, list[int]] = {}
        for index, unit in enumerate(units):
            if index not in parsed:
                self.pending.setdefault(unit.name, []).append(index)
        self.whole = False
        self.targets = _assigned_paths(text, units)
        self.binds = _binds(text, units)
        self._words: set[str] = set()  # the words of the parsed units (`_mentioned`)
        self._read: set[int] = set()

    def need(self, name: str) -> bool:
        """Parse the blocks named `name` (and what they make necessary); False when that
        is not possible and the caller must `complete` instead."""
        indexes = self.pending.get(name)
        if not indexes:
            return True
        return self._add(set(indexes))

    def complete(self) -> bool:
        """Parse the whole module; the statements already parsed keep their nodes. False
        when the module does not parse (the parts stay as they are)."""
        if self.whole:
            return True
        full = _parse(self.text, str(self.path))
        if full is None:
            self.pending = {}  # not retried: the parts stay what this module offers
            return False
        mine = {(s.lineno, s.col_offset, s.end_lineno, type(s)): s for s in self.tree.body}
        self._grow([mine.get((s.lineno, s.col_offset, s.end_lineno, type(s)), s) for s in full.body])
        self.parsed = set(range(len(self.units)))
        self.pending = {}
        self.whole = True
        return True

    # -- parsing units -------------------------------------------------------------------
    def _add(self, indexes: set[int]) -> bool:
        while indexes:
            statements = _parse_units(self.text, self.lines, self.units, sorted(indexes), str(self.path))
            if statements is None:
                return False
            self.parsed |= indexes
            for index in indexes:
                name = self.units[index].name
                left = [i for i in self.pending.get(name, ()) if i not in indexes]
                if left:
                    self.pending[name] = left
                else:
                    self.pending.pop(name, None)
            self._grow(sorted([*self.tree.body, *statements], key=lambda s: s.lineno))
            indexes = self._closure()
        return True

    def _grow(self, body: list[ast.stmt]) -> None:
        """A new tree with more statements; `single_assignments` memoises a body on its first
        statement, which may stay the same: that memo is of the smaller body."""
        for tree in (self.tree, ast.Module(body=body, type_ignores=[])):
            if tree.body:
                tree.body[0].__dict__.pop("_cfgfix_single_assignments", None)
        self.tree = ast.Module(body=body, type_ignores=[])

    def _closure(self) -> set[int]:
        """Blocks not parsed yet that may change what `ImportMap` or `single_assignments`
        say about a name the parsed code mentions. A block that may bind such a name by an
        import, `global` or `nonlocal` statement is parsed (`_binds`). Besides imports,
        `ImportMap` makes a name assigned exactly once in the whole file, to a dotted path
        of two dots at least under an imported module, an alias of that path (`autocast =
        torch.cuda.amp.autocast`). So, for a name the parsed code mentions:
        - if no import binds it and the parsed code never assigns it, a block that may
          assign it such a path (`_ASSIGNED_PATH`) could make it an alias: parsed;
        - if the parsed code made it an alias, a block that mentions it at all could assign
          it again, which undoes the alias: parsed.
        A name the parsed code assigns without it becoming an alias never becomes one (a
        second assignment only adds to its count), and one that its imports bind is never
        an alias (the blocks that may import it again are parsed by the first rule)."""
        imported: set[str] = set()
        assigned: set[str] = set()
        for node in iter_statements(self.tree.body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assigned.update(n.id for n in walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
                assigned.add(node.target.id)
            elif isinstance(node, ast.Import):
                imported.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.update(a.asname or a.name for a in node.names if a.name != "*")
        waiting = [i for indexes in self.pending.values() for i in indexes]
        # unsure what it assigns or binds
        wanted = {i for i in waiting if self.targets[i] is None or self.binds[i] is None}
        bound = self._mentioned({b for i in waiting if self.binds[i] for b in self.binds[i]})
        if bound:
            wanted.update(i for i in waiting if self.binds[i] and self.binds[i] & bound)
        names = {t for i in waiting if self.targets[i] for t in self.targets[i]} - imported - assigned
        if names:
            names = self._mentioned(names)
        if names:
            wanted.update(i for i in waiting if self.targets[i] and self.targets[i] & names)
        aliases = set(ImportMap(self.tree).aliases) - imported
        if aliases:  # rare: `autocast = torch.cuda.amp.autocast` in the parsed code
            for index in waiting:
                unit = self.units[index]
                if aliases & _words(self.text, unit.start, unit.end):
                    wanted.add(index)
        return wanted

    def _mentioned(self, names: set[str]) -> set[str]:
        """Those of `names` that the parsed units' text holds as a word."""
        for index in self.parsed - self._read:
            unit = self.units[index]
            self._words |= _words(self.text, unit.start, unit.end)
        self._read |= self.parsed
        return names & self._words


# `= a.b.c` with what may lie between the tokens (blanks, continuations, comments, brackets:
# `x = (\n    torch.cuda.amp.autocast)`), chained targets included (`x = y = a.b.c`); a
# keyword argument matches too (`f(x=a.b.c)`): more blocks parsed, never fewer. Not after
# an operator (`==`, `<=`, `+=`, `:=`: not an assignment `ImportMap` can make an alias of).
_ASSIGNED_PATH = re.compile(
    r"=(?<![=!<>+\-*/%&|^@:~]=)(?!=)" + _OPEN + r"(?:\w+" + _CLOSE + r"=(?!=)" + _OPEN + r")*"
    + r"\w+" + _CLOSE + r"\." + _CLOSE + r"\w+" + _CLOSE + r"\."
)
_CHAINED = re.compile(r"(\w+)" + _CLOSE + "=")


def _assigned_paths(text: str, units: list[_Unit]) -> list[set[str] | None]:
    """For each unit, the names it may assign a dotted path of two dots at least (see
    `_ASSIGNED_PATH`; words of comments too); None when a target is not sure to be found
    (a line break between the first target and its `=`: a comment may hide it)."""
    import bisect

    starts = [unit.start for unit in units]
    found: list[set[str] | None] = [set() for _ in units]
    for match in _ASSIGNED_PATH.finditer(text):
        index = bisect.bisect_right(starts, match.start()) - 1
        if index < 0 or found[index] is None:
            continue
        names = found[index]
        at = match.start()
        while at and text[at - 1] in " \t)\\":
            at -= 1
        if at and text[at - 1] == "\n":
            found[index] = None
            continue
        end = at
        while at and (text[at - 1].isalnum() or text[at - 1] == "_" or not text[at - 1].isascii()):
            at -= 1
        if at < end:
            names.add(_normal(text[at:end]))
        names.update(_normal(word) for word in _CHAINED.findall(match.group()))
    return found


def _binds(text: str, units: list[_Unit]) -> list[set[str] | None]:
    """For each unit, the words of its statements that may bind a name for the whole
    module (`_BINDING`), from the keyword to the end of the statement: the names bound are
    among them. None when the end is not sure to be found."""
    import bisect

    starts = [unit.start for unit in units]
    found: list[set[str] | None] = [set() for _ in units]
    for match in _BINDING.finditer(text):
        at = match.start()
        if at and (text[at - 1].isalnum() or text[at - 1] == "_" or not text[at - 1].isascii()):
            continue  # inside a longer word
        before = text.rfind("\n", 0, at) + 1
        head = text[before:at].rstrip(" \t")
        if head and head[-1] not in ";:":
            continue  # `yield from`, `raise X from e`, a word in a sentence
        index = bisect.bisect_right(starts, at) - 1
        if index < 0 or found[index] is None:
            continue
        end = _statement_end(text, match.end())
        if end < 0:
            found[index] = None
            continue
        names = match.end()
        if match.group() == "from":  # `from a.b import c as d`: what follows `import`
            names = text.find("import", names, end)
            if names < 0:
                continue  # not an import
            names += len("import")
        # the names bound are among the words not after a dot (`import a.b` binds `a`)
        found[index].update(_normal(word) for word in _NAME.findall(text, names, end) if word != "as")
    return found


def _statement_end(text: str, at: int) -> int:
    """Where an import or a `global` statement that goes on at `at` ends: its line's end,
    after the lines that a backslash or a bracket joins to it; -1 when unsure (a bracket
    inside the brackets, which these statements never hold)."""
    while True:
        end = text.find("\n", at)
        if end < 0:
            end = len(text)
        line = text[at:end]
        opened = line.find("(")
        if opened >= 0 and line.find(")", opened) < 0:
            close = text.find(")", at + opened)
            if close < 0 or text.find("(", at + opened + 1, close) >= 0:
                return -1
            at = close
            continue
        if line.endswith("\\") and end < len(text):
            at = end + 1
            continue
        return end


def _normal(word: str) -> str:
    if word.isascii():
        return word
    import unicodedata  # only for text beyond ASCII

    return unicodedata.normalize("NFKC", word)


def module_parts(path, display: str, data: bytes) -> ModuleParts | None:
    """The module in parts, or None when it is to be parsed whole: small, not plain text
    (carriage returns, form feeds, identifiers that Unicode normalisation changes), a cut
    after a backslash line, or a first parse that does not parse or does not line up."""
    if len(data) < MIN_BYTES:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    if "\r" in text or "\f" in text or "\x00" in text:
        return None
    lines = text.split("\n")
    units = _units(text, lines)
    if units is None:
        return None
    first = {i for i, unit in enumerate(units) if unit.name is None or text.find("set_default_", unit.start, unit.end) >= 0}
    if len(first) == len(units):
        return None  # nothing to leave out
    statements = _parse_units(text, lines, units, sorted(first), str(path))
    if statements is None:
        return None
    parts = ModuleParts(path, display, text, lines, units, ast.Module(body=statements, type_ignores=[]), first)
    more = parts._closure()
    if more and not parts._add(more):
        return None
    return parts


def _words(text: str, start: int, end: int) -> set[str]:
    """The words of `text[start:end]` as the tree spells names: Python normalises
    identifiers (NFKC), so `Kᵀ` in the text is the name `KT`."""
    words = set(_WORD.findall(text, start, end))
    odd = [w for w in words if not w.isascii()]
    if odd:
        words.update(_normal(w) for w in odd)
    return words


def _units(text: str, lines: list[str]) -> list[_Unit] | None:
    """The top-level units, or None when a cut would follow a backslash continuation. Lines
    before the first unit (comments, blank lines) belong to it."""
    starts: list[tuple[int, int]] = []  # (line, offset)
    line, pos = 0, 0
    for match in _UNIT_START.finditer(text):
        at = match.start()
        line += text.count("\n", pos, at)
        pos = at
        if line and lines[line - 1].endswith("\\"):
            return None
        starts.append((line, at))
    if not starts:
        return None
    if any(line.strip() and not line.lstrip().startswith("#") for line in lines[:starts[0][0]]):
        return None  # indented code before the first column-0 line: not a module that parses
    units: list[_Unit] = []
    decorators: tuple[int, int] | None = None  # the first line of pending decorators
    for number, (line, at) in enumerate(starts):
        last = starts[number + 1][0] if number + 1 < len(starts) else len(lines)
        end = starts[number + 1][1] if number + 1 < len(starts) else len(text)
        block = _BLOCK.match(text, at) if text[at] in "adc" else None
        if not units and decorators is None:
            line, at = 0, 0  # the lines before the first unit belong to it
        if decorators is not None:
            if block is None:
                continue  # a decorator's argument lines at column 0: still the decorators
            line, at = decorators
            decorators = None
        elif text[at] == "@":
            decorators = (line, at) if units else (0, 0)
            continue
        name = block.group(1) if block else None
        if name is not None:
            name = _normal(name)  # as the tree spells it
        units.append(_Unit(line, last, name, at, end))
    if decorators is not None:  # decorators with nothing under them: not a module that parses
        return None
    return units


def _parse_units(text: str, lines: list[str], units: list[_Unit], chosen: list[int], filename: str):
    """The top-level statements of the chosen units, parsed together with every other line
    blank; None when that does not parse or a statement runs outside its unit's run of
    chosen units (the cut was inside a string or a bracket)."""
    keep = [""] * len(lines)
    segment = [-1] * len(lines)
    previous = None
    for index in chosen:
        unit = units[index]
        if previous is None or units[previous].last != unit.first:
            run = index  # a new run of adjacent chosen units
        keep[unit.first:unit.last] = lines[unit.first:unit.last]
        segment[unit.first:unit.last] = [run] * (unit.last - unit.first)
        previous = index
    tree = _parse("\n".join(keep), filename)
    if tree is None:
        return None
    for stmt in tree.body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
        last = stmt.end_lineno or stmt.lineno
        if segment[first - 1] < 0 or segment[first - 1] != segment[last - 1]:
            return None
    return tree.body


def _parse(text: str, filename: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text, filename=filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def parse_in_parts(project, path, needs: tuple[bytes, ...] = ()) -> ParsedModule | None:
    """`ProjectModules.parse`, in parts when the module is large enough: a `ModuleParts`
    kept like a parse (once per process, while the file's size and mtime stay), else the
    whole module."""
    if needs:
        data = project.raw(path)
        if data is None or not any(word in data for word in needs):
            return None
    parts = project._stamped("parts:" + str(path), path,
                             lambda: module_parts(path, _display(path), project.raw(path) or b"") or False)
    return parts if parts else project.parse(path)
