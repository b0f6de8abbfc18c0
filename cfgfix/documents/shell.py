"""Launch scripts as logical lines: words with exact positions, commands and assignments.

Shell scripts, Makefile recipes, Dockerfile `RUN`/`CMD`/`ENTRYPOINT`/`ENV` and `.env` files
all end up as the same `ShellDocument`. `shlex` cannot report where a token sits in the
file, so a small tokenizer of our own follows the POSIX quoting rules closely enough for
launch lines and keeps the offset of every word. It never raises on bad input: a line it
cannot tokenize (an unbalanced quote) is skipped. Launch recognition lives in `launches.py`.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

from cfgfix.core import Span
from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass, field

DIALECTS = ("sh", "makefile", "dockerfile", "env")


@dataclass(frozen=True)
class Word:
    """One shell word after quote removal (`$VAR` and `$(...)` are left as written)."""

    text: str
    raw: str
    span: Span


@dataclass(frozen=True)
class Assignment:
    """`export A=B` ("export"), `A=B` ("plain"), `A=B cmd` / `env A=B cmd` ("prefix"),
    Dockerfile `ENV` and `.env` lines ("env")."""

    name: str
    value: Word
    span: Span
    kind: str


@dataclass(frozen=True)
class Command:
    words: tuple[Word, ...]  # argv, after the prefix assignments
    env: tuple[Assignment, ...]  # prefix assignments of this command
    span: Span


@dataclass
class ShellDocument:
    source: SourceText
    commands: list[Command] = field(default_factory=list)
    assignments: list[Assignment] = field(default_factory=list)
    # Block path (if/loop/case branch, function body, subshell, one Makefile recipe line or
    # Dockerfile instruction) of each command and assignment, keyed by its span start: an
    # assignment certainly ran before a command only from the same or an enclosing block.
    # Blocks that run in a shell of their own (subshells, recipe lines, RUN) have ids < 0.
    scopes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # (name, offset) where a variable took a value we cannot know (`for NAME in`, `read`,
    # `unset`, `NAME+=`); name "*" for `source`/`.`/`eval`, which may change any variable.
    clobbers: list[tuple[str, int]] = field(default_factory=list)
    # Dockerfile RUN/CMD/ENTRYPOINT bodies written as a JSON array that is not one (`CMD
    # ['python', 'train.py']`): (instruction, start, end) of the body; Docker runs them in
    # the shell form, as `/bin/sh -c "['python', 'train.py']"`
    bad_exec_forms: list[tuple[str, int, int]] = field(default_factory=list)
    # (start, end) of the inline scripts that run once per task (`srun bash -c '...'`,
    # `mpirun -np 4 sh -c "..."`): a plain `python train.py` there is one of several copies.
    copied: list[tuple[int, int]] = field(default_factory=list)
    # (start, end) of the single-quoted inline scripts (`srun bash -c '...'`): the inner shell
    # expands their `$X`, and sees only what the outer shell exported (or set inside); and the
    # (start, end) of the outer variables spliced into them (`'"$X"'`), which the outer shell
    # expands before the inner one starts
    environment_only: list[tuple[int, int]] = field(default_factory=list)
    outer_splices: list[tuple[int, int]] = field(default_factory=list)

    def command_covering(self, line: int) -> Command | None:
        """The last command whose span covers `line` (an inner one over the one enclosing it)."""
        found = None
        for command in self.commands:
            if command.span.line <= line <= command.span.end_line:
                found = command
        return found


def parse_shell(source: SourceText, dialect: str = "sh") -> ShellDocument:
    """Commands and assignments of a shell script, Makefile, Dockerfile or `.env` file.
    Never raises on the file's content; an unknown `dialect` is a programming error."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown shell dialect {dialect!r}; expected one of {DIALECTS}")
    doc = ShellDocument(source)
    builder = _Builder(doc)
    if dialect == "sh":
        _parse_sh_range(builder, _Lexer(source.text), 0)
        builder.heredoc_scripts()
    elif dialect == "makefile":
        _parse_makefile(builder)
    elif dialect == "dockerfile":
        _parse_dockerfile(builder)
    else:
        _parse_env(doc)
    return doc


# --------------------------------------------------------------------------- tokenizer

_OPERATORS = (  # longest first, so `&&` wins over `&`
    ";;&", "&>>", "<<<", "<<-",
    "&&", "||", ";;", ";&", "|&", "&>", ">>", ">|", ">&", "<&", "<>", "<<",
    ";", "&", "|", "<", ">", "(", ")",
)
_OPERATOR = re.compile("|".join(re.escape(op) for op in _OPERATORS))
_PLAIN = re.compile(r"[^ \t\r\n\f\v;&|<>()\\'\"$`]+")  # word characters with no special meaning
_PLAIN_DOUBLE = re.compile(r'[^"\\$`]+')  # the same inside double quotes
_PLAIN_PAREN = re.compile(r"[^\\'\"`()]+")  # inside `$(...)`
_PLAIN_BRACE = re.compile(r"[^\\'\"`{}]+")  # inside `${...}`
_MAX_NESTING = 64
_BLANKS = re.compile(r"(?:[ \t\f\v]|\r(?!\n))+")
_REDIRECTS = {">", ">>", ">|", "<", "<>", "&>", "&>>", ">&", "<&", "<<<", "<<", "<<-"}
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_ANSI_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "e": "\x1b"}


class _Unbalanced(Exception):
    """A quote, `$(`, `${` or backtick that never closes; `pos` is where it opened."""

    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


@dataclass
class _Tok:
    kind: str  # "word" | "op" | "nl"
    start: int
    end: int
    text: str  # words: the value after quote removal; operators: the operator


