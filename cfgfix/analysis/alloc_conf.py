"""`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`: the allocator's grammar as data, a
parser that keeps every token's offsets, where a Python file sets the variable, and whether
CUDA had already read it by then (CFX304, CFX305; facts A8).

The grammar follows torch's own parser (`c10/core/AllocatorConfig.{h,cpp}`: a
`ConfigTokenizer` splits on `,` `:` `[` `]` and drops whitespace; the CUDA keys come from
`c10/cuda/CUDAAllocatorConfig.cpp`). Offsets are into the variable's value, so a rule can
point at `true` inside `"expandable_segments:true"` and replace just that token.
"""

from __future__ import annotations

import ast
import difflib
import re

from cfgfix.analysis.names import gpu_branch, module_statements, walk_scope
from cfgfix.records import dataclass

VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
CUDA_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
TABLE_VERSION = "2.13"  # the torch release the key table was read from

# --------------------------------------------------------------------------- the grammar


@dataclass(frozen=True)
class KeySpec:
    kind: str  # "bool" | "size" | "float" | "roundup" | "threads" | "backend" | "any"
    minimum: float | None = None  # for "size" / "float"
    min_inclusive: bool = True
    maximum: float | None = None
    max_inclusive: bool = True
    native_only: bool = False  # ignored (with a warning) under backend:cudaMallocAsync
    cuda_only: bool = False  # parsed by the CUDA allocator only (c10/cuda)


# torch 2.13, plus the two reserve keys of later releases (so they are never called typos).
# Minimums: kLargeBuffer (20 MiB) for the split sizes, kMinLargeAlloc (10 MiB, exclusive)
# for large_segment_size_mb, kPinnedMaxRegisterThreads (128) for the register threads.
KEYS: dict[str, KeySpec] = {
    # generic (AcceleratorAllocatorConfig)
    "large_segment_size_mb": KeySpec("size", minimum=10, min_inclusive=False),
    "max_split_size_mb": KeySpec("size", minimum=20, native_only=True),
    "max_non_split_rounding_mb": KeySpec("size", minimum=20),
    "garbage_collection_threshold": KeySpec(
        "float", minimum=0, min_inclusive=False, maximum=1, max_inclusive=False, native_only=True
    ),
    "roundup_power2_divisions": KeySpec("roundup", native_only=True),
    "expandable_segments": KeySpec("bool"),
    "pinned_use_background_threads": KeySpec("bool"),
    "pinned_max_round_threshold_mb": KeySpec("any"),
    "pinned_max_cached_size_mb": KeySpec("any"),
    # CUDA only (CUDAAllocatorConfig); the hip spellings are accepted on every build
    "backend": KeySpec("backend", cuda_only=True),
    "release_lock_on_cudamalloc": KeySpec("bool", cuda_only=True),
    "release_lock_on_hipmalloc": KeySpec("bool", cuda_only=True),
    "pinned_use_cuda_host_register": KeySpec("bool", cuda_only=True),
    "pinned_use_hip_host_register": KeySpec("bool", cuda_only=True),
    "graph_capture_record_stream_reuse": KeySpec("bool", cuda_only=True),
    "pinned_reserve_segment_size_mb": KeySpec("size", minimum=0, min_inclusive=False, cuda_only=True),
    "pinned_num_register_threads": KeySpec("threads", maximum=128, cuda_only=True),
    "per_process_memory_fraction": KeySpec("float", minimum=0, maximum=1, cuda_only=True),
    "pinned_free_catch_all": KeySpec("bool", cuda_only=True),
    "throw_on_cudamalloc_oom": KeySpec("bool", cuda_only=True),
    "expandable_segments_reserve": KeySpec("any", cuda_only=True),
    "expandable_segments_reserve_by_class": KeySpec("any", cuda_only=True),
}
BACKENDS = ("native", "cudaMallocAsync", "hipMallocAsync")
ASYNC_BACKENDS = ("cudaMallocAsync", "hipMallocAsync")

# What torch's std::stoull / std::stod accept: a numeric prefix (the rest is ignored).
_INT_PREFIX = re.compile(r"[+-]?\d+")
_FLOAT_PREFIX = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.IGNORECASE)


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Token:
    text: str  # as torch compares it: whitespace removed
    start: int  # offsets into the value string
    end: int


@dataclass(frozen=True)
class Option:
    key: Token
    colon: bool  # a `:` followed the key
    value: Token | None  # a scalar value; None for a list or a missing value
    items: tuple[tuple[Token, Token | None], ...] | None  # `[64:8,>:1]` entries
    end: int  # offset after the option's last token


