"""CFX604 accelerator-precision-vs-deepspeed."""

from __future__ import annotations

import ast

from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.decisions import Decisions, also, listed


@register
class AcceleratorPrecisionVsDeepSpeed(ProjectRule):
    """## What it does
    Flags a `mixed_precision` of `fp16` or `bf16` that reaches `Accelerator(mixed_precision=...)`
    from a training config, the script's flags or its code, in an `accelerate launch` whose
    DeepSpeed config (named by the accelerate config's `deepspeed_config_file`) enables the
    other format with `"enabled": true`. The script must build the `Accelerator` with a
    `mixed_precision=` argument; a value in the accelerate config itself is CFX402's, and an
    HF Trainer launch is CFX511's.

    ## Why is this bad?
    accelerate checks the pair when the `Accelerator` is built and stops:
    "`--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config
    file." (`DeepSpeedPlugin.set_mixed_precision`). The run dies before the first step, and
    only on the DeepSpeed launch: a plain launch that reads the same training config works,
    which is how the pair usually comes about (one config edited for one launch).

    ## Example
    ```yaml
    # train.yaml, read by train.py: Accelerator(mixed_precision=cfg["mixed_precision"]);
    # launched with accelerate launch --config_file accelerate_ds.yaml, whose
    # deepspeed_config_file ds.json says "fp16": {"enabled": true}
    mixed_precision: bf16
    ```

    ## Use instead
    ```yaml
    mixed_precision: fp16   # or bf16 in both files, or "enabled": "auto" in ds.json
    ```

    ## Fix safety
    No automatic fix: which file is right depends on the hardware and on the other launches
    that read the same training config.

    ## References
    - accelerate `utils/dataclasses.py` (`DeepSpeedPlugin.set_mixed_precision`), called from
      `Accelerator.__init__`
    """

    code = "CFX604"
    name = "accelerator-precision-vs-deepspeed"
    severity = Severity.ERROR

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        decisions = Decisions(self)
        for setup in training_setups(project):
            if setup.launch.launcher != "accelerate" or setup.trainer or setup.script is None:
                continue
            deepspeed = setup.sources.get("deepspeed config") or {}
            enabled = {fmt for fmt in ("fp16", "bf16")
                       if deepspeed.get(fmt) is not None and deepspeed[fmt].value is True}
            if len(enabled) != 1 or not _passes_mixed_precision(project, setup.script):
                continue
            (ds_format,) = enabled
            # the places that give the Accelerator its mixed_precision (flags before configs):
            # one finding for the launch, at the first, the others related
            places = []
            for source, found in setup.sources.items():
                if source in ("deepspeed config", "accelerate config"):
                    continue  # the JSON itself; the accelerate config's own value is CFX402's
                value = found.get("mixed_precision")
                if value is None or value.span is None or value.value not in ("fp16", "bf16") or value.value == ds_format:
                    continue
                places.append(value)
            if not places:
                continue
            value, others = places[0], places[1:]
            ds_value = deepspeed[ds_format]
            related = [*also(others, f"gives {value.value}"), Related(setup.launch.span, "the DeepSpeed launch")]
            if ds_value.span is not None:
                related.insert(0, Related(ds_value.span, f"{ds_format} enabled here"))
            so_do = f" (so do {listed(others)})" if others else ""
            decisions.add(
                value.span,
                f"{value.origin} gives Accelerator(mixed_precision={value.value!r}){so_do}, but this launch's "
                f"DeepSpeed config enables {ds_format} ({ds_value.origin}): accelerate stops when the Accelerator is "
                f"built ('--mixed_precision arg cannot be set to {value.value} when {ds_format} is set in the "
                f"DeepSpeed config file'); make the two agree, or set \"enabled\": \"auto\" in the DeepSpeed config",
                related=related,
            )
        yield from decisions.findings()

    _SCRIPT = (
        "import yaml\nfrom accelerate import Accelerator\n\n"
        "cfg = yaml.safe_load(open('train.yaml'))\n"
        "accelerator = Accelerator(mixed_precision=cfg['mixed_precision'])\n"
    )
    _ACC = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
            "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n")
    _DS = '{"%s": {"enabled": %s}, "zero_optimization": {"stage": 2}}\n'
    _LAUNCH = "accelerate launch --config_file acc.yaml train.py --config train.yaml\n"
    VALID = [
        Example("mixed_precision: fp16\ngradient_accumulation_steps: 4\n", "the same format in both files", path="train.yaml",
                files={"train.py": _SCRIPT, "acc.yaml": _ACC, "ds.json": _DS % ("fp16", "true"), "run.sh": _LAUNCH}),
        Example("mixed_precision: bf16\ngradient_accumulation_steps: 4\n", "\"enabled\": \"auto\": accelerate fills it in", path="train.yaml",
                files={"train.py": _SCRIPT, "acc.yaml": _ACC, "ds.json": _DS % ("fp16", '"auto"'), "run.sh": _LAUNCH}),
        Example("mixed_precision: bf16\ngradient_accumulation_steps: 4\n", "the script never passes mixed_precision to the Accelerator", path="train.yaml",
                files={"train.py": _SCRIPT.replace("mixed_precision=cfg['mixed_precision']", ""), "acc.yaml": _ACC,
                       "ds.json": _DS % ("fp16", "true"), "run.sh": _LAUNCH}),
        Example("mixed_precision: bf16\ngradient_accumulation_steps: 4\n", "a plain launch without DeepSpeed", path="train.yaml",
                files={"train.py": _SCRIPT, "ds.json": _DS % ("fp16", "true"),
                       "run.sh": "accelerate launch --num_processes 1 train.py --config train.yaml\n"}),
    ]
    INVALID = [
        Example("mixed_precision: bf16\ngradient_accumulation_steps: 4\n", "bf16 in the training config, fp16 in the DeepSpeed JSON", path="train.yaml",
                line=1, files={"train.py": _SCRIPT, "acc.yaml": _ACC, "ds.json": _DS % ("fp16", "true"), "run.sh": _LAUNCH}),
        Example("mixed_precision: fp16\ngradient_accumulation_steps: 4\n", "one config read by a plain and a DeepSpeed launch", path="train.yaml",
                line=1, files={"train.py": _SCRIPT, "acc.yaml": _ACC, "ds.json": _DS % ("bf16", "true"),
                               "run.sh": _LAUNCH + "accelerate launch --num_processes 1 train.py --config train.yaml\n"}),
    ]


def _passes_mixed_precision(project, script) -> bool:
    """The script builds an `Accelerator(...)` with a `mixed_precision=` argument."""
    parsed = project.script(script)
    if parsed is None:
        return False
    for node in ast.walk(parsed[1]):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "Accelerator" and any(k.arg == "mixed_precision" for k in node.keywords):
                return True
    return False
