"""Code that a training framework runs once per step, with no loop in sight.

A `TrainerCallback.on_step_end`, a `Trainer` subclass's `training_step` or `compute_loss`,
a Lightning `training_step` or `on_train_batch_end`: the loop that calls them lives in the
library, so a loop analysis of the user's file never sees them. This module names them from
the class's bases and the method's name, which the frameworks fix. The evaluation loops'
per-batch hooks count too (Lightning's `validation_step` and `on_test_batch_end`, the HF
Trainer's `prediction_step` and its callbacks' `on_prediction_step`); hooks that run once
per evaluation (`on_evaluate`, `on_validation_epoch_end`) do not.
"""

from __future__ import annotations

import ast
import re

from cfgfix.analysis.names import ImportMap, dotted
from cfgfix.records import dataclass

# Hook names per framework family, each run once per optimizer step or micro-batch.
# Callbacks: HF `TrainerCallback` (on_step_*, on_substep_end, on_*optimizer_step), Lightning
# `Callback` (on_train_batch_*, on_before_/after_backward, ...), Keras (on_*batch_begin/end).
_CALLBACK_HOOKS = frozenset({
    "on_step_begin", "on_step_end", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step",
    "on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_batch_end", "on_batch_begin",
    "on_train_batch_begin",
})
# Once per batch of an evaluation loop: HF `Trainer.evaluation_loop` calls
# `callback_handler.on_prediction_step` after each `prediction_step`; Lightning's
# evaluation and predict loops call `on_{validation,test,predict}_batch_{start,end}` on
# callbacks and the module around each `*_step`; Keras names them `_begin`.
_CALLBACK_EVAL_HOOKS = frozenset({
    "on_prediction_step",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_test_batch_begin", "on_predict_batch_begin",
})
_TRAINER_STEP_METHODS = frozenset({"training_step", "compute_loss", "optimizer_step", "train_step"})
_TRAINER_EVAL_METHODS = frozenset({"prediction_step"})  # `Trainer.evaluation_loop`, per batch
_LIGHTNING_STEP_METHODS = frozenset({
    "training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "optimizer_step", "on_before_zero_grad",
})
_LIGHTNING_EVAL_METHODS = frozenset({
    "validation_step", "test_step", "predict_step",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_batch_start", "on_predict_batch_end",
})
_HOOKS = {  # framework -> (per training step, per evaluation step)
    "callback": (_CALLBACK_HOOKS, _CALLBACK_EVAL_HOOKS),
    "trainer": (_TRAINER_STEP_METHODS, _TRAINER_EVAL_METHODS),
    "lightning": (_LIGHTNING_STEP_METHODS, _LIGHTNING_EVAL_METHODS),
}
# Every name above, for a rule's text-only first look (`def on_test_batch_end(`).
STEP_HOOK_DEF = re.compile(
    rb"def\s+(?:" + b"|".join(sorted({n.encode() for pair in _HOOKS.values() for names in pair for n in names}))
    + rb")\s*\("
)
# Bases, by the last part of their qualified name.
_CALLBACK_BASE = re.compile(r"(?:^|\.)(?:\w*Callback)$")
_TRAINER_BASE = re.compile(r"(?:^|\.)(?:\w*Trainer)$")
_LIGHTNING_BASE = re.compile(r"(?:^|\.)(?:LightningModule|LightningLite)$")


@dataclass(frozen=True)
class StepFunction:
    function: ast.FunctionDef | ast.AsyncFunctionDef
    owner: ast.ClassDef
    framework: str  # "callback", "trainer" or "lightning"
    evaluation: bool = False  # once per batch of an evaluation (or predict) loop, not a training step

    @property
    def step(self) -> str:
        return "evaluation step" if self.evaluation else "training step"

    @property
    def description(self) -> str:
        every = "every evaluation step" if self.evaluation else "every step"
        return f"`{self.owner.name}.{self.function.name}`, which the {_WHO[self.framework]} calls {every}"


_WHO = {"callback": "trainer", "trainer": "Trainer's loop", "lightning": "Lightning loop"}


def step_functions(tree: ast.Module, imports: ImportMap) -> dict[int, StepFunction]:
    """id(function node) -> StepFunction, for every per-step hook or step method in the
    module (classes nested anywhere included)."""
    found: dict[int, StepFunction] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        framework = _framework(cls, imports)
        if framework is None:
            continue
        train, evaluation = _HOOKS[framework]
        hooks = [node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and (node.name in train or node.name in evaluation)]
        if hooks and framework == "callback" and _never_registered(tree, cls):
            continue
        for node in hooks:
            found[id(node)] = StepFunction(node, cls, framework, node.name in evaluation)
    return found


def _never_registered(tree: ast.Module, cls: ast.ClassDef) -> bool:
    """The module builds the callback only into names nothing reads (`cb = C()` with its
    `callbacks=[cb]` commented out), and uses the class no other way: no trainer ever gets
    it. A class the module never builds may be built by another module: not this."""
    built: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id == cls.name \
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            built.append(node.targets[0].id)
    if not built:
        return False
    uses = {cls.name: 0, **{name: 0 for name in built}}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in uses and isinstance(node.ctx, ast.Load):
            uses[node.id] += 1
        elif isinstance(node, ast.Attribute) and node.attr == cls.name:
            return False  # `callbacks.ClearCache` built through a module name
    # each `x = C()` reads the class once; any other read of it or of x may register it
    return uses[cls.name] == len(built) and all(uses[name] == 0 for name in built)


def _framework(cls: ast.ClassDef, imports: ImportMap) -> str | None:
    for base in cls.bases:
        name = imports.qualify(base) or dotted(base) or ""
        if _CALLBACK_BASE.search(name):
            return "callback"
        if _LIGHTNING_BASE.search(name):
            return "lightning"
        if _TRAINER_BASE.search(name):
            return "trainer"
    return None
