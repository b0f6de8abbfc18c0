"""Values DeepSpeed refuses when it reads its config, as data: each check with the release
that began to make it, read from that release's code (git history of deepspeedai/DeepSpeed
and the 0.19.6/0.19.7/0.19.8 sdists; facts.md C12).

- `fp16.loss_scale` (`DeepSpeedFP16Config._validate_loss_scale`, #7889, 0.18.8): a number
  (a numeric string passes `float()`), not bool, finite, >= 0.
- `fp16.loss_scale_window`, `fp16.min_loss_scale` (`_reject_non_integer_scale_params` and
  `_validate_dynamic_loss_scale_params`, #8050, 0.19.3): an integer (not bool, not inf/nan,
  `int()` must accept it, and pydantic's int field refuses a fraction), and > 0 when fp16 is
  enabled with dynamic scaling (`loss_scale` 0).
- `gradient_allreduce_op` (`get_gradient_allreduce_op` and `DeepSpeedConfig._do_error_check`,
  #8232, 0.19.6; earlier releases do not read the key): "mean" or "sum" (any case), and
  "sum" neither under ZeRO-3 nor with ZenFlow or DeepCompile.
A value of "auto" is dropped by `DeepSpeedConfigModel.__init__` (the default is used), except
for `gradient_allreduce_op`, which is read as a plain scalar."""

from __future__ import annotations

import math

LOSS_SCALE_SINCE = "0.18.8"
SCALE_PARAMS_SINCE = "0.19.3"
ALLREDUCE_OP_SINCE = "0.19.6"
ALLREDUCE_OPS = ("mean", "sum")


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def loss_scale_problem(value) -> str | None:
    """Why DeepSpeed refuses this `fp16.loss_scale`, or None."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return "must be a number, not bool"
    number = _number(value)
    if number is None:
        return "must be a number"
    if not math.isfinite(number):
        return "must be a finite number (not inf/-inf/nan)"
    if number < 0:
        return "must be >= 0 (0 enables dynamic loss scaling)"
    return None


def scale_param_type_problem(value) -> str | None:
    """Why DeepSpeed refuses this `fp16.loss_scale_window` / `fp16.min_loss_scale` as a value."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return "must be an integer, not bool"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number (not inf/-inf/nan)"
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        return "must be an integer"
    if isinstance(value, float) and value != whole:
        return "must be an integer (pydantic refuses a fraction)"
    if isinstance(value, str) and _number(value) != whole:
        return "must be an integer"
    return None


def scale_param_value(value) -> int | None:
    """The integer DeepSpeed takes from a value `scale_param_type_problem` accepts."""
    if value == "auto" or isinstance(value, bool):
        return None
    try:
        return int(float(value)) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def allreduce_op_problem(value, stage: int | None, zenflow: bool, deepcompile: bool) -> str | None:
    """Why DeepSpeed refuses this `gradient_allreduce_op`, or None."""
    op = value.lower() if isinstance(value, str) else value
    if op not in ALLREDUCE_OPS:
        return f"must be one of {list(ALLREDUCE_OPS)} (got {value!r})"
    if op == "sum":
        if stage == 3:
            return "'sum' is not supported with ZeRO stage 3"
        if zenflow:
            return "'sum' is not supported with ZenFlow"
        if deepcompile:
            return "'sum' is not supported with DeepCompile"
    return None


# -- the pydantic models' fields (analysis/deepspeed_fields.py) ----------------------------------
# pydantic 2's lax mode, as DeepSpeed validates a config dict (DeepSpeedConfigModel: extra
# "forbid", use_enum_values, populate_by_name). Checked against pydantic itself in
# tests/test_deepspeed_fields.py. Where pydantic's answer depends on a detail this does not
# model (pydantic refuses "1e3" for an int, which float() reads), the value passes.
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})
MODELS_SINCE = "0.19.6"  # the oldest release whose models were read (deepspeed_fields.RELEASES)


def _as_int(value) -> tuple[bool, int | None]:
    """(pydantic takes it as an int, the int when this can tell)."""
    if isinstance(value, bool):
        return True, int(value)
    if isinstance(value, int):
        return True, value
    if isinstance(value, float):
        return (math.isfinite(value) and value == int(value)), (int(value) if math.isfinite(value) else None)
    if isinstance(value, str):
        text = value.strip()
        number = _number(text)
        if number is None or not math.isfinite(number):
            return False, None
        if number != int(number):
            return False, None
        return True, int(number)
    return False, None


