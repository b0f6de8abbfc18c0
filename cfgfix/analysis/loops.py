"""Loops of training scripts: which run a training or evaluation *step*, which only
evaluate, and where autograd is switched off. Shared by CFX301-CFX303.

Built on the module index (every call with its loops, `with` blocks and function), once per
module and cached in `ctx.notes` (`loop_analysis(ctx)`). Everything here answers "not sure"
with the reading that keeps a rule silent: a `with` item that may disable autograd counts as
disabling it, a value whose origin is unknown does not require grad.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property

from cfgfix.analysis.names import BLOCKS_OF, block_fields, child_nodes, dotted, walk
from cfgfix.analysis.structure import CallSite, Context, Function, Loop, ModuleIndex
from cfgfix.core import LazyRegex

NOTE = "cfgfix.analysis.loops"
_LOOP_TYPES = frozenset((ast.For, ast.AsyncFor, ast.While))  # `Loop`, for `type(node) in`
_SCOPE_TYPES = frozenset((ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
# The statements `ScopeFlow._bind` reads names from.
_BINDING_TYPES = frozenset((ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith))

# The last part of a dotted name that conventionally holds an `nn.Module`: `model`,
# `self.model`, `ref_model`, `unet`, `text_encoder_2`, `resnet`.
_MODULE_NAME = LazyRegex(
    r"(?:^|_)(?:model|network|unet|vae|transformer|encoder|decoder|backbone|classifier|teacher|student)"
    r"(?:_?\d+)?$|net(?:_?\d+)?$",
    re.IGNORECASE,
)
_OPTIMIZER = LazyRegex(r"optim|^opt$|scaler$|engine$", re.IGNORECASE)
# Functions run by a framework that already turns autograd off around them.
_FRAMEWORK_NO_GRAD = frozenset({
    "validation_step", "test_step", "predict_step", "prediction_step", "eval_forward",
    "validation_epoch_end", "test_epoch_end",
})
EVAL_FUNCTION = LazyRegex(r"^_*(?:(?:evaluate|validate|evaluation|validation|eval|val)$|(?:eval|val)_)")
MODEL_LOADS = frozenset({
    "from_pretrained", "from_config", "from_single_file", "load_state_dict", "load_checkpoint",
    "load_model", "load_adapter",
})
_MODEL_LOAD_NAMES = frozenset({"torch.load", "safetensors.torch.load_file"})
_BATCH_WORDS = ("batch", "loader", "dataset", "data", "sample", "inputs", "examples", "chunk", "micro", "mini")
# `range(int(bs / fbs))`, `range(0, n, mbs)`: batch sizes by their usual short names.
_BATCH_SIZE_NAME = LazyRegex(r"^[a-z]?[a-z]?bs$|_bs$|^bsz$")
_MODEL_WORDS = ("model", "ckpt", "checkpoint")
# A function whose name says it makes a model (`get_parallel_model`, `self.build_model`,
# `create_reward_model`): calling it builds one, it does not run one.
_MODEL_BUILDER = LazyRegex(
    r"^_*(?:get|load|build|create|make|init|initialize|setup|set_up|prepare|instantiate|construct|new)_",
    re.IGNORECASE,
)


def loop_analysis(ctx) -> LoopAnalysis:
    analysis = ctx.notes.get(NOTE)
    if analysis is None:
        analysis = ctx.notes[NOTE] = LoopAnalysis(ctx.index, ctx.functions)
    return analysis


def last_part(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


def module_like(name: str | None) -> bool:
    """A dotted name whose last part is a conventional model name."""
    return bool(name) and bool(_MODULE_NAME.search(last_part(name)))


def builds_model(name: str | None) -> bool:
    """`get_parallel_model(...)`, `self.build_model(cfg)`: a call that makes a model-named
    object (a factory), not a forward pass of one."""
    return module_like(name) and bool(_MODEL_BUILDER.search(last_part(name)))


def is_backward(site: CallSite) -> bool:
    """`loss.backward()`, `accelerator.backward(loss)`, `self.manual_backward(loss)`,
    `torch.autograd.backward(...)`."""
    return site.method in ("backward", "manual_backward")


def is_optimizer_step(site: CallSite) -> bool:
    """`optimizer.step()`, `scaler.step(opt)`, `model_engine.step()`, `*.zero_grad()`."""
    if site.method == "zero_grad":
        return True
    if site.method == "train_batch":  # DeepSpeed's PipelineEngine: forward, backward and step
        return "engine" in last_part(site.receiver).lower()
    return site.method == "step" and bool(_OPTIMIZER.search(last_part(site.receiver)))


def identifiers(node: ast.AST | None) -> list[str]:
    """Every name and attribute identifier in an expression, lower-cased."""
    if node is None:
        return []
    out = []
    for sub in walk(node):
        if isinstance(sub, ast.Name):
            out.append(sub.id.lower())
        elif isinstance(sub, ast.Attribute):
            out.append(sub.attr.lower())
    return out


def grad_off_expr(expr: ast.AST, imports, with_item: bool = False) -> bool:
    """A `with` item or decorator that disables autograd, or may: `torch.no_grad()`,
    `torch.inference_mode()` (not `inference_mode(False)`), `torch.set_grad_enabled(x)`
    unless x is literally True, `no_grad() if cond else nullcontext()`, a custom
    `maybe_no_grad(...)`, or a context manager held in a variable (unknown: it may)."""
    if isinstance(expr, ast.IfExp):
        return grad_off_expr(expr.body, imports, with_item) or grad_off_expr(expr.orelse, imports, with_item)
    call = expr if isinstance(expr, ast.Call) else None
    func = call.func if call is not None else expr
    name = imports.qualify(func) or dotted(func)
    if name is None:
        return False
    last = last_part(name).lower()
    first = _first_arg(call, "mode")
    if "no_grad" in last:
        return True
    if "inference_mode" in last:
        return not (isinstance(first, ast.Constant) and first.value is False)
    if last == "set_grad_enabled":
        return not (isinstance(first, ast.Constant) and first.value is True)
    # `with ctx:` where ctx was built elsewhere: it may be no_grad
    return with_item and call is None and isinstance(expr, ast.Name)


def _first_arg(call: ast.Call | None, keyword: str) -> ast.AST | None:
    if call is None:
        return None
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


class LoopAnalysis:
    def __init__(self, index: ModuleIndex, functions=None) -> None:
        self.functions = functions  # `analysis.model_functions.FunctionTable`: the project's functions
        self.index = index
        self.imports = index.imports
        self._direct: dict[int, list[CallSite]] = {}
        self._within: dict[int, list[CallSite]] = {}
        self._scopes_done: set[int] = set()
        self._guarded_functions: dict[int, bool] = {}
        self._values = None  # `attributes.ValueIndex`, built when a helper object's method is asked about

    # -- calls per loop ----------------------------------------------------------------
    def direct_calls(self, loop: ast.stmt) -> list[CallSite]:
        """Calls that run once per iteration of `loop` (not inside a nested loop or def)."""
        self._index_loops(loop)
        return self._direct.get(id(loop), [])

    def calls_within(self, loop: ast.stmt) -> list[CallSite]:
        """Calls anywhere inside `loop`, nested loops included (nested defs not)."""
        self._index_loops(loop)
        return self._within.get(id(loop), [])

    def _index_loops(self, loop: ast.stmt) -> None:
        """The calls per loop of the scope around `loop`, once per scope: a module's every
        loop at once walked every function body of the module index (issue 15)."""
        calls = self.index.calls_in_scope_of(loop)
        if id(calls) in self._scopes_done:
            return
        self._scopes_done.add(id(calls))
        for site in calls:
            loops = site.context.loops
            if loops:
                self._direct.setdefault(id(loops[-1]), []).append(site)
                for outer in loops:
                    self._within.setdefault(id(outer), []).append(site)

    # -- statement structure -------------------------------------------------------------
    @cached_property
    def parents(self) -> dict[int, ast.AST]:
        """id(statement) -> the statement (or except handler / match case) holding it."""
        parents: dict[int, ast.AST] = {}
        stack: list[ast.AST] = [self.index.tree]
        while stack:
            node = stack.pop()
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, name, None)
                if isinstance(children, list):
                    for child in children:
                        parents[id(child)] = node
                        stack.append(child)
        return parents

    def chain(self, stmt: ast.stmt, stop: ast.AST) -> list[ast.AST]:
        """The compound statements (and handlers) between `stop` and `stmt`, innermost first."""
        out = []
        node = self.parents.get(id(stmt))
        while node is not None and node is not stop:
            out.append(node)
            node = self.parents.get(id(node))
        return out

    # -- what a loop does ----------------------------------------------------------------
    @cached_property
    def step_functions(self) -> set[str]:
        """Names of functions that run one training step themselves (a backward or an
        optimizer step outside any loop of theirs): `for batch in loader: train_step(batch)`."""
        names = set()
        for site in self.index.calls_to_method("backward", "manual_backward", "step", "zero_grad"):
            func = site.context.function
            if isinstance(func, Function) and not site.context.loops and (is_backward(site) or is_optimizer_step(site)):
                names.add(func.name)
        return names

    def calls_step_function(self, site: CallSite) -> bool:
        func = site.node.func
        if self.step_functions:
            if isinstance(func, ast.Name) and func.id in self.step_functions:
                return True
            if site.receiver in ("self", "cls") and site.method in self.step_functions:
                return True
        if isinstance(func, ast.Name) and self.functions is not None:
            found = self.functions.lookup(func, None)  # a step function in another module
            if found is not None and found[0] is not self.functions:
                return _runs_step(found[1])
        return self.calls_helper_step(site)

    def calls_helper_step(self, site: CallSite) -> bool:
        """`trainer.train_dpo(batch)`: a method that runs one step itself, of an object built
        from a project class (this module's or another's, a class it inherits the method
        from, either class of a conditional alias `cls = A if unsup else B`), through a name
        or `self.x` bound once."""
        func = site.node.func
        if self.functions is None or not isinstance(func, ast.Attribute) or site.receiver in (None, "self", "cls") \
                or site.method in _LOOP_STEP_METHODS or not self._class_names:
            return False  # most modules build no object of a project class: nothing to ask
        built = self.values.origin(func.value, site.context.function, site.context.classdef)
        if not isinstance(built, ast.Call):
            return False
        for cls in _class_choices(self.values, built.func, site.context):
            if (dotted(cls) or "").split(".")[0] not in self._class_names:
                continue  # a library class (`torch.nn.Linear`), never parsed for
            found = self.functions.class_lookup(cls)
            if found is not None and isinstance(found[1], ast.ClassDef) and \
                    _method_runs_step(found[0], found[1], site.method):
                return True
        return False

    @cached_property
    def _class_names(self) -> frozenset[str]:
        """The names that may build an object of a project class here: this module's
        classes, capitalised names imported from the project's modules, and the project
        modules imported whole (`engine.Trainer(...)`). Path lookups, no parse."""
        table = self.functions
        names = {name for name in table._classes if name[:1].isupper()}
        if table.project is not None and table.path is not None:
            imports = table.imports
            for local in [*imports.relative, *imports.aliases]:
                if local[:1].isupper() and table._resolves(local) or table.is_project_module(local):
                    names.add(local)
        return frozenset(names)

    @property
    def values(self):
        """The module's `attributes.ValueIndex` (what built a name or `self.x`), made once."""
        if self._values is None:
            from cfgfix.analysis.attributes import ValueIndex

            self._values = ValueIndex(self.index.tree)
        return self._values

    def returns_graph(self, call: ast.Call) -> bool:
        """A call of the project's own function that returns a loss with its graph
        (`loss = train_one_step(model, batch)`, `return outputs.loss`)."""
        if self.functions is None:
            return False
        found = self.functions.lookup(call.func, None)
        if found is None or not isinstance(found[1], Function):
            return False
        table, func, _ = found
        key = ("returns-graph", id(func))
        cache = table.__dict__.setdefault("_loop_notes", {})
        if key not in cache:
            cache[key] = False  # recursion: unknown while computed
            cache[key] = _function_returns_graph(func, table)
        return cache[key]

    @cached_property
    def known_modules(self) -> set[str]:
        """Dotted names used as modules: `.eval()`, `.train()`, `.parameters()` receivers."""
        return {
            site.receiver
            for site in self.index.calls_to_method(*self._MODULE_METHODS)
            if site.receiver and "trainer" not in site.receiver.lower()
        }

    def is_forward(self, site: CallSite, generate: bool = False) -> bool:
        """A forward pass of a known or conventionally named module: `model(x)`,
        `self.unet(...)`, `model.forward(x)` (and, when asked, `model.generate(...)`)."""
        func = site.node.func
        if site.method in ("forward", "generate"):
            if site.method == "generate" and not generate:
                return False
            name = site.receiver
        elif isinstance(func, (ast.Name, ast.Attribute)):
            name = dotted(func)
        else:
            return False
        if name is None or builds_model(name):
            return False
        return self.is_known_module(name) or module_like(name)

    _MODULE_METHODS = ("eval", "train", "parameters", "named_parameters", "requires_grad_")

    def is_known_module(self, name: str) -> bool:
        """`name in self.known_modules`, asking the index about this one receiver only."""
        if "known_modules" in self.__dict__:
            return name in self.known_modules
        return "trainer" not in name.lower() and bool(self.index.calls_to_method_on(name, *self._MODULE_METHODS))

    def runs_training_step(self, loop: ast.stmt) -> bool:
        return any(
            is_backward(site) or is_optimizer_step(site) or self.calls_step_function(site)
            for site in self.direct_calls(loop)
        )

    def runs_forward(self, loop: ast.stmt) -> bool:
        return any(
            self.is_forward(site, generate=True) or self.calls_forward_function(site) for site in self.direct_calls(loop)
        )

    @cached_property
    def forward_functions(self) -> set[str]:
        """Names of this module's functions and methods that run a forward pass themselves
        (`def compute_logprobs(self, model, batch): out = model(**batch) ...`)."""
        names = set()
        for site in self.index.calls:
            func = site.context.function
            if isinstance(func, Function) and self.is_forward(site):
                names.add(func.name)
        return names

    def calls_forward_function(self, site: CallSite) -> bool:
        func = site.node.func
        if isinstance(func, ast.Name):
            return func.id in self.forward_functions
        return site.receiver in ("self", "cls") and site.method in self.forward_functions

    def step_callers(self, function: ast.AST) -> list[tuple[CallSite, ast.stmt | None, object]]:
        """Where this module calls `function` once per step: (the call, its step loop, the
        loop's kind), or (the call, None, the `steps.StepFunction`) for a call in a
        framework's per-step hook (`on_step_end`). For a plain function (`cleanup()`), a
        method of the same class (`self._cleanup_memory()`), or a method of a helper object
        the module builds from the method's class (`self.memory_manager.after_batch()` after
        `self.memory_manager = MemoryManager()`, `memory = MemoryManager()` then
        `memory.step()`)."""
        if not isinstance(function, Function):
            return []
        owner = self._class_of(function)

        def matches(site: CallSite) -> bool:
            if isinstance(site.node.func, ast.Name) and site.node.func.id == function.name:
                return True
            if site.receiver in ("self", "cls") and site.method == function.name:
                return site.context.classdef is not None and site.context.classdef is owner
            return owner is not None and site.method == function.name and self._instance_of(site, owner.name)

        sites = {id(s.node): s for s in [*self.index.calls_to_method(function.name),
                                         *self.index.calls_named(function.name)]}
        return self._per_step(matches, sorted(sites.values(), key=lambda s: (s.node.lineno, s.node.col_offset)))

    def project_step_callers(self, function: ast.AST, project, path) -> list[tuple[object, CallSite, object, object]]:
        """`step_callers` in the project's other modules: (the module, the call, its step
        loop or None, the loop's kind or the hook), for a function they import and call, or
        a method of a class of this module whose objects they build (`self.memory =
        MemoryManager()` ... `self.memory.after_batch()` in the training loop)."""
        if not isinstance(function, Function) or project is None or path is None:
            return []
        from cfgfix.analysis.project_callers import importers, module_index

        owner = self._class_of(function)
        out = []
        for parsed, local in importers(project, path, owner.name if owner is not None else function.name):
            other = LoopAnalysis(module_index(parsed))
            if owner is None:
                found = other._per_step(lambda site, name=local: isinstance(site.node.func, ast.Name)
                                        and site.node.func.id == name, other.index.calls)
            else:
                found = other._per_step(lambda site, of=other, name=local: of._instance_of(site, name),
                                        other.index.calls_to_method(function.name))
            # In another module only a call the step itself makes counts: under an `if` (a
            # periodic sampling or evaluation branch) or in a `try` it may be a phase there.
            out.extend((parsed, site, loop, kind) for site, loop, kind in found
                       if not any(isinstance(node, (ast.If, ast.Try, ast.ExceptHandler))
                                  for node in other.chain(site.context.stmt, loop or site.context.function)))
        return out

    def _per_step(self, matches, sites: list[CallSite]) -> list[tuple[CallSite, ast.stmt | None, object]]:
        out = []
        for site in sites:
            if not matches(site):
                continue
            loops = site.context.loops
            if not loops:
                hook = self._step_hooks.get(id(site.context.function))
                if hook is not None:
                    out.append((site, None, hook))
                continue
            kind = self.is_step_loop(loops[-1])
            if kind is not None:
                out.append((site, loops[-1], kind))
        return out

    @cached_property
    def _step_hooks(self) -> dict:
        from cfgfix.analysis.steps import step_functions

        return step_functions(self.index.tree, self.imports)

    def _instance_of(self, site: CallSite, cls: str) -> bool:
        """The call's receiver was built by `cls(...)` (the class's name here), through a
        name or `self.x` bound once."""
        if not isinstance(site.node.func, ast.Attribute) or site.receiver is None:
            return False
        built = self.values.origin(site.node.func.value, site.context.function, site.context.classdef)
        return isinstance(built, ast.Call) and isinstance(built.func, ast.Name) and built.func.id == cls

    def _class_of(self, function: ast.AST):
        context = self.index.context_of(function)
        return context.classdef if context is not None else None

    def iterates_batches(self, loop: ast.stmt) -> bool:
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            return False
        words = identifiers(loop.iter) + identifiers(loop.target)
        return any(w in word for word in words for w in _BATCH_WORDS) or any(
            _BATCH_SIZE_NAME.search(word) for word in identifiers(loop.iter))

    def iterates_models(self, loop: ast.stmt) -> bool:
        """A loop over models or checkpoints: it loads one per iteration, deletes one, or
        iterates names that say so (`for ckpt in checkpoints`, `for model in models`)."""
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            words = identifiers(loop.iter) + identifiers(loop.target)
            if any(w in word for word in words for w in _MODEL_WORDS):
                return True
            if any(module_like(name) for name in identifiers(loop.target)):
                return True
        for site in self.direct_calls(loop):
            if site.method in MODEL_LOADS or site.name in _MODEL_LOAD_NAMES:
                return True
        built = set()  # names bound from a model factory in the loop (`policy, tok = get_parallel_model(...)`)
        for stmt in scope_statements(loop.body):
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and builds_model(dotted(stmt.value.func)):
                built.update(name for target in stmt.targets for name in identifiers(target))
        for stmt in scope_statements(loop.body):
            if isinstance(stmt, ast.Delete) and any(module_like(dotted(t)) or (dotted(t) or "").lower() in built for t in stmt.targets):
                return True  # built and deleted every iteration: one model per iteration
        return False

    def is_step_loop(self, loop: ast.stmt) -> str | None:
        """"training" or "evaluation" when `loop` runs one step per iteration, else None."""
        if self.iterates_models(loop):
            return None
        if self.runs_training_step(loop):
            return "training"
        if self.runs_forward(loop) and self.iterates_batches(loop):
            return "evaluation"
        return None

    # -- autograd switched off ------------------------------------------------------------
    def with_guarded(self, context: Context) -> bool:
        return any(
            grad_off_expr(item.context_expr, self.imports, with_item=True)
            for stmt in context.withs
            for item in stmt.items  # type: ignore[attr-defined]
        )

    @cached_property
    def _grad_disabled_lines(self) -> dict[int, list[int]]:
        """id(function or None) -> lines of statement calls `torch.set_grad_enabled(False)`."""
        out: dict[int, list[int]] = {}
        for site in self.index.calls_to_method("set_grad_enabled", "_set_grad_enabled"):
            stmt = site.context.stmt
            if isinstance(stmt, ast.Expr) and stmt.value is site.node and grad_off_expr(site.node, self.imports):
                out.setdefault(id(site.context.function), []).append(site.node.lineno)
        return out

    def function_guarded(self, func: ast.AST | None, depth: int = 0) -> bool:
        """Autograd is off for the whole function: a `@torch.no_grad()`-style decorator, a
        framework hook that runs under no_grad, a `def` inside a no_grad block or a guarded
        function, or a call of it (`evaluate(...)`, `self.evaluate(...)`) that is guarded."""
        if func is None or not isinstance(func, Function) or depth > 3:
            return False
        key = id(func)
        if key in self._guarded_functions:
            return self._guarded_functions[key]
        self._guarded_functions[key] = False  # recursion guard
        result = (
            any(grad_off_expr(d, self.imports) for d in func.decorator_list)
            or func.name in _FRAMEWORK_NO_GRAD
            or self._def_guarded(func, depth)
            or any(self.site_guarded(site, depth + 1) for site in self.callers(func))
        )
        if result or depth == 0:  # a False found deep in a call chain may be cut short
            self._guarded_functions[key] = result
        else:
            del self._guarded_functions[key]
        return result

    def _def_guarded(self, func: ast.AST, depth: int) -> bool:
        context = self.index.context_of(func)
        if context is None:
            return False
        return self.with_guarded(context) or self.function_guarded(context.function, depth + 1)

    def callers(self, func: ast.AST) -> list[CallSite]:
        name = func.name  # type: ignore[attr-defined]
        # `self.f(...)` asked of the index as such: `super().__init__(...)` is no caller,
        # and asking for every `.__init__(` walked trl's 940-line `__init__` (issue 15).
        return self.index.calls_to_method_on(("self", "cls"), name) + [
            site
            for site in self.index.calls_named(name)
            if (site.method is None and isinstance(site.node.func, ast.Name))
            or site.receiver in ("self", "cls")
        ]

    def site_guarded(self, site: CallSite, depth: int = 0) -> bool:
        return self.context_guarded(site.context, site.node.lineno, depth)

    def context_guarded(self, context: Context, line: int, depth: int = 0) -> bool:
        """Autograd is (or may be) off at `line` in this context."""
        if self.with_guarded(context):
            return True
        if any(off < line for off in self._grad_disabled_lines.get(id(context.function), ())):
            return True
        if context.function is not None and self._grad_disabled_lines.get(id(None)):
            return True  # switched off at import time, before any function runs
        return self.function_guarded(context.function, depth)

    # -- evaluation loops ------------------------------------------------------------------
    def backward_sites(self, func: ast.AST | None) -> list[CallSite]:
        return [s for s in self.index.calls_to_method("backward", "manual_backward") if s.context.function is func]

    def eval_receivers(self, loop: ast.stmt, func: ast.AST | None) -> dict[str, CallSite]:
        """Modules put in eval mode before `loop` in its function `func` and not back in
        train mode before it: receiver -> the `.eval()` call."""
        modes: list[tuple[int, int, str, CallSite]] = []
        for site in self.index.calls_to_method("eval", "train"):
            if site.context.function is not func or site.receiver is None:
                continue
            line = site.node.lineno
            if line >= loop.lineno:
                continue
            args = site.node.args
            if site.method == "eval" and not args and not site.node.keywords:
                modes.append((line, site.node.col_offset, "eval", site))
            elif site.method == "train":
                off = bool(args) and isinstance(args[0], ast.Constant) and args[0].value is False
                if not args or off or (isinstance(args[0], ast.Constant) and args[0].value is True):
                    modes.append((line, site.node.col_offset, "eval" if off else "train", site))
        state: dict[str, CallSite | None] = {}
        for _, _, mode, site in sorted(modes, key=lambda m: (m[0], m[1])):
            state[site.receiver] = site if mode == "eval" else None  # type: ignore[index]
        return {name: site for name, site in state.items() if site is not None}

    def is_eval_function(self, func: ast.AST | None) -> bool:
        if not isinstance(func, Function):
            return False
        if not EVAL_FUNCTION.match(func.name):
            return False
        owner = self.index.context_of(func)
        cls = owner.classdef if owner is not None else None
        # framework hooks (Lightning, Composer): the framework turns autograd off
        return cls is None or not any("lightning" in w or "composer" in w for b in cls.bases for w in identifiers(b))

    @cached_property
    def frozen_modules(self) -> set[str]:
        """`model.requires_grad_(False)`, or `for p in model.parameters(): p.requires_grad = False`:
        a forward through a frozen module records nothing."""
        return self._frozen(self.index.calls_to_method("requires_grad_"),
                            self.index.calls_to_method("parameters", "named_parameters"))

    def is_frozen(self, name: str) -> bool:
        """`name in self.frozen_modules`, asking the index about this one receiver only."""
        if "frozen_modules" in self.__dict__:
            return name in self.frozen_modules
        return bool(self._frozen(self.index.calls_to_method_on(name, "requires_grad_"),
                                 self.index.calls_to_method_on(name, "parameters", "named_parameters")))

    @staticmethod
    def _frozen(requires_grad_calls, parameters_calls) -> set[str]:
        frozen = set()
        for site in requires_grad_calls:
            arg = _first_arg(site.node, "requires_grad")
            if site.receiver and isinstance(arg, ast.Constant) and arg.value is False:
                frozen.add(site.receiver)
        for site in parameters_calls:
            stmt = site.context.stmt
            if isinstance(stmt, (ast.For, ast.AsyncFor)) and site.receiver and _contains_node(stmt.iter, site.node):
                for sub in scope_statements(stmt.body):
                    if isinstance(sub, ast.Assign) and any(
                        isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in sub.targets
                    ):
                        frozen.add(site.receiver)
        return frozen

    def needs_grad_inside(self, loop: ast.stmt) -> bool:
        """The loop trains or asks for gradients itself: backward, optimizer steps,
        `torch.autograd.grad`, `requires_grad`, `.grad`, `torch.enable_grad()`, `torch.func`."""
        for site in self.calls_within(loop):
            name = site.name or ""
            if is_backward(site) or is_optimizer_step(site) or self.calls_step_function(site):
                return True
            if site.method == "requires_grad_" and _is_false(site.node.args[0] if site.node.args else None):
                continue  # `requires_grad_(False)` freezes: it asks for no gradient
            if site.method in ("requires_grad_", "enable_grad", "grad") or name.startswith(("torch.func", "functorch")):
                return True
            if last_part(name) in ("enable_grad", "grad", "vjp", "jvp", "jacobian", "hessian", "jacrev", "jacfwd"):
                return True
        frozen = set()  # `x.requires_grad = False`: a store that turns gradients off
        # one walk: breadth first, an assignment comes before its targets
        for node in walk(loop):
            if isinstance(node, ast.Assign) and _is_false(node.value):
                frozen.update(id(t) for t in node.targets)
            elif isinstance(node, ast.Attribute) and node.attr in ("grad", "requires_grad") and id(node) not in frozen:
                return True
            # `Variable(y, requires_grad=False)`, `torch.zeros(n, requires_grad=False)`: no request
            if isinstance(node, ast.keyword) and node.arg == "requires_grad" and not _is_false(node.value):
                return True
        return False


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def scope_statements(body: list[ast.stmt]):
    """Statements of a block and the blocks nested in it, not entering defs or classes."""
    stack = list(reversed(body))
    pop, push, extend, blocks_of = stack.pop, stack.append, stack.extend, BLOCKS_OF
    while stack:
        node = pop()
        yield node
        kind = type(node)
        fields = blocks_of.get(kind)
        if fields is None:
            fields = block_fields(kind)
        if not fields or kind in _SCOPE_TYPES:
            continue
        for name in fields:
            children = getattr(node, name, None)
            if children:
                for child in reversed(children):
                    if isinstance(child, ast.stmt):
                        push(child)
                    else:  # except handlers, match cases
                        extend(reversed(child.body))


