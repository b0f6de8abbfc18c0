"""Whether a PEFT model's frozen inputs leave a reentrant checkpoint without gradients
(CFX306; CFX307 leaves alone what it reports): the scope model of bindings, the wrapped
model, the enabling calls and Trainers, and the fix. Split from `analysis/checkpointing.py`
unchanged: the rules import it only for a file that passes `may_break_peft` there."""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.arms import ArmPaths
from cfgfix.analysis.checkpointing import (
    GC_METHODS,
    TRAINING_FLAGS,
    kwargs_argument,
    set_reentrant_false,
    trainer_drops,
    use_reentrant_of,
)
from cfgfix.analysis.names import dotted, single_assignments
from cfgfix.core import Applicability, Fix, Related
from cfgfix.documents import python_edits
from cfgfix.records import dataclass, field

HF_TRAINERS = {
    "transformers.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.trainer.Trainer",
    "transformers.trainer_seq2seq.Seq2SeqTrainer",
}

# PEFT methods that inject adapters and freeze every other weight (the embeddings included).
_ADAPTER_CONFIGS = {
    "lora", "loha", "lokr", "adalora", "ia3", "vera", "vblora", "oft", "boft", "fourierft",
    "hra", "bone", "lntuning", "randlora", "shira", "c3a", "road", "miss", "delora", "gralora",
}
# Module names that are (or hold) the input embeddings: training them makes the first
# checkpointed block's input require grad, which is all reentrant checkpointing needs.
_EMBEDDING = re.compile(r"embed|wte|wpe|(^|\.)shared($|\.)", re.IGNORECASE)
# Models whose `main_input_name` is not "input_ids": transformers 5 does not call
# `enable_input_require_grads()` for them.
_NON_TEXT = re.compile(
    r"^(AutoModelFor(ImageClassification|SemanticSegmentation|InstanceSegmentation|UniversalSegmentation"
    r"|ObjectDetection|DepthEstimation|VideoClassification|MaskedImageModeling|AudioClassification"
    r"|AudioFrameClassification|AudioXVector|CTC|SpeechSeq2Seq)"
    r"|(ViT|DeiT|Swin|Swinv2|ConvNext|ConvNextV2|Beit|Dinov2|Segformer|Mask2Former|Detr|Whisper|Wav2Vec2"
    r"|Hubert|WavLM|Speech2Text)(Model|For\w+))$"
)
_RETURNS_SELF = {"to", "cuda", "half", "bfloat16", "float", "train", "requires_grad_"}
_LOADS = {"from_pretrained", "from_config", "_from_config"}
# A helper that receives the base model before `get_peft_model` may enable checkpointing.
_MAY_ENABLE = re.compile(r"checkpoint|prepare|setup|configure|patch", re.IGNORECASE)


def _pin(ctx, package: str) -> str:
    info = ctx.versions.get(package)
    return f"{package}{info.specifier}" if info.specifier else package


# -------------------------------------------------------------------------- scope model


@dataclass
class _Binding:
    pos: tuple[int, int]
    target: str
    value: ast.expr | None  # None: bound by a loop, `with`, a tuple target, `+=` ...
    stmt: ast.stmt


