"""Questions the CFX5xx rules ask of a DeepSpeed config and of the project around it: its
`zero_optimization` block and stage, the DeepSpeed configs of this run that launches use,
and the training scripts those launches run."""

from __future__ import annotations


def zero_block(root):
    zero = root.get("zero_optimization")
    return zero if zero is not None and zero.kind == "mapping" else None


def zero_stage(zero) -> int | None:
    """The ZeRO stage as written; None when "auto" or not an integer (stay silent)."""
    stage = zero.get("stage")
    if stage is None:
        return 0  # DeepSpeed's default
    value = stage.value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def zero_names(key: str, deprecated: bool = True) -> tuple[str, ...]:
    """Every name under which DeepSpeed sets the ZeRO option `key` names: its alias, its field
    name and (with `deprecated`) the deprecated fields that set it [deepspeed_keys.ZERO_ALIASES]."""
    from cfgfix.analysis.deepspeed_keys import ZERO_DEPRECATED, zero_option, zero_spellings

    names = zero_spellings(key)
    if deprecated:
        option = zero_option(key)
        names += tuple(old for old, new in ZERO_DEPRECATED.items() if new == option)
    return names


def zero_entries(zero, key: str, deprecated: bool = True) -> list:
    """The (key, value) entries of `zero_optimization` that set the option `key` names, in
    zero_names order: more than one is a config DeepSpeed refuses (CFX507, CFX504)."""
    return [found for name in zero_names(key, deprecated) if (found := zero.entry(name)) is not None]


def zero_entry(zero, key: str, deprecated: bool = True):
    """The (key, value) entry that sets the ZeRO option `key` names, under whichever name the
    config writes it (`stage3_gather_16bit_weights_on_model_save`, its field name
    `gather_16bit_weights_on_model_save`, or the deprecated `stage3_gather_fp16_...`); None."""
    found = zero_entries(zero, key, deprecated)
    return found[0] if found else None


def offload_device(zero, block: str):
    """(device, value node) for `offload_optimizer` / `offload_param`: the block's `device`, or
    the deprecated boolean (`cpu_offload`, `cpu_offload_param`) DeepSpeed maps to device "cpu"
    when true; (None, None) when the config sets neither, (None, node) when the value is
    something else ("auto", no device)."""
    for key, value in zero_entries(zero, block):
        if key.value == block:
            if value.kind != "mapping":
                return None, value
            device = value.get("device")
            if device is None or not isinstance(device.value, str):
                return None, value
            return device.value, device
        on = value.truthy()
        return ({True: "cpu", False: "none"}.get(on), value)
    return None, None


def script_uses(project, uses):
    """(use, source, facts) for each use whose training script is a readable Python file."""
    from cfgfix.analysis.training_script import script_facts

    for use in uses:
        if use.script is None:
            continue
        found = script_facts(project, use.script)
        if found is not None:
            yield use, found[0], found[1]


def checked_docs(project):
    """(path, uses, document) for each DeepSpeed config of this run that launches use."""
    for path, uses in project.deepspeed_uses().items():
        if path not in project.displays:
            continue  # not a file of this run: reported when it is checked
        doc = project.read(path)
        if doc is not None:
            yield path, uses, doc


def ast_name(call) -> str:
    """`trainer.save_model(...)` as written, arguments elided."""
    import ast

    return ast.unparse(call.func) + "(...)"