def _contains_node(outer: ast.AST, inner: ast.AST) -> bool:
    return any(sub is inner for sub in walk(outer))


# -- CFX302: values that carry an autograd graph, and how an accumulator is used -----------

NUMBER, TENSOR, BACKWARD, UNKNOWN, NEUTRAL = "number", "tensor", "backward", "unknown", "neutral"

# `loss.detach()`, `loss.item()`: no graph any more.
_DROPS_GRAD = frozenset({"detach", "item", "tolist", "numpy", "detach_"})
# `loss.mean()`, `loss.float()`, `loss.to(device)`: still the same graph.
_KEEPS_GRAD = frozenset({
    "mean", "sum", "float", "double", "half", "bfloat16", "to", "cuda", "cpu", "clone", "view",
    "reshape", "squeeze", "unsqueeze", "repeat", "expand", "contiguous", "abs", "flatten", "mul",
    "div", "add", "sub",
})
# Methods that treat the accumulator as a tensor (so `.item()` in the fix would break them).
_TENSOR_METHODS = _KEEPS_GRAD | frozenset({"std", "var", "max", "min", "norm", "exp", "log", "sqrt", "numel", "size", "dim"})
_TORCH_LOSSES = frozenset({
    "cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "ctc_loss", "poisson_nll_loss",
    "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "multilabel_margin_loss", "soft_margin_loss", "multilabel_soft_margin_loss", "multi_margin_loss",
    "triplet_margin_loss", "triplet_margin_with_distance_loss",
})
_LOSS_CALLEE = LazyRegex(r"loss$|criterion$|^loss_?f(?:n|unc|unction)$|^compute_loss$", re.IGNORECASE)
_NOT_TORCH = ("sklearn", "numpy", "scipy", "math", "statistics", "evaluate", "torchmetrics", "tensorflow", "jax")
# Calls that read the accumulator as a plain number.
_NUMBER_FUNCS = frozenset({"float", "int", "round", "str", "repr", "print", "format", "abs", "bool", "min", "max"})
_NUMBER_MODULES = ("numpy.", "np.", "math.", "statistics.")
_LOG_METHODS = frozenset({
    "print", "log", "info", "debug", "warning", "warn", "error", "add_scalar", "add_scalars",
    "set_postfix", "set_postfix_str", "set_description", "log_metrics", "log_dict", "format", "write",
    "append_log",
})


