"""What CFX203 and CFX205 share: the text prefilter for a torch Adam/AdamW build, the
wording of where the weights got their dtype, and the transformers 5 pin of the examples."""

from __future__ import annotations

import re

from cfgfix.core import Related

# `torch.optim.AdamW(`, not `PagedAdamW(`. The pattern starts with its literal so `re` can
# skip to each "Adam" (a leading `\b` made it try every byte: 25x slower); the word
# boundary before it is checked by hand.
_ADAM_CALL = re.compile(rb"AdamW?\s*\(")


def builds_torch_adam(data: bytes) -> bool:
    for match in _ADAM_CALL.finditer(data):
        start = match.start()
        if start == 0 or not (data[start - 1:start].isalnum() or data[start - 1] == 0x5F):  # `\b`: no \w before
            return True
    return False


# `self.model = model`: a trainer class keeps a model its callers hand it (they may load it
# in bfloat16 in another module).
_MODEL_HANDED_IN = re.compile(
    rb"(?m)^[ \t]*self\.(?!d_model\b)\w*(?:model|net)(?:_?\d+)?[ \t]*=[ \t]*\w+[ \t]*(?:#.*)?$")


def may_hold_bf16_weights(data: bytes) -> bool:
    """CFX205's text gate after the Adam build: the file says `bfloat16`, or its model may
    come from elsewhere: a model-like name bound to a loader's result (`model =
    setup_lora_model(name)`), or a model a class is handed."""
    if b"bfloat16" in data:
        return True
    from cfgfix.analysis.project_modules import model_assignment_callees

    return bool(model_assignment_callees(data)) or _MODEL_HANDED_IN.search(data) is not None


V5 = {"requirements.txt": "transformers>=5.0\n"}


def dtype_origin(src, source) -> tuple[str, Related]:
    """How the weights got their dtype: `loaded with torch_dtype=... on line 3`."""
    state = source.state
    if state.cast_by is None:
        load = state.load
        text = f"loaded with `{(load.source or src).node_text(load.dtype_keyword)}` on {load.where}"
        return text, Related((load.source or src).span_of_node(load.call), f"loaded in {state.dtype} here")
    cast = state.cast_by
    method = src.node_text(cast)[len(src.node_text(cast.func.value)):]
    text = f"cast with `{' '.join(method.split())}` on line {cast.lineno}"
    return text, Related(src.span_of_node(cast), f"cast to {state.dtype} here")


def optimizer_name(build) -> str:
    return f"torch.optim.{build.cls}"
