"""What a training script says about its PyTorch Lightning `Trainer`: the arguments of its one
`Trainer(...)` (`lightning`, `lightning.pytorch`, `pytorch_lightning`, imported under any
alias) or `Fabric(...)`, each a literal, a strategy object (`DeepSpeedStrategy(stage=3)`,
`FSDPStrategy(...)`, also through a name bound once) or a reference to the script's flags or
config file; `Trainer(**kwargs)` over a dict literal (or a name bound once to one), a mapping
of its config file (`**cfg["trainer"]`) or of its Hydra config (`**cfg.trainer`); whether it
builds the Trainer from its flags (`Trainer.from_argparse_args`, 1.x), runs `LightningCLI`
(then `--trainer.X` flags, `--config` files and `trainer_defaults=` decide) or has Hydra build
it (`hydra.utils.instantiate(cfg.trainer)` in an `@hydra.main` script: the composed config's
node decides, when its `_target_` is Lightning's Trainer; training/hydra_config.py).

A script with several `Trainer(...)` calls (examples side by side) says nothing certain: none
is read. Per-launch resolution is `training/resolve.py`'s (`_lightning`).
"""

from __future__ import annotations

import ast

from cfgfix.records import dataclass, field
from cfgfix.training.frameworks.lightning import (
    ARGUMENTS,
    CLI_CLASSES,
    FABRIC_ARGUMENTS,
    FABRIC_CLASSES,
    TRAINER_CLASSES,
)
from cfgfix.training.hydra_config import hydra_path, read_hydra_main
from cfgfix.training.values import literal

_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
_STRATEGY_CLASSES = ("DeepSpeedStrategy", "FSDPStrategy", "DDPStrategy", "ModelParallelStrategy")
_INSTANTIATE = frozenset({"hydra.utils.instantiate", "hydra.utils.call", "hydra.utils.get_class"})


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
    # `Trainer(**spread)`: a HydraPath or a config Ref (training/references.py) whose mapping's
    # keys are arguments, resolved per launch (a literal dict's keys are in `arguments`)
    spread: object = None
    hydra: object = None  # HydraMain of an `@hydra.main` script
    # `hydra.utils.instantiate(cfg.X, **kw)` calls: (HydraPath, {name: Argument}); the one whose
    # composed node's `_target_` is a Lightning Trainer builds it
    instantiated: list = field(default_factory=list)
    fabric: bool = False  # a Fabric(...) rather than a Trainer: no accumulate_grad_batches
    launches: bool = False  # calls `.launch()` (Fabric: it starts devices x num_nodes processes)