@dataclass
class _Scope:
    """One function body (or the module body): its bindings in source order, and for each
    statement the arms of the compound statements around it."""

    bindings: list[_Binding] = field(default_factory=list)
    arms: ArmPaths | None = None

    @classmethod
    def build(cls, body: list[ast.stmt]) -> _Scope:
        scope = cls(arms=ArmPaths(body))
        scope._block(body)
        scope.bindings.sort(key=lambda b: b.pos)
        return scope

    def _block(self, body) -> None:
        for stmt in body:
            self._bind(stmt)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # another scope
            for name in ("body", "orelse", "finalbody"):
                children = getattr(stmt, name, None)
                if children:
                    self._block(children)
            for handler in getattr(stmt, "handlers", ()) or ():
                self._block(handler.body)
            for case in getattr(stmt, "cases", ()) or ():
                self._block(case.body)

    def _bind(self, stmt: ast.stmt) -> None:
        pos = (stmt.lineno, stmt.col_offset)
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                name = dotted(target)
                if name:
                    self.bindings.append(_Binding(pos, name, stmt.value, stmt))
                else:
                    self._loose(target, pos, stmt)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            name = dotted(stmt.target)
            if name:
                self.bindings.append(_Binding(pos, name, stmt.value, stmt))
        elif isinstance(stmt, ast.AugAssign) or isinstance(stmt, (ast.For, ast.AsyncFor)):
            self._loose(stmt.target, pos, stmt)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._loose(item.optional_vars, pos, stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.bindings.append(_Binding(pos, stmt.name, None, stmt))

    def _loose(self, target, pos, stmt) -> None:
        for node in ast.walk(target):
            name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name:
                self.bindings.append(_Binding(pos, name, None, stmt))

    # -- queries --------------------------------------------------------------------------
    def last_binding(self, name: str, before: tuple[int, int]) -> _Binding | None:
        found = None
        for binding in self.bindings:
            if binding.pos >= before:
                break
            if binding.target == name:
                found = binding
        return found

    def value_of(self, node: ast.expr, before: tuple[int, int]) -> ast.expr | None:
        """A name's value at a point, through names bound by a plain assignment; None when
        a name is not bound that way in this scope."""
        for _ in range(5):
            name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name is None:
                return node
            binding = self.last_binding(name, before)
            if binding is None or binding.value is None:
                return None
            node, before = binding.value, binding.pos
        return None

    def rebound_between(self, name: str, start: tuple[int, int], end: tuple[int, int], skip: ast.stmt) -> bool:
        """`name` (or a prefix of it) is bound again strictly between two points, other than
        by `x = x.to(...)`-style calls that return the same module."""
        for binding in self.bindings:
            if not (start < binding.pos < end) or binding.stmt is skip:
                continue
            if binding.target != name and not name.startswith(binding.target + "."):
                continue
            value = binding.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in _RETURNS_SELF
                and dotted(value.func.value) == binding.target
            ):
                continue
            return True
        return False

    def exclusive(self, a: ast.stmt, b: ast.stmt) -> bool:
        """The two statements sit in arms of one compound statement that never both run."""
        return self.arms.exclusive(a, b)


# ------------------------------------------------------------------------ CFX306 analysis


@dataclass
class _Hit:
    node: ast.AST  # where to report: the checkpointing call, or `gradient_checkpointing=True`
    message: str
    fix: Fix | None
    related: list[Related]
    flagged_call: ast.Call  # the call CFX307 then leaves alone


_KEY_FALSE = '"use_reentrant": False'
_FIX_TEXT = "Use non-reentrant checkpointing (`use_reentrant=False`)"


_CONSEQUENCE = (
    "No input of a checkpointed layer requires grad, so the adapters get no gradient: torch "
    "warns \"None of the inputs have requires_grad=True. Gradients will be None\" and `backward` "
    "raises \"element 0 of tensors does not require grad\" (or, with a trainable head after the "
    "layers, training runs and the adapters never change)."
)


def _advice(wrapped: _Wrapped, fix: str, has_kwargs: bool = True) -> str:
    if not has_kwargs:
        return (
            "transformers < 4.35 takes no checkpointing kwargs: call "
            "`model.enable_input_require_grads()` after `get_peft_model`."
        )
    if wrapped.remote_code:
        return (
            f"{fix} Hub code (`trust_remote_code`) with the old checkpointing format ignores it; "
            "call `model.enable_input_require_grads()` instead."
        )
    return fix


@dataclass(frozen=True)
class _Wrapped:
    """A `get_peft_model` call and what the model it wraps tells."""

    call: ast.Call
    non_text: bool  # main input is not `input_ids`: transformers 5 does not prepare it either
    remote_code: bool  # `trust_remote_code`: the model's own code may ignore the kwargs