def is_loss_call(call: ast.Call, imports) -> bool:
    """`criterion(out, y)`, `self.loss_fn(...)`, `F.cross_entropy(...)`,
    `nn.CrossEntropyLoss()(...)`, `compute_loss(...)`; not `sklearn.metrics.log_loss`."""
    func = call.func
    if isinstance(func, ast.Call):  # nn.MSELoss()(pred, y)
        name = imports.qualify(func.func) or dotted(func.func) or ""
        return name.startswith("torch.") and name.endswith("Loss")
    name = imports.qualify(func) or dotted(func)
    if not name:
        return False
    if name.startswith("torch."):
        return last_part(name) in _TORCH_LOSSES or name.startswith("torch.nn.functional.") and name.endswith("_loss")
    root = name.split(".")[0]
    if root in imports.aliases and imports.aliases[root].split(".")[0] in _NOT_TORCH or root in _NOT_TORCH:
        return False
    return bool(_LOSS_CALLEE.search(last_part(name)))


class ScopeFlow:
    """Name bindings and expression parents of one scope (a function body, or the module's
    top-level statements), computed only for scopes that hold a candidate.

    The bindings come from statements alone, the expression side (`parent`, `loads`,
    `nested_names`) from one walk; each is built only when first read. CFX302's first look needs only the
    bindings, and on trl's GRPO trainer the eager expression walk of its three candidate
    scopes was 8 of CFX302's 10 ms, for candidates that mostly stop there (issue 15)."""

    def __init__(self, body: list[ast.stmt], function: ast.AST | None = None) -> None:
        self._body = body
        self.function = function  # the function whose body this is (None: the module's top level)

    @cached_property
    def statements(self) -> list[ast.stmt]:
        return list(scope_statements(self._body))

    @cached_property
    def bindings(self) -> dict[str, list[tuple[int, int, ast.stmt, ast.AST | None]]]:
        """name -> (line, column, statement, value) of each binding, in order. Built on the
        first question: CFX302's first look asks none for a call's value (`x += f(...)`),
        and trl's GRPO trainer's 940-line `__init__` held two such candidates only."""
        self._bindings: dict[str, list[tuple[int, int, ast.stmt, ast.AST | None]]] = {}
        for stmt in self.statements:
            if type(stmt) in _BINDING_TYPES:  # the others bind nothing (defs: not here)
                self._bind(stmt)
        for entries in self._bindings.values():
            entries.sort(key=lambda e: (e[0], e[1]))
        return self._bindings

    @cached_property
    def declared(self) -> set[str]:
        """Names declared global / nonlocal."""
        return {name for stmt in self.statements if isinstance(stmt, (ast.Global, ast.Nonlocal)) for name in stmt.names}

    @property
    def parent(self) -> dict[int, ast.AST]:
        return self._expressions[0]

    @property
    def loads(self) -> dict[str, list[ast.Name]]:
        return self._expressions[1]

    @property
    def nested_names(self) -> set[str]:
        """Names read inside nested defs and classes."""
        return self._expressions[2]

    @cached_property
    def _expressions(self):
        """(parent, loads, nested_names): one walk over the scope's expressions."""
        self._parent: dict[int, ast.AST] = {}
        self._loads: dict[str, list[ast.Name]] = {}
        nested: set[str] = set()
        for stmt in self.statements:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for sub in walk(stmt):
                    if isinstance(sub, ast.Name):
                        nested.add(sub.id)
                continue
            for name, value in ast.iter_fields(stmt):
                if name in ("body", "orelse", "finalbody", "handlers", "cases"):
                    continue
                for child in value if isinstance(value, list) else [value]:
                    if isinstance(child, ast.AST):
                        self._parent[id(child)] = stmt
                        self._walk(child)
        return self._parent, self._loads, nested

    def _walk(self, root: ast.AST) -> None:
        stack = [root]
        parent, loads = self._parent, self._loads
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loads.setdefault(node.id, []).append(node)
            for child in child_nodes(node):
                parent[id(child)] = node
                stack.append(child)

    def _bind(self, stmt: ast.stmt) -> None:
        kind = type(stmt)
        value = None
        if kind is ast.Assign:
            targets, value = stmt.targets, stmt.value
        elif kind is ast.AnnAssign or kind is ast.AugAssign:
            targets, value = [stmt.target], stmt.value
        elif kind is ast.For or kind is ast.AsyncFor:
            targets = [stmt.target]
        elif kind is ast.With or kind is ast.AsyncWith:
            targets = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
        else:
            return
        bindings, line, column = self._bindings, stmt.lineno, stmt.col_offset
        for target in targets:
            target_kind = type(target)
            if target_kind is ast.Name:
                bindings.setdefault(target.id, []).append((line, column, stmt, value))
            elif target_kind is ast.Tuple or target_kind is ast.List or target_kind is ast.Starred:
                for sub in walk(target):
                    if type(sub) is ast.Name:
                        bindings.setdefault(sub.id, []).append((line, column, stmt, None))

    def binding_before(self, name: str, stmt: ast.stmt):
        """The last binding of `name` by a statement that starts before `stmt`."""
        best = None
        for entry in self.bindings.get(name, ()):
            if entry[2] is stmt or (entry[0], entry[1]) >= (stmt.lineno, stmt.col_offset):
                break
            best = entry
        return best

    def statement_of(self, node: ast.AST) -> ast.stmt | None:
        while node is not None and not isinstance(node, ast.stmt):
            node = self.parent.get(id(node))
        return node


