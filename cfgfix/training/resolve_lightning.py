"""A Lightning launch's Trainer arguments, resolved as Lightning applies them, and the setup
they make (training/frameworks/lightning.py): processes = devices x num_nodes (Lightning
starts them itself under plain `python`), ZeRO stage and offload from a DeepSpeed strategy,
FSDP sharding, autocast or converted weights from `precision`, `accumulate_grad_batches`.

Where the arguments come from, lowest first: `LightningCLI(trainer_defaults=...)`, a Hydra
config node the script instantiates (`instantiate(cfg.trainer)` with `_target_` Lightning's
Trainer, composed for this launch's group choices and overrides: training/hydra_config.py) and
that call's keywords, the `**mapping` the script's Trainer call spreads (a dict literal, its
config file's mapping, its Hydra config's node), the script's one literal `Trainer(...)` or
`Fabric(...)` (its references resolved against the launch), then for a
LightningCLI script the launch's `--config` files (their `trainer:` block, or the file it
names) and `--trainer.X` flags in the order written (jsonargparse applies them in order), and
for `Trainer.from_argparse_args(args)` the launch's `--X` flags. An argument the launch may
set at run time (a `$VAR` config, a value computed in code) leaves what it decides unknown.
"""

from __future__ import annotations

from cfgfix.training.frameworks import lightning as pl
from cfgfix.training.values import Value


def resolve_lightning(resolver, script) -> None:
    facts = script.lightning
    setup = resolver.setup
    arguments: dict[str, Value] = {}
    unknown = set(facts.opaque)
    where = resolver.display(setup.script) if setup.script is not None else "the script"
    for name, argument in facts.cli_defaults.items():
        _take(resolver, script, arguments, unknown, argument, f"LightningCLI(trainer_defaults={{{name!r}: ...}}) in {where}")
    built = _instantiated(resolver, script, arguments, unknown, where) if facts.instantiated else False
    if facts.spread is not None:
        _spread(resolver, script, arguments, unknown, facts.spread, where)
    call = "Fabric" if facts.fabric else "Trainer"
    for name, argument in facts.arguments.items():
        _take(resolver, script, arguments, unknown, argument, f"{call}({name}=) in {where}")
    if facts.cli:
        _cli_arguments(resolver, arguments, unknown)
    elif facts.from_argparse and facts.call is None:
        _flag_arguments(resolver, arguments, unknown, prefix="--")
    if not (facts.call is not None or facts.cli or facts.from_argparse or built) or "*" in unknown:
        return
    if facts.fabric:
        unknown.add("accumulate_grad_batches")  # the script's own loop accumulates
        if not facts.launches:
            unknown.add("devices")  # without .launch() Fabric starts no processes of its own
    found = _settings(arguments, unknown, "**" in unknown)
    if built:
        setup.trains = True  # Hydra builds Lightning's Trainer: its fit() runs the training steps
    target = getattr(resolver, "_hydra_target", None)
    if built and target is not None and target.span is not None:  # where fix --fit adds a Trainer key
        found["hydra_trainer"] = Value("hydra_trainer", str(target.value), target.origin, target.span, "_target_")
    setup.sources["lightning"] = found
    _deepspeed(setup, arguments, found)


def _composed(resolver, script):
    """The launch's composed Hydra config (memoised on the resolver), or None."""
    cached = getattr(resolver, "_hydra_composed", False)
    if cached is not False:
        return cached
    from cfgfix.training.hydra_config import compose

    main = script.lightning.hydra
    composed = None
    if main is not None and main.config_path is not None and resolver.setup.script is not None:
        folder = (resolver.setup.script.parent / main.config_path).resolve()
        if folder.is_dir():
            composed = compose(resolver.project.read, resolver.display, folder, main.config_name, resolver.launch.args)
    resolver._hydra_composed = composed
    return composed


