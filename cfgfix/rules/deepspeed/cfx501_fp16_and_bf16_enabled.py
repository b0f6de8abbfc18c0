"""CFX501 fp16-and-bf16-enabled."""

from __future__ import annotations

from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class Fp16AndBf16Enabled(ProjectRule):
    """## What it does
    Flags a DeepSpeed config whose `fp16` and `bf16` blocks are both `"enabled": true`, or
    where one is `true` and the other `"auto"` and a launch that uses the file asks for the
    other format (`--bf16 True` to the HF Trainer, accelerate's `mixed_precision: bf16`), so
    that the integration fills `"auto"` with `true`.

    ## Why is this bad?
    DeepSpeed asserts at start-up ("bfloat16 and fp16 modes cannot be simultaneously
    enabled"): one run can train in one 16-bit format only. An `"auto"` block is flagged only
    when a launch's own precision is known: with no launch, or a launch that leaves the
    format open, `"auto"` may well be filled with `false`.

    ## Example
    ```json
    {"fp16": {"enabled": true}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": false}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}
    ```
    (bf16 on Ampere and newer GPUs; fp16 with its loss scaling on older ones.)

    ## Fix safety
    No fix: which format to keep depends on the GPU and on how the model was trained.

    ## References
    - facts.md C12; DeepSpeed `runtime/config.py` (the bf16/fp16 assertion)
    """

    code = "CFX501"
    name = "fp16-and-bf16-enabled"
    severity = Severity.ERROR
    triggers = DeepSpeedRule.triggers + ((b"bf16", b"bfloat16"), (b"fp16",))

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        autos: dict = {}  # path -> (launch precision Value, its launch)
        for setup in training_setups(project):
            path = setup.files.get("deepspeed")
            mixed = setup.values.get("mixed_precision")
            if path is not None and mixed is not None and mixed.value in ("bf16", "fp16"):
                autos.setdefault(path, []).append((mixed, setup.launch))
        for path, kinds in project.configs.items():
            if "deepspeed" not in kinds or path not in project.displays:
                continue
            doc = project.read(path)
            if doc is None:
                continue
            root = doc.root
            fp16 = _enabled(root, "fp16")
            bf16 = _enabled(root, "bf16") or _enabled(root, "bfloat16")
            if not (fp16 and bf16):
                continue
            if fp16.truthy() is True and bf16.truthy() is True:
                yield self.finding(
                    doc.span(fp16),
                    "fp16.enabled and bf16.enabled are both true: DeepSpeed asserts 'bfloat16 and fp16 "
                    "modes cannot be simultaneously enabled'; keep one (bf16 on Ampere or newer)",
                    related=[Related(doc.span(bf16), "bf16 is enabled here")],
                )
                continue
            for on, auto, auto_name in ((fp16, bf16, "bf16"), (bf16, fp16, "fp16")):
                if on.truthy() is not True or auto.value != "auto":
                    continue
                launches = autos.get(path, [])
                if not launches or any(mixed.value != auto_name for mixed, _ in launches):
                    continue  # "auto" is filled with false by some launch, or nothing says
                mixed, launch = launches[0]
                yield self.finding(
                    doc.span(on),
                    f"{'fp16' if auto_name == 'bf16' else 'bf16'}.enabled is true while {auto_name}.enabled is "
                    f"\"auto\" and the launch asks for {auto_name} ({mixed.origin}), so both end up enabled: "
                    f"DeepSpeed asserts 'bfloat16 and fp16 modes cannot be simultaneously enabled'",
                    related=[Related(doc.span(auto), f"{auto_name} \"auto\" is filled from the launch")]
                    + ([Related(mixed.span, mixed.origin)] if mixed.span else []) + [Related(launch.span, "launched here")],
                )

    VALID = [
        Example('{"fp16": {"enabled": false}, "bf16": {"enabled": true}, "train_batch_size": 8}',
                "only bf16 enabled", path=DS),
        Example('{"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}, "train_batch_size": "auto"}',
                "\"auto\" under HF/accelerate: filled from the launch, never both", path=DS),
        Example('{"fp16": {"enabled": true}, "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}',
                "bf16 \"auto\" and no launch: not known from this file", path=DS),
        Example('{"fp16": {"enabled": true}, "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}',
                "bf16 \"auto\" and a launch that asks for fp16", path=DS,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds_config.json --fp16 True\n"}),
        Example('{"fp16": {"enabled": true}, "bf16": {"loss_scale": 0}, "train_batch_size": 8}',
                "a bf16 block without enabled is off", path=DS),
    ]
    INVALID = [
        Example('{\n  "fp16": {"enabled": true},\n  "bf16": {"enabled": true},\n  "train_batch_size": 8\n}\n',
                "both enabled", path=DS, line=2),
        Example("bfloat16:\n  enabled: true\nfp16:\n  enabled: true\ntrain_micro_batch_size_per_gpu: 1\n",
                "the legacy bfloat16 name, in a YAML DeepSpeed config", path="ds_config.yaml", line=4),
        Example('{\n  "fp16": {"enabled": true},\n  "bf16": {"enabled": "auto"},\n  "zero_optimization": {"stage": 2}\n}\n',
                "bf16 \"auto\" filled with true from the launch's --bf16", path=DS, line=2,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds_config.json --bf16 True\n"}),
    ]


def _enabled(root, block: str):
    node = root.get(block)
    return node.get("enabled") if node is not None and node.kind == "mapping" else None
