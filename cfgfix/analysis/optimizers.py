"""Which torch Adam/AdamW optimizers update which models' weights, in what dtype, and
whether something else (DeepSpeed, accelerate, a Trainer, PEFT, a wrapper optimizer) takes
over the precision of those updates. Used by CFX203 and CFX205 (whether a loaded model
is trained at all, CFX206's question, is analysis/load_training.py).

Which module's Parameters each optimizer holds, and their dtype where `.parameters()` was
taken, come from the shared parameter flow (`analysis.parameters`): this module is a query
over it for torch Adam/AdamW, adding what those rules need to know about ownership.

Precision over recall: the optimizer or the model handed to anything that may own the
precision (`accelerator.prepare`, `deepspeed.initialize`, a `*Trainer`, `amp.initialize`,
FSDP, PEFT, a wrapper optimizer), a later cast, a loop that edits or freezes parameters,
or an optimizer that is never stepped: the pair is reported as owned, and rules stay silent.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from cfgfix.analysis.load_training import _assigned_keys, _is_false, _last_name, _mentions
from cfgfix.analysis.model_loads import _Resolver
from cfgfix.analysis.model_wrappers import wrapper_kind
from cfgfix.analysis.names import dotted
from cfgfix.analysis.parameters import PARAM_METHODS, SAME_PARAMETERS, ParamSource, keeps_dtype, parameter_flow

TORCH_ADAM = {
    "torch.optim.Adam": "Adam",
    "torch.optim.adam.Adam": "Adam",
    "torch.optim.AdamW": "AdamW",
    "torch.optim.adamw.AdamW": "AdamW",
}
# Where a model or an optimizer handed over may get fp32 master weights, an up-cast, frozen
# base weights or a replacement optimizer (matched on the callee's last name, lower-cased).
_OWNER = re.compile(
    r"prepare|initiali[sz]e|setup|wrap|optimi[sz]e|boost|trainer|fsdp|fullysharded|fully_shard|"
    r"deepspeed|fp16|fp32|master|kahan|peft|lora|kbit|adapter|^amp$|fabric|lookahead"
)
# Calls that may take the optimizer without touching its precision.
_HARMLESS_FOR_OPTIMIZER = re.compile(
    r"(?i)schedul|warmup|(^|_)lr$|[a-z]LR$|^(print|len|isinstance|type|id|str|repr|hasattr|getattr|vars|dir)$"
)
_PARAMETER_LOOP_METHODS = PARAM_METHODS | {"modules", "named_modules", "children", "named_children"}


# A NamedTuple and a plain class, not dataclasses: the same fields and equality, at a
# fraction of the import cost (issue 15; see parameters.py).
class AdamBuild(NamedTuple):
    call: ast.Call
    cls: str  # "Adam" or "AdamW"
    target: str | None  # the name the optimizer is bound to
    sources: tuple[ParamSource, ...]
    eps: float | None  # the eps it uses when known (the default included)
    eps_default: bool
    fused: bool | None  # a constant `fused=`, None when absent
    hidden: bool  # `**kwargs` or a `fused=`/`eps=` that cannot be resolved
    beta2: float  # 0.999 unless a constant says otherwise
    owner: str | None  # why the precision of its updates is decided elsewhere, if it may be
    eps_node: ast.AST | None = None  # the `eps` argument as written

    @property
    def line(self) -> int:
        return self.call.lineno


class OptimizerAnalysis:
    def __init__(self) -> None:
        self.builds: list[AdamBuild] = []
        # id(ParamSource.call) -> why that model's precision is decided elsewhere
        self.model_owner: dict[int, str] = {}

    def owner_of(self, build: AdamBuild, source: ParamSource) -> str | None:
        return build.owner or self.model_owner.get(id(source.call))


def optimizer_analysis(ctx) -> OptimizerAnalysis:
    """Computed once per file and kept in `ctx.notes`."""
    cached = ctx.notes.get("optimizers")
    if cached is None:
        cached = ctx.notes["optimizers"] = _Builder(ctx).run()
    return cached


class _Builder:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.index = ctx.index
        self.imports = ctx.models.imports
        self.tree = ctx.document.tree
        self.sites = {id(site.node): site for site in self.index.calls}

    def run(self) -> OptimizerAnalysis:
        result = OptimizerAnalysis()
        sites = self.index.calls_named(*TORCH_ADAM)
        if not sites:
            return result
        flow = parameter_flow(self.ctx)
        self.casts = [*flow.analysis.calls, *self.ctx.models.calls]
        for site in sites:
            built = flow.builds.get(id(site.node))
            consts = flow.consts.get(id(site.context.function or self.tree))
            if built is None or consts is None:
                continue  # in a lambda, or in code the walk does not reach
            build = self._build(site, consts, built.sources)
            result.builds.append(build)
            for source in build.sources:
                reason = self._model_owner(source, site)
                if reason:
                    result.model_owner[id(source.call)] = reason
        return result

    # -- one optimizer -----------------------------------------------------------------
    def _build(self, site, consts: dict, found: tuple[ParamSource, ...]) -> AdamBuild:
        call = site.node
        cls = TORCH_ADAM[site.name]
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        hidden = any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)
        resolver = _Resolver(self.imports, consts)
        eps_node = keywords.get("eps", call.args[3] if len(call.args) > 3 else None)
        eps, eps_default = 1e-8, eps_node is None
        if eps_node is not None:
            eps = _number(resolver.deref(eps_node))
            hidden = hidden or eps is None
        fused = None
        if "fused" in keywords:
            value = resolver.deref(keywords["fused"])
            if isinstance(value, ast.Constant) and (isinstance(value.value, bool) or value.value is None):
                fused = value.value
            else:
                hidden = True
        beta2 = 0.999
        betas = keywords.get("betas", call.args[2] if len(call.args) > 2 else None)
        if betas is not None:
            betas = resolver.deref(betas)
            if isinstance(betas, (ast.Tuple, ast.List)) and len(betas.elts) == 2:
                beta2 = _number(resolver.deref(betas.elts[1])) or beta2
        target = _assigned_key(site.context.stmt, call)
        owner = self._optimizer_owner(site, target)
        return AdamBuild(call, cls, target, tuple(found), eps, eps_default, fused, hidden, beta2, owner, eps_node)

    def _optimizer_owner(self, site, target: str | None) -> str | None:
        if target is None:
            return "the optimizer is not bound to a name (it is built inside another call)"
        stepped = any(s.receiver == target for s in self.index.calls_to_method("step"))
        if not stepped and not self.ctx.models.trains and not self._handed_to_project_loop(site, target):
            return "the optimizer is never stepped in this file"
        for other in self._calls_seeing(site, target):
            if other.receiver == target or other.node is site.node or not _mentions(other.node, target):
                continue
            callee = _last_name(other.name) or ""
            if _HARMLESS_FOR_OPTIMIZER.search(callee):
                continue
            if other.method in ("step", "unscale_") and "scaler" in (other.receiver or "").rsplit(".", 1)[-1].lower():
                continue  # GradScaler.step(opt) calls opt.step(): it owns no precision
            local = self._local_functions(other)
            if local and not _calls_owner(self.index, local):
                continue  # this module's own training loop
            project = self._project_function(other)
            if project is not None and not _walk_calls_owner(project):
                continue  # the project's own loop in another module (`engine.train_one_epoch(...)`)
            return f"the optimizer is handed to `{other.name or 'a call'}` on line {other.node.lineno}"
        return None

    def _project_function(self, site) -> ast.AST | None:
        """The function of another project module that a call runs (`from engine import
        train_one_epoch`, `import engine; engine.train_one_epoch(...)`); None for this module's
        own functions, methods, classes and anything outside the project."""
        func = site.node.func
        if not isinstance(func, (ast.Name, ast.Attribute)) or self.ctx.functions is None:
            return None
        table = self.ctx.functions
        if isinstance(func, ast.Name) and (func.id in table.defs or func.id in table.classes):
            return None
        found = table.lookup(func, None)
        if found is None or found[0] is table or found[2]:
            return None
        node = found[1]
        return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None

    def _handed_to_project_loop(self, site, target: str) -> bool:
        """The optimizer is passed to a function of another project module that steps it
        (`train_one_epoch(model, loader, optimizer)` and there `optimizer.step()`)."""
        for other in self._calls_seeing(site, target):
            if other.receiver == target or other.node is site.node or not _mentions(other.node, target):
                continue
            function = self._project_function(other)
            if function is not None and _steps_argument(function, other.node, target):
                return True
        return False

    # -- one model ---------------------------------------------------------------------
    def _model_owner(self, source: ParamSource, site) -> str | None:
        key, load = source.key, source.state.load
        if load.quantized or getattr(load, "quant_keywords", False):
            return "the model is quantized"
        here = site.context.function
        for mc in self.casts:
            if mc.state.load.call is not load.call or mc.call is load.call:
                continue
            if not mc.dtype_unknown and mc.target_dtype in (None, source.dtype):
                continue  # a device move, or the same dtype again
            cast_site = self.sites.get(id(mc.call))
            elsewhere = cast_site is None or cast_site.context.function is not here
            if elsewhere or _after(mc.call, source.call):
                return f"the model is cast again on line {mc.call.lineno}"
        for other in self._calls_seeing(site, key):
            if other.receiver == key:
                if other.method == "requires_grad_" and _is_false(other.node):
                    return f"the model is frozen on line {other.node.lineno}"
                if other.method in ("apply", "add_adapter", "load_adapter"):
                    return f"`{key}.{other.method}()` on line {other.node.lineno} may change its parameters"
                continue
            if other.name in SAME_PARAMETERS or keeps_dtype(other.name, other.node) or not _mentions(other.node, key):
                continue
            if _recast_after_wrap(other, source, self.sites) or _adapters_in_base_dtype(other, source):
                continue
            callee = (_last_name(other.name) or "").lower()
            local = self._local_functions(other)
            # A function of this module or of the project is judged by what it calls, not by
            # its name (`save_lora_weights(model, path)` saves); anything else by its name.
            project = self._project_function(other) if not local else None
            if (local and _calls_owner(self.index, local)) or (project is not None and _walk_calls_owner(project)) \
                    or (not local and project is None and _OWNER.search(callee)):
                return f"the model is handed to `{other.name}` on line {other.node.lineno}"
            # rebound to what a function of the project returns: the flow followed it
            if not local and project is None and key in _assigned_keys(other.context.stmt):
                return f"`{key}` is rebound to the result of `{other.name}` on line {other.node.lineno}"
        for node in ast.walk(self._scope_node(site, key)):
            loops = isinstance(node, (ast.For, ast.AsyncFor)) and _iterates_parameters_of(node.iter, key)
            if loops and _edits_loop_target(node):
                return f"a loop over its parameters on line {node.lineno} edits or freezes them"
        return None

    def _scope_node(self, site, key: str) -> ast.AST:
        """Where `key` means the same object as at `site`: the class for `self.x`, the
        function for a local name, the module for a module-level name."""
        context = site.context
        if key.startswith("self.") and context.classdef is not None:
            return context.classdef
        return context.function or self.tree

    def _calls_seeing(self, site, key: str) -> list:
        scope = self._scope_node(site, key)
        if scope is not self.tree:
            return self.index.calls_within(scope)
        root = key.split(".")[0]
        shadowing = [f for f in self.index.functions if _binds_locally(f, root)]
        return [s for s in self.index.calls if not any(_inside(f, s.node) for f in shadowing)]

    def _local_functions(self, site) -> list[ast.AST]:
        """The functions of this module a call may run (`train(...)`, `self.train(...)`)."""
        name = site.name
        if not name or ("." in name and not (name.startswith("self.") and name.count(".") == 1)):
            return []
        short = name.split(".")[-1]
        return [f for f in self.index.functions if getattr(f, "name", None) == short]


def _recast_after_wrap(wrap_site, source: ParamSource, sites: dict) -> bool:
    """A PEFT wrap (`get_peft_model`, `prepare_model_for_kbit_training`) followed, in the
    same scope, by the whole-model cast that gave the model the dtype it has where the
    optimizer takes its parameters. The cast reaches the adapters too (`model.to(torch.bfloat16)`
    on a PeftModel makes the LoRA weights bfloat16, whatever peft created them in: checked on
    peft 0.21.2), so the wrap no longer keeps float32 trainable weights. A cast before the wrap
    is not this: peft >= 0.12 creates float32 adapters over a half-precision base by default
    (`autocast_adapter_dtype=True`), older peft the base's dtype, so the rule stays silent.
    `PeftModel.from_pretrained` is left an owner: without `is_trainable=True` its adapters
    are frozen and nothing may train."""
    kind = wrapper_kind(wrap_site.name)
    if kind not in ("adapters", "upcast") or (wrap_site.name or "").endswith(".from_pretrained"):
        return False
    cast = source.state.cast_by
    cast_site = sites.get(id(cast)) if cast is not None else None
    return (
        source.dtype in ("float16", "bfloat16")
        and cast_site is not None
        and cast_site.context.function is wrap_site.context.function
        and _after(cast, wrap_site.node)
    )


def _adapters_in_base_dtype(wrap_site, source: ParamSource) -> bool:
    """`get_peft_model` on a peft whose LoRA adapters take the base's dtype (the model flow
    kept the dtype through the wrap: `model_wrappers.keeps_base_dtype`): every trained
    weight is half precision, the wrap owns nothing."""
    state = source.state
    return (wrapper_kind(wrap_site.name) == "adapters" and (wrap_site.name or "").endswith("get_peft_model")
            and state.base is not None and state.dtype in ("float16", "bfloat16"))


def _binds_locally(func: ast.AST, name: str) -> bool:
    args = func.args
    if name in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
        return True
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(func))


def _inside(outer: ast.AST, inner: ast.AST) -> bool:
    return (outer.lineno, outer.col_offset) <= (inner.lineno, inner.col_offset) and (
        (inner.end_lineno, inner.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)
    )


def _calls_owner(index, functions: list[ast.AST]) -> bool:
    return any(
        _OWNER.search((_last_name(inner.name) or "").lower())
        for func in functions
        for inner in index.calls_within(func)
    )


def _walk_calls_owner(function: ast.AST) -> bool:
    """`_calls_owner` for a function of another module (no module index there)."""
    return any(
        isinstance(node, ast.Call) and _OWNER.search((_last_name(dotted(node.func)) or "").lower())
        for node in ast.walk(function)
    )


def _steps_argument(function: ast.AST, call: ast.Call, target: str) -> bool:
    """`function` steps the parameter that `call` binds to `target`: `optim.step()`, or a
    scaler's `scaler.step(optim)` (which calls it)."""
    args = function.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    names = set()
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            break
        if dotted(arg) == target and index < len(positional):
            names.add(positional[index])
    names.update(k.arg for k in call.keywords if k.arg and dotted(k.value) == target)
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
        and any(isinstance(n, ast.Name) and n.id in names for n in [node.func.value, *node.args[:1]])
        for node in ast.walk(function)
    )


