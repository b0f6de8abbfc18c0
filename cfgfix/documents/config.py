"""Position-keeping reader for JSON and YAML configs (accelerate, DeepSpeed).

One `Node` type for both formats: every mapping key and value keeps its exact span (offsets
into the decoded `SourceText`), duplicate keys are kept as separate entries (never merged),
and hostile input is bounded: file size, nesting depth, and YAML alias expansion ("billion
laughs") are refused with a `ConfigError` before they can exhaust memory or recursion.

JSON is read by a small scanner of our own (the `json` module keeps no positions); YAML by
PyYAML's composer (the C loader when installed), whose node marks give the spans.
"""

from __future__ import annotations

import json
import re

from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass, field

MAX_BYTES = 10 * 1024 * 1024  # a config larger than this is refused, not read
MAX_DEPTH = 100  # nesting levels; real configs use fewer than 10
MAX_NODES = 200_000  # nodes after alias expansion; bounds "billion laughs"


class ConfigError(ValueError):
    """The file cannot be read as a config; `line`/`column` are 1-based."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


@dataclass
class Node:
    kind: str  # "mapping" | "sequence" | "scalar"
    start: int
    end: int
    value: object = None  # the loaded value of a scalar (str, int, float, bool, None)
    style: str = ""  # a scalar's quoting: "" plain, '"', "'", "|" or ">" (YAML block)
    entries: list[tuple["Node", "Node"]] = field(default_factory=list)  # mapping (key, value)
    children: list["Node"] = field(default_factory=list)  # sequence items

    # -- mappings ------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return [str(k.value) for k, _ in self.entries]

    def get(self, key: str) -> "Node | None":
        """The value of `key` as loaders see it (the last one when duplicated)."""
        found = None
        for k, v in self.entries:
            if k.value == key:
                found = v
        return found

    def entry(self, key: str) -> "tuple[Node, Node] | None":
        found = None
        for k, v in self.entries:
            if k.value == key:
                found = (k, v)
        return found

    def __contains__(self, key: str) -> bool:
        return any(k.value == key for k, _ in self.entries)

    def duplicates(self) -> list[tuple[str, list["Node"]]]:
        """(key, [key nodes]) for each key that appears more than once in this mapping."""
        seen: dict[object, list[Node]] = {}
        for k, _ in self.entries:
            seen.setdefault(k.value, []).append(k)
        return [(str(key), nodes) for key, nodes in seen.items() if len(nodes) > 1]

    def walk(self):
        """Every node below and including this one, depth first."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            for k, v in reversed(node.entries):
                stack.extend((v, k))
            stack.extend(reversed(node.children))

    def to_python(self):
        if self.kind == "scalar":
            return self.value
        if self.kind == "sequence":
            return [c.to_python() for c in self.children]
        return {k.value: v.to_python() for k, v in self.entries}

    # -- values ---------------------------------------------------------------------------
    def truthy(self) -> bool | None:
        """True/False for a boolean-like scalar, None when it is anything else ("auto")."""
        if self.kind != "scalar":
            return None
        value = self.value
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"  # DeepSpeed/accelerate read "true" strings too
        return None


@dataclass
class ConfigDocument:
    source: SourceText
    fmt: str  # "json" | "yaml"
    root: Node | None
    # what analyses read from this document, by the analysis (they never change it)
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    # Set when the JSON holds comments or trailing commas and was read as DeepSpeed's hjson
    # loader reads it (`parse_config(..., lenient=True)`): what strict JSON said about it.
    lenient_error: "ConfigError | None" = field(default=None, compare=False, repr=False)

    def span(self, node: Node):
        return self.source.span(node.start, node.end)


