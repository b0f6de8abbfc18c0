"""Coverage of the change: which statements the fix (or the revision) edited, which lines of
them the harness must see run, and whether it did.

A changed line is one whose code differs between the two copies; indentation, spacing and
comments do not count (wrapping a block in `with torch.no_grad():` changes one line, not the
re-indented block). Each changed line of a Python file maps to a *unit*, the statement that holds it; a
unit ran when any of its probe lines produced a line event in a process of the launch:
- a simple statement: its own lines;
- the header of a compound statement (`if`, `for`, `with`, ...): the header's lines;
- a `def` line or a decorator: the function's body, since the header runs at import and
  the change matters only when the function is called (an `@torch.no_grad()` added to an
  `evaluate()` that two steps never reach did not run);
- a line that holds no code (a comment, a blank line, a docstring) is no unit.
Lines are the patched copy's (the after tree's), and a pure deletion is the original's
removed statements, which must have run in the original run. A changed file that is not
Python (a YAML or JSON config, a shell script) counts when a process of the launch opened
it, or it is the launch script itself: its lines are not traced.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
from pathlib import Path

from cfgfix.records import dataclass, field

PYTHON_SUFFIXES = (".py",)
_CUDA_TEST = re.compile(r"\bcuda\b|is_cuda|\bgpu\b", re.IGNORECASE)
_EVAL_NAME = re.compile(r"eval|valid|test|predict|sample|generate", re.IGNORECASE)
_EVERY_N = re.compile(r"%")


@dataclass
class Unit:
    path: str  # posix, relative to the tree root
    side: str  # "after": ran in the patched/after run; "before": a deletion, in the original run
    lines: list[int]  # the changed lines it holds
    probe: list[int]  # any of these running proves it ran
    code: str  # the first changed line, stripped (for the report)
    counts: bool = True  # decides the verdict (before-side units of a replacement only balance the tracing)
    cuda_guard: int | None = None  # the line of an enclosing `if` on CUDA
    every_n: int | None = None  # the line of an enclosing `if ... % ...` (every N steps)
    function: str | None = None  # the enclosing function's name
    ran: bool | None = None
    hint: str = ""  # when it did not run: why it may not have, and what would make it run

    def to_dict(self) -> dict:
        return {"path": self.path, "side": self.side, "lines": self.lines, "code": self.code,
                "ran": self.ran, "probe": self.probe, "counts": self.counts, "function": self.function,
                "cuda_guard": self.cuda_guard, "every_n": self.every_n, "hint": self.hint}


@dataclass
class OtherFile:
    path: str  # a changed file that is not Python
    read: bool | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "read": self.read}


@dataclass
class Change:
    units: list[Unit] = field(default_factory=list)
    other: list[OtherFile] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)  # changed Python files that do not parse

    def spec(self, root: Path, side: str) -> dict:
        """The harness's CFGFIX_VERIFY_COVER document for the run of one side: per file, the
        probe lines of each unit (the harness stops watching a unit once one of them ran)."""
        files: dict[str, list[list[int]]] = {}
        for unit in self.units:
            if unit.side == side:
                files.setdefault(str(root / unit.path), []).append(unit.probe)
        reads = [str(root / f.path) for f in self.other]
        # "steady": both runs pay sys.settrace's cost alike (harness: _Coverage), even the side
        # with nothing of its own to watch (a pure insertion leaves the original none)
        return {"files": files, "reads": reads, "steady": bool(self.units)}

    def to_dict(self) -> dict:
        return {"units": [u.to_dict() for u in self.units], "other_files": [f.to_dict() for f in self.other],
                "unparsed": self.unparsed}


# -- what changed -------------------------------------------------------------------------------
def code_lines(source: str) -> list[str]:
    """Each line's code tokens, joined by one space: a change of indentation, spacing or a
    comment is no change of code. A source that does not tokenize: its stripped lines."""
    import io
    import tokenize

    count = len(source.splitlines())
    lines: list[list[str]] = [[] for _ in range(count + 1)]
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in skip and token.start[0] <= count:
                lines[token.start[0]].append(token.string)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [line.strip() for line in source.splitlines()]
    return [" ".join(tokens) for tokens in lines[1:]]


def changed_lines(old: str, new: str) -> tuple[set[int], set[int], set[int]]:
    """(after-side changed lines, before-side replaced lines, before-side deleted lines), 1-based,
    comparing code only (code_lines)."""
    a, b = code_lines(old), code_lines(new)
    after, replaced, deleted = set(), set(), set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            after.update(range(j1 + 1, j2 + 1))
        if tag == "replace":
            replaced.update(range(i1 + 1, i2 + 1))
        elif tag == "delete":
            deleted.update(range(i1 + 1, i2 + 1))
    return after, replaced, deleted


def build(pairs: list[tuple[str | None, str | None]], before_tree: Path, after_tree: Path) -> Change:
    """The change between two trees, from (before path, after path) pairs (None: added or
    deleted), each relative to its tree."""
    change = Change()
    for old_path, new_path in pairs:
        path = new_path or old_path
        if not path.endswith(PYTHON_SUFFIXES):
            if new_path is not None:
                change.other.append(OtherFile(new_path))
            continue
        old = _read(before_tree / old_path) if old_path else ""
        new = _read(after_tree / new_path) if new_path else ""
        if old is None or new is None:
            continue
        after, replaced, deleted = changed_lines(old, new)
        try:
            if new_path and after:
                change.units += _units(new, new_path, after, "after", counts=True)
            if old_path and (replaced or deleted):
                change.units += _units(old, old_path, deleted, "before", counts=True)
                change.units += _units(old, old_path, replaced, "before", counts=False)
        except (SyntaxError, ValueError):
            change.unparsed.append(path)
    return change


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def git_pairs(top: Path, before: str, after: str) -> list[tuple[str | None, str | None]]:
    """(before path, after path) of each file that differs between two revisions, renames
    followed; straight from one tree to the other, as the two runs differ."""
    from cfgfix.review.gitdiff import git

    out = git(top, "diff", "--name-status", "-z", "--find-renames", "--no-color", "--no-ext-diff",
              "--no-textconv", before, after)
    fields = out.split("\0")
    pairs, i = [], 0
    while i < len(fields) and fields[i]:
        status = fields[i][0]
        if status in "RC":
            pairs.append((None if status == "C" else fields[i + 1], fields[i + 2]))
            i += 3
            continue
        name = fields[i + 1]
        pairs.append({"A": (None, name), "D": (name, None)}.get(status, (name, name)))
        i += 2
    return pairs


# -- statements ---------------------------------------------------------------------------------
def executable_lines(source: str, filename: str = "<changed>") -> set[int]:
    """The lines that hold bytecode: the only ones a line event can name."""
    found: set[int] = set()
    pending = [compile(source, filename, "exec", dont_inherit=True)]
    while pending:
        code = pending.pop()
        found.update(line for _, _, line in code.co_lines() if line is not None)
        pending.extend(c for c in code.co_consts if hasattr(c, "co_lines"))
    return found


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
if hasattr(ast, "TryStar"):
    _COMPOUND += (ast.TryStar,)
if hasattr(ast, "Match"):
    _COMPOUND += (ast.Match,)


def _start(node) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _children(node) -> list:
    """The statements directly inside a compound statement, every clause included."""
    out = []
    for name in ("body", "orelse", "finalbody"):
        out += getattr(node, name, None) or []
    for handler in getattr(node, "handlers", None) or []:
        out += handler.body
    for case in getattr(node, "cases", None) or []:
        out += case.body
    return out


def _chain(tree: ast.Module, line: int) -> list:
    """The statements that hold `line`, outermost first."""
    chain, body = [], tree.body
    while True:
        node = next((s for s in body if _start(s) <= line <= (s.end_lineno or s.lineno)), None)
        if node is None:
            return chain
        chain.append(node)
        if not isinstance(node, _COMPOUND):
            return chain
        body = _children(node)


def _units(source: str, path: str, lines: set[int], side: str, counts: bool) -> list[Unit]:
    if not lines:
        return []
    tree = ast.parse(source)
    executable = executable_lines(source, path)
    text = source.splitlines()
    units: dict[tuple, Unit] = {}
    for line in sorted(lines):
        stripped = text[line - 1].strip() if line <= len(text) else ""
        if not stripped or stripped.startswith("#"):
            continue
        chain = _chain(tree, line)
        if not chain:
            continue
        probe = _probe(chain, line, executable)
        if not probe:
            continue  # a comment, a blank line, a docstring: no code changed here
        key = tuple(probe)
        unit = units.get(key)
        if unit is None:
            unit = units[key] = Unit(path, side, [], probe, text[line - 1].strip()[:120], counts)
            _context(unit, chain)
        unit.lines.append(line)
    return list(units.values())


def _probe(chain: list, line: int, executable: set[int]) -> list[int]:
    node = chain[-1]
    if not isinstance(node, _COMPOUND):
        span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        return sorted(executable.intersection(span))
    children = _children(node)
    first_child = min((_start(c) for c in children), default=(node.end_lineno or node.lineno) + 1)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and line < first_child:
        return sorted(executable.intersection(range(first_child, (node.end_lineno or node.lineno) + 1)))
    if line < first_child:  # the header of if/for/with/while/try/class
        return sorted(executable.intersection(range(_start(node), first_child)))
    # between clauses (`else:`, `except ValueError:`, `finally:`): the line itself, else the
    # clause's first statement
    if line in executable:
        return [line]
    following = min((c for c in children if _start(c) > line), key=_start, default=None)
    if following is None:
        return []
    return sorted(executable.intersection(range(following.lineno, (following.end_lineno or following.lineno) + 1)))


def _context(unit: Unit, chain: list) -> None:
    """What may keep the unit from running: an enclosing CUDA guard, an every-N-steps test,
    the function it sits in."""
    for outer, inner in zip(chain, chain[1:] + [None]):
        if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
            unit.function = outer.name
        if isinstance(outer, (ast.If, ast.While)) and inner is not None and inner in outer.body:
            test = ast.unparse(outer.test)
            if _CUDA_TEST.search(test):
                unit.cuda_guard = outer.lineno
            elif _EVERY_N.search(test):
                unit.every_n = outer.lineno


# -- judging ------------------------------------------------------------------------------------
def mark(change: Change, before_root: Path, after_root: Path, before, after, launch: list[str]) -> None:
    """Set `ran` on each unit and `read` on each other file from the two runs' records
    (runner.RunResult.covered / .reads, real paths)."""
    runs = {"before": (before_root, before), "after": (after_root, after)}
    for unit in change.units:
        root, run = runs[unit.side]
        if run is None:
            continue
        hits = set(run.covered.get(os.path.realpath(root / unit.path), ()))
        unit.ran = any(line in hits for line in unit.probe)
    launched = {os.path.normpath(word) for word in launch}
    for other in change.other:
        if after is None:
            continue
        path = os.path.realpath(after_root / other.path)
        other.read = path in after.reads or other.path in launched or os.path.normpath(other.path) in launched


def hint(unit: Unit, steps: int, on_cpu: bool) -> str:
    """Why the unit may not have run, and what would make it run."""
    if unit.cuda_guard is not None and on_cpu:
        return f"it is under the CUDA test at line {unit.cuda_guard} and this run was on the CPU: verify on a GPU"
    if unit.every_n is not None:
        return (f"it runs every N steps (the test at line {unit.every_n}): run more steps (--steps) "
                f"or make the launch reach it within {steps}")
    if unit.function and _EVAL_NAME.search(unit.function):
        return (f"{unit.function}() did not run in {steps} steps: add an evaluation step to the launch "
                f"(an eval-every-step argument) or run more steps (--steps)")
    if unit.function:
        return f"{unit.function}() did not reach it in {steps} steps: run more steps (--steps) or a launch that calls it"
    return f"the launch did not reach it in {steps} steps: run more steps (--steps) or a launch that does"
