"""Code that a training framework runs once per step, with no loop in sight.

A `TrainerCallback.on_step_end`, a `Trainer` subclass's `training_step` or `compute_loss`,
a Lightning `training_step` or `on_train_batch_end`: the loop that calls them lives in the
library, so a loop analysis of the user's file never sees them. This module names them from
the class's bases and the method's name, which the frameworks fix.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from cfgfix.analysis.names import ImportMap, dotted

# Hook names per framework family, each run once per optimizer step or micro-batch.
_CALLBACK_HOOKS = frozenset({
    "on_step_begin", "on_step_end", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step",
    "on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_batch_end", "on_batch_begin",
})
_TRAINER_STEP_METHODS = frozenset({"training_step", "compute_loss", "optimizer_step", "train_step"})
_LIGHTNING_STEP_METHODS = frozenset({
    "training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "optimizer_step", "on_before_zero_grad",
})
# Bases, by the last part of their qualified name.
_CALLBACK_BASE = re.compile(r"(?:^|\.)(?:\w*Callback)$")
_TRAINER_BASE = re.compile(r"(?:^|\.)(?:\w*Trainer)$")
_LIGHTNING_BASE = re.compile(r"(?:^|\.)(?:LightningModule|LightningLite)$")


@dataclass(frozen=True)
class StepFunction:
    function: ast.FunctionDef | ast.AsyncFunctionDef
    owner: ast.ClassDef
    framework: str  # "callback", "trainer" or "lightning"

    @property
    def description(self) -> str:
        return f"`{self.owner.name}.{self.function.name}`, which the {_WHO[self.framework]} calls every step"


_WHO = {"callback": "trainer", "trainer": "Trainer's loop", "lightning": "Lightning loop"}


def step_functions(tree: ast.Module, imports: ImportMap) -> dict[int, StepFunction]:
    """id(function node) -> StepFunction, for every per-step hook or step method in the
    module (classes nested anywhere included)."""
    found: dict[int, StepFunction] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        framework = _framework(cls, imports)
        if framework is None:
            continue
        names = {"callback": _CALLBACK_HOOKS, "trainer": _TRAINER_STEP_METHODS,
                 "lightning": _LIGHTNING_STEP_METHODS}[framework]
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                found[id(node)] = StepFunction(node, cls, framework)
    return found


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
