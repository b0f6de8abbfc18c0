"""Minimal text edits on YAML/JSON configs: only the bytes of the value or entry change, so
comments, quoting style, key order, indentation and blank lines survive outside the edit."""

from __future__ import annotations

import difflib
import json
from itertools import pairwise

from cfgfix.core import Edit
from cfgfix.documents.config import ConfigDocument, ConfigError, Node, parse_config


def scalar_text(doc: ConfigDocument, value, style: str = "") -> str:
    """`value` written as the document writes scalars (JSON literals, YAML quoting kept)."""
    if doc.fmt == "json":
        return json.dumps(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if style == '"':
        return json.dumps(value)
    if style == "'":
        return "'" + value.replace("'", "''") + "'"
    return value  # plain: callers pass identifiers and enum names


def replace_scalar(doc: ConfigDocument, node: Node, value) -> Edit:
    return Edit(doc.source.path, node.start, node.end, scalar_text(doc, value, node.style))


def replace_text(doc: ConfigDocument, start: int, end: int, content: str) -> Edit:
    return Edit(doc.source.path, start, end, content)


def rename_key(doc: ConfigDocument, key: Node, name: str) -> Edit:
    return replace_scalar(doc, key, name)


def delete_entry(doc: ConfigDocument, mapping: Node, key: Node, value: Node) -> Edit:
    """Remove `key: value` with its line(s). JSON: also the comma that separated it."""
    text = doc.source.text
    line_start = text.rfind("\n", 0, key.start) + 1
    end = value.end
    if doc.fmt == "json":
        index = next(i for i, (k, _) in enumerate(mapping.entries) if k is key)
        rest = text[end:].lstrip(" \t")
        if rest.startswith(","):
            end = text.index(",", end) + 1
        elif index > 0:  # the last entry: from the comma after the previous one
            comma = text.index(",", mapping.entries[index - 1][1].end)
            return Edit(doc.source.path, comma, end, "")
        else:  # the only entry
            return Edit(doc.source.path, key.start, end, "")
    if text[line_start:key.start].strip():  # another entry before it on the line
        return Edit(doc.source.path, key.start, end, "")
    return Edit(doc.source.path, line_start, _after_line(text, end), "")


def _line_end(text: str, offset: int) -> int:
    """Offset of the line ending after `offset` (or the end of the text)."""
    newline = text.find("\n", offset)
    if newline == -1:
        return len(text)
    return newline - 1 if newline > 0 and text[newline - 1] == "\r" else newline


def _after_line(text: str, offset: int) -> int:
    """Offset just past the line ending after `offset`, when only blanks or a comment follow."""
    newline = text.find("\n", offset)
    tail = text[offset:newline if newline != -1 else len(text)]
    if tail.strip() and not tail.strip().startswith("#"):
        return offset
    return len(text) if newline == -1 else newline + 1


def close_match(word: str, choices) -> str | None:
    """The one choice close to `word`, or None when there is none or more than one."""
    matches = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.8)
    if len(matches) == 1:
        return matches[0]
    lowered = {c.lower().replace("-", "_"): c for c in choices}
    return lowered.get(word.lower().replace("-", "_"))