def _hydra_arguments(resolver, script, node, arguments, unknown, label: str) -> None:
    """The Trainer arguments a composed config node holds (`strategy: {_target_:
    ...DeepSpeedStrategy, stage: 3}` as a strategy object)."""
    from cfgfix.training.hydra_config import UNKNOWN, Leaf, resolve_leaf

    composed = _composed(resolver, script)
    if not isinstance(node, dict) or "__unknown__" in node:
        unknown.update(pl.ARGUMENTS)
        return
    for key in pl.ARGUMENTS:
        if key not in node:
            continue
        item = node[key]
        if isinstance(item, Leaf) and isinstance(item.value, str) and (target := _referenced_node(composed, item)):
            item = target  # `strategy: ${strategy}`: the node of another group (instantiated with it)
        if isinstance(item, Leaf):
            value, origin, span = resolve_leaf(composed, item), item.origin, item.span
        elif isinstance(item, dict) and isinstance(item.get("_target_"), Leaf):
            value = {"class": str(item["_target_"].value).rsplit(".", 1)[-1]}
            for name, part in item.items():
                if name != "_target_":
                    value[name] = resolve_leaf(composed, part) if isinstance(part, Leaf) else UNKNOWN
            if any(v is UNKNOWN for v in value.values()):
                value = UNKNOWN
            origin, span = f"{label}.{key} (_target_ {item['_target_'].value})", item["_target_"].span
        else:
            value, origin, span = UNKNOWN, label, None
        if value is UNKNOWN or isinstance(value, str) and "${" in value:
            unknown.add(key)
            arguments.pop(key, None)
            continue
        arguments[key] = Value(key, value, f"{origin} (Hydra config)", span, key)
        unknown.discard(key)


def _referenced_node(composed, leaf):
    """The config node a whole-value `${a.b}` interpolation points at, or None."""
    from cfgfix.training.hydra_config import lookup, reference

    keys = reference(leaf.value)
    found = lookup(composed, keys) if keys is not None and composed is not None else None
    return found if isinstance(found, dict) else None


def _instantiated(resolver, script, arguments, unknown, where: str) -> bool:
    """`instantiate(cfg.trainer, ...)`: the call whose composed node targets Lightning's
    Trainer; True when one does (or may: an unknown node leaves every argument unknown)."""
    from cfgfix.training.hydra_config import UNKNOWN, Leaf, lookup, resolve_leaf

    composed = _composed(resolver, script)
    if composed is None:
        return False
    for path, kwargs, spread in script.lightning.instantiated:
        node = lookup(composed, path.keys)
        if node is UNKNOWN:
            unknown.update(pl.ARGUMENTS)
            return True
        target = node.get("_target_") if isinstance(node, dict) else None
        if not isinstance(target, Leaf) or str(resolve_leaf(composed, target)) not in pl.TRAINER_CLASSES:
            continue
        resolver._hydra_target = target
        _hydra_arguments(resolver, script, node, arguments, unknown, ".".join(path.keys))
        for name, argument in kwargs.items():
            _take(resolver, script, arguments, unknown, argument, f"instantiate(..., {name}=) in {where}")
        if spread:
            unknown.add("**")
        return True
    return False


def _spread(resolver, script, arguments, unknown, spread, where: str) -> None:
    from cfgfix.training.hydra_config import UNKNOWN, HydraPath, lookup

    if isinstance(spread, HydraPath):
        composed = _composed(resolver, script)
        node = lookup(composed, spread.keys) if composed is not None else UNKNOWN
        _hydra_arguments(resolver, script, node, arguments, unknown, ".".join(spread.keys))
        return
    from cfgfix.training.resolve_refs import RefResolver

    resolved = RefResolver(resolver.project, resolver.launch, resolver.launch_file, resolver.setup.script,
                           script.refs).resolve(spread)
    node = getattr(resolved, "value", None)
    if node is None or not hasattr(node, "kind") or node.kind != "mapping":
        unknown.add("**")
        return
    for key in pl.ARGUMENTS:
        item = node.get(key)
        if item is None:
            continue
        value = item.to_python()
        if isinstance(value, str) and "$" in value:
            unknown.add(key)
            continue
        span = resolved.doc.span(item) if resolved.doc is not None else None
        arguments[key] = Value(key, value, f"{key} in {resolved.origin} (Trainer(**...) in {where})", span, key)
        unknown.discard(key)