def tokenize(value: str) -> list[Token]:
    """torch's ConfigTokenizer, keeping offsets: separators are tokens of their own and
    whitespace is dropped (also inside a word: `expandable _segments` is one key)."""
    tokens: list[Token] = []
    chars: list[str] = []
    start = end = 0
    for i, ch in enumerate(value):
        if ch in ",:[]":
            if chars:
                tokens.append(Token("".join(chars), start, end))
                chars = []
            tokens.append(Token(ch, i, i + 1))
        elif not ch.isspace():
            if not chars:
                start = i
            chars.append(ch)
            end = i + 1
    if chars:
        tokens.append(Token("".join(chars), start, end))
    return tokens


def parse(value: str) -> list[Option]:
    """The options of a settings string, in order. Parsing stops quietly at a structure it
    cannot follow (torch would raise there too, but cfgfix does not guess at intent)."""
    toks = tokenize(value)
    options: list[Option] = []
    i, n = 0, len(toks)
    while i < n:
        key = toks[i]
        if key.text == ",":
            i += 1
            continue
        if key.text in ":[]":
            break
        if i + 1 >= n or toks[i + 1].text != ":":
            options.append(Option(key, False, None, None, key.end))
            i += 1
            while i < n and toks[i].text != ",":
                i += 1
            continue
        i += 2
        if i >= n or toks[i].text == ",":
            options.append(Option(key, True, None, None, toks[i - 1].end))
        elif toks[i].text == "[":
            items, i, closed = _list_items(toks, i + 1)
            if not closed:
                break
            options.append(Option(key, True, None, tuple(items), toks[i].end))
            i += 1
        elif toks[i].text in ":]":
            break
        else:
            options.append(Option(key, True, toks[i], None, toks[i].end))
            i += 1
        if i < n and toks[i].text != ",":
            break  # `a:b:c`: torch expects a comma here
    return options


def _list_items(toks: list[Token], i: int) -> tuple[list[tuple[Token, Token | None]], int, bool]:
    items: list[tuple[Token, Token | None]] = []
    n = len(toks)
    while i < n and toks[i].text != "]":
        if toks[i].text == ",":
            i += 1
            continue
        left = toks[i]
        right = None
        if i + 2 < n and toks[i + 1].text == ":" and toks[i + 2].text not in ",[]:":
            right = toks[i + 2]
            i += 3
        else:
            i += 1
        items.append((left, right))
    return items, i, i < n


# --------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Problem:
    severity: str  # "error" | "warning"
    start: int  # offsets into the value
    end: int
    message: str
    replacement: tuple[int, int, str] | None = None  # a safe edit: value[start:end] -> text


def close_keys(key: str) -> list[str]:
    """Known keys a typo most likely meant: one when the choice is clear."""
    lowered = key.lower()
    if lowered in KEYS:
        return [lowered]
    scored = sorted(
        ((difflib.SequenceMatcher(None, lowered, k).ratio(), k) for k in KEYS), reverse=True
    )
    close = [(r, k) for r, k in scored if r >= 0.8]
    if len(close) > 1 and close[0][0] - close[1][0] >= 0.05:
        close = close[:1]
    return [k for _, k in close]


def check(value: str, variable: str, report_unknown: bool, unknown: tuple = ()) -> list[Problem]:
    """Every problem in a settings string. `report_unknown`: also report keys that look
    like no known key (only where the CUDA allocator would reject them and the key table is
    not older than the project's torch). `unknown`: the (start, end) ranges of the string
    that are computed when it runs (an f-string's `{mb}`): an option with a part there is
    not judged alone, only in combination with the others (`max_split_size_mb:{mb}` beside
    `expandable_segments:True`)."""
    options = parse(value)
    problems: list[Problem] = []
    flagged: set[int] = set()
    for option in options:
        if any(start < option.end and option.key.start < end for start, end in unknown):
            continue
        found = _check_option(option, value, variable, report_unknown)
        if found:
            flagged.add(id(option))
            problems.extend(found)
    problems.extend(_combinations(options, flagged))
    return problems


