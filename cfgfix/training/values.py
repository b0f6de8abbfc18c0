"""Training settings read from one place, each with the span that sets it.

Three readers, one result shape (`dict[setting, Value]`):
- `from_config`: a YAML/JSON training config, keys at any depth (`training: {bf16: true}`);
- `from_args`: a launch's script flags (`--per_device_train_batch_size 4 --bf16`);
- `from_python`: a Python config module's dict literals and constants
  (`TRAINING_CONFIG = {"per_device_train_batch_size": 2}`, `GRADIENT_ACCUMULATION_STEPS = 8`),
  and the keywords of a `TrainingArguments(...)` call.

A setting named twice with different values at the same depth is ambiguous and left out:
the setup says "unknown" rather than guess.
"""

from __future__ import annotations

import ast

from cfgfix.analysis.training_keys import LORA_BLOCKS, NAME_TO_SETTING, SETTING_NAMES
from cfgfix.core import LazyRegex, Span
from cfgfix.records import dataclass

BOOL_SETTINGS = frozenset({"bf16", "fp16", "gradient_checkpointing", "use_8bit_adam", "load_in_4bit", "load_in_8bit",
                           "precompute_ref_log_probs"})


@dataclass(frozen=True)
class Value:
    """A setting's value and where it came from. `span` is None for computed values and
    defaults; `origin` says in words where it came from ("--bf16 True in train.sh")."""

    setting: str
    value: object
    origin: str
    span: Span | None = None
    name: str = ""  # the key or flag as written

    def to_dict(self) -> dict:
        return {"value": self.value, "origin": self.origin, "name": self.name,
                "span": self.span.to_dict() if self.span is not None else None}


_INTEGER = LazyRegex(r"[+-]?[0-9]+")


def normalise(setting: str, value: object) -> object:
    """Booleans from "true"/"True" strings and numbers from numeric strings, as the tools that
    read these files do (HfArgumentParser's string_to_bool, YAML 1.1)."""
    if isinstance(value, str):
        text = value.strip()
        if setting in BOOL_SETTINGS and text.lower() in ("true", "false", "yes", "no", "1", "0"):
            return text.lower() in ("true", "yes", "1")
        if _INTEGER.fullmatch(text):  # not `"--0"` or `"²"`, which str.isdigit lets through and int() refuses
            # past 30 digits no tool reads it as a count (and past 4,300 Python cannot): unknown
            return int(text) if len(text) <= 30 else value
        try:
            return float(text) if any(c.isdigit() for c in text) else value
        except ValueError:
            return value
    return value


# -- YAML / JSON ------------------------------------------------------------------------------
def from_config(doc, origin: str) -> dict[str, Value]:
    """Settings of a training config document (a `ConfigDocument`), the shallowest wins;
    read once per document and origin (each launch and each round of `fix` asks again)."""
    key = ("training-values", origin)
    if key not in doc.memo:
        doc.memo[key] = _from_config(doc, origin)
    return dict(doc.memo[key])


def _from_config(doc, origin: str) -> dict[str, Value]:
    found: dict[str, list[tuple[int, Value]]] = {}
    stack = [(doc.root, 0, "")]
    while stack:
        node, depth, parent = stack.pop()
        if node is None or node.kind != "mapping" or depth > 6:
            continue
        for key, value in node.entries:
            name = key.value if isinstance(key.value, str) else None
            if name is None:
                continue
            if value.kind == "mapping":
                stack.append((value, depth + 1, name.lower()))
                continue
            setting = NAME_TO_SETTING.get(name)
            if setting is None and name == "r" and parent in LORA_BLOCKS:
                setting = "lora_rank"
            if setting == "lora_targets" and value.kind == "sequence":
                # axolotl's `lora_target_modules: [q_proj, v_proj]`: one comma list
                names = [c.value for c in value.children if c.kind == "scalar" and isinstance(c.value, str)]
                if names and len(names) == len(value.children):
                    found.setdefault(setting, []).append(
                        (depth, Value(setting, ",".join(names), f"{name} in {origin}", doc.span(value), name)))
                continue
            if setting is None or value.kind != "scalar":
                continue
            found.setdefault(setting, []).append(
                (depth, Value(setting, normalise(setting, value.value), f"{name} in {origin}", doc.span(value), name)))
    return _shallowest(found)


def _shallowest(found: dict[str, list[tuple[int, Value]]]) -> dict[str, Value]:
    result: dict[str, Value] = {}
    for setting, entries in found.items():
        depth = min(d for d, _ in entries)
        top = [v for d, v in entries if d == depth]
        if len({repr(v.value) for v in top}) == 1:
            result[setting] = top[0]
    return result