class _Lexer:
    """Tokens of one logical line at a time, with offsets into `text`.

    `make`: Makefile recipe text (`$$` is the shell's `$`, make drops the tab after a
    backslash-newline). `docker`: Dockerfile text (comment lines inside a continued
    instruction are removed by Docker before the shell sees them)."""

    def __init__(self, text: str, end: int | None = None, *, make: bool = False, docker: bool = False):
        self.text = text
        self.n = len(text) if end is None else end  # where tokens may reach
        self.limit = self.n  # where heredoc bodies may reach
        # The heredoc bodies of the last line: (index of the `<<` token, body start, body
        # end), the end being where the delimiter line starts (None: it never came).
        self.bodies: list[tuple[int, int, int | None]] = []
        self.make = make
        self.docker = docker
        self.nesting = 0  # depth of `$(`/`${` inside each other

    def _newline(self, pos: int) -> int:
        """Length of the line break at `pos` (0 when there is none)."""
        if pos >= self.n:
            return 0
        if self.text[pos] == "\n":
            return 1
        if self.text.startswith("\r\n", pos) and pos + 1 < self.n:
            return 2
        return 0

    def eol(self, pos: int) -> int:
        """Offset just after the physical line holding `pos`."""
        end = self.text.find("\n", pos, self.n)
        return self.n if end < 0 else end + 1

    def _continue(self, pos: int) -> int:
        """Skip a backslash-newline at `pos`, and what the dialect drops after it."""
        pos += 1 + self._newline(pos + 1)
        if self.make and pos < self.n and self.text[pos] == "\t":
            pos += 1
        if self.docker:
            while pos < self.n:
                line = self.text[pos:self.eol(pos)]
                if line.strip() and not line.lstrip().startswith("#"):
                    break
                pos = self.eol(pos)
        return pos

    def line(self, pos: int) -> tuple[list[_Tok], int]:
        """Tokens from `pos` to the end of the logical line, and the offset after it
        (past any heredoc bodies the line opened). Raises `_Unbalanced`."""
        text, toks = self.text, []
        heredocs: list[tuple[str, bool, int]] = []
        self.bodies = []
        while pos < self.n:
            c = text[pos]
            if c == "\\" and self._newline(pos + 1):
                pos = self._continue(pos)
            elif nl := self._newline(pos):
                toks.append(_Tok("nl", pos, pos + nl, "\n"))
                return toks, self._skip_heredocs(pos + nl, heredocs)
            elif c in " \t\r\f\v":
                pos = _BLANKS.match(text, pos).end() if c != "\r" else pos + 1
            elif c == "#":  # a comment: `#` can only start one where a word would start
                end = text.find("\n", pos, self.n)
                pos = self.n if end < 0 else end - (text[end - 1] == "\r")
            elif (op := self._operator(pos)) is not None:
                start = pos
                prev = toks[-1] if toks else None
                fd = prev is not None and prev.kind == "word" and prev.end == pos and text[prev.start:pos].isdigit()
                if op[0] in "<>" and fd:
                    start = toks.pop().start  # `2>&1`: the fd number belongs to the redirection
                toks.append(_Tok("op", start, pos + len(op), op))
                pos += len(op)
                if op in ("<<", "<<-"):
                    while pos < self.n and text[pos] in " \t":
                        pos += 1
                    if pos < self.n and not self._newline(pos):
                        word, pos = self._word(pos)
                        toks.append(word)
                        heredocs.append((word.text, op == "<<-", len(toks) - 2))
            else:
                word, pos = self._word(pos)
                toks.append(word)
        return toks, pos

    def _operator(self, pos: int) -> str | None:
        text = self.text
        if text[pos] not in ";&|<>()":
            return None
        if text[pos] in "<>" and text.startswith("(", pos + 1):
            return None  # `<(cmd)`: process substitution is part of a word
        match = _OPERATOR.match(text, pos, self.n)
        return match.group() if match else None

    def _skip_heredocs(self, pos: int, heredocs: list[tuple[str, bool, int]]) -> int:
        # Heredoc bodies are data (a Python program, a config), not commands of this
        # script; the builder reads those that are scripts run elsewhere (`heredoc_scripts`).
        for delimiter, strip_tabs, index in heredocs:
            start, closed = pos, None
            while pos < self.limit:
                end = self.text.find("\n", pos, self.limit)
                end = self.limit if end < 0 else end + 1
                line = self.text[pos:end].rstrip("\r\n")
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    closed = pos
                    pos = end
                    break
                pos = end
            self.bodies.append((index, start, closed))
        return pos

    def _word(self, pos: int) -> tuple[_Tok, int]:
        text, start, out = self.text, pos, []
        while pos < self.n:
            if plain := _PLAIN.match(text, pos, self.n):
                out.append(plain.group())
                pos = plain.end()
                continue
            c = text[pos]
            if c in " \t\r\n\f\v":
                break
            if c in ";&|<>()":
                if c == "(" and _ASSIGN.fullmatch(text[start:pos]):
                    end = self._balanced(pos, "(", ")")  # `A=(1 2 3)`: an array value
                elif c in "<>" and pos == start and text.startswith("(", pos + 1):
                    end = self._balanced(pos + 1, "(", ")")
                else:
                    break
                out.append(text[pos:end])
                pos = end
            elif c == "\\":
                if self._newline(pos + 1):
                    pos = self._continue(pos)
                elif pos + 1 < self.n:
                    out.append(text[pos + 1])
                    pos += 2
                else:
                    out.append(c)
                    pos += 1
            elif c == "'":
                end = text.find("'", pos + 1, self.n)
                if end < 0:
                    raise _Unbalanced(pos)
                out.append(text[pos + 1:end])
                pos = end + 1
            elif c == '"':
                pos = self._double(pos, out)
            elif c == "$" or c == "`":
                pos = self._expansion(pos, out)
            else:
                out.append(c)
                pos += 1
        return _Tok("word", start, pos, "".join(out)), pos

    def _expansion(self, pos: int, out: list[str]) -> int:
        """`$...` or a backtick at `pos`: kept as written (make's `$$` becomes `$`)."""
        text = self.text
        if self.make and text.startswith("$$", pos):
            if text[pos + 2:pos + 3] in ("(", "{") and pos + 2 < self.n:
                end = self._balanced(pos + 2, text[pos + 2], ")" if text[pos + 2] == "(" else "}")
                out.append(text[pos + 1:end].replace("$$", "$"))
                return end
            out.append("$")
            return pos + 2
        if text[pos] == "`":
            end = self._backtick(pos)
        elif text.startswith("$'", pos):
            return self._ansi_c(pos, out)
        elif text[pos + 1:pos + 2] in ("(", "{") and pos + 1 < self.n:
            end = self._balanced(pos + 1, text[pos + 1], ")" if text[pos + 1] == "(" else "}")
        else:
            out.append("$")
            return pos + 1
        out.append(text[pos:end])
        return end

    def _double(self, pos: int, out: list[str]) -> int:
        text, start = self.text, pos
        pos += 1
        while pos < self.n:
            if plain := _PLAIN_DOUBLE.match(text, pos, self.n):
                out.append(plain.group())
                pos = plain.end()
                continue
            c = text[pos]
            if c == '"':
                return pos + 1
            if c == "\\":
                nxt = text[pos + 1] if pos + 1 < self.n else ""
                if self._newline(pos + 1):
                    pos = self._continue(pos)
                elif nxt in ("$", "`", '"', "\\"):
                    out.append(nxt)
                    pos += 2
                else:
                    out.append(c)
                    pos += 1
            elif c == "`" or (c == "$" and not text.startswith("$'", pos)):
                pos = self._expansion(pos, out)
            else:  # `$'...'` is ANSI-C quoting only outside double quotes
                out.append(c)
                pos += 1
        raise _Unbalanced(start)

    def _ansi_c(self, pos: int, out: list[str]) -> int:
        text, start = self.text, pos
        pos += 2
        while pos < self.n:
            c = text[pos]
            if c == "'":
                return pos + 1
            if c == "\\" and pos + 1 < self.n:
                out.append(_ANSI_ESCAPES.get(text[pos + 1], "\\" + text[pos + 1]))
                pos += 2
            else:
                out.append(c)
                pos += 1
        raise _Unbalanced(start)

    def _backtick(self, pos: int) -> int:
        i = pos + 1
        while i < self.n:
            if self.text[i] == "\\":
                i += 2
            elif self.text[i] == "`":
                return i + 1
            else:
                i += 1
        raise _Unbalanced(pos)

    def _balanced(self, pos: int, opening: str, closing: str) -> int:
        """Offset after the bracket that closes the one at `pos`, skipping quoted text."""
        if self.nesting >= _MAX_NESTING:  # `"$("$("...`: give up rather than recurse on
            raise _Unbalanced(pos)
        self.nesting += 1
        try:
            return self._scan_balanced(pos, opening, closing)
        finally:
            self.nesting -= 1

    def _scan_balanced(self, pos: int, opening: str, closing: str) -> int:
        text, depth, i = self.text, 0, pos
        plain = _PLAIN_PAREN if opening == "(" else _PLAIN_BRACE
        while i < self.n:
            if run := plain.match(text, i, self.n):
                i = run.end()
                continue
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                end = text.find("'", i + 1, self.n)
                if end < 0:
                    raise _Unbalanced(i)
                i = end + 1
                continue
            if c == '"':
                i = self._double(i, [])
                continue
            if c == "`":
                i = self._backtick(i)
                continue
            if c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise _Unbalanced(pos)