def scope_flow(ctx, function: ast.AST | None) -> ScopeFlow:
    """The flow of a function's body (or, for None, of the module's top level), built once
    per context."""
    flows = ctx.notes.setdefault(NOTE + ".flows", {})
    key = id(function)
    if key not in flows:
        body = function.body if function is not None else ctx.document.tree.body  # type: ignore[attr-defined]
        flows[key] = ScopeFlow(body, function)
    return flows[key]


def graph_origin(analysis, flow: ScopeFlow, expr: ast.AST, at: ast.stmt, region: ast.stmt, imports, depth: int = 0):
    """The expression that gives `expr` an autograd graph (`outputs.loss`, `criterion(...)`),
    or None when it has none or cfgfix cannot tell. Names are followed to their last binding
    before `at`, which must lie inside `region` (the loop) and outside any no_grad block.

    With `analysis` None this is the cheap first look (no module index): no-grad blocks are
    not checked and any call counts as a forward pass, so it finds a superset."""
    if depth > 8:
        return None

    def again(node, stmt):
        return graph_origin(analysis, flow, node, stmt, region, imports, depth + 1)

    def usable(entry) -> bool:
        line, stmt = entry[0], entry[2]
        if not (region.lineno <= line <= (region.end_lineno or line)):
            return False
        return analysis is None or not analysis.context_guarded(analysis.index.context_of_stmt(stmt), line)

    if isinstance(expr, ast.Name):
        entry = flow.binding_before(expr.id, at)
        if entry is None or entry[3] is None or not usable(entry):
            return None
        stmt, value = entry[2], entry[3]
        if isinstance(stmt, ast.AugAssign):  # `loss += aux`: graph from either side
            return again(value, stmt) or again(expr, stmt)
        return again(value, stmt)
    if isinstance(expr, (ast.Attribute, ast.Subscript)):
        is_loss = (isinstance(expr, ast.Attribute) and expr.attr == "loss") or (
            isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and expr.slice.value == "loss"
        )
        if not is_loss:
            return None
        base = expr.value
        if isinstance(base, ast.Name):  # `outputs.loss` with `outputs = model(**batch)`
            entry = flow.binding_before(base.id, at)
            if entry is None or not isinstance(entry[3], ast.Call) or not usable(entry):
                return None
            base = entry[3]
        if isinstance(base, ast.Call) and _forward_like(base, analysis):
            return expr
        return None
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in _DROPS_GRAD:
            return None
        if isinstance(func, ast.Attribute) and func.attr in _KEEPS_GRAD:
            return again(func.value, at)
        if is_loss_call(expr, imports):
            return expr
        if analysis is None:  # the cheap first look: a plain function's result may be a loss
            return expr if isinstance(func, ast.Name) and func.id not in _NOT_LOSS_BUILTINS else None
        if analysis.returns_graph(expr):
            return expr
        return None
    if isinstance(expr, ast.BinOp):
        return again(expr.left, at) or again(expr.right, at)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        return again(expr.operand, at)
    return None


