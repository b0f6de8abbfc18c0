"""Whether a file may run float16 at all, from its text, less the casts that cannot.

A rule that speaks only where nothing runs float16 (a GradScaler beside bfloat16-only
autocast) reads every mention of float16 as a sign that something might: `torch.float16`,
`.half()`, `torch.half`, an `fp16` option. One kind of mention says nothing about the run:
a cast of a state dict's tensors when a checkpoint is written,

    state_dict = {k: v.half().cpu() for k, v in model.state_dict().items()}
    torch.save(state_dict, path)

`Tensor.half()` returns a new tensor; the model's parameters keep their dtype (and
`load_state_dict` copies values into the existing parameters, keeping theirs too). Such a
cast is one whose receiver is a value read from a state dict: the target of a `for` or a
comprehension over its `.items()` / `.values()`, or a subscript of it; a state dict being a
call of `state_dict()` (`model.state_dict()`, `get_peft_model_state_dict(model)`), or a name
spelled `*state_dict` or bound somewhere in the module to such a call. Every other mention
still counts.
"""

from __future__ import annotations

import ast
import re

from cfgfix.core import LazyRegex

# float16 may be in play somewhere in the file (not `bfloat16`/`bf16`): what this pattern
# finds, `fp16_mentions` finds by `bytes.find` (the pattern, starting with a lookbehind and
# an alternation, was tried at every position: ~5 ms on a 100 kB module, issue 15).
FP16_TEXT = LazyRegex(rb"(?<![bB])float16|\.half\(|torch\.half\b|(?<![bB])fp16|\bFP16")
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _not_b_before(data: bytes, at: int, end: int) -> bool:
    return at == 0 or data[at - 1] not in b"bB"


def _word_edge_after(data: bytes, at: int, end: int) -> bool:
    return end == len(data) or data[end] not in _WORD_BYTES


def _word_edge_before(data: bytes, at: int, end: int) -> bool:
    return at == 0 or data[at - 1] not in _WORD_BYTES


# FP16_TEXT's alternatives in its order: (literal, test of a hit at `at` ending at `end`)
_FP16_LITERALS = (
    (b"float16", _not_b_before),
    (b".half(", None),
    (b"torch.half", _word_edge_after),
    (b"fp16", _not_b_before),
    (b"FP16", _word_edge_before),
)


def fp16_mentions(data: bytes, first: bool = False) -> list[int]:
    """The starts of `FP16_TEXT.finditer(data)`'s matches (with `first`, a list holding one
    start when there is any match, else empty). At each start the first alternative that
    matches wins and the next match starts after it, as `re` does."""
    hits = []
    for order, (literal, test) in enumerate(_FP16_LITERALS):
        size = len(literal)
        at = data.find(literal)
        while at >= 0:
            if test is None or test(data, at, at + size):
                if first:
                    return [at]
                hits.append((at, order, at + size))
            at = data.find(literal, at + 1)
    hits.sort()
    starts, end = [], 0
    for at, _, stop in hits:
        if at >= end:
            starts.append(at)
            end = stop
    return starts
_FLOAT16 = frozenset({"float16", "half"})


def may_run_float16_text(data: bytes) -> bool:
    """Text only: a float16 mention that a state-dict cast cannot explain (no `state_dict`
    in the file), or any mention when one might (the tree decides, `may_run_float16`)."""
    return bool(fp16_mentions(data, first=True)) and b"state_dict" not in data


def may_run_float16(data: bytes, tree: ast.Module) -> bool:
    """Some float16 mention in the file lies outside every cast of state-dict tensors."""
    mentions = fp16_mentions(data)
    if not mentions:
        return False
    if b"state_dict" not in data:
        return True
    starts = [0]
    for match in re.finditer(rb"\n", data):
        starts.append(match.end())
    spans = []
    for cast in _state_dict_casts(tree):
        if cast.end_lineno is None or cast.end_col_offset is None:
            continue
        spans.append((starts[cast.lineno - 1] + cast.col_offset, starts[cast.end_lineno - 1] + cast.end_col_offset))
    return any(not any(a <= at < b for a, b in spans) for at in mentions)


def _state_dict_casts(tree: ast.Module) -> list[ast.Call]:
    """float16 casts (`.half()`, `.to(torch.float16)`) of tensors read from a state dict:
    inside the loop or comprehension whose target holds its values, or of a subscript."""
    bound = _bound_to_state_dicts(tree)
    casts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _float16_cast(node):
            receiver = _innermost(node.func.value)  # type: ignore[union-attr]
            if isinstance(receiver, ast.Subscript) and _is_state_dict(receiver.value, bound):
                casts.append(node)
        for target, iterable, inside in _iterations(node):
            over = _items_of(iterable, bound)
            if over == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                target = target.elts[1]
            elif over != "values":
                continue
            if not isinstance(target, ast.Name):
                continue
            for part in inside:
                for sub in ast.walk(part):
                    if isinstance(sub, ast.Call) and _float16_cast(sub):
                        receiver = _innermost(sub.func.value)  # type: ignore[union-attr]
                        if isinstance(receiver, ast.Name) and receiver.id == target.id:
                            casts.append(sub)
    return casts


def _iterations(node: ast.AST):
    """(target, iterable, what runs with the target bound) of a loop or comprehension."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        yield node.target, node.iter, node.body
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        for generator in node.generators:
            yield generator.target, generator.iter, [node.elt]
    elif isinstance(node, ast.DictComp):
        for generator in node.generators:
            yield generator.target, generator.iter, [node.key, node.value]


def _items_of(node: ast.expr, bound: set[str]) -> str | None:
    """"items" / "values" for `<state dict>.items()` / `.values()`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
            and node.func.attr in ("items", "values") and _is_state_dict(node.func.value, bound):
        return node.func.attr
    return None


def _is_state_dict(node: ast.expr, bound: set[str]) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name.endswith("state_dict") and not name.startswith("load")
    if isinstance(node, ast.Name):
        return node.id.endswith("state_dict") or node.id in bound
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("state_dict")
    return False


def _bound_to_state_dicts(tree: ast.Module) -> set[str]:
    """Names some assignment of the module binds to a `state_dict()` call (`sd =
    model.state_dict()`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_state_dict(node.value, set()) and isinstance(node.value, ast.Call):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _innermost(node: ast.expr) -> ast.expr:
    """The tensor a chain of tensor methods starts from: `v.detach().cpu()` -> `v`."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("detach", "cpu", "clone", "contiguous", "cuda", "to", "float", "half"):
        node = node.func.value
    return node


def _float16_cast(call: ast.Call) -> bool:
    if not isinstance(call.func, ast.Attribute):
        return False
    method = call.func.attr
    if method == "half":
        return True
    if method != "to":
        return False
    values = list(call.args) + [k.value for k in call.keywords if k.arg == "dtype"]
    return any(isinstance(v, ast.Attribute) and v.attr in _FLOAT16 for v in values)