class _Peft:
    """Per file: every checkpointing that runs reentrant on a `get_peft_model` model whose
    embeddings are frozen, with nobody calling `enable_input_require_grads()`."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.src = ctx.source
        self.index = ctx.index
        self.imports = ctx.models.imports
        self.scopes: dict[int, _Scope] = {}
        self.hits: list[_Hit] = []
        wraps = [
            site for site in self.index.calls
            if site.name and site.name.startswith("peft.") and site.name.split(".")[-1] == "get_peft_model"
        ]
        if not wraps or self._handled_in_file():
            return
        tf = ctx.versions.get("transformers")
        self.tf_v4 = tf.below("5")  # True: 4.x, False: 5.x, None: unknown
        self.tf_kwargs = tf.below("4.35") is not True  # `gradient_checkpointing_kwargs` exists
        self.peft_prepares = ctx.versions.get("peft").below("0.4") is not True
        for wrap in wraps:
            self._check_wrap(wrap)

    # -- file-wide escapes --------------------------------------------------------------------
    def _handled_in_file(self) -> bool:
        index = self.index
        for site in index.calls:
            last = (site.name or "").split(".")[-1]
            if last == "enable_input_require_grads":
                return True
            # QLoRA preparation calls `enable_input_require_grads()` itself for quantized models.
            if last in ("prepare_model_for_kbit_training", "prepare_model_for_int8_training"):
                return True
        # The manual form: a forward hook that calls `requires_grad_()` on the embeddings' output.
        if index.calls_to_method("register_forward_hook") and index.calls_to_method("requires_grad_"):
            return True
        return self._unfreezes_something()

    def _unfreezes_something(self) -> bool:
        """An `x.requires_grad = True` / `x.requires_grad_()` that may reach the embeddings
        makes the checkpointed inputs require grad after all."""
        for node in ast.walk(self.ctx.document.tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in node.targets
            ):
                value = node.value
                target = next(t for t in node.targets if isinstance(t, ast.Attribute)).value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_":
                args = node.args or [k.value for k in node.keywords]
                value = args[0] if args else None
                target = node.func.value
            else:
                continue
            if isinstance(value, ast.Constant) and value.value is False:
                continue
            if self._may_reach_embeddings(node, target):
                return True
        return False

    def _may_reach_embeddings(self, node: ast.AST, target: ast.expr) -> bool:
        context = self.index.contexts.get(id(node)) if isinstance(node, ast.stmt) else None
        if context is None:
            context = next((s.context for s in self.index.calls if s.node is node), None)
        if context is not None and context.loops:
            # `for n, p in model.named_parameters(): if "lora" in n: p.requires_grad = True`:
            # the names the loop filters on say what it unfreezes; no filter: everything.
            filters = _filter_strings(context.loops[-1])
            return not filters or any(_EMBEDDING.search(f) for f in filters)
        text = self.src.node_text(target)
        return bool(_EMBEDDING.search(text)) or "." not in text  # `p.requires_grad_()`: p is anything

    # -- one `get_peft_model` -----------------------------------------------------------------
    def _scope(self, function) -> _Scope:
        key = id(function) if function is not None else 0
        if key not in self.scopes:
            body = function.body if function is not None else self.ctx.document.tree.body
            self.scopes[key] = _Scope.build(body)
        return self.scopes[key]

    def _consts(self, function) -> dict[str, ast.expr]:
        """Names bound once in the module or the function (`bnb = BitsAndBytesConfig(...)`)."""
        module = single_assignments(self.ctx.document.tree.body)
        return {**module, **single_assignments(function.body)} if function is not None else module

    def _check_wrap(self, wrap) -> None:
        call, context = wrap.node, wrap.context
        if context.classdef is not None and context.function is None:
            return  # a class body
        function = context.function
        scope = self._scope(function)
        wrap_pos = (call.lineno, call.col_offset)
        stmt = context.stmt
        base_arg = call.args[0] if call.args else _keyword(call, "model")
        config_arg = call.args[1] if len(call.args) > 1 else _keyword(call, "peft_config")
        if base_arg is None or config_arg is None:
            return
        stmt_pos = (stmt.lineno, stmt.col_offset)  # names as they were before this statement
        if not self._freezes_embeddings(scope, config_arg, stmt_pos):
            return
        load = self._base_load(scope, base_arg, stmt_pos)
        if load is None:
            return  # where the model comes from (and whether checkpointing is on) is unknown
        base = dotted(base_arg)
        load_pos = (load.lineno, load.col_offset)
        prior = self._checkpointing_before(function, base, load, wrap_pos)
        if prior and self.peft_prepares and _quantized(load, self._consts(function)) is not True:
            # PEFT calls `enable_input_require_grads()` as it wraps a model whose checkpointing
            # is already on (unless the model is quantized): the order of the calls matters.
            return
        peft_name = None
        if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1:
            peft_name = dotted(stmt.targets[0])
        names = {n for n in (peft_name, base) if n}
        wrapped = _Wrapped(
            call,
            non_text=bool(_NON_TEXT.match(_class_name(self.imports, load))),
            # Hub code with the pre-4.35 checkpointing format ignores the kwargs: no automatic fix.
            remote_code=any(
                k.arg == "trust_remote_code" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in load.keywords
            ),
        )
        for method, keyword in GC_METHODS.items():
            for site in self.index.calls_to_method(method):
                pos = (site.node.lineno, site.node.col_offset)
                if site.context.function is not function or scope.exclusive(stmt, site.context.stmt):
                    continue
                if pos > wrap_pos:
                    owner = _owner(site.receiver, names)
                    if owner is None or scope.rebound_between(owner, wrap_pos, pos, stmt):
                        continue
                elif prior and load_pos < pos:
                    # Enabled on the base model before wrapping, which PEFT does not prepare
                    # here (a quantized model, or PEFT < 0.4).
                    owner = _owner(site.receiver, {base} if base else set())
                    if owner is None or scope.rebound_between(owner, pos, wrap_pos, stmt):
                        continue
                else:
                    continue
                self._check_enable(scope, site, keyword, wrapped, before_wrap=pos < wrap_pos)
        for site in self.index.calls_named(*HF_TRAINERS):
            pos = (site.node.lineno, site.node.col_offset)
            if site.context.function is not function or pos <= wrap_pos:
                continue
            if scope.exclusive(stmt, site.context.stmt):
                continue
            model_arg = site.node.args[0] if site.node.args else _keyword(site.node, "model")
            owner = _owner(dotted(model_arg) if model_arg is not None else None, names)
            if owner is None or scope.rebound_between(owner, wrap_pos, pos, stmt):
                continue
            args_arg = site.node.args[1] if len(site.node.args) > 1 else _keyword(site.node, "args")
            at = (site.context.stmt.lineno, site.context.stmt.col_offset)
            training_args = scope.value_of(args_arg, at) if args_arg is not None else None
            if isinstance(training_args, ast.Call):
                self._check_trainer(scope, training_args, wrapped)

    def _freezes_embeddings(self, scope: _Scope, config_arg: ast.expr, pos) -> bool:
        config = scope.value_of(config_arg, pos)
        if isinstance(config, ast.Call):
            return self._adapter_config_ok(scope, config)
        # A config built elsewhere: only when every PEFT config this file builds is an
        # adapter config that leaves the embeddings frozen.
        configs = [
            (self._scope(s.context.function), s.node)
            for s in self.index.calls
            if s.name and s.name.startswith("peft.") and s.name.endswith("Config")
            and not (s.context.classdef is not None and s.context.function is None)
        ]
        return bool(configs) and all(self._adapter_config_ok(where, c) for where, c in configs)

    def _adapter_config_ok(self, scope: _Scope | None, config: ast.Call) -> bool:
        name = self.imports.qualify(config.func) or ""
        kind = name.split(".")[-1]
        if not (name.startswith("peft.") and kind.endswith("Config")):
            return False
        if kind[: -len("Config")].lower() not in _ADAPTER_CONFIGS:
            return False
        keywords = {k.arg: k.value for k in config.keywords if k.arg}
        for hidden in (k.value for k in config.keywords if k.arg is None):
            mapping = scope.value_of(hidden, (config.lineno, config.col_offset)) if scope else None
            if isinstance(mapping, ast.Dict):
                for key, value in zip(mapping.keys, mapping.values):
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        keywords.setdefault(key.value, value)
            # else a mapping from elsewhere: LoRA's defaults (embeddings frozen) are the reading
        inference = keywords.get("inference_mode")
        if isinstance(inference, ast.Constant) and inference.value is True:
            return False  # nothing is trained
        if "trainable_token_indices" in keywords:
            return False  # trains embedding rows: the embeddings' output requires grad
        saved = keywords.get("modules_to_save")
        if saved is not None and not (isinstance(saved, ast.Constant) and saved.value is None):
            strings = _strings(saved)
            if strings is None or any(_EMBEDDING.search(s) for s in strings):
                return False
        targets = keywords.get("target_modules")
        if targets is not None:
            strings = _strings(targets)
            if strings is not None and any(_EMBEDDING.search(s) for s in strings):
                return False  # LoRA on the embeddings: their output requires grad
        return True

    def _base_load(self, scope: _Scope, base_arg: ast.expr, before) -> ast.Call | None:
        """The `from_pretrained` / `from_config` call the base model comes from, in this scope."""
        node, pos = base_arg, before
        for _ in range(6):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in _LOADS:
                    return node
                if isinstance(func, ast.Attribute) and func.attr in _RETURNS_SELF:
                    node = func.value  # `model.to(device)` is the same model
                    continue
                return None
            name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name is None:
                return None
            binding = scope.last_binding(name, pos)
            if binding is None or binding.value is None:
                return None
            node, pos = binding.value, binding.pos
        return None

    def _checkpointing_before(self, function, base: str | None, load: ast.Call, wrap_pos) -> bool:
        """Checkpointing may already be on when `get_peft_model` wraps the model."""
        if any(k.arg in ("gradient_checkpointing", "use_gradient_checkpointing") for k in load.keywords):
            return True
        load_pos = (load.lineno, load.col_offset)
        for site in self.index.calls:
            pos = (site.node.lineno, site.node.col_offset)
            if site.context.function is not function or not (load_pos < pos < wrap_pos):
                continue
            if site.method in GC_METHODS:
                return True  # on this model or another: checkpointing may be on
            if base is None:
                continue
            passes_model = any(
                dotted(arg) == base for arg in [*site.node.args, *(k.value for k in site.node.keywords)]
            )
            if passes_model and site.name and _MAY_ENABLE.search(site.name.split(".")[-1]):
                return True
        return False

    # -- the checkpointing that runs reentrant --------------------------------------------
    def _reentrant(self, state: str, non_text: bool, trainer: bool, kwargs_node) -> str | None:
        """Why this checkpointing is reentrant with nobody calling `enable_input_require_grads()`,
        or None when it is not (or the versions cannot tell)."""
        tf = _pin(self.ctx, "transformers")
        if state == "default":
            if self.tf_v4 is True:
                return f"`use_reentrant` defaults to True on {tf}"
            return None  # transformers 5 defaults to False; unknown: depends on the version
        if state == "missing" and trainer and trainer_drops(kwargs_node) and self.tf_v4 is not True:
            return None  # transformers 5's Trainer passes such a dict on as None (use_reentrant=False)
        if state in ("true", "missing"):
            said = (
                "`use_reentrant=True`" if state == "true"
                else "its kwargs dict has no `use_reentrant`, so torch defaults to True"
            )
            if self.tf_v4 is True:
                return f"{said}, on {tf}"
            if non_text:
                return (
                    f"{said}; this model's main input is not `input_ids`, so transformers 5 does "
                    "not call `enable_input_require_grads()` for it either"
                )
        return None

    def _fix_edit(self, wrapped, call: ast.Call, keyword: str, value, literal):
        """`use_reentrant: False`: a new kwargs keyword on `call`, or the key set in the dict
        literal already passed; none for remote code or kwargs held in a variable."""
        if wrapped.remote_code:
            return None
        if value is None:
            return python_edits.add_keyword(self.src, call, f'{keyword}={{"use_reentrant": False}}') if self.tf_kwargs else None
        return set_reentrant_false(self.src, literal) if literal is not None else None

    def _kwargs_state(self, scope: _Scope, value, pos) -> tuple[str, ast.AST | None, ast.AST | None]:
        """(use_reentrant state, the node it was read from, the literal node a fix may edit)."""
        if isinstance(value, (ast.Name, ast.Attribute)):
            resolved = scope.value_of(value, pos)
            if resolved is None:
                return "unknown", None, None
            return use_reentrant_of(resolved), resolved, None  # a shared dict: no automatic edit
        return use_reentrant_of(value), value, value

    def _check_enable(self, scope: _Scope, site, keyword: str, wrapped: _Wrapped, before_wrap: bool) -> None:
        call = site.node
        value, hidden = kwargs_argument(call, keyword)
        if hidden:
            return
        at = (site.context.stmt.lineno, site.context.stmt.col_offset)
        state, read, literal = self._kwargs_state(scope, value, at)
        why = self._reentrant(state, wrapped.non_text, False, read)
        if why is None:
            return
        src, wrap = self.src, wrapped.call
        edit = self._fix_edit(wrapped, call, keyword, value, literal)
        receiver = src.node_text(call.func.value)  # type: ignore[attr-defined]
        method = call.func.attr  # type: ignore[attr-defined]
        if before_wrap:
            which = (
                f"for the quantized model that `get_peft_model` wraps on line {wrap.lineno} and "
                "freezes, and nothing calls `enable_input_require_grads()`: PEFT skips it for "
                "quantized models, even with checkpointing on (`prepare_model_for_kbit_training` "
                "is what calls it there)."
            )
        else:
            which = (
                f"for the PEFT model that `get_peft_model` built on line {wrap.lineno} with frozen "
                "embeddings, and nothing calls `enable_input_require_grads()`: PEFT only does when "
                "checkpointing is already on as it wraps the model, and transformers 4 only for "
                "adapters added with `add_adapter`."
            )
        message = (
            f"`{receiver}.{method}()` turns on reentrant checkpointing ({why}) {which} "
            f"{_CONSEQUENCE} {_advice(wrapped, 'Pass `use_reentrant=False`.', self.tf_kwargs or value is not None)}"
        )
        self.hits.append(_Hit(
            call, message, Fix((edit,), _FIX_TEXT, Applicability.SAFE) if edit else None,
            [Related(src.span_of_node(wrap), "adapters injected here; every other weight frozen")], call,
        ))

    def _check_trainer(self, scope: _Scope, args_call: ast.Call, wrapped: _Wrapped) -> None:
        name = self.imports.qualify(args_call.func) or ""
        if not (name.startswith("transformers.") and name.endswith("TrainingArguments")):
            return
        flag = next(
            (k for k in args_call.keywords
             if k.arg in TRAINING_FLAGS and isinstance(k.value, ast.Constant) and k.value.value is True),
            None,
        )
        if flag is None:
            return
        keyword = TRAINING_FLAGS[flag.arg]
        value = next((k.value for k in args_call.keywords if k.arg in TRAINING_FLAGS.values()), None)
        if value is None and any(k.arg is None for k in args_call.keywords):
            return  # `**kwargs` may carry the kwargs
        state, read, literal = self._kwargs_state(scope, value, (args_call.lineno, args_call.col_offset))
        why = self._reentrant(state, wrapped.non_text, True, read)
        if why is None:
            return
        src, wrap = self.src, wrapped.call
        edit = self._fix_edit(wrapped, args_call, keyword, value, literal)
        message = (
            f"`{flag.arg}=True` makes the HF `Trainer` turn on reentrant checkpointing ({why}) for "
            f"the PEFT model that `get_peft_model` built on line {wrap.lineno} with frozen "
            "embeddings, and neither `Trainer` nor PEFT calls `enable_input_require_grads()` (PEFT "
            "only does when checkpointing is already on as it wraps the model). "
            f"{_CONSEQUENCE} {_advice(wrapped, 'Pass `' + keyword + '={' + _KEY_FALSE + '}`.', self.tf_kwargs)}"
        )
        self.hits.append(_Hit(
            flag, message, Fix((edit,), _FIX_TEXT, Applicability.SAFE) if edit else None,
            [Related(src.span_of_node(wrap), "adapters injected here; every other weight frozen")], args_call,
        ))


def _filter_strings(loop: ast.AST) -> list[str]:
    """Strings a loop compares names with (`"lora" in n`, `n.startswith("embed")`)."""
    found = []
    for node in ast.walk(loop):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "startswith", "endswith", "search", "match", "fullmatch",
        ):
            parts = list(node.args)
        else:
            continue
        for part in parts:
            for sub in ast.walk(part):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    found.append(sub.value)
    return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _owner(receiver: str | None, names: set[str]) -> str | None:
    """The tracked name a receiver reaches the transformers model through
    (`model`, `model.base_model`, `model.base_model.model`)."""
    if receiver is None:
        return None
    for name in names:
        if receiver == name:
            return name
        rest = receiver[len(name) + 1 :] if receiver.startswith(name + ".") else None
        if rest in ("base_model", "base_model.model", "model", "base_model.model.model"):
            return name
    return None


def _strings(node: ast.expr) -> list[str] | None:
    """The strings of a literal list/tuple/set or of one string; None when not literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
                return None
            out.append(elt.value)
        return out
    return None