_NOT_LOSS_BUILTINS = frozenset({"float", "int", "round", "len", "str", "sum", "max", "min", "abs", "list", "dict", "tuple"})


def _forward_like(call: ast.Call, analysis) -> bool:
    """A forward pass whose `.loss` carries the graph: `model(**batch)`, `self.model(...)`,
    `model.forward(...)`, `self.forward_step(...)`; not `accelerator.gather(...)` or a
    function returning a dict of numbers."""
    func = call.func
    name = dotted(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    if name is None:
        return False
    if analysis is None:
        return True
    return analysis.is_known_module(name) or module_like(name) or "forward" in last_part(name)


def accumulator_uses(analysis: LoopAnalysis, flow: ScopeFlow, name: str, skip: set[int], eval_function: bool) -> set[str]:
    """How `name` is used in its scope, apart from the accumulating statements (`skip`):
    NUMBER (formatted, logged, compared, `.item()`), TENSOR (a tensor op or method),
    BACKWARD (differentiated), UNKNOWN (escapes: returned, stored, passed on), NEUTRAL."""
    kinds: set[str] = set()
    _uses_of(analysis, flow, name, skip, eval_function, kinds, {name}, 0)
    return kinds


def _uses_of(analysis, flow, name, skip, eval_function, kinds, seen, depth) -> None:
    if name in flow.nested_names or name in flow.declared:
        kinds.add(UNKNOWN)
        return
    for node in flow.loads.get(name, ()):
        if id(node) not in skip:
            _climb(analysis, flow, node, skip, eval_function, kinds, seen, depth)


def _climb(analysis, flow, node, skip, eval_function, kinds, seen, depth) -> None:
    imports = analysis.imports
    cur = node
    while True:
        parent = flow.parent.get(id(cur))
        if parent is None:
            kinds.add(UNKNOWN)
            return
        if isinstance(parent, ast.Attribute):
            call = flow.parent.get(id(parent))
            attr = parent.attr
            if attr in ("backward", "manual_backward"):
                kinds.add(BACKWARD)
                return
            if not (isinstance(call, ast.Call) and call.func is parent):
                kinds.add(TENSOR if attr in ("shape", "dtype", "device", "ndim") else UNKNOWN)
                return
            if attr in ("item", "tolist"):
                kinds.update((TENSOR, NUMBER))
                return
            if attr == "clear":
                kinds.add(NEUTRAL)
                return
            if attr in _TENSOR_METHODS:
                kinds.add(TENSOR)
                cur = call
                continue
            kinds.add(UNKNOWN)
            return
        if isinstance(parent, (ast.keyword, ast.Starred)):
            cur = parent
            continue
        if isinstance(parent, ast.Call):
            if cur is parent.func:
                kinds.add(UNKNOWN)
                return
            func = parent.func
            method = func.attr if isinstance(func, ast.Attribute) else None
            qualified = imports.qualify(func) or dotted(func) or ""
            if method in ("backward", "manual_backward") or qualified == "torch.autograd.backward":
                kinds.add(BACKWARD)
                return
            if qualified == "len":
                kinds.add(NEUTRAL)
                return
            if qualified in _NUMBER_FUNCS or qualified.startswith(_NUMBER_MODULES) or method in _LOG_METHODS:
                kinds.add(NUMBER)
                return
            if qualified == "sum" or qualified.startswith("torch.") and not qualified.startswith("torch.distributed"):
                if qualified != "sum":
                    kinds.add(TENSOR)
                cur = parent
                continue
            if qualified.startswith(("wandb.", "mlflow.")) or last_part(qualified) in ("log", "log_metrics"):
                kinds.add(NUMBER)
                return
            kinds.add(UNKNOWN)
            return
        if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Tuple, ast.List, ast.Dict, ast.Set)):
            cur = parent
            continue
        if isinstance(parent, ast.Subscript):
            if cur is parent.value:
                cur = parent
                continue
            kinds.add(NEUTRAL)
            return
        if isinstance(parent, (ast.FormattedValue, ast.Compare, ast.BoolOp, ast.If, ast.While, ast.Assert)):
            kinds.add(NUMBER)
            return
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and cur is parent.value:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            if depth > 3 or not all(isinstance(t, ast.Name) for t in targets):
                kinds.add(UNKNOWN)
                return
            for target in targets:
                if target.id not in seen:
                    seen.add(target.id)
                    _uses_of(analysis, flow, target.id, skip, eval_function, kinds, seen, depth + 1)
            return
        if isinstance(parent, ast.Return):
            if eval_function:
                kinds.add(NUMBER)
            else:
                _returned_uses(analysis, flow, kinds, depth)
            return
        if isinstance(parent, ast.Expr):
            kinds.add(NEUTRAL)
            return
        kinds.add(UNKNOWN)
        return