def parse_config(source: SourceText, fmt: str, lenient: bool = False) -> ConfigDocument:
    """The document's tree. `lenient` reads a JSON file with `//` / `/* */` comments or
    trailing commas as DeepSpeed does (its loader is hjson), marking the document with the
    strict error (`lenient_error`); otherwise such a file is a `ConfigError`, as for
    `json.load`."""
    if len(source.text) > MAX_BYTES:
        raise ConfigError(f"the file is larger than {MAX_BYTES // (1024 * 1024)} MB; not read as a config")
    if len(source.text) < _REMEMBER_FROM:
        return _parse(source, fmt, lenient)
    # A large config is read by the linter, by the project stage and again by every round of
    # `fix` that re-checks a launch linking it: parsed once per content (issue 24: a 6.4 MB
    # YAML made `fix --diff` 5x slower than `check`).
    import hashlib

    key = (source.path, fmt, lenient and fmt == "json", hashlib.blake2b(source.text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    found = _REMEMBERED.pop(key, None)
    if found is None:
        try:
            found = _parse(source, fmt, lenient)
        except ConfigError as exc:
            found = exc
    _REMEMBERED[key] = found  # most recent last
    while len(_REMEMBERED) > _REMEMBER_COUNT:
        del _REMEMBERED[next(iter(_REMEMBERED))]
    if isinstance(found, ConfigError):
        raise found.with_traceback(None)
    return found


_REMEMBER_FROM = 256 * 1024  # smaller configs parse in milliseconds
_REMEMBER_COUNT = 4
_REMEMBERED: dict[tuple, ConfigDocument | ConfigError] = {}


def _parse(source: SourceText, fmt: str, lenient: bool = False) -> ConfigDocument:
    if fmt == "json":
        try:
            return ConfigDocument(source, fmt, _JsonScanner(source).parse())
        except ConfigError as strict:
            if not (lenient and is_json_with_comments(source.text)):
                raise
            return ConfigDocument(source, fmt, _JsonScanner(source, lenient=True).parse(), lenient_error=strict)
    return ConfigDocument(source, fmt, _parse_yaml(source))


# -- JSON -------------------------------------------------------------------------------------
_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = (("true", True), ("false", False), ("null", None),
             ("NaN", float("nan")), ("Infinity", float("inf")), ("-Infinity", float("-inf")))


class _JsonScanner:
    """Recursive descent over the text, as strict as `json.loads` (which the fixer uses to
    check its edits), with a depth limit; `lenient` also skips `//` and `/* */` comments and
    trailing commas, as DeepSpeed's hjson loader does."""

    def __init__(self, source: SourceText, lenient: bool = False) -> None:
        self.source = source
        self.text = source.text
        self.pos = 0
        self.lenient = lenient

    def error(self, message: str, pos: int | None = None) -> ConfigError:
        line, column = self.source.position(self.pos if pos is None else min(pos, len(self.text)))
        return ConfigError(f"invalid JSON: {message}", line, column)

    def skip(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()
        while self.lenient and self.text.startswith(("//", "/*"), self.pos):
            if self.text.startswith("//", self.pos):
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end == -1 else end
            else:
                end = self.text.find("*/", self.pos + 2)
                if end == -1:
                    raise self.error("unterminated /* comment")
                self.pos = end + 2
            self.pos = _WS.match(self.text, self.pos).end()

    def parse(self) -> Node:
        self.skip()
        node = self.value(0)
        self.skip()
        if self.pos != len(self.text):
            raise self.error("extra data after the top-level value")
        return node

    def value(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH} levels; not read as a config")
        text, pos = self.text, self.pos
        if pos >= len(text):
            raise self.error("unexpected end of file")
        char = text[pos]
        if char == "{":
            return self.container(depth, "}", "mapping")
        if char == "[":
            return self.container(depth, "]", "sequence")
        if char == '"':
            match = _STRING.match(text, pos)
            if not match:
                raise self.error("unterminated or invalid string")
            self.pos = match.end()
            return Node("scalar", pos, self.pos, json.loads(match.group(0)), '"')
        for word, value in _LITERALS:
            if text.startswith(word, pos):
                self.pos = pos + len(word)
                return Node("scalar", pos, self.pos, value)
        match = _NUMBER.match(text, pos)
        if match:
            self.pos = match.end()
            try:
                number = json.loads(match.group(0))
            except ValueError:  # past Python's 4,300-digit limit: json.load (every reader) fails too
                raise self.error("a number with more than 4,300 digits, which Python's json module cannot read", pos) from None
            return Node("scalar", pos, self.pos, number)
        raise self.error(f"unexpected character {char!r}")

    def container(self, depth: int, close: str, kind: str) -> Node:
        start = self.pos
        node = Node(kind, start, start)
        self.pos += 1
        self.skip()
        if self.text.startswith(close, self.pos):
            self.pos += 1
            node.end = self.pos
            return node
        while True:
            if kind == "mapping":
                if not self.text.startswith('"', self.pos):
                    raise self.error("expected a property name in double quotes")
                key = self.value(depth + 1)
                self.skip()
                if not self.text.startswith(":", self.pos):
                    raise self.error("expected ':' after the property name")
                self.pos += 1
                self.skip()
                node.entries.append((key, self.value(depth + 1)))
            else:
                node.children.append(self.value(depth + 1))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                self.skip()
                if self.lenient and self.text.startswith(close, self.pos):
                    self.pos += 1  # a trailing comma
                    node.end = self.pos
                    return node
                continue
            if self.text.startswith(close, self.pos):
                self.pos += 1
                node.end = self.pos
                return node
            raise self.error(f"expected ',' or '{close}'")


# -- YAML -------------------------------------------------------------------------------------
def _yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


def _flow_depth(text: str) -> int:
    """The deepest bracket nesting, roughly (quotes ignored): a guard run before the
    composer, which recurses once per level."""
    depth = best = 0
    for match in re.finditer(r"[\[\]{}]", text):
        depth += 1 if match.group(0) in "[{" else -1
        best = max(best, depth)
    return best


# A file this large may hold more than MAX_NODES nodes: they are counted from the parser's
# events first, which stops at the limit, rather than after composing every node of a
# 6 MB file (8 s) only to refuse it (issue 24). Each node takes at least two characters.
_COUNT_FIRST_BYTES = 2 * MAX_NODES


def _refuse_past_max_nodes(text: str) -> None:
    import yaml

    count = 0
    for event in yaml.parse(text, Loader=_yaml_loader()):
        if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent, yaml.AliasEvent)):
            count += 1
            if count > MAX_NODES:
                raise ConfigError(f"more than {MAX_NODES} nodes after expanding aliases; not read as a config")


def _parse_yaml(source: SourceText) -> Node | None:
    import yaml

    text = source.text
    if text.count("[") + text.count("{") > MAX_DEPTH and _flow_depth(text) > MAX_DEPTH:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels; not read as a config")
    try:
        if len(text) > _COUNT_FIRST_BYTES:
            _refuse_past_max_nodes(text)
        documents = yaml.compose_all(text, Loader=_yaml_loader())
        root = next((d for d in documents if d is not None), None)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise ConfigError(f"invalid YAML: {exc.problem or exc.context}", line, column) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError("nested too deeply; not read as a config") from None
    if root is None:
        return None
    return _YamlConverter(source).convert(root, 0)


class _YamlConverter:
    def __init__(self, source: SourceText) -> None:
        from yaml.constructor import SafeConstructor

        self.source = source
        self.constructor = SafeConstructor()
        self.count = 0

    def offset(self, mark) -> int:
        # Marks count characters; line/column are the robust pair across loaders.
        # libyaml puts the end mark of a file without a final newline on the line after the last
        if mark.line >= len(self.source.line_starts):
            return len(self.source.text)
        return min(self.source.offset(mark.line + 1, mark.column), len(self.source.text))

    def convert(self, ynode, depth: int) -> Node:
        import yaml

        self.count += 1
        if self.count > MAX_NODES:
            raise ConfigError(f"more than {MAX_NODES} nodes after expanding aliases; not read as a config")
        if depth > MAX_DEPTH:
            line = ynode.start_mark.line + 1
            raise ConfigError(f"nested deeper than {MAX_DEPTH} levels; not read as a config", line)
        start, end = self.offset(ynode.start_mark), self.offset(ynode.end_mark)
        if isinstance(ynode, yaml.ScalarNode):
            try:
                value = self.constructor.construct_object(ynode, deep=True)
            except Exception:  # an odd tag or timestamp: keep the text
                value = ynode.value
            if not isinstance(value, (str, int, float, bool, type(None))):
                value = ynode.value  # dates, binary: rules compare strings
            return Node("scalar", start, end, value, ynode.style or "")
        if isinstance(ynode, yaml.SequenceNode):
            node = Node("sequence", start, end)
            node.children = [self.convert(c, depth + 1) for c in ynode.value]
            return node
        node = Node("mapping", start, end)
        node.entries = [(self.convert(k, depth + 1), self.convert(v, depth + 1)) for k, v in ynode.value]
        for key, _ in node.entries:
            if key.kind != "scalar" or not isinstance(key.value, (str, int, float, bool, type(None))):
                key.value = self.source.text[key.start:key.end]
        return node


def is_json_with_comments(text: str) -> bool:
    """True when `text` is valid JSON once `//` and `/* */` comments outside strings and
    trailing commas are removed (DeepSpeed's own loader, hjson, accepts both; `json.load`
    does not)."""
    import json

    out, i, n, in_string = [], 0, len(text), False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                return False
            i = end + 2
            continue
        else:
            out.append(ch)
        i += 1
    stripped = re.sub(r",(\s*[}\]])", r"\1", "".join(out))
    if stripped == text:
        return False
    try:
        json.loads(stripped)
    except (ValueError, RecursionError):  # not JSON, a >4,300-digit integer, absurd nesting
        return False
    return True