def _check_option(option: Option, value: str, variable: str, report_unknown: bool) -> list[Problem]:
    key = option.key
    spec = KEYS.get(key.text)
    if spec is None:
        return _unknown_key(option, value, variable, report_unknown)
    shown = value[key.start:option.end] if option.colon else key.text
    if option.value is None and option.items is None:
        return [Problem("error", key.start, key.end, f"`{key.text}` has no value: write `{key.text}:VALUE`; "
                        "torch's parser fails on this string at the first CUDA allocation.")]
    if spec.kind == "any":
        return []
    if spec.kind == "roundup":
        return _roundup(option, shown)
    if option.value is None:
        return [Problem("error", key.start, option.end, f"`{key.text}` takes a single value, not a list.")]
    token = option.value
    text = token.text
    if spec.kind == "bool":
        return _boolean(key.text, token, value)
    if spec.kind == "backend":
        return _backend(token, value)
    if spec.kind in ("size", "threads"):
        match = _INT_PREFIX.match(text)
        if match is None:
            return [_bad_value(token, f"`{shown}`: `{key.text}` takes a whole number, and torch raises "
                                      f"`std::invalid_argument` on `{text}` at the first CUDA allocation.")]
        number = int(match.group())
        if number < 0:
            return []  # stoull wraps it to a huge size: accepted, if odd
        if spec.kind == "threads":
            if number == 0 or number & (number - 1) or number > (spec.maximum or 0):
                return [_bad_value(token, f"`{shown}`: `{key.text}` must be a power of two no larger than "
                                          f"{int(spec.maximum or 0)}; torch raises at the first CUDA allocation.")]
            return _trailing(token, match, shown, key.text)
        return _range(key.text, token, number, spec, shown, unit=" MB") or _trailing(token, match, shown, key.text)
    if spec.kind == "float":
        match = _FLOAT_PREFIX.match(text)
        if match is None:
            return [_bad_value(token, f"`{shown}`: `{key.text}` takes a number, and torch raises "
                                      f"`std::invalid_argument` on `{text}` at the first CUDA allocation.")]
        number = float(match.group())
        return _range(key.text, token, number, spec, shown, unit="") or _trailing(token, match, shown, key.text)
    return []


def _trailing(token: Token, match: re.Match, shown: str, key: str) -> list[Problem]:
    """`max_split_size_mb:512MB`: torch reads the leading number and silently drops the rest."""
    rest = token.text[match.end():]
    if not rest:
        return []
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return [Problem("warning", token.start, token.end,
                    f"`{shown}`: torch reads only the leading number `{match.group()}` and silently ignores "
                    f"`{rest if len(rest) <= 40 else rest[:37] + '...'}`"
                    + (" (the key name already gives the unit)" if key.endswith("_mb") else "")
                    + ". Write the number alone.")]


def _bad_value(token: Token, message: str) -> Problem:
    return Problem("error", token.start, token.end, message)


def _boolean(key: str, token: Token, value: str) -> list[Problem]:
    text = token.text
    if text in ("True", "False"):
        return []
    case = text.lower() in ("true", "false")
    message = (
        f"`{key}:{text}`: " + ("allocator booleans are case-sensitive. " if case else "")
        + f"Only `True` and `False` are accepted; `{text}` raises `ValueError: Expected 'True' or "
        "'False'` at the first CUDA allocation (a CPU-only run never reads it, so the error first "
        "shows on the GPU machine)."
    )
    if case and value[token.start:token.end] == text:
        fixed = text.capitalize()
        return [Problem("error", token.start, token.end, message + f" Write `{key}:{fixed}`.",
                        (token.start, token.end, fixed))]
    return [Problem("error", token.start, token.end, message)]


def _backend(token: Token, value: str) -> list[Problem]:
    text = token.text
    if text in BACKENDS:
        return []
    message = (
        f"`backend:{text}` is not an allocator backend: torch accepts `native` and "
        "`cudaMallocAsync` and raises `Unknown allocator backend` at the first CUDA use."
    )
    exact = [b for b in BACKENDS if b.lower() == text.lower()]
    if exact and value[token.start:token.end] == text:
        return [Problem("error", token.start, token.end, message + f" Write `backend:{exact[0]}`.",
                        (token.start, token.end, exact[0]))]
    return [Problem("error", token.start, token.end, message)]


def _range(key: str, token: Token, number: float, spec: KeySpec, shown: str, unit: str) -> list[Problem]:
    low, high = spec.minimum, spec.maximum
    too_low = low is not None and (number < low or (number == low and not spec.min_inclusive))
    too_high = high is not None and (number > high or (number == high and not spec.max_inclusive))
    if not (too_low or too_high):
        return []
    if key == "max_split_size_mb":
        why = ("torch raises `CachingAllocator option max_split_size_mb too small, must be >= 20` "
               "at the first CUDA allocation. Blocks under 20 MB are never split anyway; use 20 or more.")
    else:
        left = "[" if spec.min_inclusive else "("
        right = "]" if spec.max_inclusive else ")"
        if low is not None and high is not None:
            allowed = f"in {left}{_num(low)}, {_num(high)}{right}"
        elif low is not None:
            allowed = f"{'>=' if spec.min_inclusive else '>'} {_num(low)}{unit}"
        else:
            allowed = f"{'<=' if spec.max_inclusive else '<'} {_num(high)}{unit}"
        why = f"`{key}` must be {allowed}; torch raises at the first CUDA allocation."
    return [Problem("error", token.start, token.end, f"`{shown}`: {why}")]


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def _power_of_two(text: str, zero_ok: bool) -> bool:
    match = _INT_PREFIX.match(text)
    if match is None:
        return False
    number = int(match.group())
    if number == 0:
        return zero_ok
    return number > 0 and not number & (number - 1)