def _returned_uses(analysis, flow, kinds, depth) -> None:
    """A value the function returns is used as its callers in this module use the call
    (`avg = train_epoch(...)` then `print(f"{avg:.3f}")`); UNKNOWN with no such caller, or
    a few returns deep."""
    function = flow.function
    callers = analysis.callers(function) if isinstance(function, Function) and depth < 3 else []
    if not callers:
        kinds.add(UNKNOWN)
        return
    for site in callers:
        outer = site.context.function
        caller_flow = ScopeFlow(outer.body if outer is not None else analysis.index.tree.body, outer)
        evaluation = outer is not None and analysis.is_eval_function(outer)
        _climb(analysis, caller_flow, site.node, set(), evaluation, kinds, set(), depth + 1)


def statements_in_loops(tree: ast.Module):
    """(statement, its function or None, the outermost loop around it in that function) for
    every statement inside a loop, found by a statement-only walk: cheap, so rules use it to
    decide whether they need the module index at all. (Dispatched on the exact node type:
    simple statements, most of a module, cost one lookup; the isinstance tests and the five
    field reads per statement were half of it, issue 15.)"""
    stack: list[tuple[ast.AST, ast.AST | None, ast.AST | None]] = [(s, None, None) for s in reversed(tree.body)]
    pop, push, blocks_of = stack.pop, stack.append, BLOCKS_OF
    while stack:
        node, function, outer = pop()
        if outer is not None:  # only statements are ever pushed
            yield node, function, outer
        kind = type(node)
        fields = blocks_of.get(kind)
        if fields is None:
            fields = block_fields(kind)
        if not fields:
            continue
        if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            function, inner = node, None
        elif kind is ast.ClassDef:
            function, inner = None, None
        else:
            inner = outer or (node if kind in _LOOP_TYPES else None)
        for name in fields:
            children = getattr(node, name, None)
            if children:
                child_outer = outer if name == "orelse" and kind in _LOOP_TYPES else inner
                for child in reversed(children):
                    if isinstance(child, ast.stmt):
                        push((child, function, child_outer))
                    else:  # except handlers, match cases
                        stack.extend((c, function, child_outer) for c in reversed(child.body))


