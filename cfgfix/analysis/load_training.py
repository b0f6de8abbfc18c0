"""Is a loaded model trained? CFX206 asks of a `from_pretrained` without `dtype`: the
names its result is bound to are followed (through a function that returns it, two
levels deep) to an optimizer, a `*Trainer`, `accelerator.prepare` or `model.train()`;
PEFT, DeepSpeed and a frozen model say the load's dtype does not decide the training
precision.

Split from optimizers.py, with the small helpers both use: the answer reads the module
index only, and importing the Adam analysis pulled in the parameter flow (~7 ms of
imports for CFX206 on a training script; issue 15)."""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from cfgfix.analysis.names import dotted
from cfgfix.analysis.optimizer_sites import PARAM_METHODS


def _assigned_keys(stmt: ast.stmt) -> set[str]:
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    keys = set()
    for target in targets:
        for node in ast.walk(target):
            key = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if key and isinstance(getattr(node, "ctx", None), ast.Store):
                keys.add(key)
    return keys


def _mentions(call: ast.Call, key: str) -> bool:
    """`key` itself (not `key.attr`, not `key.parameters()`) among the call's arguments,
    also inside tuples, lists and dicts (`optimizers=(optimizer, scheduler)`)."""
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        stack = [arg]
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.Name, ast.Attribute)) and dotted(node) == key:
                return True
            if isinstance(node, ast.Starred):
                stack.append(node.value)
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                stack.extend(node.elts)
            elif isinstance(node, ast.Dict):
                stack.extend(v for v in node.values if v is not None)
    return False


def _last_name(name: str | None) -> str | None:
    return name.split(".")[-1] if name else None


def _is_false(call: ast.Call) -> bool:
    values = [*call.args, *(k.value for k in call.keywords if k.arg == "requires_grad")]
    return any(isinstance(v, ast.Constant) and v.value is False for v in values)


_TRAINER = re.compile(r"Trainer$")
_OPTIMIZER_CLASS = re.compile(
    r"^(Adam\w*|\w*AdamW\w*|SGD\w*|Adafactor|Lion\w*|RMSprop|Adagrad|Adadelta|Adamax|NAdam|RAdam|"
    r"LAMB|Lamb|Adan|Prodigy\w*|Muon\w*|\w*Optimizer)$"
)
_PEFT_CALLS = re.compile(r"peft|lora|kbit|adapter")


class Training(NamedTuple):  # not a frozen dataclass: a fraction of the import cost (issue 15)
    """What a script does with a loaded model: `evidence` that it trains it (None: no
    evidence), or `other` reason its dtype at load does not decide the training precision."""

    evidence: str | None = None
    other: str | None = None


def load_training(ctx, load_call: ast.Call) -> Training:
    """Follows the names a `from_pretrained` result is bound to (and through a function
    that returns it, two levels deep) to an optimizer, a `*Trainer`, `accelerator.prepare`
    or `model.train()`. PEFT (the base model stays frozen), DeepSpeed (fp32 master weights)
    and a frozen model are reported as `other`."""
    index = ctx.index
    site = next((s for s in index.calls if s.node is load_call), None)
    if site is None:
        return Training()
    for other in index.calls_within(site.context.stmt):
        if other.node is not load_call and _encloses_argument(other.node, load_call):
            found = _classify_use(other, "the model", lambda node: _chain_root(node) is load_call)
            if found is not None:
                return found
    return _follow(index, site.context, _bound_keys(site.context.stmt, load_call), depth=0)


class _Window(NamedTuple):
    """The lines where a name still holds the load: after the statement that binds it and
    before the next one that binds it again, in the same scope; a use inside a loop that
    also holds the binding may run after it on a later pass, wherever it is written."""

    after: int
    before: int | None
    loops: tuple

    def holds(self, site) -> bool:
        line = site.node.lineno
        if self.after < line and (self.before is None or line < self.before):
            return True
        return any(loop in self.loops for loop in site.context.loops)


def _window(context, key: str) -> _Window | None:
    """None for `self.x` (methods run in any order). Only a rebinding in the binding's own
    block ends the window: one under an `if` may not run, and the load may still be trained."""
    if key.startswith("self."):
        return None
    stmt = context.stmt
    after = getattr(stmt, "end_lineno", None) or stmt.lineno
    before = next((node.lineno for node in context.block
                   if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno > after
                   and key in _assigned_keys(node)), None)
    return _Window(after, before, context.loops)