def _take(resolver, script, arguments, unknown, argument, origin: str) -> None:
    parsed = resolver.project.script(resolver.setup.script) if argument.node is not None else None
    span = parsed[0].span_of_node(argument.node) if parsed is not None else None
    if argument.known:
        arguments[argument.name] = Value(argument.name, argument.value, origin, span, argument.name)
        unknown.discard(argument.name)
        return
    from cfgfix.training.hydra_config import HydraPath

    if isinstance(argument.ref, HydraPath):  # Trainer(devices=cfg.trainer.devices)
        from cfgfix.training.hydra_config import UNKNOWN, lookup

        composed = _composed(resolver, script)
        item = lookup(composed, argument.ref.keys) if composed is not None else UNKNOWN
        node = {argument.name: item} if item is not None and item is not UNKNOWN else {"__unknown__": UNKNOWN}
        if item is None:  # not in the composed config: the run fails on the missing key
            unknown.add(argument.name)
            arguments.pop(argument.name, None)
            return
        before = set(unknown)
        _hydra_arguments(resolver, script, node, arguments, unknown, origin)
        if "__unknown__" in node:
            unknown.clear()
            unknown.update(before | {argument.name})
        return
    from cfgfix.training.resolve_refs import UNKNOWN, RefResolver

    resolved = RefResolver(resolver.project, resolver.launch, resolver.launch_file, resolver.setup.script,
                           script.refs).resolve(argument.ref) if argument.ref is not None else None
    if resolved is None or resolved is UNKNOWN:
        unknown.add(argument.name)
        arguments.pop(argument.name, None)
        return
    value = resolved.value.to_python() if hasattr(resolved.value, "kind") else resolved.value
    arguments[argument.name] = Value(argument.name, value, f"{argument.name}= from {resolved.origin}",
                                     resolved.span, argument.name)
    unknown.discard(argument.name)


def _words(resolver) -> list[tuple[str, object]]:
    return [(text, span) for text, span in resolver.launch.args]


def _cli_arguments(resolver, arguments, unknown) -> None:
    """`fit --config a.yaml --trainer.devices 2 -c b.yaml`: each in order."""
    words = _words(resolver)
    i = 0
    while i < len(words):
        span = words[i][1]
        name, value, step = _option(words, i)
        if name in ("--config", "-c"):
            _config_file(resolver, value, arguments, unknown)
        elif name == "--trainer":
            _trainer_file(resolver, value, resolver.launch_file.parent, arguments, unknown)
        elif name is not None and name.startswith("--trainer."):
            _flag(name[len("--trainer."):], name, value, span, resolver, arguments, unknown)
        i += step


def _flag_arguments(resolver, arguments, unknown, prefix: str) -> None:
    words = _words(resolver)
    i = 0
    while i < len(words):
        name, value, step = _option(words, i)
        if name is not None and name.startswith(prefix):
            _flag(name[len(prefix):], name, value, words[i][1], resolver, arguments, unknown)
        i += step


def _option(words, i) -> tuple[str | None, str | None, int]:
    text = words[i][0]
    if not text.startswith("-"):
        return None, None, 1
    if "=" in text:
        name, value = text.split("=", 1)
        return name, value, 1
    if i + 1 < len(words) and not words[i + 1][0].startswith("--"):
        return text, words[i + 1][0], 2
    return text, None, 1