def _roundup(option: Option, shown: str) -> list[Problem]:
    key = option.key.text
    if option.value is not None:
        token = option.value
        if not _power_of_two(token.text, zero_ok=False):
            return [_bad_value(token, f"`{shown}`: `{key}` must be a power of two (1, 2, 4, 8, ...), or a "
                                      "list such as `[256:1,512:2,>:4]`; torch raises at the first CUDA allocation.")]
        return []
    problems = []
    for left, right in option.items or ():
        if right is None:
            problems.append(_bad_value(left, f"`{shown}`: each entry of `{key}` is `SIZE_MB:DIVISIONS` "
                                             "(or `>:DIVISIONS`); torch fails to parse this list."))
        elif left.text != ">" and not _power_of_two(left.text, zero_ok=False):
            problems.append(_bad_value(left, f"`{shown}`: the size `{left.text}` in `{key}` must be a power of "
                                             "two (in MB) or `>`; torch raises at the first CUDA allocation."))
        elif not _power_of_two(right.text, zero_ok=True):
            problems.append(_bad_value(right, f"`{shown}`: the divisions `{right.text}` in `{key}` must be a "
                                              "power of two, or 0 to turn rounding off; torch raises at the "
                                              "first CUDA allocation."))
    return problems


def _unknown_key(option: Option, value: str, variable: str, report_unknown: bool) -> list[Problem]:
    key = option.key
    exact = value[key.start:key.end] == key.text  # no whitespace inside: safe to replace
    if "=" in key.text:
        name = key.text.split("=", 1)[0]
        if name in KEYS and exact:
            at = key.start + key.text.index("=")
            fixed = key.text.replace("=", ":", 1)
            return [Problem(
                "error", key.start, key.end,
                f"`{key.text}` uses `=`: allocator options are `key:value`, so torch reads one unknown key "
                f"`{key.text}` (the CUDA allocator raises `Unrecognized key`; a CPU build ignores it "
                f"silently). Write `{fixed}`.",
                (at, at + 1, ":"),
            )]
    candidates = close_keys(key.text)
    where = "the CUDA allocator raises `Unrecognized key` at the first CUDA allocation"
    silent = "a CPU-only build accepts it silently, so CI never notices"
    if len(candidates) == 1 and exact:
        fixed = candidates[0]
        return [Problem("error", key.start, key.end,
                        f"`{key.text}` is not an allocator option (did you mean `{fixed}`?): {where}; {silent}.",
                        (key.start, key.end, fixed))]
    if candidates:
        listed = " or ".join(f"`{c}`" for c in candidates[:3])
        return [Problem("error", key.start, key.end,
                        f"`{key.text}` is not an allocator option (did you mean {listed}?): {where}; {silent}.")]
    if report_unknown and variable == CUDA_VARIABLE:
        return [Problem("error", key.start, key.end,
                        f"`{key.text}` is not an allocator option torch {TABLE_VERSION} knows: {where}; {silent}.")]
    return []


def _combinations(options: list[Option], flagged: set[int]) -> list[Problem]:
    """Options that are valid alone but do nothing together (warnings)."""
    by_key = {o.key.text: o for o in options if o.value is not None or o.items is not None}
    problems = []
    backend = by_key.get("backend")
    if backend is not None and backend.value is not None and backend.value.text in ASYNC_BACKENDS:
        for option in options:
            spec = KEYS.get(option.key.text)
            if spec is not None and spec.native_only and id(option) not in flagged and option.colon:
                problems.append(Problem(
                    "warning", option.key.start, option.end,
                    f"`{option.key.text}` does nothing with `backend:{backend.value.text}`: the asynchronous "
                    "backend is CUDA's own pool allocator, and torch ignores `max_split_size_mb`, "
                    "`roundup_power2_divisions` and `garbage_collection_threshold` there (with a warning). "
                    "Drop it, or use the native backend.",
                ))
        return problems
    expandable = by_key.get("expandable_segments")
    split = by_key.get("max_split_size_mb")
    if (expandable is not None and expandable.value is not None and expandable.value.text == "True"
            and split is not None and id(split) not in flagged):
        shown = f"max_split_size_mb:{split.value.text}" if split.value is not None else "max_split_size_mb"
        problems.append(Problem(
            "warning", split.key.start, split.end,
            f"`{shown}` with `expandable_segments:True` does not reduce fragmentation: with expandable "
            "segments the allocator ignores max_split_size when it decides whether to split a block, "
            "and the pair has crashed the allocator with an INTERNAL ASSERT (pytorch/pytorch#119452). "
            "`expandable_segments:True` alone is the documented setting against fragmentation.",
        ))
    return problems


# --------------------------------------------------------------------------- Python sites