def insert_entry(doc: ConfigDocument, mapping: Node, key: str, value) -> Edit | None:
    """An edit that adds `key: value` as the last entry of `mapping`, in the mapping's style
    (JSON or YAML, block or flow, its indentation); `value` is a scalar or a dict (in a YAML
    block mapping, a block indented by the file's own step; elsewhere a flow mapping). None
    when the layout is not one this writer knows. Only the inserted text is new: every
    other byte of the file stays as it was (a round-trip YAML writer re-emits the whole
    document and so re-indents, re-spaces and re-aligns lines the change never touched)."""
    text = doc.source.text
    if mapping.kind != "mapping" or not mapping.entries:
        return None
    written = json.dumps(value) if doc.fmt == "json" or isinstance(value, dict) else scalar_text(doc, value)
    if doc.fmt == "yaml" and isinstance(value, dict):
        written = "{" + ", ".join(f"{k}: {scalar_text(doc, v)}" for k, v in value.items()) + "}"
    last_key, last_value = mapping.entries[-1]
    line_start = text.rfind("\n", 0, last_key.start) + 1
    indent = text[line_start:last_key.start]
    if doc.fmt == "json":
        entry = f'"{key}": {written}'
        if not indent.strip() and "\n" in text[mapping.start:last_key.start]:
            return Edit(doc.source.path, last_value.end, last_value.end, ",\n" + indent + entry)
        return Edit(doc.source.path, last_value.end, last_value.end, ", " + entry)
    if text[mapping.start:mapping.start + 1] == "{":  # YAML flow mapping
        return Edit(doc.source.path, last_value.end, last_value.end, f", {key}: {written}")
    if indent.strip():
        return None
    end = _line_end(text, max(last_value.end - 1, last_key.end))
    newline = "\r\n" if text[end:end + 2] == "\r\n" else "\n"
    if isinstance(value, dict) and value:
        lines = _block_lines(doc, key, value, indent, _indent_step(text))
        return Edit(doc.source.path, end, end, "".join(newline + line for line in lines))
    return Edit(doc.source.path, end, end, newline + indent + f"{key}: {written}")


def _block_lines(doc: ConfigDocument, key: str, value: dict, indent: str, step: int) -> list[str]:
    """`key:` and its mapping as YAML block lines, each level `step` spaces deeper."""
    lines = [f"{indent}{key}:"]
    inner = indent + " " * step
    for name, item in value.items():
        if isinstance(item, dict) and item:
            lines += _block_lines(doc, name, item, inner, step)
        else:
            lines.append(f"{inner}{name}: {scalar_text(doc, item)}")
    return lines


def _indent_step(text: str) -> int:
    """How many spaces the file indents a nested mapping by (the smallest step between the
    indentations of its keys), 2 when it nests none."""
    depths = set()
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if stripped and not stripped.startswith(("#", "-")) and ":" in stripped:
            depths.add(len(line) - len(stripped))
    ordered = sorted(depths)
    steps = [b - a for a, b in pairwise(ordered)]
    return min(steps) if steps else 2


def change_is_local(fmt: str, old_text: str, new_text: str, edits) -> bool:
    """After a fix: every value that differs between the two loaded documents sits under a
    node that one of the edits touched. A text edit that shifted another value (an
    indentation change, a swallowed comma) is refused, so a fix changes only what it says."""
    from cfgfix.documents.text import SourceText

    try:
        old = parse_config(SourceText("old", old_text), fmt)
        new = parse_config(SourceText("new", new_text), fmt)
    except (ConfigError, ValueError, RecursionError, MemoryError):
        return False
    before, after = _leaves(old.root), _leaves(new.root)

    def touched(span) -> bool:
        return span is not None and any(edit.start <= span[1] and span[0] <= edit.end for edit in edits)

    for path in before.keys() | after.keys():
        if path in before and path in after and before[path][0] == after[path][0]:
            continue
        if path in before:
            # its own entry was edited, or an ancestor's key was (a renamed block moves its children)
            if touched(before[path][1]) or any(touched(before[path[:i]][2]) for i in range(1, len(path))):
                continue
            return False
        prefix = path[:-1]  # a new value: inserted into the deepest mapping that existed
        while prefix not in before:
            prefix = prefix[:-1]
        if not touched(before[prefix][1]):
            return False
    return True


def _leaves(node, path=(), span=None, key_span=None, out=None) -> dict:
    """path -> (loaded value, (start, end) of its entry, (start, end) of its key), every node."""
    out = {} if out is None else out
    if node is None:
        return out
    out[path] = (node.to_python() if node.kind == "scalar" else node.kind, span or (node.start, node.end), key_span)
    for key, value in node.entries:
        _leaves(value, path + (("k", repr(key.value)),), (key.start, value.end), (key.start, key.end), out)
    for index, child in enumerate(node.children):
        _leaves(child, path + (("i", index),), (child.start, child.end), None, out)
    return out