def _parse_sh_range(builder: _Builder, lexer: _Lexer, pos: int) -> None:
    """Feed every logical line from `pos` to `lexer.n` to the builder."""
    limit = lexer.n
    budget = 8 * (limit - pos) + 65536  # characters scanned in vain before we stop trusting quotes
    while pos < limit:
        if budget < 0:  # many unclosed quotes: quotes may no longer span physical lines
            lexer.n = _physical_end(lexer.text, pos, limit)
        try:
            toks, pos = lexer.line(pos)
        except _Unbalanced as exc:  # skip the broken line, go on with the next one
            budget -= lexer.n - exc.pos
            pos = lexer.eol(exc.pos)
            continue
        finally:
            lexer.n = limit
        builder.feed(toks)
        if lexer.bodies:
            builder.note_heredocs(toks, lexer.bodies)


def _physical_end(text: str, pos: int, limit: int) -> int:
    """End of the line at `pos`, following backslash-newline continuations."""
    while True:
        end = text.find("\n", pos, limit)
        if end < 0:
            return limit
        body = text[pos:end].rstrip("\r")
        if (len(body) - len(body.rstrip("\\"))) % 2 == 0:
            return end + 1
        pos = end + 1


# --------------------------------------------------------------------------- commands

_OPENERS = {"if", "while", "until", "{"}
_BRANCHES = {"then", "else", "elif", "do"}
_CLOSERS = {"fi", "done", "esac", "}"}
_SEPARATORS = {";", "&&", "||", "|", "|&", "&", ";;", ";&", ";;&"}
_DECLARERS = {"export", "declare", "typeset", "readonly", "local"}
_SOURCING = {"source", ".", "eval"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
# Programs that run the command after their own options: `timeout 3h srun -N 2 bash -c '...'`
# (the same wrappers launches.py strips before a launcher).
_RUN_WRAPPERS = {
    "nohup", "exec", "time", "command", "setsid", "sudo", "srun", "mpirun", "mpiexec", "timeout",
    "nice", "ionice", "taskset", "numactl", "stdbuf", "unbuffer", "xvfb-run", "env",
}
_MULTIPLIERS = {"srun", "mpirun", "mpiexec"}  # start one copy of the command per task
# An outer variable spliced between two single-quoted parts of a `bash -c` script:
# `'"$OUT"'`, `'"${OUT}"'`, `'$OUT'`.
_SPLICE = re.compile(r"'(\"?)\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})\1'")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Builder:
    """Groups tokens into commands and assignments, tracking the block structure
    (if/loop/case/function/subshell) only as far as variable scoping needs it."""

    def __init__(self, doc: ShellDocument) -> None:
        self.doc = doc
        self.source = doc.source
        self.stack: list[tuple[str, int]] = []  # (kind, block id)
        self.next_id = 0
        self.expect_pattern = False  # inside `case`, before the `)` of a pattern
        self.skip: str | None = None  # inside a `for`/`case`/`function` header
        self.inline_depth = 0  # `bash -c` inside `bash -c`
        # Heredoc bodies that are shell scripts: (start, end, the file it is written to, or
        # None when a shell or a scheduler reads it from stdin).
        self.heredocs: list[tuple[int, int, str | None]] = []

    # -- blocks
    def _push(self, kind: str) -> None:
        self.next_id += 1
        block = -self.next_id if kind in ("subshell", "isolated") else self.next_id
        self.stack.append((kind, block))

    def _branch(self) -> None:
        if self.stack:
            self.next_id += 1
            self.stack[-1] = (self.stack[-1][0], self.next_id)

    def _pop(self) -> None:
        if self.stack:
            self.stack.pop()

    def scope(self) -> tuple[int, ...]:
        return tuple(block for _, block in self.stack)

    @contextmanager
    def isolated(self):
        """A Makefile recipe line, a Dockerfile instruction, `bash -c '...'`: its own shell."""
        saved = self.stack, self.expect_pattern, self.skip
        self.stack, self.expect_pattern, self.skip = list(saved[0]), False, None
        self._push("isolated")
        try:
            yield
        finally:
            self.stack, self.expect_pattern, self.skip = saved

    # -- tokens
    def feed(self, toks: list[_Tok]) -> None:
        cur: list[_Tok] = []
        end = 0
        i = 0
        while i < len(toks):
            tok = toks[i]
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            i += 1
            if self.skip is not None and self._skipping(tok):
                continue
            if self.expect_pattern:  # the `a|b)` that opens a case branch
                if tok.kind == "word" and tok.text == "esac":
                    self.expect_pattern = False
                    self._pop()
                elif tok.kind == "op" and tok.text == ")":
                    self.expect_pattern = False
                    self._branch()
                continue
            if tok.kind == "word":
                if not cur and tok.text == "for" and nxt is not None and nxt.text == "(":
                    i = self._skip_arithmetic(toks, i)  # `for ((i=0; i<n; i++))`
                    self._push("loop")
                    self.skip = "header"
                elif not cur and self._keyword(tok, nxt):
                    pass
                else:
                    cur.append(tok)
                    end = tok.end
                continue
            if tok.kind == "nl":
                self._flush(cur, end)
                cur = []
                continue
            op = tok.text
            if op in _REDIRECTS:
                end = tok.end
                if nxt is not None and nxt.kind == "word":  # the target is not an argument
                    end = nxt.end
                    i += 1
                continue
            if op == "(" and len(cur) == 1 and nxt is not None and nxt.text == ")":
                cur = []  # `name() {`: a function definition, not a command
                i += 1
                continue
            self._flush(cur, end)
            cur = []
            if op == "(":
                if nxt is not None and nxt.text == "(" and nxt.start == tok.end:
                    i = self._skip_arithmetic(toks, i + 1)  # `(( i++ ))`
                else:
                    self._push("subshell")
            elif op == ")":
                self._pop()
            elif op in (";;", ";&", ";;&") and self.stack and self.stack[-1][0] == "case":
                self.expect_pattern = True
        self._flush(cur, end)

    def _skipping(self, tok: _Tok) -> bool:
        """Consume the parts of `for`/`case`/`function` headers that are not commands."""
        if self.skip == "name":  # `function NAME`
            self.skip = None
            return tok.kind == "word"
        if self.skip == "in":  # `case WORD in`
            if tok.kind == "word" and tok.text == "in":
                self.skip, self.expect_pattern = None, True
            return True
        # `for NAME in a b c` up to `;`, a newline or `do`
        if tok.kind == "word" and tok.text == "do":
            self.skip = None
            self._branch()
        elif tok.kind == "nl" or (tok.kind == "op" and tok.text in _SEPARATORS):
            self.skip = None
        return True

    @staticmethod
    def _skip_arithmetic(toks: list[_Tok], i: int) -> int:
        while i + 1 < len(toks):
            if toks[i].text == ")" and toks[i + 1].text == ")":
                return i + 2
            i += 1
        return len(toks)

    def _keyword(self, tok: _Tok, nxt: _Tok | None) -> bool:
        """Handle a reserved word in command position; True when it was one."""
        if self.source.text[tok.start:tok.end] != tok.text:  # a quoted `"if"` is a plain word
            return False
        word = tok.text
        if word in _OPENERS:
            self._push(word)
        elif word in _BRANCHES:
            self._branch()
        elif word in _CLOSERS:
            self._pop()
        elif word in ("for", "select"):
            if nxt is not None and nxt.kind == "word":  # the loop variable changes
                self._clobber(nxt.text, tok.start)
            self._push("loop")
            self.skip = "header"
        elif word == "case":
            self._push("case")
            self.skip = "in"
        elif word == "function":
            self.skip = "name"  # then `()` and `{` as for `name() {`
        elif word != "!":
            return False
        return True

    def _flush(self, toks: list[_Tok], end: int) -> None:
        if not toks:
            return
        words = [self._word(t) for t in toks]
        scope = self.scope()
        k = 0
        while k < len(words) and _ASSIGN.match(words[k].raw):
            k += 1
        argv = words[k:]
        span = self.source.span(words[0].span.start, max(end, words[-1].span.end))
        prefix = self._assignments(words[:k], "prefix" if argv else "plain", scope)
        if argv:
            self._declarations(argv, scope)
            self._env_wrapper(argv, scope)
            self._clobbers(argv)
            self.doc.commands.append(Command(tuple(argv), tuple(prefix), span))
            self.doc.scopes.setdefault(span.start, scope)
            self.inline_script(argv)

    def inline_script(self, argv: list[Word] | tuple[Word, ...]) -> None:
        """`bash -c 'torchrun ...'`, also behind wrappers (`timeout 3h srun bash -c '...'`):
        parse the script in place, so every inner word keeps its exact position in the file.
        The quotes must hold it verbatim (no escapes); a single-quoted script may be spliced
        with the outer shell's variables (`'... --out '"$OUT"' ...'`), read as `$OUT`."""
        if self.inline_depth >= 4:
            return
        shell = _inline_shell(argv)
        if shell is None:
            return
        for i, word in enumerate(argv[shell + 1:-1], start=shell + 1):
            if not word.text.startswith("-"):
                return  # `bash run.sh`: a file, not an inline script
            if not word.text.startswith("--") and word.text.endswith("c"):  # -c, -lc, -ec
                script = argv[i + 1]
                break
        else:
            return
        raw = script.raw
        if len(raw) < 2 or raw[0] not in "'\"" or raw[-1] != raw[0]:
            return
        text = self.source.text
        if script.text != raw[1:-1]:
            spliced = _spliced(raw) if raw[0] == "'" else None
            if spliced is None:
                return
            start = script.span.start
            text = text[:start] + spliced + text[start + len(raw):]  # same length: offsets hold
            self.doc.outer_splices.extend((start + m.start(), start + m.end()) for m in _SPLICE.finditer(raw, 1, len(raw) - 1))
        if raw[0] == "'":
            self.doc.environment_only.append((script.span.start, script.span.end))
        if any(word.text.rsplit("/", 1)[-1] in _MULTIPLIERS for word in argv[:shell]):
            self.doc.copied.append((script.span.start, script.span.end))
        self.inline_depth += 1
        try:
            with self.isolated():
                _parse_sh_range(self, _Lexer(text, script.span.end - 1), script.span.start + 1)
        finally:
            self.inline_depth -= 1

    def note_heredocs(self, toks: list[_Tok], bodies: list[tuple[int, int, int | None]]) -> None:
        """Keep the heredoc bodies that are scripts: fed to `sbatch`/`qsub`/a shell
        (`sbatch <<EOF`, `cat <<EOF | sbatch`), or written to a file by `cat > job.sh <<EOF`
        / `tee job.sh <<EOF` (read only if this script later runs that file)."""
        for index, start, end in bodies:
            if end is None or self.inline_depth >= 4:
                continue  # an unterminated body is not trusted
            first, last = index, index
            while first > 0 and not _ends_command(toks[first - 1]):
                first -= 1
            while last + 1 < len(toks) and not _ends_command(toks[last + 1]):
                last += 1
            argv, target = _simple_command(toks[first:last + 1], self.source.text)
            piped = argv and argv[0].rsplit("/", 1)[-1] == "cat" and last + 2 < len(toks) \
                and toks[last + 1].text == "|" \
                and _reads_script(_simple_command(_command_at(toks, last + 2), self.source.text)[0])
            if _reads_script(argv) or piped:  # `sbatch <<EOF`, `cat <<EOF | sbatch`
                self.heredocs.append((start, end, None))
                reader = argv if not piped else _simple_command(_command_at(toks, last + 2), self.source.text)[0]
                shell = _stdin_shell(reader) if reader and reader[0].rsplit("/", 1)[-1] in _RUN_WRAPPERS else None
                if shell is not None and any(w.rsplit("/", 1)[-1] in _MULTIPLIERS for w in reader[:shell]):
                    self.doc.copied.append((start, end))  # `srun bash <<EOF`: the body runs once per task
            elif argv and argv[0].rsplit("/", 1)[-1] in ("cat", "tee"):
                if argv[0].endswith("tee"):  # tee writes its file arguments (and stdout)
                    target = next((w for w in argv[1:] if not w.startswith("-")), None)
                if target is not None:
                    self.heredocs.append((start, end, _normal_target(target)))

    def heredoc_scripts(self) -> None:
        """Read the heredoc bodies kept by `note_heredocs` as scripts of their own (a shell of
        their own, like `bash -c`), words at their exact positions in this file: a body
        written to a file only when a later command runs that file (`sbatch "$SCRIPT"`)."""
        rounds = 0
        while self.heredocs and rounds < 4:
            pending, self.heredocs = self.heredocs, []
            rounds += 1
            for start, end, target in pending:
                if target is not None and not _runs_file(self.doc, target, end):
                    continue
                self.inline_depth += 1
                try:
                    with self.isolated():
                        _parse_sh_range(self, _Lexer(self.source.text, end), start)
                finally:
                    self.inline_depth -= 1
        self.doc.commands.sort(key=lambda c: c.span.start)
        self.doc.assignments.sort(key=lambda a: a.span.start)
        self.doc.clobbers.sort(key=lambda c: c[1])

    def _word(self, tok: _Tok) -> Word:
        text = self.source.text
        # most words are written as they read (no quotes): one string for both, not a copy
        # per word (issue 24: a launch line of 400,000 arguments)
        same = tok.end - tok.start == len(tok.text) and text.startswith(tok.text, tok.start)
        return Word(tok.text, tok.text if same else text[tok.start:tok.end], self.source.span(tok.start, tok.end))

    def _assignments(self, words: list[Word], kind: str, scope: tuple[int, ...]) -> list[Assignment]:
        found = []
        for word in words:
            assignment = _assignment(word, kind, self.source)
            if assignment is None:  # `A+=x`: the value now depends on what came before
                self._clobber(word.raw.split("+=", 1)[0], word.span.start)
                continue
            found.append(assignment)
            self.add(assignment, scope)
        return found

    def _clobber(self, name: str, offset: int) -> None:
        self.doc.clobbers.append((name, offset))
        self.doc.scopes.setdefault(offset, self.scope())

    def add(self, assignment: Assignment, scope: tuple[int, ...] = ()) -> None:
        self.doc.assignments.append(assignment)
        self.doc.scopes[assignment.span.start] = scope

    def _declarations(self, argv: list[Word], scope: tuple[int, ...]) -> None:
        """`export A=B`, `declare -x A=B`, `local A=B`, `readonly A=B`."""
        if argv[0].text not in _DECLARERS or argv[0].raw != argv[0].text:
            return
        args = argv[1:]
        exported = argv[0].text == "export" or any(
            w.text.startswith("-") and "x" in w.text for w in args if not _ASSIGN.match(w.raw)
        )
        self._assignments([w for w in args if _ASSIGN.match(w.raw)], "export" if exported else "plain", scope)

    def _env_wrapper(self, argv: list[Word], scope: tuple[int, ...]) -> None:
        """`env A=B cmd` (behind `nohup`/`exec`/`time` too) sets A for cmd like a prefix."""
        words = env_wrapper_assignments(argv)
        self._assignments(words, "prefix", scope)

    def _clobbers(self, argv: list[Word]) -> None:
        name = argv[0].text
        if name in _SOURCING:
            self._clobber("*", argv[0].span.start)
        elif name in ("read", "unset", "getopts", "mapfile", "readarray"):
            for word in argv[1:]:
                if _IDENT.fullmatch(word.text):
                    self._clobber(word.text, word.span.start)


def _inline_shell(argv) -> int | None:
    """Index of the shell in `bash -c ...`, `srun bash -c ...`, `timeout 1h srun -N 2 sh -c ...`."""
    name = argv[0].text.rsplit("/", 1)[-1]
    if name in _SHELLS:
        return 0
    if name not in _RUN_WRAPPERS:
        return None
    # wrapper options vary (`srun -p gpu`, `timeout 1h`): the first shell word after them
    return next((i for i, word in enumerate(argv[1:], start=1) if word.text.rsplit("/", 1)[-1] in _SHELLS), None)


def _spliced(raw: str) -> str | None:
    """A single-quoted script spliced with outer variables, `'a '"$X"' b'`, rewritten at the
    same length so the inner shell reads each splice as a bare `$X` where it stands:
    `'"$X"'` -> `""$X""` (also right inside an inner double-quoted string), `'$X'` -> `"$X"`.
    None for any other quoting (escapes, `'"'"'`, command substitutions)."""
    parts, pos = [], 1
    for match in _SPLICE.finditer(raw, 1, len(raw) - 1):
        parts.append(raw[pos:match.start()])
        inner = match.group()[1:-1]
        parts.append('"' + inner + '"')  # `"$X"` -> `""$X""`, `$X` -> `"$X"`: two quotes either way
        pos = match.end()
    parts.append(raw[pos:len(raw) - 1])
    body = "".join(parts)
    if len(body) != len(raw) - 2 or "'" in body:
        return None
    return raw[0] + body + raw[-1]


_SCRIPT_READERS = {"sbatch", "qsub"}  # submit the script they read from stdin


def _ends_command(tok: _Tok) -> bool:
    return tok.kind == "nl" or (tok.kind == "op" and (tok.text in _SEPARATORS or tok.text in "()"))


def _command_at(toks: list[_Tok], i: int) -> list[_Tok]:
    end = i
    while end < len(toks) and not _ends_command(toks[end]):
        end += 1
    return toks[i:end]


def _simple_command(toks: list[_Tok], text: str) -> tuple[list[str], str | None]:
    """The argv (prefix assignments dropped) of one simple command's tokens, and the file
    its standard output goes to (`> job.sh`, `1>> job.sh`; not `2> err.log`), if any."""
    argv: list[str] = []
    target = None
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.kind == "op" and tok.text in _REDIRECTS:
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            fd = text[tok.start:tok.end - len(tok.text)]
            if tok.text in (">", ">>", ">|") and fd in ("", "1") and nxt is not None and nxt.kind == "word":
                target = nxt.text
            i += 2
            continue
        if tok.kind == "word" and not (not argv and _ASSIGN.match(tok.text)):
            argv.append(tok.text)
        i += 1
    while argv and argv[0] in _QUIET_WRAPPERS:
        argv = argv[1:]
    return argv, target


def _reads_script(argv: list[str]) -> bool:
    """`sbatch`, `qsub`, or a shell given no script file (`bash`, `bash -s`, `sh -x`):
    what comes on standard input is a script."""
    if not argv:
        return False
    name = argv[0].rsplit("/", 1)[-1]
    if name in _SCRIPT_READERS:
        return True
    if name in _RUN_WRAPPERS:  # `srun bash <<EOF`, `nohup bash -s <<EOF`: the shell behind the wrapper
        shell = _stdin_shell(argv)
        if shell is None:
            return False
        argv, name = argv[shell:], argv[shell].rsplit("/", 1)[-1]
    return name in _SHELLS and all(w.startswith("-") and "c" not in w.lstrip("-") for w in argv[1:])


def _stdin_shell(argv: list[str]) -> int | None:
    """Index of the first shell behind the wrappers of `argv` (`srun -N 2 bash`)."""
    return next((i for i, word in enumerate(argv[1:], start=1) if word.rsplit("/", 1)[-1] in _SHELLS), None)


def _normal_target(text: str) -> str:
    """`${SCRIPT}` and `$SCRIPT`, `./job.sh` and `job.sh` name the same file."""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", r"$\1", text).removeprefix("./")


_SUBSTITUTION = re.compile(r"\$\((.*)\)|`(.*)`", re.DOTALL)
_ARGUMENT = re.compile(r"\"[^\"]*\"|'[^']*'|[^\s;&|<>()]+")


def _runs_file(doc: ShellDocument, target: str, after: int) -> bool:
    """A command after offset `after` runs the file `target`: `sbatch job.sh`,
    `bash "$SCRIPT"`, `qsub job.pbs`, `source job.sh`, `./job.sh`, also inside a command
    substitution (`JOB=$(sbatch --parsable "$SCRIPT")`)."""
    argvs = [[w.text for w in c.words] for c in doc.commands if c.span.start >= after]
    words = [w for c in doc.commands if c.span.start >= after for w in c.words]
    words += [a.value for a in doc.assignments if a.span.start >= after]
    for word in words:
        if "$(" in word.text or "`" in word.text:
            live = re.sub(r"'[^']*'", "", word.raw)  # `'$(bash x.sh)'` is a literal string
            for match in _SUBSTITUTION.finditer(live):
                inner = match.group(1) if match.group(1) is not None else match.group(2)
                argvs.append([t.strip("\"'") for t in _ARGUMENT.findall(inner)])
    for argv in argvs:
        while argv and argv[0] in _QUIET_WRAPPERS:
            argv = argv[1:]
        if not argv:
            continue
        if _normal_target(argv[0]) == target:
            return True
        name = argv[0].rsplit("/", 1)[-1]
        if name in _SCRIPT_READERS | _SHELLS | _SOURCING | {"srun"} \
                and any(_normal_target(w) == target for w in argv[1:]):
            return True
    return False


def _assignment(word: Word, kind: str, source: SourceText) -> Assignment | None:
    match = _ASSIGN.match(word.raw)
    if match is None or match.group().endswith("+="):
        return None
    name = match.group()[:-1]
    if not word.text.startswith(name + "="):
        return None
    start = word.span.start + len(name) + 1
    value = Word(word.text[len(name) + 1:], word.raw[len(name) + 1:], source.span(start, word.span.end))
    return Assignment(name, value, word.span, kind)


_QUIET_WRAPPERS = {"nohup", "exec", "time", "command", "builtin", "setsid"}


def env_wrapper_assignments(argv: list[Word] | tuple[Word, ...]) -> list[Word]:
    """The `A=B` words of an `env` wrapper at the start of argv (after nohup/exec/time)."""
    i = 0
    while i < len(argv) and argv[i].text in _QUIET_WRAPPERS:
        i += 1
    if i >= len(argv) or argv[i].text.rsplit("/", 1)[-1] != "env":
        return []
    found = []
    i += 1
    while i < len(argv):
        text = argv[i].text
        if text in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif text.startswith("-"):
            i += 1
        elif _ASSIGN.match(argv[i].raw):
            found.append(argv[i])
            i += 1
        else:
            break
    return found


# --------------------------------------------------------------------------- Makefile

_MAKE_CONDITIONALS = {"ifeq", "ifneq", "ifdef", "ifndef", "else", "endif"}
_MAKE_EXPORT = re.compile(r"export[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:=|:=|::=)[ \t]*")
_MAKE_VARIABLE = re.compile(r"(?:override[ \t]+|export[ \t]+)?[^\s:#=]+[ \t]*(?:[:?+!]|::)?=")


def _make_lines(text: str):
    """(start, end) of each logical Makefile line (backslash-newline joins lines)."""
    pos, n = 0, len(text)
    while pos < n:
        start = pos
        while True:
            end = text.find("\n", pos)
            end = n if end < 0 else end
            body = text[pos:end].rstrip("\r")
            pos = min(end + 1, n) if end < n else n
            trailing = len(body) - len(body.rstrip("\\"))
            if trailing % 2 == 0 or pos >= n:
                break
        yield start, end


def _parse_makefile(builder: _Builder) -> None:
    text = builder.source.text
    in_rule = in_define = False
    for start, end in _make_lines(text):
        line = text[start:end]
        stripped = line.strip()
        if in_define:
            in_define = stripped != "endef" and not stripped.startswith("endef ")
            continue
        if line.startswith("\t") and in_rule:
            _make_recipe(builder, start + 1, end)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        first = stripped.split(None, 1)[0]
        if first in _MAKE_CONDITIONALS:
            continue
        if re.match(r"(?:(?:export|override)\s+)*define\b", stripped):
            in_define, in_rule = True, False
        elif (match := _MAKE_EXPORT.match(line)) is not None:
            _make_export(builder, match, start, end)
            in_rule = False
        elif _MAKE_VARIABLE.match(line):
            in_rule = False
        elif ":" in line:
            in_rule = True
            colon = line.index(":")
            semi = line.find(";", colon)
            if semi >= 0:  # `target: deps ; recipe`
                _make_recipe(builder, start + semi + 1, end)
        else:
            in_rule = False


def _make_recipe(builder: _Builder, start: int, end: int) -> None:
    text = builder.source.text
    while start < end and text[start] in " \t@-+":  # echo-off, ignore-errors, always-run
        start += 1
    with builder.isolated():
        _parse_sh_range(builder, _Lexer(text, end, make=True), start)


def _make_export(builder: _Builder, match: re.Match, start: int, end: int) -> None:
    text = builder.source.text
    value_start = start + match.end()
    value_end = value_start + len(text[value_start:end].rstrip())
    comment = text.find("#", value_start, value_end)
    if comment >= 0:
        value_end = value_start + len(text[value_start:comment].rstrip())
    raw = text[value_start:value_end]
    name_start = start + match.start(1)
    value = Word(raw.replace("$$", "$"), raw, builder.source.span(value_start, value_end))
    builder.add(Assignment(match.group(1), value, builder.source.span(name_start, value_end), "export"))


# --------------------------------------------------------------------------- Dockerfile

_DOCKER_INSTRUCTION = re.compile(r"[ \t]*([A-Za-z]+)[ \t]*")
_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
# `[` then a quote: the exec form was meant (`RUN [ -f x ]` is the shell's test command)
_EXEC_FORM_MEANT = re.compile(r"""\[\s*['"\u2018\u201c]""")


def _docker_end(text: str, pos: int) -> int:
    """End of the logical instruction starting at `pos`: continuation lines end with a
    backslash; blank and comment lines inside it are dropped by Docker."""
    n = len(text)
    while pos < n:
        eol = text.find("\n", pos)
        eol = n if eol < 0 else eol
        body = text[pos:eol].rstrip()
        pos = eol + 1
        if not body.endswith("\\"):
            return min(eol, n)
        while pos < n:  # skip the comment / blank lines Docker removes
            nxt = text.find("\n", pos)
            nxt = n if nxt < 0 else nxt
            line = text[pos:nxt].strip()
            if line and not line.startswith("#"):
                break
            pos = nxt + 1
    return n


def _parse_dockerfile(builder: _Builder) -> None:
    text, n, pos = builder.source.text, len(builder.source.text), 0
    stage = _DockerStage()
    while pos < n:
        eol = text.find("\n", pos)
        eol = n if eol < 0 else eol
        stripped = text[pos:eol].strip()
        match = _DOCKER_INSTRUCTION.match(text, pos, eol)
        if not stripped or stripped.startswith("#") or match is None:
            pos = eol + 1
            continue
        keyword, args = match.group(1).upper(), match.end()
        end = _docker_end(text, pos)
        if keyword in ("RUN", "CMD", "ENTRYPOINT"):
            before = len(builder.doc.commands)
            with builder.isolated():
                end = _docker_command(builder, keyword, args, end)
            if keyword != "RUN":
                exec_form = text.startswith("[", args) and len(builder.doc.commands) == before + 1
                stage.set(keyword, builder.doc.commands[before] if exec_form else None, before)
        elif keyword == "ENV":
            _docker_env(builder, args, end, stage.args)
        elif keyword == "ARG":
            stage.arg(builder, args, end)
        elif keyword == "FROM":
            _docker_run_command(builder, stage)
            stage = _DockerStage(stage.global_args)
            stage.started = True
        pos = end + 1
    _docker_run_command(builder, stage)


class _DockerStage:
    """What one build stage (`FROM` to `FROM`) says about the container's command: the last
    ENTRYPOINT and CMD (exec form, or None for the shell form), and its ARG defaults."""

    def __init__(self, global_args: dict[str, str] | None = None) -> None:
        self.global_args = dict(global_args or {})  # ARGs before the first FROM
        self.args: dict[str, str] = {}
        self.started = False
        self.entrypoint: tuple[Command | None, int] | None = None
        self.cmd: tuple[Command | None, int] | None = None

    def set(self, keyword: str, command: Command | None, index: int) -> None:
        if keyword == "ENTRYPOINT":
            self.entrypoint = (command, index)
            self.cmd = None  # Docker: a new ENTRYPOINT resets an inherited CMD
        else:
            self.cmd = (command, index)

    def arg(self, builder: _Builder, start: int, end: int) -> None:
        """`ARG NAME=default`; a global ARG redeclared in the stage keeps its default."""
        for word in builder.source.text[start:end].split():
            name, eq, value = word.partition("=")
            if not _IDENT.fullmatch(name):
                continue
            value = value.strip("\"'") if eq else (self.global_args if self.started else {}).get(name, "")
            (self.args if self.started else self.global_args)[name] = value


def _docker_run_command(builder: _Builder, stage: _DockerStage) -> None:
    """`ENTRYPOINT ["torchrun", "--nproc_per_node=4"]` + `CMD ["train.py", ...]`: the
    container runs the two as one command (Docker appends CMD to an exec-form ENTRYPOINT),
    which replaces the two halves as launches."""
    if stage.entrypoint is None or stage.cmd is None:
        return
    (entry, entry_index), (cmd, cmd_index) = stage.entrypoint, stage.cmd
    if entry is None or cmd is None:  # a shell-form ENTRYPOINT ignores CMD; a shell-form CMD is `sh -c` text
        return
    words = entry.words + cmd.words
    start = min(entry.span.start, cmd.span.start)
    end = max(entry.span.end, cmd.span.end)
    span = builder.source.span(start, end)
    commands = builder.doc.commands
    for index in sorted((entry_index, cmd_index), reverse=True):
        if index < len(commands) and commands[index] in (entry, cmd):
            del commands[index]
    commands.append(Command(words, (), span))
    builder.doc.scopes.setdefault(span.start, builder.doc.scopes.get(entry.span.start, ()))

def _docker_command(builder: _Builder, keyword: str, start: int, end: int) -> int:
    """Parse a RUN/CMD/ENTRYPOINT body; returns where the instruction really ends."""
    text = builder.source.text
    if text.startswith("[", start) and (words := _docker_exec_form(builder.source, start, end)):
        span = builder.source.span(words[0].span.start, words[-1].span.end)
        builder.doc.commands.append(Command(tuple(words), (), span))
        builder.doc.scopes.setdefault(span.start, builder.scope())
        builder.inline_script(words)
        return end
    if _EXEC_FORM_MEANT.match(text, start, end) and text[start:end].rstrip().endswith("]"):
        builder.doc.bad_exec_forms.append((keyword, start, len(text[:end].rstrip())))
    heredoc = "<<" in text[start:end]  # BuildKit heredocs run past the instruction line
    lexer = _Lexer(text, None if heredoc else end, docker=True)
    try:
        toks, stop = lexer.line(start)
    except _Unbalanced:
        return end
    if keyword == "RUN":  # `RUN --mount=... cmd`: BuildKit flags are not the command
        while toks and toks[0].kind == "word" and toks[0].text.startswith("--"):
            toks.pop(0)
    builder.feed(toks)
    return max(end, stop - 1) if heredoc else end


def _docker_exec_form(source: SourceText, start: int, end: int) -> list[Word] | None:
    """`CMD ["torchrun", "--nproc_per_node", "2", "train.py"]`: JSON strings as words."""
    body = re.sub(r"\\\r?\n", "", source.text[start:end])
    try:
        values = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, a >4,300-digit integer, absurd nesting
        return None
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return None
    tokens = list(_JSON_STRING.finditer(source.text, start, end))
    if [json.loads(t.group()) for t in tokens] != values:
        return None
    return [Word(json.loads(t.group()), t.group(), source.span(t.start(), t.end())) for t in tokens]


def _docker_env(builder: _Builder, start: int, end: int, args: dict[str, str] | None = None) -> None:
    """`ENV A=B C="d e"` or the legacy `ENV A some value`. Docker substitutes the stage's
    ARG values into ENV at build time (`ARG NPROC=4` + `ENV NPROC=${NPROC}`): the launch
    sees the substituted value at run time."""
    first = len(builder.doc.assignments)
    _docker_env_words(builder, start, end)
    if not args:
        return
    for i in range(first, len(builder.doc.assignments)):
        assignment = builder.doc.assignments[i]
        value = assignment.value
        if "$" in value.text:
            text = _DOCKER_VAR.sub(lambda m: _docker_substitute(m, args), value.text)
            builder.doc.assignments[i] = Assignment(assignment.name, Word(text, value.raw, value.span),
                                                    assignment.span, assignment.kind)


_DOCKER_VAR = re.compile(r"\$\{(\w+)(?::?([-+])([^}]*))?\}|\$(\w+)")


def _docker_substitute(match: re.Match, args: dict[str, str]) -> str:
    name = match.group(1) or match.group(4)
    if name not in args:
        return match.group(0)  # not an ARG: stays as written (unknown, or an ENV set earlier)
    value, op, word = args[name], match.group(2), match.group(3)
    if op == "-":
        return value or word
    if op == "+":
        return word if value else ""
    return value


def _docker_env_words(builder: _Builder, start: int, end: int) -> None:
    try:
        toks, _ = _Lexer(builder.source.text, end, docker=True).line(start)
    except _Unbalanced:
        return
    words = [builder._word(t) for t in toks if t.kind == "word"]
    if not words:
        return
    if _ASSIGN.match(words[0].raw):
        for word in words:
            assignment = _assignment(word, "env", builder.source)
            if assignment is not None:
                builder.add(assignment)
    elif len(words) > 1 and _IDENT.fullmatch(words[0].text):
        first, last = words[1].span, words[-1].span
        raw = builder.source.text[first.start:last.end]
        value = Word(" ".join(w.text for w in words[1:]), raw, builder.source.span(first.start, last.end))
        span = builder.source.span(words[0].span.start, last.end)
        builder.add(Assignment(words[0].text, value, span, "env"))


# --------------------------------------------------------------------------- .env

_DOTENV = re.compile(r"[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.]*)[ \t]*=[ \t]*")
_DOTENV_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "$": "$"}