def _follow(index, context, keys: list[tuple[int | None, str]], depth: int) -> Training:
    found = Training()
    for _, key in keys:
        scope = context.classdef if key.startswith("self.") and context.classdef else context.function
        window = _window(context, key)
        result = _evidence_in(index, scope, key, window)
        if result.other:
            return result
        if result.evidence and not found.evidence:
            found = result
    if found.evidence or depth >= 2 or not isinstance(context.function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return found
    func = context.function
    for ret in (n for n in ast.walk(func) if isinstance(n, ast.Return) and n.value is not None):
        for position, key in keys:
            returned = _returned_position(ret.value, key)
            if returned is None:
                continue
            for caller in index.calls:
                if caller.name not in (func.name, f"self.{func.name}"):
                    continue
                targets = _bound_keys(caller.context.stmt, caller.node, position=returned)
                result = _follow(index, caller.context, targets, depth + 1)
                if result.other:
                    return result
                if result.evidence and not found.evidence:
                    found = result
    return found


def _evidence_in(index, scope, key: str, window: _Window | None = None) -> Training:
    """Uses of `key` in `scope` that show training; with a `window`, only the uses where the
    name still holds this load (a load after `trainer.train()` rebinding `model` for
    inference is not the trained one)."""
    calls = index.calls_within(scope) if scope is not None else [s for s in index.calls if s.context.function is None]
    if window is not None:
        calls = [s for s in calls if window.holds(s)]
    optimizers = [s for s in calls if _is_optimizer_class(s.name or "")]
    evidence = None
    for s in calls:
        receiver = s.receiver or ""
        if receiver == key or receiver.startswith(key + "."):
            if receiver == key and s.method == "requires_grad_" and _is_false(s.node):
                return Training(other=f"`{key}` is frozen on line {s.node.lineno}")
            if s.method in ("add_adapter", "load_adapter"):
                return Training(other=f"adapters are added to `{key}` on line {s.node.lineno} (PEFT)")
            if receiver == key and s.method == "train" and evidence is None:
                evidence = f"`{key}.train()` on line {s.node.lineno}"
            if s.method in PARAM_METHODS and evidence is None and _feeds_optimizer(s, optimizers):
                evidence = f"an optimizer over `{key}`'s parameters on line {s.node.lineno}"
            continue
        if _mentions(s.node, key):
            found = _classify_use(s, key, lambda node, key=key: dotted(node) == key)
            if found is not None and found.other:
                return found
            if found is not None and evidence is None and not _only_evaluated(s, calls):
                evidence = found.evidence
    return Training(evidence=evidence)


def _only_evaluated(site, calls) -> bool:
    """`trainer = Trainer(model=model, ...)` whose trainer, in the same scope, is evaluated or
    asked to predict and never trained: the model is not trained there."""
    if not _TRAINER.search(site.name or ""):
        return False
    stmt = site.context.stmt
    if not (isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return False
    name = stmt.targets[0].id
    methods = {c.method for c in calls if c.receiver == name}
    return "train" not in methods and bool(methods & {"evaluate", "predict"})


_OPTIMIZER_NAME = re.compile(r"optim|(^|_)opt$")


def _classify_use(site, what: str, is_it) -> Training | None:
    """A call that receives the model (`is_it(node)` tells which argument is the model)."""
    name = site.name or ""
    last = (_last_name(name) or "").lower()
    line = site.node.lineno
    if _PEFT_CALLS.search(last) or name.startswith("peft."):
        return Training(other=f"`{what}` goes to `{name}` on line {line} (PEFT trains adapters, the base stays frozen)")
    if name == "deepspeed.initialize":
        return Training(
            other=f"`{what}` goes to `deepspeed.initialize` on line {line}, which keeps fp32 master weights"
        )
    call = site.node
    if _TRAINER.search(name):
        # the trained model is the first argument or `model=`; `ref_model=`, `teacher=` are not
        first = bool(call.args) and is_it(call.args[0])
        if first or any(k.arg == "model" and is_it(k.value) for k in call.keywords):
            return Training(evidence=f"`{name}(model=...)` on line {line}")
        return None
    if site.method in ("prepare", "prepare_model") or (site.method == "setup" and "fabric" in name.lower()):
        # prepared together with an optimizer: a reference model is prepared alone
        names = [dotted(a) or "" for a in [*call.args, *(k.value for k in call.keywords)]]
        if any(_OPTIMIZER_NAME.search(n.split(".")[-1].lower()) for n in names):
            return Training(evidence=f"`{name}` with an optimizer on line {line}")
    return None


def _is_optimizer_class(name: str) -> bool:
    if name.startswith("torch.optim.") and "lr_scheduler" not in name:
        return True
    return bool(_OPTIMIZER_CLASS.match(_last_name(name) or ""))


def _feeds_optimizer(site, optimizers) -> bool:
    if any(_encloses_argument(o.node, site.node) for o in optimizers):
        return True
    names = {n for n in _assigned_keys(site.context.stmt) if "." not in n}
    return bool(names) and any(
        isinstance(n, ast.Name) and n.id in names for o in optimizers for n in ast.walk(o.node)
    )


def _encloses_argument(outer: ast.Call, inner: ast.AST) -> bool:
    for arg in [*outer.args, *(k.value for k in outer.keywords)]:
        if (arg.lineno, arg.col_offset) <= (inner.lineno, inner.col_offset) and (
            (inner.end_lineno, inner.end_col_offset) <= (arg.end_lineno, arg.end_col_offset)
        ):
            return True
    return False


def _chain_root(node: ast.AST) -> ast.AST:
    """`X.from_pretrained(...).to(d).train()` -> the load call."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr != "from_pretrained":
        node = node.func.value
    return node


def _bound_keys(stmt: ast.stmt, call: ast.Call, position: int | None = None) -> list[tuple[int | None, str]]:
    """The names an assignment binds `call` (or a method chain on it) to; with `position`,
    the element of a tuple target at that index (`model, tok = load()`)."""
    if isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets, value = [stmt.target], stmt.value
    else:
        return []
    keys = []
    for target in targets:
        if position is None and _chain_root(value) is call:
            key = dotted(target)
            if key:
                keys.append((None, key))
        elif position is not None and value is call:
            if position == -1:
                key = dotted(target)
            elif isinstance(target, ast.Tuple) and position < len(target.elts):
                key = dotted(target.elts[position])
            else:
                key = None
            if key:
                keys.append((None, key))
    return keys


def _returned_position(value: ast.AST, key: str) -> int | None:
    """-1 when `return key`, the index when `return a, key`, else None."""
    if dotted(value) == key:
        return -1
    if isinstance(value, ast.Tuple):
        for i, elt in enumerate(value.elts):
            if dotted(elt) == key:
                return i
    return None
