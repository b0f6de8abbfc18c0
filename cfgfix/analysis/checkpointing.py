"""Gradient checkpointing as CFX306 and CFX307 see it: where checkpointing is enabled
(`gradient_checkpointing_enable`, `TrainingArguments(gradient_checkpointing=True)`,
`torch.utils.checkpoint`), the `use_reentrant` each call resolves to, and whether a PEFT
model's frozen inputs leave a reentrant checkpoint without gradients; with the shared edit
(`use_reentrant=False`) and wording. Moved here unchanged from `rules/checkpointing.py`.

The PEFT analysis itself (`peft_analysis`) is in `analysis/peft_checkpointing.py`, which
the rules import only for a file that passes `may_break_peft`: its classes and patterns
cost ~2.5 ms to import, which every run that loaded CFX307 paid (issue 15)."""

from __future__ import annotations

import ast

from cfgfix.core import Edit, LazyRegex
from cfgfix.documents import python_edits

# The model methods that turn checkpointing on, and the keyword that carries the torch kwargs
# (`activation_checkpointing_enable` is the transformers 5.23 name).
GC_METHODS = {
    "gradient_checkpointing_enable": "gradient_checkpointing_kwargs",
    "activation_checkpointing_enable": "activation_checkpointing_kwargs",
}
# `TrainingArguments` flags, and their kwargs keyword.
TRAINING_FLAGS = {
    "gradient_checkpointing": "gradient_checkpointing_kwargs",
    "activation_checkpointing": "activation_checkpointing_kwargs",
}


# ------------------------------------------------------------------------ shared helpers


def use_reentrant_of(node: ast.AST | None) -> str:
    """What a `gradient_checkpointing_kwargs` value says about `use_reentrant`:
    "default" (absent or None: the library default), "true", "false", "missing" (a dict
    without the key: torch's own default, True), or "unknown"."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return "default"
    pairs: list[tuple[str | None, ast.expr]] = []
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is None:
                pairs.append((None, value))  # `**other`
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                pairs.append((key.value, value))
            else:
                pairs.append((None, value))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        pairs = [(k.arg, k.value) for k in node.keywords]
    else:
        return "unknown"
    for key, value in pairs:
        if key == "use_reentrant":
            if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                return "true" if value.value else "false"
            return "unknown"
    return "unknown" if any(key is None for key, _ in pairs) else "missing"


def _is_empty_dict(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Dict) and not node.keys) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
        and not node.args and not node.keywords
    )


def trainer_drops(node: ast.AST | None) -> bool:
    """A `TrainingArguments` kwargs dict that transformers 5's Trainer hands on as None once
    it has taken out its own keys (`every_n_layers`, `offload`): the 5.x default applies."""
    if _is_empty_dict(node):
        return True
    if isinstance(node, ast.Dict) and None not in node.keys:
        return all(isinstance(k, ast.Constant) and k.value in ("every_n_layers", "offload") for k in node.keys)
    return False


def set_reentrant_false(src, node: ast.AST) -> Edit | None:
    """Make a kwargs dict literal say `"use_reentrant": False`: replace a present value, else add the item."""
    if isinstance(node, ast.Constant) and node.value is None:
        return python_edits.replace_node(src, node, '{"use_reentrant": False}')
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == "use_reentrant":
                return python_edits.replace_node(src, value, "False")
        if not node.keys:
            return python_edits.replace_node(src, node, '{"use_reentrant": False}')
        end = src.span_of_node(node.values[-1]).end
        return Edit(src.path, end, end, ', "use_reentrant": False')
    if isinstance(node, ast.Call):  # dict(...)
        for kw in node.keywords:
            if kw.arg == "use_reentrant":
                return python_edits.replace_node(src, kw.value, "False")
        return python_edits.add_keyword(src, node, "use_reentrant=False")
    return None


def kwargs_argument(call: ast.Call, keyword: str) -> tuple[ast.AST | None, bool]:
    """The kwargs value passed to a checkpointing method (keyword or first positional), and
    whether a `**mapping` may carry it instead."""
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value, False
    if call.args:
        return call.args[0], False
    return None, any(kw.arg is None for kw in call.keywords)


_ESCAPES = ("enable_input_require_grads", "prepare_model_for_kbit_training", "prepare_model_for_int8_training")
_ENABLES = LazyRegex(r"checkpointing_enable|(gradient|activation)_checkpointing\s*=\s*True")


def may_break_peft(data: bytes | str) -> bool:
    """Text-only prefilter for CFX306: a `get_peft_model` call and checkpointing turned on, in a
    file that never names one of the functions that prepare the inputs (the same file-wide
    escapes the analysis applies, so the expensive index is built only where it can matter)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if "get_peft_model" not in text or any(name in text for name in _ESCAPES):
        return False
    return bool(_ENABLES.search(text))