def _quantized(load: ast.Call, consts: dict[str, ast.expr] | None = None) -> bool | None:
    """True: loaded 4/8-bit; False: not; None: a config variable that may or may not quantize.
    A name bound once (`bnb_cfg = BitsAndBytesConfig(load_in_8bit=True)`) is read through."""
    consts = consts or {}
    for kw in load.keywords:
        value = kw.value
        if isinstance(value, ast.Name) and value.id in consts:
            value = consts[value.id]
        if kw.arg in ("load_in_4bit", "load_in_8bit"):
            if not isinstance(value, ast.Constant):
                return None
            if value.value is True:
                return True
        elif kw.arg == "quantization_config":
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            return True if isinstance(value, ast.Call) else None
        elif kw.arg is None:
            return None
    return False


def _class_name(imports, load: ast.Call) -> str:
    owner = imports.qualify(load.func.value) if isinstance(load.func, ast.Attribute) else None
    return owner.split(".")[-1] if owner else ""


def peft_analysis(ctx) -> _Peft:
    """Computed once per file, shared by CFX306 and CFX307 (which skips what CFX306 reports)."""
    if "cfx306-peft" not in ctx.notes:
        ctx.notes["cfx306-peft"] = _Peft(ctx)
    return ctx.notes["cfx306-peft"]