@dataclass(frozen=True)
class Setting:
    """One place a Python file sets the variable in its own environment."""

    variable: str
    stmt: ast.stmt  # the statement that sets it
    value: ast.expr | None  # the value expression as written
    literal: ast.Constant | None  # the string constant it resolves to (maybe elsewhere)
    root: str  # the name the statement reaches `os` through (`os`, `environ`, `putenv`)
    # An f-string value (`f"expandable_segments:True,max_split_size_mb:{mb}"`): its text, each
    # `{...}` replaced by the constant it names when bound once, else by its own source, and
    # the ranges of the text that stay unknown until it runs (`check`'s `unknown`), and the
    # f-string node (maybe bound to a name elsewhere).
    template: tuple[str, tuple, ast.JoinedStr] | None = None


_SETTERS = ("os.environ.setdefault", "os.putenv", "os.environ.update")


def python_settings(ctx) -> list[Setting]:
    """Every `os.environ[V] = ...`, `os.environ.setdefault(V, ...)`, `os.putenv(V, ...)` and
    `os.environ.update({V: ...})` for V in VARIABLES (computed once per file)."""
    if "alloc-conf-settings" not in ctx.notes:
        ctx.notes["alloc-conf-settings"] = _python_settings(ctx)
    return ctx.notes["alloc-conf-settings"]


def _python_settings(ctx) -> list[Setting]:
    index = ctx.index
    imports = index.imports
    found: list[Setting] = []
    scopes = _Scopes(index)
    for stmt in module_statements(index.tree):
        if not isinstance(stmt, ast.Assign):
            continue
        for target in stmt.targets:
            if not isinstance(target, ast.Subscript) or imports.qualify(target.value) != "os.environ":
                continue
            name = scopes.string(target.slice, stmt)
            if name in VARIABLES:
                root = _root_name(target.value)
                found.append(Setting(name, stmt, stmt.value, scopes.literal(stmt.value, stmt), root,
                                     scopes.template(stmt.value, stmt)))
    for site in index.calls_named(*_SETTERS):
        call, stmt = site.node, site.context.stmt
        root = _root_name(call.func)
        if site.name == "os.environ.update":
            pairs = []
            if len(call.args) == 1 and isinstance(call.args[0], ast.Dict):
                pairs = [(k, v) for k, v in zip(call.args[0].keys, call.args[0].values) if k is not None]
            pairs += [(ast.Constant(kw.arg), kw.value) for kw in call.keywords if kw.arg]
            for key, value in pairs:
                name = scopes.string(key, stmt)
                if name in VARIABLES:
                    found.append(Setting(name, stmt, value, scopes.literal(value, stmt), root,
                                         scopes.template(value, stmt)))
        elif len(call.args) == 2 and not call.keywords:
            name = scopes.string(call.args[0], stmt)
            if name in VARIABLES:
                found.append(Setting(name, stmt, call.args[1], scopes.literal(call.args[1], stmt), root,
                                     scopes.template(call.args[1], stmt)))
    found.sort(key=lambda s: (s.stmt.lineno, s.stmt.col_offset))
    return found


