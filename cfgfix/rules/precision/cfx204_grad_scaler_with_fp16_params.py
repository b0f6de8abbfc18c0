"""CFX204 grad-scaler-with-fp16-params."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Iterator

from cfgfix.analysis.amp import (
    OPTIMIZER,
    AmpFacts,
    Resolver,
    Scaler,
    assignments,
    guarded_statements,
    scope_body,
    scope_resolver,
    short,
)
from cfgfix.analysis.names import dotted
from cfgfix.core import Finding, Related, Severity
from cfgfix.rules.base import Example, Rule, register

_DEVICE_ONLY = frozenset({"cuda", "cpu", "train", "eval", "requires_grad_", "share_memory"})
_CASTS = {"half": "float16", "bfloat16": "bfloat16", "float": "float32", "double": "float64"}
# Calls that see a module without changing its dtype (a model handed to anything else may
# be cast in place, e.g. PEFT's `prepare_model_for_kbit_training` up-casts to float32).
_HARMLESS = frozenset(
    {
        "print", "len", "isinstance", "type", "id", "str", "repr", "hasattr", "getattr", "vars",
        "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel", "torch.compile",
    }
)


@dataclass
class _Fp16Model:
    cast: ast.AST  # the `.half()`, `.to(torch.float16)` or float16 load
    key: str


@dataclass
class _Optimizer:
    built: ast.Call
    attached: str | None  # the name of the module whose parameters it holds, while bound
    model: _Fp16Model | None  # set while those parameters are known to be float16


@register
class GradScalerWithFp16Params(Rule):
    """## What it does
    Flags `scaler.step(optimizer)` / `scaler.unscale_(optimizer)` where the optimizer trains
    float16 parameters: a model made float16 (`model.half()`, `model.to(torch.float16)`,
    `from_pretrained(..., torch_dtype=torch.float16)`) whose `.parameters()` the optimizer
    was built from, with an enabled GradScaler.

    ## Why is this bad?
    It crashes at the first step: `ValueError: Attempting to unscale FP16 gradients.` A
    GradScaler unscales gradients in place and refuses float16 ones (`scaler.step` calls
    `unscale_` itself). Loss scaling is designed for float32 weights under float16
    autocast, where the weights and their gradients stay float32; PyTorch's autocast docs
    also say not to call `.half()` on a model that is autocast.

    cfgfix stays silent when the cast happens only under a condition, when the model is
    handed to other code between the cast and the optimizer (PEFT's
    `prepare_model_for_kbit_training` and `get_peft_model` create or up-cast float32
    parameters), when the optimizer gets something other than the model's own parameters
    (an fp32 master copy), when the same code freezes or replaces parameters
    (`requires_grad`, `.data =`: frozen float16 parameters get no gradient and raise
    nothing), and when the scaler is disabled or decided at run time.

    ## Example
    ```python
    model = Net().cuda().half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    ...
    scaler.step(optimizer)
    ```

    ## Use instead
    ```python
    model = Net().cuda()  # float32 weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Fix safety
    No automatic fix: keeping the weights in float32 doubles their memory, and dropping the
    scaler leaves pure float16 training, which has its own problems (CFX203). The choice is
    yours.

    ## References
    - facts A5, D1: `torch/amp/grad_scaler.py` L274-275 raises
      `ValueError("Attempting to unscale FP16 gradients.")`; reproduced on CPU.
    - `torch/amp/autocast_mode.py`: "You should not call ``half()`` or ``bfloat16()`` on your
      model(s) or inputs when using autocasting."
    """

    code = "CFX204"
    name = "grad-scaler-with-fp16-params"
    severity = Severity.ERROR
    fix_availability = "none"
    triggers = ((b"GradScaler",), (b"half", b"float16"), (b".step(", b"unscale_("), (b"parameters(",))

    VALID = [
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n"
            "    loss = model(x).mean()\n"
            "scaler.scale(loss).backward()\n"
            "scaler.step(optimizer)\n"
            "scaler.update()\n",
            why="float32 weights under float16 autocast: what the scaler is for",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda()\n"
            "if args.half:\n"
            "    model.half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="the cast happens only under a condition",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "from peft import get_peft_model\n"
            "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.float16)\n"
            "model = get_peft_model(model, lora_config)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="PEFT adapters are float32 (the base weights are frozen)",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "master = [p.detach().float().requires_grad_() for p in model.parameters()]\n"
            "optimizer = torch.optim.AdamW(master, lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="the optimizer trains a float32 master copy",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda', enabled=args.amp)\n"
            "scaler.step(optimizer)\n",
            why="the scaler is enabled only for some runs",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "model.float()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="cast back to float32 before training",
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "for p in model.parameters():\n"
            "    p.requires_grad = False\n"
            "model.head.float().requires_grad_(True)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "scaler.step(optimizer)\n",
            why="frozen float16 parameters get no gradient; the trained head is float32",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "class SFTTrainer:\n"
            "    def __init__(self, args):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(args.model).half().cuda()\n"
            "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr)\n"
            "        self.scaler = torch.amp.GradScaler('cuda')\n"
            "    def step(self, batch):\n"
            "        with torch.autocast('cuda', dtype=torch.float16):\n"
            "            loss = self.model(**batch).loss\n"
            "        self.scaler.scale(loss).backward()\n"
            "        self.scaler.step(self.optimizer)\n"
            "        self.scaler.update()\n",
            why="a trainer class builds the scaler in `__init__` and steps it in another method",
            line=12,
        ),
        Example(
            "import torch\n"
            "model = Net().cuda().half()\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
            "for x, y in loader:\n"
            "    with torch.cuda.amp.autocast():\n"
            "        loss = criterion(model(x), y)\n"
            "    scaler.scale(loss).backward()\n"
            "    scaler.step(optimizer)\n"
            "    scaler.update()\n",
            why="`.half()` on the model plus the textbook AMP loop",
            line=9,
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "def train(args):\n"
            "    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float16)\n"
            "    model.gradient_checkpointing_enable()\n"
            "    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "    for batch in loader:\n"
            "        scaler.scale(model(**batch).loss).backward()\n"
            "        scaler.unscale_(optimizer)\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n",
            why="a float16 load trained in full; `unscale_` is the first call that raises",
            line=10,
        ),
        Example(
            "import torch\n"
            "model = Net()\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model.to('cuda', dtype=torch.half)\n"
            "scaler = torch.amp.GradScaler()\n"
            "scaler.step(optimizer)\n",
            why="the in-place cast after the optimizer still makes its parameters float16",
            line=6,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        facts = AmpFacts.of(ctx)
        scopes = {id(s.function): s for s in facts.scalers if s.enabled is True and s.key}
        for scaler in scopes.values():
            function = scaler.function
            body = scope_body(ctx, function) + _later_methods(ctx, scaler)
            if not _changes_trainable_params(body):
                yield from self._scope(ctx, function, facts, body)

    def _scope(self, ctx, function, facts: AmpFacts, body: list | None = None) -> Iterator[Finding]:
        """One pass over a scope's statements in source order. Casts to float16 count only
        when unconditional; anything that may undo them (a cast back, the model handed to
        other code, a rebinding) counts wherever it is."""
        src = ctx.source
        resolver = scope_resolver(ctx, function)
        scaler_calls = {id(s.call): s for s in facts.scalers}
        fp16: dict[str, _Fp16Model] = {}  # key -> how the module it names became float16
        optimizers: dict[str, _Optimizer] = {}
        scalers: dict[str, Scaler] = {}
        reported: set[str] = set()

        def cast(key: str, dtype: str | None, node: ast.AST, guarded: bool) -> None:
            if dtype is None:
                return  # a device move
            if dtype == "float16":
                if not guarded:
                    fp16[key] = _Fp16Model(node, key)
                    for opt in optimizers.values():
                        if opt.attached == key:
                            opt.model = fp16[key]
            else:
                forget(key)

        def forget(key: str) -> None:
            fp16.pop(key, None)
            for opt in optimizers.values():
                if opt.attached == key:
                    opt.model = None

        def unbind(key: str) -> None:
            fp16.pop(key, None)
            optimizers.pop(key, None)
            scalers.pop(key, None)
            for opt in optimizers.values():
                if opt.attached == key:
                    opt.attached = None  # the optimizer keeps the old module's parameters

        for stmt, guarded in guarded_statements(body if body is not None else scope_body(ctx, function)):
            for call in _calls_in(stmt):
                func = call.func
                receiver = dotted(func.value) if isinstance(func, ast.Attribute) else None
                if receiver is not None:
                    method = func.attr
                    if method in _CASTS or method in ("to", "type", "apply"):
                        dtype = "?" if method == "apply" else _cast_dtype(call, resolver)
                        # Module casts work in place: the name (and an optimizer holding its
                        # parameters) sees the new dtype, whatever the statement binds.
                        cast(receiver, dtype, call, guarded)
                        for key in [k for k in fp16 if receiver.startswith(k + ".")]:
                            if dtype not in (None, "float16"):
                                forget(key)  # a sub-module cast back to float32
                    if (method in ("step", "unscale_") and receiver in scalers and call.args
                            and receiver not in reported):
                        opt = optimizers.get(dotted(call.args[0]) or "")
                        if opt is not None and opt.model is not None:
                            reported.add(receiver)
                            yield self._finding(src, call, opt.model, opt.built, scalers[receiver])
                if (ctx.index.imports.qualify(func) or "") not in _HARMLESS:
                    for arg in [*call.args, *(k.value for k in call.keywords)]:
                        key = dotted(arg.value if isinstance(arg, ast.Starred) else arg)
                        if key is not None and (key in fp16 or any(o.attached == key for o in optimizers.values())):
                            forget(key)  # handed to code that may cast it or wrap its parameters
            for target, value in assignments(stmt):
                key = dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if key is None:
                    for node in ast.walk(target):
                        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                            unbind(dotted(node) or "")
                    continue
                unbind(key)
                if value is None or isinstance(stmt, ast.AugAssign):
                    continue
                if isinstance(value, ast.Call) and id(value) in scaler_calls:
                    if scaler_calls[id(value)].enabled is True:
                        scalers[key] = scaler_calls[id(value)]
                    continue
                model = _fp16_value(ctx, value, resolver)
                if model is not None:
                    if not guarded:
                        fp16[key] = _Fp16Model(model, key)
                    continue
                model_key = _optimized_model(ctx, value)
                if model_key is not None and not guarded:
                    optimizers[key] = _Optimizer(value, model_key, fp16.get(model_key))

    def _finding(self, src, call: ast.Call, model: _Fp16Model, built: ast.Call, scaler: Scaler) -> Finding:
        return self.finding(
            src.span_of_node(call),
            f"`{short(src, call)}` raises `ValueError: Attempting to unscale FP16 gradients.`: the "
            f"optimizer (line {built.lineno}) trains the parameters of `{model.key}`, which are float16 "
            f"(`{short(src, model.cast, 60)}`, line {model.cast.lineno}). A GradScaler is for float32 "
            "weights under float16 autocast; keep the weights in float32 and autocast the forward, "
            "or train without the scaler.",
            related=[
                Related(src.span_of_node(model.cast), "the parameters become float16 here"),
                Related(src.span_of_node(scaler.call), "the GradScaler"),
            ],
        )


def _changes_trainable_params(body: list[ast.stmt]) -> bool:
    """Freezing or replacing parameters (`p.requires_grad = False`, `requires_grad_()`,
    `p.data = p.data.float()`): frozen float16 parameters get no gradient and raise
    nothing, and the trained ones may be float32. cfgfix cannot follow which is which."""
    for stmt, _ in guarded_statements(body):
        for target, _value in assignments(stmt):
            if isinstance(target, ast.Attribute) and target.attr in ("requires_grad", "data"):
                return True
        if any(isinstance(c.func, ast.Attribute) and c.func.attr == "requires_grad_" for c in _calls_in(stmt)):
            return True
    return False


def _calls_in(stmt: ast.stmt) -> list[ast.Call]:
    """Calls of one statement's own expressions (not its nested blocks), innermost first."""
    roots = [v for name, v in ast.iter_fields(stmt) if name not in ("body", "orelse", "finalbody", "handlers", "cases")]
    stack = []
    for value in roots:
        stack.extend(value if isinstance(value, list) else [value])
    seen = []
    while stack:
        node = stack.pop()
        if not isinstance(node, ast.AST) or isinstance(node, (ast.Lambda, ast.stmt)):
            continue
        if isinstance(node, ast.Call):
            seen.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return sorted(seen, key=lambda c: (c.end_lineno, c.end_col_offset))


def _cast_dtype(call: ast.Call, resolver: Resolver) -> str | None:
    """The dtype a method call casts to: a dtype, "?" when it may cast to an unknown one,
    None when it keeps the dtype (a device move)."""
    method = call.func.attr  # type: ignore[attr-defined]
    if method in _CASTS:
        return _CASTS[method] if not call.args and not call.keywords else "?"
    if method == "type":
        return "?"
    if method != "to":
        return None
    found = None
    for arg in [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", None))]:
        dtype = resolver.dtype(arg)
        if dtype is not None and dtype != "default":
            found = dtype
        elif not _looks_like_device(arg, resolver):
            return "?"
    return found


def _looks_like_device(node: ast.expr, resolver: Resolver) -> bool:
    node = resolver.deref(node)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (str, int)) and not isinstance(node.value, bool)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Call):
        return resolver.imports.qualify(node.func) == "torch.device"
    name = dotted(node)
    return bool(name) and "device" in name.split(".")[-1].lower() or name in ("rank", "local_rank")


def _fp16_value(ctx, value: ast.expr, resolver: Resolver) -> ast.AST | None:
    """The call that makes `value` a float16 module: the outermost cast of a method chain
    (`Net().cuda().half()`, `.half().to(device)`), or a float16 `from_pretrained` load."""
    node = value
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        method = node.func.attr
        if method in _CASTS or method in ("to", "type"):
            dtype = _cast_dtype(node, resolver)
            if dtype == "float16":
                return node
            if dtype is not None:
                return None  # another dtype, or one cfgfix cannot tell
        elif method == "from_pretrained":
            keywords = {k.arg: k.value for k in node.keywords}
            if None in keywords or any(k in keywords for k in ("load_in_4bit", "load_in_8bit", "quantization_config")):
                return None
            dtype = keywords.get("dtype", keywords.get("torch_dtype"))
            return node if dtype is not None and resolver.dtype(dtype, strings=True) == "float16" else None
        elif method not in _DEVICE_ONLY:
            return None
        node = node.func.value
    return None


def _optimized_model(ctx, value: ast.expr) -> str | None:
    """`torch.optim.AdamW(model.parameters(), ...)` -> "model": the one model whose own
    parameters the optimizer trains (filters and comprehensions allowed, nothing else)."""
    if not isinstance(value, ast.Call):
        return None
    name = ctx.index.imports.qualify(value.func) or ""
    if not OPTIMIZER.search(name):
        return None
    params = value.args[0] if value.args else next((k.value for k in value.keywords if k.arg == "params"), None)
    if params is None:
        return None
    model = None
    for node in ast.walk(params):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("parameters", "named_parameters") and not node.args:
            key = dotted(func.value)
            if key is None or (model is not None and key != model):
                return None
            model = key
        elif not (isinstance(func, ast.Name) and func.id in ("filter", "list", "tuple")):
            return None
    return model


def _later_methods(ctx, scaler) -> list[ast.stmt]:
    """A trainer class builds `self.scaler` in one method and steps it in others: their
    statements follow the building method's, as one pass would see them at run time."""
    if not (scaler.key or "").startswith("self.") or scaler.function is None:
        return []
    context = ctx.index.contexts.get(id(scaler.function))
    cls = context.classdef if context is not None else None
    if cls is None:
        return []
    later = []
    for method in cls.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method is not scaler.function:
            if any(dotted(n) == scaler.key for n in ast.walk(method) if isinstance(n, ast.Attribute)):
                later.extend(method.body)
    return later