def _parse_env(doc: ShellDocument) -> None:
    source = doc.source
    text, n, pos = source.text, len(source.text), 0
    while pos < n:
        eol = text.find("\n", pos)
        eol = n if eol < 0 else eol
        match = _DOTENV.match(text, pos, eol)
        if match is None:
            pos = eol + 1
            continue
        start = match.end()
        quote = text[start] if start < n and text[start] in "\"'" else ""
        if quote:
            value_end, value_text = _dotenv_quoted(text, start, quote)
            if value_end < 0:  # unterminated: skip the line
                pos = eol + 1
                continue
            eol = text.find("\n", value_end)
            eol = n if eol < 0 else eol
        else:
            line = text[start:eol]
            cut = re.search(r"[ \t]#", line)  # `A=b # comment`
            value_text = (line[:cut.start()] if cut else line).strip()
            value_end = start + len(value_text)
        raw = text[start:value_end]
        value = Word(value_text, raw, source.span(start, value_end))
        doc.assignments.append(Assignment(match.group(1), value, source.span(match.start(1), value_end), "env"))
        doc.scopes[match.start(1)] = ()
        pos = eol + 1


def _dotenv_quoted(text: str, start: int, quote: str) -> tuple[int, str]:
    """(offset after the closing quote, value) of a quoted .env value; (-1, "") if open."""
    out, i = [], start + 1
    while i < len(text):
        c = text[i]
        if c == quote:
            return i + 1, "".join(out)
        if c == "\\" and quote == '"' and i + 1 < len(text):
            out.append(_DOTENV_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
            i += 2
            continue
        out.append(c)
        i += 1
    return -1, ""