# ---------------------------------------------------------------------------- helpers


def _number(node: ast.AST | None) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _assigned_key(stmt: ast.stmt, call: ast.Call) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1:
        return dotted(stmt.targets[0])
    if isinstance(stmt, ast.AnnAssign) and stmt.value is call:
        return dotted(stmt.target)
    return None


def _after(a: ast.AST, b: ast.AST) -> bool:
    return (a.lineno, a.col_offset) > (b.lineno, b.col_offset)


def _iterates_parameters_of(node: ast.AST, key: str) -> bool:
    for inner in ast.walk(node):
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in _PARAMETER_LOOP_METHODS
        ):
            receiver = dotted(inner.func.value) or ""
            if receiver == key or receiver.startswith(key + "."):
                return True
    return False


def _edits_loop_target(loop: ast.For | ast.AsyncFor) -> bool:
    """The body changes what the loop variable refers to: assigns one of its attributes
    (`p.data = p.data.float()`, `p.requires_grad = False`, `module.weight = ...`) or casts
    or freezes it (`module.to(torch.float32)`, `p.requires_grad_(False)`)."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}

    def rooted(node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id in names

    for stmt in loop.body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and rooted(t) for t in targets):
                    return True
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("to", "float", "half", "bfloat16", "requires_grad_", "type")
                and rooted(node.func.value)
            ):
                return True
    return False