def _runs_step(func: ast.AST) -> bool:
    """A function that runs one training step itself: a backward pass or an optimizer
    step outside any loop of its own."""
    for node in _body_nodes(func, Loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            receiver = last_part(dotted(node.func.value))
            if method in ("backward", "manual_backward") or (
                    method == "step" and _OPTIMIZER.search(receiver or "")):
                return True
    return False


# Methods `is_backward` / `is_optimizer_step` judge by themselves.
_LOOP_STEP_METHODS = frozenset({"backward", "manual_backward", "step", "zero_grad"})


def _class_choices(values, node: ast.expr, context: Context, depth: int = 0) -> list[ast.expr]:
    """The class names a constructor call's target may be: `Trainer`, `mod.Trainer`, each
    arm of a conditional alias (`cls = A if c else B`, `A or B`), a name bound once to them.
    Only names spelt like classes (a capital first letter): a call of a function that
    returns an object is not followed."""
    if depth > 3:
        return []
    if isinstance(node, ast.IfExp):
        return [*_class_choices(values, node.body, context, depth + 1),
                *_class_choices(values, node.orelse, context, depth + 1)]
    if isinstance(node, ast.BoolOp):
        return [c for v in node.values for c in _class_choices(values, v, context, depth + 1)]
    if isinstance(node, ast.Name):
        bound = values.origin(node, context.function, context.classdef)
        if bound is not node:
            return _class_choices(values, bound, context, depth + 1)
        return [node] if node.id[:1].isupper() else []
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr[:1].isupper():
        return [node]
    return []


def _method_runs_step(table, cls: ast.ClassDef, name: str, depth: int = 0) -> bool:
    """The class's method `name`, its own or inherited from the project's classes (in any
    module), runs one step itself (`_runs_step`); memoised on the class."""
    from cfgfix.analysis.model_functions import _method

    notes = cls.__dict__.setdefault("_cfgfix_runs_step", {})
    if name in notes:
        return notes[name]
    notes[name] = False  # recursion: no while computed
    method = _method(cls, name)
    if method is not None:
        notes[name] = _runs_step(method)
    elif depth < 4:
        for base in cls.bases:
            found = table.class_lookup(base)
            if found is not None and isinstance(found[1], ast.ClassDef) and \
                    _method_runs_step(found[0], found[1], name, depth + 1):
                notes[name] = True
                break
    return notes[name]


def _function_returns_graph(func: ast.AST, table) -> bool:
    """Every value the function returns carries an autograd graph (a loss, an output's
    `.loss`, a criterion's result), by the same analysis the caller's loop gets."""
    index = table.__dict__.get("_loop_index")
    if index is None:
        index = table._loop_index = ModuleIndex.build(table.tree, table.imports)
    analysis = LoopAnalysis(index, table)
    flow = ScopeFlow(func.body)
    returns = [n for n in _body_nodes(func) if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return False
    for ret in returns:
        value = ret.value
        if isinstance(value, ast.Tuple) and value.elts:
            value = value.elts[0]  # `return loss, logits`
        if graph_origin(analysis, flow, value, ret, func, table.imports) is None:
            return False
    return True


def _body_nodes(func: ast.AST, stop: tuple = ()):
    """Every node of a function's body, not inside nested definitions (nor inside `stop`)."""
    stack = list(getattr(func, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (*stop, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(child_nodes(node))


_LITERALS = (ast.Tuple, ast.List, ast.Set)
_ORDERING = frozenset({"enumerate", "zip", "sorted", "reversed"})
_DICT_VIEWS = frozenset({"items", "keys", "values"})
_DICT_READS = _DICT_VIEWS | {"get", "copy"}


def over_spelled_out_collection(loop: ast.stmt, scope: ast.AST | None) -> bool:
    """A `for` over a collection the code spells out: a literal tuple, list or set (`for key
    in ("chosen", "rejected"):`), `enumerate`/`zip`/`sorted`/`reversed` of such, a dict
    literal or its `.items()`/`.keys()`/`.values()`, or a name `scope` binds only to such a
    literal (`pairs = {"a": x, "b": y}`) and never changes in place. It runs a few times
    where it stands -- per step inside a step -- not a pass over data (a loader, a dataset,
    `range(epochs)`), which is a phase."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    return _spelled_out(loop.iter, scope)


def _spelled_out(node: ast.AST, scope: ast.AST | None) -> bool:
    if isinstance(node, _LITERALS):
        return not any(isinstance(e, ast.Starred) for e in node.elts)
    if isinstance(node, ast.Dict):
        return None not in node.keys
    if isinstance(node, ast.Call) and not node.keywords:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _ORDERING and node.args:
            return all(_spelled_out(a, scope) for a in node.args)
        if isinstance(func, ast.Attribute) and func.attr in _DICT_VIEWS and not node.args:
            return _spelled_out(func.value, scope) and not isinstance(func.value, _LITERALS)
        return False
    if isinstance(node, ast.Name) and scope is not None:
        return _bound_to_literal(node.id, scope)
    return False


def _bound_to_literal(name: str, scope: ast.AST) -> bool:
    """Every binding of `name` in `scope` is a literal collection (or `dict(k=v, ...)`), and
    nothing changes it in place (no item stores, no `append`/`update`, no other use as a
    loop or `with` target)."""
    bound = False
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for target in node.targets for t in ast.walk(target)):
                if not (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and _literal_value(node.value)):
                    return False
                bound = True
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr, ast.withitem)):
            target = node.optional_vars if isinstance(node, ast.withitem) else node.target
            if target is not None and any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(target)):
                return False
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.value, ast.Name) \
                and node.value.id == name:
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                return False
            if isinstance(node, ast.Attribute) and node.attr not in _DICT_READS:
                return False
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
    return bound


def _literal_value(node: ast.AST) -> bool:
    if isinstance(node, _LITERALS):
        return not any(isinstance(e, ast.Starred) for e in node.elts)
    if isinstance(node, ast.Dict):
        return None not in node.keys
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
            and not node.args and all(k.arg for k in node.keywords))