def _flag(key: str, written: str, value: str | None, span, resolver, arguments, unknown) -> None:
    if key not in pl.ARGUMENTS:
        return
    if value is None or "$" in value:
        unknown.add(key)
        arguments.pop(key, None)
        return
    origin = f"{written} on the launch in {resolver.display(resolver.launch_file)}"
    arguments[key] = Value(key, _scalar(value), origin, span, key)
    unknown.discard(key)


def _scalar(text: str):
    text = text.strip().strip("'\"")
    if text.lstrip("-").isdigit():
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        items = [part.strip() for part in text[1:-1].split(",") if part.strip()]
        if all(part.lstrip("-").isdigit() for part in items):
            return [int(part) for part in items]
    return text


def _config_file(resolver, written: str | None, arguments, unknown) -> None:
    from cfgfix.project import _resolve

    path = _resolve(written, resolver.launch_file, resolver.project.root) if written and "$" not in written else None
    doc = resolver.project.read(path) if path is not None else None
    if doc is None or doc.root is None or doc.root.kind != "mapping":
        unknown.update(pl.ARGUMENTS)  # a config the launch computes, or one that is missing
        for key in pl.ARGUMENTS:
            arguments.pop(key, None)
        return
    resolver.setup.files.setdefault("lightning config", path)
    trainer = doc.root.get("trainer")
    if trainer is None:
        return
    if trainer.kind == "scalar" and isinstance(trainer.value, str):
        _trainer_file(resolver, trainer.value, path.parent, arguments, unknown)
    elif trainer.kind == "mapping":
        _trainer_block(resolver, doc, trainer, path, arguments, unknown)


def _trainer_file(resolver, written: str | None, folder, arguments, unknown) -> None:
    """`trainer: trainer.yaml` in a config (jsonargparse: relative to that config's folder)."""
    if not written or "$" in written:
        unknown.update(pl.ARGUMENTS)
        return
    path = (folder / written).resolve() if not written.startswith("/") else None
    doc = resolver.project.read(path) if path is not None and path.is_file() else None
    if doc is None or doc.root is None or doc.root.kind != "mapping":
        unknown.update(pl.ARGUMENTS)
        return
    resolver.setup.files.setdefault("lightning trainer config", path)
    _trainer_block(resolver, doc, doc.root, path, arguments, unknown)


def _trainer_block(resolver, doc, block, path, arguments, unknown) -> None:
    name = resolver.display(path)
    for key in pl.ARGUMENTS:
        node = block.get(key)
        if node is None:
            continue
        value = node.to_python()
        if isinstance(value, dict) and "class_path" in value:  # strategy: {class_path, init_args}
            value = {"class": str(value["class_path"]).rsplit(".", 1)[-1], **(value.get("init_args") or {})}
        arguments[key] = Value(key, value, f"trainer.{key} in {name}", doc.span(node), key)
        unknown.discard(key)


