"""What a training script says about its PyTorch Lightning `Trainer`: the arguments of its one
`Trainer(...)` (`lightning`, `lightning.pytorch`, `pytorch_lightning`, imported under any
alias), each a literal, a strategy object (`DeepSpeedStrategy(stage=3)`, `FSDPStrategy(...)`,
also through a name bound once) or a reference to the script's flags or config file; whether
it builds the Trainer from its flags (`Trainer.from_argparse_args`, 1.x) or runs `LightningCLI`
(then `--trainer.X` flags, `--config` files and `trainer_defaults=` decide).

A script with several `Trainer(...)` calls (examples side by side) says nothing certain: none
is read. Per-launch resolution is `training/resolve.py`'s (`_lightning`).
"""

from __future__ import annotations

import ast

from cfgfix.records import dataclass, field
from cfgfix.training.frameworks.lightning import ARGUMENTS, CLI_CLASSES, TRAINER_CLASSES
from cfgfix.training.values import literal

_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
_STRATEGY_CLASSES = ("DeepSpeedStrategy", "FSDPStrategy", "DDPStrategy", "ModelParallelStrategy")


@dataclass
class Argument:
    """One Trainer argument as the script writes it: `value` when literal (a strategy object
    as a dict: {"class": "DeepSpeedStrategy", "stage": 3, ...}), else `ref` (training/
    references.py) to resolve per launch; `node` for its span."""

    name: str
    value: object = None
    ref: object = None
    node: ast.AST | None = None
    known: bool = False


@dataclass
class LightningFacts:
    arguments: dict[str, Argument] = field(default_factory=dict)  # the Trainer(...) call's
    opaque: set = field(default_factory=set)  # arguments computed at run time
    from_argparse: bool = False  # Trainer.from_argparse_args(args): the launch's flags are its arguments
    cli: bool = False  # LightningCLI: --trainer.* flags and --config files
    cli_defaults: dict[str, Argument] = field(default_factory=dict)  # LightningCLI(trainer_defaults={...})
    call: ast.Call | None = None


def read_lightning(tree: ast.Module, imports, consts, refs, conditional: set[int]) -> LightningFacts | None:
    facts = LightningFacts()
    calls = []
    bound = _bound_calls(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        if name in TRAINER_CLASSES:
            calls.append(node)
        elif name.endswith(".from_argparse_args") and name.rsplit(".", 1)[0] in TRAINER_CLASSES:
            facts.from_argparse = True
        elif name in CLI_CLASSES:
            facts.cli = True
            defaults = next((kw.value for kw in node.keywords if kw.arg == "trainer_defaults"), None)
            if isinstance(defaults, ast.Dict):
                for key, value in zip(defaults.keys, defaults.values):
                    if isinstance(key, ast.Constant) and key.value in ARGUMENTS:
                        facts.cli_defaults[key.value] = _argument(key.value, value, imports, consts, refs, bound)
    if not (calls or facts.from_argparse or facts.cli):
        return None
    unconditional = [call for call in calls if id(call) not in conditional]
    if len(calls) == 1 and unconditional:
        facts.call = call = calls[0]
        for kw in call.keywords:
            if kw.arg is None:
                facts.opaque.add("**")
            elif kw.arg in ARGUMENTS:
                argument = _argument(kw.arg, kw.value, imports, consts, refs, bound)
                if argument.known or argument.ref is not None:
                    facts.arguments[kw.arg] = argument
                else:
                    facts.opaque.add(kw.arg)
    elif len(calls) > 1:
        facts.opaque.add("*")  # several Trainers: which one runs is not certain
    return facts


def _bound_calls(tree: ast.Module) -> dict[str, ast.Call]:
    """Names bound exactly once in the module (any scope) to a strategy call."""
    seen: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(node.value)
    return {name: values[0] for name, values in seen.items()
            if len(values) == 1 and isinstance(values[0], ast.Call)}


def _argument(name: str, node: ast.expr, imports, consts, refs, bound) -> Argument:
    if isinstance(node, ast.Name) and node.id in bound:
        node = bound[node.id]
    if isinstance(node, ast.Call):
        strategy = _strategy(node, imports, consts)
        return Argument(name, strategy, node=node, known=strategy is not None)
    try:
        return Argument(name, literal(node, consts), node=node, known=True)
    except _LITERAL_ERRORS:
        ref = refs.ref(node) if refs is not None else None
        return Argument(name, ref=ref, node=node)


def _strategy(call: ast.Call, imports, consts) -> dict | None:
    """`DeepSpeedStrategy(stage=3, offload_optimizer=True)` as {"class": ..., keyword: value};
    None for a class it does not know or a keyword it cannot read that matters."""
    name = (imports.qualify(call.func) or "").rsplit(".", 1)[-1]
    if name not in _STRATEGY_CLASSES:
        return None
    found: dict[str, object] = {"class": name}
    for kw in call.keywords:
        if kw.arg is None:
            return None
        try:
            found[kw.arg] = literal(kw.value, consts)
        except _LITERAL_ERRORS:
            if kw.arg in ("stage", "offload_optimizer", "offload_parameters", "sharding_strategy", "config",
                          "cpu_offload"):
                return None
    return found
