"""A submodule of a tracked model replaced by a new module (a LoRA layer written by hand):
`setattr(parent, name, LoRALinear(module, r))`, `block.q_proj = LoRALinear(block.q_proj)`.

The new module's Parameters join the model's. Their dtype is the model's only when the
class makes them so; a project class whose `__init__` casts every Parameter it creates to
the dtype of a layer it is given (`self.lora_A = self.lora_A.to(original.weight.dtype)`,
`nn.Linear(d, r, dtype=base.weight.dtype)`) keeps the model's dtype. Any other new module
(torch's float32 default, a class cfgfix cannot read) leaves the dtype unknown (the model
walker, model_walker.py, then forgets it: precision over recall)."""

from __future__ import annotations

import ast

from cfgfix.analysis.names import dotted, walk

# Calls that create Parameters: torch's layers and `nn.Parameter` (by the last name).
_NEW_PARAMETERS = frozenset({
    "Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "LayerNorm", "Parameter", "Conv1D",
})


def new_module_class(value: ast.expr | None) -> ast.expr | None:
    """The class a replacement value builds (`LoRALinear(module, r)` -> `LoRALinear`), when
    it is spelt like one (a capital first letter); None for anything else."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return func if name[:1].isupper() else None


def keeps_wrapped_dtype(table, cls_node: ast.expr) -> bool:
    """The project class `cls_node` names casts every Parameter its `__init__` creates to
    the dtype of a layer its caller hands it; memoised on the class."""
    if table is None:
        return False
    found = table.class_lookup(cls_node)
    if found is None or not isinstance(found[1], ast.ClassDef):
        return False
    cls = found[1]
    cached = cls.__dict__.get("_cfgfix_keeps_wrapped_dtype")
    if cached is None:
        cached = _keeps_wrapped_dtype(cls)
        cls._cfgfix_keeps_wrapped_dtype = cached  # type: ignore[attr-defined]
    return cached


def _keeps_wrapped_dtype(cls: ast.ClassDef) -> bool:
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return False
    params = {a.arg for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs]} - {"self"}
    assignments = [(dotted(n.targets[0]), n.value) for n in walk(init)
                   if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) is not None]
    dtype_names: set[str] = set()  # `dtype = original_layer.weight.dtype`
    for target, value in assignments:
        if "." not in target and _wrapped_dtype(value, params, dtype_names):
            dtype_names.add(target)
    created: set[str] = set()  # `self.lora_A` built by a layer call without the wrapped dtype
    cast: set[str] = set()  # `self.lora_A` cast (or built) with it
    for target, value in assignments:
        if not target.startswith("self.") or target.count(".") != 1:
            continue
        if _creates_parameters(value):
            (cast if _with_dtype(value, params, dtype_names) else created).add(target)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "to" \
                and dotted(value.func.value) == target and _with_dtype(value, params, dtype_names):
            cast.add(target)  # `self.lora_A = self.lora_A.to(dtype)`
    return bool(created | cast) and created <= cast


def _creates_parameters(value: ast.expr) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in _NEW_PARAMETERS


def _with_dtype(call: ast.Call, params: set[str], dtype_names: set[str]) -> bool:
    """`dtype=` (or `.to(x)`'s argument) is the wrapped layer's dtype."""
    values = [k.value for k in call.keywords if k.arg == "dtype"]
    if isinstance(call.func, ast.Attribute) and call.func.attr == "to":
        values += call.args
    return any(_wrapped_dtype(v, params, dtype_names) for v in values)


def _wrapped_dtype(node: ast.expr, params: set[str], dtype_names: set[str]) -> bool:
    """`original_layer.weight.dtype`, `base.dtype`: a dtype read from a parameter of
    `__init__` (or a name bound to one)."""
    if isinstance(node, ast.Name):
        return node.id in dtype_names
    key = dotted(node)
    return key is not None and key.endswith(".dtype") and key.split(".")[0] in params