def _settings(arguments: dict[str, Value], unknown: set, spread: bool) -> dict[str, Value]:
    found: dict[str, Value] = {}
    get = arguments.get
    strategy = get("strategy")
    kind = _strategy_kind(strategy.value) if strategy is not None else None
    # processes: devices (or 1.x gpus) x num_nodes, unless one process drives every GPU
    devices = get("devices") or get("gpus")
    nodes = get("num_nodes")
    count = pl.device_count(devices.value) if devices is not None else None
    node_count = nodes.value if nodes is not None and isinstance(nodes.value, int) and nodes.value > 0 else (
        1 if nodes is None and "num_nodes" not in unknown and not spread else None)
    if count is not None and node_count is not None and kind not in pl.SINGLE_PROCESS_STRATEGIES \
            and "strategy" not in unknown:
        how = f"{devices.origin}" + (f" x {nodes.origin}" if nodes is not None else "")
        found["world_size"] = Value("world_size", count * node_count, f"{how} (Lightning starts the processes)",
                                    devices.span, devices.name)
    precision = get("precision")
    if precision is not None:
        unified = pl.unified_precision(precision.value)
        origin, span = precision.origin, precision.span
    elif "precision" not in unknown and not spread:
        unified, origin, span = pl.DEFAULT_PRECISION, "the Lightning Trainer's default precision 32-true", None
    else:
        unified = None
    if unified is not None:
        autocast, converted = pl.PRECISIONS[unified]
        found["mixed_precision"] = Value("mixed_precision", autocast, f"{origin} ({unified})", span, "precision")
        if converted is not None:
            found["weights_cast"] = Value("weights", converted, f"{origin} ({unified}: the module converted)", span,
                                          "precision")
        found["lightning_precision"] = Value("lightning_precision", unified, origin, span, "precision")
    accumulate = get("accumulate_grad_batches")
    if accumulate is not None and isinstance(accumulate.value, int) and not isinstance(accumulate.value, bool):
        found["grad_accum"] = accumulate
    elif accumulate is None and "accumulate_grad_batches" not in unknown and not spread:
        found["grad_accum"] = Value("grad_accum", 1, "the Lightning Trainer's default accumulate_grad_batches 1")
    if kind == "fsdp":
        sharding = strategy.value.get("sharding_strategy", "FULL_SHARD") if isinstance(strategy.value, dict) else "FULL_SHARD"
        mode = pl.FSDP_SHARDING.get(str(sharding).upper())
        if mode is not None:
            found["fsdp"] = Value("fsdp", mode, strategy.origin, strategy.span, "strategy")
    if kind is not None:
        found["strategy"] = Value("strategy", kind, strategy.origin, strategy.span, "strategy")
    return found


def _strategy_kind(value) -> str | None:
    if isinstance(value, str):
        name = value.strip().lower()
        if name in pl.DEEPSPEED_STRATEGIES:
            return "deepspeed"
        if name in pl.FSDP_STRATEGIES:
            return "fsdp"
        return name
    if isinstance(value, dict):
        return {"DeepSpeedStrategy": "deepspeed", "FSDPStrategy": "fsdp", "DDPStrategy": "ddp",
                "ModelParallelStrategy": "model-parallel"}.get(value.get("class"))
    return None


def _deepspeed(setup, arguments: dict[str, Value], found: dict[str, Value]) -> None:
    """A DeepSpeed strategy: the ZeRO stage, offload and 16-bit engine Lightning writes into
    the DeepSpeed config it builds (a `config=` JSON of the strategy is read as the
    launch's DeepSpeed config instead)."""
    strategy = arguments.get("strategy")
    if strategy is None or found.get("strategy") is None or found["strategy"].value != "deepspeed":
        return
    value = strategy.value
    if isinstance(value, str):
        stage, offload_optimizer, offload_params = pl.DEEPSPEED_STRATEGIES[value.strip().lower()]
    else:
        if value.get("config") is not None:
            return
        stage = value.get("stage", pl.DEEPSPEED_DEFAULT_STAGE)
        offload_optimizer = value.get("offload_optimizer", False) is True
        offload_params = value.get("offload_parameters", False) is True
    source = setup.sources.setdefault("deepspeed config", {})
    origin = f"{strategy.origin} (the DeepSpeed config Lightning builds)"
    source.setdefault("zero_stage", Value("zero_stage", stage, origin, strategy.span, "strategy"))
    source.setdefault("offload_optimizer", Value("offload_optimizer", offload_optimizer, origin, strategy.span, "strategy"))
    source.setdefault("offload_param", Value("offload_param", offload_params, origin, strategy.span, "strategy"))
    precision = found.get("lightning_precision")
    half = pl.DEEPSPEED_HALF.get(precision.value) if precision is not None else None
    if half is not None and "bf16" not in source and "fp16" not in source:
        source[half] = Value(half, True, f"{precision.origin} with {strategy.origin}", precision.span, "precision")
    found.pop("weights_cast", None)  # DeepSpeed's engine holds the 16-bit weights