def read_lightning(tree: ast.Module, imports, consts, refs, conditional: set[int]) -> LightningFacts | None:
    facts = LightningFacts()
    calls = []
    bound = _bound_calls(tree)
    dicts = _bound_dicts(tree)
    hydra = read_hydra_main(tree, imports)
    instantiations = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        if name in TRAINER_CLASSES or name in FABRIC_CLASSES:
            calls.append(node)
            facts.fabric = facts.fabric or name in FABRIC_CLASSES
        elif name.endswith(".from_argparse_args") and name.rsplit(".", 1)[0] in TRAINER_CLASSES:
            facts.from_argparse = True
        elif name in CLI_CLASSES:
            facts.cli = True
            defaults = next((kw.value for kw in node.keywords if kw.arg == "trainer_defaults"), None)
            if isinstance(defaults, ast.Dict):
                for key, value in zip(defaults.keys, defaults.values):
                    if isinstance(key, ast.Constant) and key.value in ARGUMENTS:
                        facts.cli_defaults[key.value] = _argument(key.value, value, imports, consts, refs, bound)
        elif name in _INSTANTIATE and hydra is not None and node.args:
            instantiations.append(node)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "launch":
            facts.launches = True
    if hydra is not None:
        facts.hydra = hydra
        for node in instantiations:
            path = hydra_path(node.args[0], hydra.names)
            if path is not None:
                kwargs = {kw.arg: _argument(kw.arg, kw.value, imports, consts, refs, bound, hydra)
                          for kw in node.keywords if kw.arg in ARGUMENTS}
                facts.instantiated.append((path, kwargs, any(kw.arg is None for kw in node.keywords)))
    if not (calls or facts.from_argparse or facts.cli or facts.instantiated):
        return None
    if facts.fabric and any(imports.qualify(c.func) in TRAINER_CLASSES for c in calls):
        facts.opaque.add("*")  # a Trainer and a Fabric: which one runs is not certain
        return facts
    names = FABRIC_ARGUMENTS if facts.fabric else ARGUMENTS
    unconditional = [call for call in calls if id(call) not in conditional]
    if len(calls) == 1 and unconditional:
        facts.call = call = calls[0]
        for kw in call.keywords:
            if kw.arg is None:
                _spread(facts, kw.value, names, imports, consts, refs, bound, dicts, hydra)
            elif kw.arg in names:
                argument = _argument(kw.arg, kw.value, imports, consts, refs, bound, hydra)
                if argument.known or argument.ref is not None:
                    facts.arguments[kw.arg] = argument
                else:
                    facts.opaque.add(kw.arg)
    elif len(calls) > 1:
        facts.opaque.add("*")  # several Trainers: which one runs is not certain
    return facts


def _spread(facts: LightningFacts, node: ast.expr, names, imports, consts, refs, bound, dicts, hydra) -> None:
    """`Trainer(**kw)`: a dict literal (or a name bound once to one) gives its keys; a Hydra
    config node or a config file's mapping is read per launch; anything else is opaque."""
    if facts.spread is not None:
        facts.opaque.add("**")
        return
    literal_dict = dicts.get(node.id) if isinstance(node, ast.Name) else node if isinstance(node, ast.Dict) else None
    if literal_dict is not None:
        for key, value in zip(literal_dict.keys, literal_dict.values):
            if key is None or not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                facts.opaque.add("**")
                return
            if key.value in names:
                argument = _argument(key.value, value, imports, consts, refs, bound, hydra)
                if argument.known or argument.ref is not None:
                    facts.arguments[key.value] = argument
                else:
                    facts.opaque.add(key.value)
        return
    found = hydra_path(node, hydra.names) if hydra is not None else None
    if found is None and refs is not None:
        ref = refs.ref(node)
        found = ref if ref is not None and ref.is_config else None
    if found is None:
        facts.opaque.add("**")
    else:
        facts.spread = found


def _bound_calls(tree: ast.Module) -> dict[str, ast.Call]:
    """Names bound exactly once in the module (any scope) to a strategy call."""
    seen: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(node.value)
    return {name: values[0] for name, values in seen.items()
            if len(values) == 1 and isinstance(values[0], ast.Call)}


def _bound_dicts(tree: ast.Module) -> dict[str, ast.Dict]:
    """Names bound exactly once in the module to a dict literal (`kw = {"devices": 4}`), and
    never changed by item assignment or `.update()` (then the literal is not the whole story)."""
    seen: dict[str, list[ast.expr]] = {}
    changed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(node.value)
                elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    changed.add(target.value.id)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            seen.setdefault(node.target.id, []).append(node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.attr in ("update", "setdefault", "pop", "__setitem__")):
            changed.add(node.func.value.id)
    return {name: values[0] for name, values in seen.items()
            if len(values) == 1 and isinstance(values[0], ast.Dict) and name not in changed}


def _argument(name: str, node: ast.expr, imports, consts, refs, bound, hydra=None) -> Argument:
    if isinstance(node, ast.Name) and node.id in bound:
        node = bound[node.id]
    path = hydra_path(node, hydra.names) if hydra is not None else None
    if path is not None and path.keys:
        return Argument(name, ref=path, node=node)
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