def _accepts(kind: str, value) -> tuple[bool, float | None]:
    """Whether pydantic accepts `value` for one non-union type, and the number it holds."""
    if kind == "bool":
        if isinstance(value, bool):
            return True, None
        if isinstance(value, (int, float)):
            return value in (0, 1), None
        return isinstance(value, str) and value.strip().lower() in _BOOL_WORDS, None
    if kind == "int":
        ok, number = _as_int(value)
        return ok, number
    if kind == "float":
        if isinstance(value, (bool, int, float)):
            return True, float(value)
        if isinstance(value, str):
            number = _number(value.strip())
            return number is not None, number
        return False, None
    if kind in ("str", "path"):
        return isinstance(value, str), None
    if kind == "dict":
        return isinstance(value, dict), None
    if kind == "list":
        return isinstance(value, list), None
    if kind.startswith("model:"):
        return isinstance(value, dict), None
    if kind.startswith("enum:"):
        members = kind[len("enum:"):].split(",")
        if all(m.lstrip("-").isdigit() for m in members):  # an int enum
            ok, number = _as_int(value)
            return ok and number is not None and str(number) in members, None
        return isinstance(value, str) and value in members, None
    return True, None  # a type not read: anything passes


def _bounds_problem(entry: dict, number: float) -> str | None:
    for key, test, words in (("gt", lambda n, b: n > b, "greater than"), ("ge", lambda n, b: n >= b, "at least"),
                             ("lt", lambda n, b: n < b, "less than"), ("le", lambda n, b: n <= b, "at most")):
        if key in entry and not (math.isfinite(number) and test(number, entry[key])):
            return f"must be {words} {entry[key]:g}"
    return None


def _type_words(spec: str) -> str:
    words = []
    for kind in spec.lstrip("?").split("|"):
        if kind.startswith("model:"):
            words.append("a mapping")
        elif kind.startswith("enum:"):
            words.append("one of " + ", ".join(kind[len("enum:"):].split(",")))
        else:
            words.append({"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string",
                          "path": "a path string", "dict": "a mapping", "list": "a list"}.get(kind, kind))
    return " or ".join(words) + (" or null" if spec.startswith("?") else "")


def field_problem(entry: dict, value) -> str | None:
    """Why DeepSpeed's model refuses `value` for a field described by `entry` (a
    deepspeed_fields.FIELDS entry), or None. "auto" is dropped before validation."""
    if value == "auto":
        return None
    spec = entry["type"]
    if value is None:
        return None if spec.startswith("?") else f"must be {_type_words(spec)}, not null"
    found = [_accepts(kind, value) for kind in spec.lstrip("?").split("|")]
    accepted = [number for ok, number in found if ok]
    if not accepted:
        shown = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        return f"must be {_type_words(spec)} (got {shown})"
    number = accepted[0]
    return _bounds_problem(entry, number) if number is not None else None


def _by_key(block: str) -> dict:
    """Field entries of a block under every name DeepSpeed reads (field name and alias)."""
    from cfgfix.analysis.deepspeed_fields import FIELDS

    fields = FIELDS.get(block, {})
    named = dict(fields)
    named.update({entry["alias"]: entry for entry in fields.values() if "alias" in entry})
    return named


def field_problems(root):
    """(value node, message) for every value of a validated block (ZeRO and its offload /
    ZenFlow / leaf-module blocks, fp16, bf16) that DeepSpeed's pydantic models refuse."""
    zero = root.get("zero_optimization")
    if zero is not None and not (zero.kind == "scalar" and isinstance(zero.value, bool)):  # true/false: the legacy form
        yield from _block_problems("zero_optimization", zero)
    bf16 = root.get("bf16")
    for key, block in (("fp16", "fp16"), ("bf16", "bf16"), ("bfloat16", "bf16")):
        node = root.get(key)
        if key == "bfloat16" and bf16 is not None and not (bf16.kind == "scalar" and bf16.value is None):
            continue  # get_bfloat16_config reads "bfloat16" only when "bf16" is absent or null
        if node is not None:
            yield from _block_problems(block, node, key)


def _block_problems(block: str, node, where: str | None = None):
    where = where or block
    if node.kind == "scalar" and (node.value is None or node.value == "auto"):
        return  # an absent block (null) or one DeepSpeed drops
    if node.kind != "mapping":
        yield node, f"{where} must be a mapping"
        return
    fields = _by_key(block)
    for key_node, value in node.entries:
        entry = fields.get(key_node.value)
        if entry is None:
            continue  # unknown keys are CFX507's
        name = f"{where}.{key_node.value}"
        nested = entry["type"].lstrip("?")
        if nested.startswith("model:"):
            if value.kind == "mapping":
                yield from _block_problems(nested[len("model:"):], value, name)
                continue
            if block == "zero_optimization" and key_node.value == "leaf_module" and value.kind == "scalar" \
                    and value.value is None:
                continue  # its before-validator reads null as {}
        if nested == "list" and block.endswith("leaf_module") and value.kind == "scalar" \
                and isinstance(value.value, str):
            continue  # the leaf-module validator wraps one string in a list
        python = value.value if value.kind == "scalar" else value.to_python()
        why = field_problem(entry, python)
        if why:
            yield value, f"{name} {why}"


def auto_is_default(dotted: str) -> bool:
    """A key whose own default in DeepSpeed's models is the string "auto"
    (`zero_optimization.zenflow.select_strategy`): dropping an "auto" there changes nothing."""
    block, _, key = dotted.rpartition(".")
    entry = _by_key(block).get(key) if block else None
    return entry is not None and entry.get("default") == "auto"