# -- script flags -----------------------------------------------------------------------------
def from_args(words, origin: str) -> dict[str, Value]:
    """Settings passed as `--name value`, `--name=value` or a bare boolean `--name`.
    `words` are (text, span) pairs; the last occurrence wins, as argparse does."""
    result: dict[str, Value] = {}
    words = list(words)
    for i, (text, span) in enumerate(words):
        if not text.startswith("--"):
            continue
        name, eq, inline = text[2:].partition("=")
        setting = NAME_TO_SETTING.get(name)
        if setting is None:
            continue
        if eq:
            raw, value_span, shown = inline, span, text
        elif i + 1 < len(words) and not words[i + 1][0].startswith("--"):
            raw, value_span, shown = words[i + 1][0], words[i + 1][1], f"{text} {words[i + 1][0]}"
        elif setting in BOOL_SETTINGS:
            raw, value_span, shown = "true", span, text
        else:
            continue
        if "$" in raw:  # an unresolved variable: known to be set, value unknown (no default applies)
            result[setting] = Value(setting, None, f"{shown} in {origin} (not resolved)", value_span, name)
            continue
        result[setting] = Value(setting, normalise(setting, raw), f"{shown} in {origin}", value_span, name)
    return result


# -- Python -----------------------------------------------------------------------------------
def literal(node: ast.AST, consts: dict[str, ast.expr] | None = None, depth: int = 0):
    """The value of a literal expression (following module constants once), or raise
    ValueError."""
    if isinstance(node, ast.Name) and consts and node.id in consts and depth < 3:
        return literal(consts[node.id], consts, depth + 1)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return f"torch.{node.attr}"  # torch.bfloat16 and friends, by name
    return ast.literal_eval(node)


def from_dict_literal(node: ast.Dict, source, origin: str, consts, lora: bool = False) -> dict[str, Value]:
    """Settings in a dict literal (nested dicts included)."""
    found: dict[str, list[tuple[int, Value]]] = {}
    stack = [(node, 0, lora)]
    while stack:
        current, depth, in_lora = stack.pop()
        for key, value in zip(current.keys, current.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            name = key.value
            if isinstance(value, ast.Dict):
                stack.append((value, depth + 1, name.lower() in LORA_BLOCKS))
                continue
            setting = NAME_TO_SETTING.get(name) or ("lora_rank" if name == "r" and in_lora else None)
            found_value = _literal_value(setting, name, value, source, origin, consts)
            if found_value is not None:
                found.setdefault(setting, []).append((depth, found_value))
    return _shallowest(found)


def _literal_value(setting, name: str, node: ast.AST, source, origin: str, consts) -> Value | None:
    """`setting` set to the literal `node` under `name`, or None (no setting, not a literal)."""
    if setting is None:
        return None
    try:
        raw = literal(node, consts)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return Value(setting, normalise(setting, raw), f"{name} in {origin}", source.span_of_node(node), name)


def from_python(source, tree: ast.Module, origin: str) -> dict[str, Value]:
    """Settings of a Python config module: module-level dict literals with training keys and
    upper-case constants named like a setting (`GRADIENT_ACCUMULATION_STEPS = 8`)."""
    from cfgfix.analysis.names import single_assignments

    consts = single_assignments(tree.body)
    found: dict[str, list[tuple[int, Value]]] = {}
    for name, value in consts.items():
        if isinstance(value, ast.Dict):
            lora = "lora" in name.lower() or "peft" in name.lower()
            for setting, found_value in from_dict_literal(value, source, f"{name} in {origin}", consts, lora).items():
                found.setdefault(setting, []).append((1, found_value))
            continue
        if not name.isupper():
            continue
        found_value = _literal_value(NAME_TO_SETTING.get(name.lower()), name, value, source, origin, consts)
        if found_value is not None:
            found.setdefault(found_value.setting, []).append((0, found_value))
    return _shallowest(found)


def from_keywords(call: ast.Call, source, origin: str, consts) -> dict[str, Value]:
    """Settings passed as literal keywords of a call (`TrainingArguments(bf16=True, ...)`)."""
    result: dict[str, Value] = {}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        setting = NAME_TO_SETTING.get(kw.arg)
        if setting is None:
            continue
        try:
            raw = literal(kw.value, consts)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        result[setting] = Value(setting, normalise(setting, raw), f"{kw.arg}= in {origin}",
                                source.span_of_node(kw.value), kw.arg)
    return result


def known_names() -> set[str]:
    return {name for names in SETTING_NAMES.values() for name in names}