def _root_name(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


class _Scopes:
    """Resolve a name to the string constant it is bound to once in its scope."""

    def __init__(self, index) -> None:
        self.index = index
        self.cache: dict[int, dict[str, ast.expr]] = {}
        self.stored: dict[int, set[str]] = {}

    def literal(self, node: ast.expr | None, stmt: ast.stmt) -> ast.Constant | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node
        if isinstance(node, ast.Name):
            value = self._lookup(node.id, stmt)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value
        return None

    def string(self, node: ast.expr | None, stmt: ast.stmt) -> str | None:
        literal = self.literal(node, stmt)
        return literal.value if literal is not None else None

    def template(self, node: ast.expr | None, stmt: ast.stmt) -> tuple[str, tuple, ast.JoinedStr] | None:
        """An f-string's text (also through a name bound once to one), with the ranges that
        stay unknown; None for anything else."""
        if isinstance(node, ast.Name):
            node = self._lookup(node.id, stmt)
        if not isinstance(node, ast.JoinedStr):
            return None
        text, unknown = "", []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                text += part.value
                continue
            if not isinstance(part, ast.FormattedValue):
                return None
            value = part.value
            if isinstance(value, ast.Name):
                value = self._lookup(value.id, stmt) or value
            if isinstance(value, ast.Constant) and isinstance(value.value, (str, int, float)) \
                    and part.conversion == -1 and part.format_spec is None:
                text += str(value.value)
                continue
            shown = "{" + ast.unparse(part.value) + "}"
            if any(ch in shown for ch in ",:[]") or any(ch.isspace() for ch in shown):
                shown = "{...}"
            unknown.append((len(text), len(text) + len(shown)))
            text += shown
        return text, tuple(unknown), node

    def _lookup(self, name: str, stmt: ast.stmt) -> ast.expr | None:
        function = self.index.contexts[id(stmt)].function if id(stmt) in self.index.contexts else None
        if function is not None and not isinstance(function, ast.Lambda):
            value = self._assignments(function).get(name)
            if value is not None or name in self._stores(function):
                return value
        return self._assignments(self.index.tree).get(name)

    def _assignments(self, scope) -> dict[str, ast.expr]:
        if id(scope) not in self.cache:
            self.cache[id(scope)] = _bound_once(scope.body)
        return self.cache[id(scope)]

    def _stores(self, function) -> set[str]:
        if id(function) not in self.stored:
            self.stored[id(function)] = {
                n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            } | {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
        return self.stored[id(function)]


def _bound_once(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names a scope binds exactly once, by `NAME = value`, to that value. (Subscript and
    attribute targets such as `os.environ[KEY] = ...` bind nothing.)"""
    counts: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    for stmt in body:
        for node in walk_scope(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                counts[node.id] = counts.get(node.id, 0) + 1
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    counts[name] = counts.get(name, 0) + 2
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = (alias.asname or alias.name).split(".")[0]
                    counts[name] = counts.get(name, 0) + 2
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                counts[node.name] = counts.get(node.name, 0) + 2
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                values[node.target.id] = node.value
    return {name: value for name, value in values.items() if counts.get(name) == 1}


_LITERAL = re.compile(r"([rRuU]?)('''|\"\"\"|'|\")(.*)\2", re.DOTALL)


def literal_base(source, node: ast.Constant) -> int | None:
    """File offset of the first character of a string constant's value, when the source
    spells the value character for character (no escapes, no implicit concatenation)."""
    span = source.span_of_node(node)
    match = _LITERAL.fullmatch(source.text[span.start:span.end])
    if match is None or match.group(3) != node.value:
        return None
    return span.start + match.start(3)


# --------------------------------------------------------------------------- CUDA order (CFX304)


@dataclass(frozen=True)
class CudaUse:
    call: ast.Call  # the call that initialises CUDA (in a helper when `via` is set)
    what: str  # how the message names it
    via: ast.Call | None = None  # the call of a local function that does it


# torch.cuda calls that initialise CUDA (they call `_lazy_init` / `device_lazy_init`).
# Not here on purpose: is_available, device_count, is_initialized (they query the driver
# without creating the allocator), manual_seed*/seed* (queued until init), empty_cache and
# the memory_* statistics (no-ops before init), amp.* and nvtx.* (no device work).
CUDA_INIT_CALLS = frozenset(
    "torch.cuda." + name
    for name in (
        "init", "set_device", "current_device", "synchronize", "get_device_name",
        "get_device_properties", "get_device_capability", "mem_get_info", "is_bf16_supported",
        "set_per_process_memory_fraction", "current_stream", "default_stream", "Stream",
        "ipc_collect", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "caching_allocator_alloc", "CUDAGraph",
    )
)
# Constructors and entry points that place work on the GPU when they run.
GPU_ENTRY_POINTS = {
    "accelerate.Accelerator": "`Accelerator()`",
    "accelerate.PartialState": "`PartialState()`",
    "deepspeed.initialize": "`deepspeed.initialize()`",
}
# Calls outside torch.* that put a model on the device named by `device=` when they run.
DEVICE_PLACERS = frozenset({"transformers.pipeline", "sentence_transformers.SentenceTransformer"})
# Calls after which the variable may be meant for a child process, not this one.
SPAWNS = frozenset({
    "subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "os.system", "os.popen", "os.execv", "os.execvp", "os.execve",
    "os.execvpe", "os.execl", "os.execlp", "os.spawnv", "os.spawnl", "os.posix_spawn",
    "multiprocessing.Process", "torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
    "torch.multiprocessing.Process", "torch.distributed.run.run", "torch.distributed.launcher.api.elastic_launch",
})
_CUDA_DEVICE = re.compile(r"cuda(?::\d+)?")
_HOST_MAPS = {"cpu", "meta", "disk"}
_MAIN_GUARD = re.compile(r"__name__\s*==\s*['\"]__main__['\"]|['\"]__main__['\"]\s*==\s*__name__")


class CudaOrder:
    """Which CUDA use has certainly run before a statement runs.

    "Certainly" means: in a statement before it in the same block or an enclosing one
    (including blocks of the `def` that holds it: a function cannot run before its `def`),
    and not behind a branch, a loop body, a `try` body, a lambda or a short-circuit. A call
    of a module-level function counts when that function's body certainly uses CUDA
    before any `return`."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.index = ctx.index
        self.imports = ctx.index.imports
        self.source = ctx.source
        self.parents: dict[int, tuple[ast.AST | None, str, list[ast.stmt]]] = {}
        self._index_parents(self.index.tree.body, None, "body")
        self.functions: dict[str, ast.AST] = {}
        duplicate: set[str] = set()
        for stmt in self.index.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.name in self.functions:
                    duplicate.add(stmt.name)
                self.functions[stmt.name] = stmt
        for name in duplicate:
            del self.functions[name]
        self.memo: dict[int, CudaUse | None] = {}
        self.scopes = _Scopes(self.index)

    def _index_parents(self, body, parent, field) -> None:
        stack = [(body, parent, field)]
        while stack:
            block, owner, name = stack.pop()
            for stmt in block:
                self.parents[id(stmt)] = (owner, name, block)
                for sub in ("body", "orelse", "finalbody"):
                    children = getattr(stmt, sub, None)
                    if isinstance(children, list) and children and isinstance(children[0], ast.stmt):
                        stack.append((children, stmt, sub))
                for handler in getattr(stmt, "handlers", None) or ():
                    stack.append((handler.body, stmt, "handlers"))
                for case in getattr(stmt, "cases", None) or ():
                    stack.append((case.body, stmt, "cases"))

    def unconditional(self, stmt: ast.stmt) -> bool:
        """Directly in a function body, the module body or the `__main__` guard: it runs
        whenever its function (or the script) does."""
        owner = self.parents.get(id(stmt), (None, "", []))[0]
        if owner is None or isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
        return (isinstance(owner, ast.If) and self.parents.get(id(owner), (None,))[0] is None
                and bool(_MAIN_GUARD.fullmatch(self.source.node_text(owner.test).strip())))

    def spawns(self, before: int | None = None) -> bool:
        """A child process may be started after line `before` (the first setting): a
        process started by module-level code that ended before it (a notebook's `pip show`
        cell) cannot receive the value, so only those are ignored."""
        for site in self.index.calls_named(*SPAWNS):
            ran_before = (before is not None and site.context.function is None and site.context.classdef is None
                          and not site.context.loops and (site.node.end_lineno or 0) < before)
            if not ran_before:
                return True
        return False

    # -- the question
    def first_use_before(self, target: ast.stmt) -> CudaUse | None:
        chain = []
        node: ast.AST | None = target
        while node is not None and id(node) in self.parents:
            owner, field, block = self.parents[id(node)]
            chain.append((node, owner, field, block))
            node = owner
        chain.reverse()
        for node, owner, field, block in chain:
            if owner is not None:
                use = self._header(owner, field)
                if use:
                    return use
            # A `def` after the `__main__` block runs only when the file is imported, and
            # then that block did not run.
            main_guard = not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for stmt in block:
                if stmt is node:
                    break
                use = self._certain_in_stmt(stmt, main_guard)
                if use:
                    return use
        return None

    def _header(self, owner: ast.AST, field: str) -> CudaUse | None:
        """What of `owner` certainly ran before its `field` block starts."""
        if isinstance(owner, (ast.If, ast.While)):
            return self._in_expr(owner.test, owner)
        if isinstance(owner, (ast.For, ast.AsyncFor)):
            return self._in_expr(owner.iter, owner)
        if isinstance(owner, (ast.With, ast.AsyncWith)):
            for item in owner.items:
                use = self._in_expr(item.context_expr, owner)
                if use:
                    return use
        if isinstance(owner, ast.Match):
            return self._in_expr(owner.subject, owner)
        if isinstance(owner, ast.Try) and field == "orelse":
            return self._in_block(owner.body)
        return None

    def _in_block(self, block: list[ast.stmt], stop_at_return: bool = False) -> CudaUse | None:
        for stmt in block:
            use = self._certain_in_stmt(stmt)
            if use:
                return use
            if stop_at_return and any(isinstance(n, ast.Return) for n in walk_scope(stmt)):
                return None
        return None

    def _certain_in_stmt(self, stmt: ast.stmt, main_guard: bool = True) -> CudaUse | None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None  # only its definition runs here
        if isinstance(stmt, ast.If):
            use = self._in_expr(stmt.test, stmt)
            if use is None and main_guard and _MAIN_GUARD.fullmatch(self.source.node_text(stmt.test).strip()):
                use = self._in_block(stmt.body)  # the script's entry point: runs when launched
            gpu_branch = self._gpu_branch(stmt)
            if use is None and gpu_branch is not None:
                # `if torch.cuda.is_available():` is taken on every GPU run, the runs an
                # allocator setting is for (as "cuda" if is_available() else "cpu" is CUDA)
                inner = self._in_block(gpu_branch)
                if inner is not None:
                    use = CudaUse(inner.call, f"{inner.what} (under `{self._short(stmt.test)}`, taken on a GPU)", inner.via)
            return use
        if isinstance(stmt, (ast.While,)):
            return self._in_expr(stmt.test, stmt)
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            return self._in_expr(stmt.iter, stmt)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            return self._header(stmt, "body") or self._in_block(stmt.body)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            return self._in_block(stmt.finalbody)
        if isinstance(stmt, ast.Match):
            return self._in_expr(stmt.subject, stmt)
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.expr):
                use = self._in_expr(child, stmt)
                if use:
                    return use
        return None

    def _gpu_branch(self, stmt: ast.If | ast.IfExp):
        return gpu_branch(stmt, self.imports)

    def _in_expr(self, expr: ast.expr, stmt: ast.stmt) -> CudaUse | None:
        for call in _certain_calls(expr):
            use = self._classify(call, stmt)
            if use:
                return use
        return None

    # -- what counts as a CUDA use
    def _classify(self, call: ast.Call, stmt: ast.stmt) -> CudaUse | None:
        func = call.func
        name = self.imports.qualify(func)
        text = self._short(call)
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and name != "torch.cuda":
            return CudaUse(call, f"`{text}`")
        if name in CUDA_INIT_CALLS:
            return CudaUse(call, f"`{text}`")
        if name in GPU_ENTRY_POINTS:
            return CudaUse(call, GPU_ENTRY_POINTS[name])
        if isinstance(func, ast.Attribute) and func.attr == "to":
            target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
            if target is not None and self._is_cuda(target, stmt):
                return CudaUse(call, f"`{text}`")
        places = bool(name) and (name.startswith("torch.") or name in DEVICE_PLACERS) and name != "torch.device"
        loads = name in DEVICE_PLACERS or (isinstance(func, ast.Attribute) and func.attr == "from_pretrained")
        for keyword in call.keywords:
            if keyword.arg in ("device", "map_location") and places and self._is_cuda(keyword.value, stmt):
                return CudaUse(call, f"`{text}`")
            if keyword.arg == "device_map" and loads and self._maps_to_gpu(keyword.value, stmt):
                return CudaUse(call, f"the `device_map=` load `{text}`")
        if (isinstance(func, ast.Name) and func.id in self.functions and self.imports.aliases.get(func.id) is None
                and not self._shadowed(func.id, stmt)):
            inner = self._function_use(self.functions[func.id])
            if inner is not None:
                return CudaUse(inner.call, inner.what, via=call)
        return None

    def _shadowed(self, name: str, stmt: ast.stmt) -> bool:
        """`name` is a local of the function holding `stmt`, not the module's function."""
        context = self.index.contexts.get(id(stmt))
        function = context.function if context is not None else None
        return function is not None and not isinstance(function, ast.Lambda) and name in self.scopes._stores(function)

    def _function_use(self, function) -> CudaUse | None:
        key = id(function)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = None  # recursion guard
        use = self._in_block(function.body, stop_at_return=True)
        self.memo[key] = use
        return use

    def _resolve(self, node: ast.expr, stmt: ast.stmt) -> ast.expr:
        if isinstance(node, ast.Name):
            value = self.scopes._lookup(node.id, stmt)
            if value is not None:
                return value
        return node

    def _is_cuda(self, node: ast.expr, stmt: ast.stmt, depth: int = 0) -> bool:
        node = self._resolve(node, stmt)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return bool(_CUDA_DEVICE.fullmatch(node.value))
        if isinstance(node, ast.IfExp) and depth < 3:
            # "cuda" if torch.cuda.is_available() else "cpu": CUDA on every GPU run
            side = self._gpu_branch(node)
            return side is not None and self._is_cuda(side, stmt, depth + 1)
        if isinstance(node, ast.Call) and self.imports.qualify(node.func) == "torch.device" and node.args:
            first = node.args[0]
            if isinstance(first, ast.IfExp) and depth < 3:
                return self._is_cuda(first, stmt, depth + 1)
            return isinstance(first, ast.Constant) and isinstance(first.value, str) and bool(
                _CUDA_DEVICE.fullmatch(first.value)
            )
        return False

    def _maps_to_gpu(self, node: ast.expr, stmt: ast.stmt) -> bool:
        node = self._resolve(node, stmt)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return node.value not in _HOST_MAPS
            return isinstance(node.value, int) and not isinstance(node.value, bool)
        if isinstance(node, ast.Dict) and node.values:
            return any(
                not (isinstance(v, ast.Constant) and (v.value in _HOST_MAPS or v.value is None)) for v in node.values
            )
        return False

    def _short(self, call: ast.Call) -> str:
        text = " ".join(self.source.node_text(call).split())
        return text if len(text) <= 60 else text[:57] + "..."


def _certain_calls(expr: ast.AST):
    """Calls in `expr` that run whenever `expr` is evaluated, in source order."""
    found = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.IfExp):
            stack.append(node.test)
            continue
        if isinstance(node, ast.BoolOp):
            stack.append(node.values[0])
            continue
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            stack.append(node.generators[0].iter)
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return found
