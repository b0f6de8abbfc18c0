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
