"""CFX503 offload-without-effect."""

from __future__ import annotations

from cfgfix.analysis.deepspeed_config import zero_block, zero_entries, zero_stage
from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class OffloadWithoutEffect(DeepSpeedRule):
    """## What it does
    Flags `offload_param` under ZeRO stage 0, 1 or 2, and `offload_optimizer` under stage 0,
    when the offload device is not `"none"` (also as the deprecated `cpu_offload_param: true` /
    `cpu_offload: true`, which DeepSpeed maps onto those blocks); in a DeepSpeed config, and in an accelerate
    config's own `deepspeed_config:` keys (`zero_stage: 2` with `offload_param_device: cpu`),
    which accelerate's DeepSpeedPlugin writes into the same `zero_optimization` block.

    ## Why is this bad?
    DeepSpeed accepts both silently and does nothing with them: parameter offload is
    implemented by ZeRO-3 only ("Valid only with stage 3"), and optimizer offload needs
    ZeRO to be on. The run keeps the parameters (or optimizer states) on the GPU while the
    config says they were moved to CPU, so memory estimates made from the config are wrong.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    ```
    or remove `offload_param` and keep stage 2 with `offload_optimizer`.

    ## Fix safety
    No fix: moving to stage 3 changes how the model is sharded and saved; removing the
    block changes what the author believed was offloaded.

    ## References
    - facts.md C12; DeepSpeed `runtime/zero/config.py` and `offload_config.py` docstrings
    """

    code = "CFX503"
    name = "offload-without-effect"
    severity = Severity.WARNING
    triggers = ((DeepSpeedRule.triggers[0] + (b"zero_stage",)), (b"offload_param", b"offload_optimizer", b"cpu_offload"))

    def check(self, ctx):
        if "deepspeed" in ctx.kinds:
            return self.check_config(ctx, ctx.root)
        if "accelerate" in ctx.kinds:
            return self._accelerate(ctx, ctx.root)
        return ()

    def _accelerate(self, ctx, root):
        """accelerate's own `deepspeed_config:` keys (`zero_stage: 2`, `offload_param_device:
        cpu`): its DeepSpeedPlugin writes them into the same zero_optimization block."""
        block = root.get("deepspeed_config")
        if block is None or block.kind != "mapping" or block.get("deepspeed_config_file") is not None:
            return  # with a DeepSpeed file these keys are refused (CFX403); the file is checked itself
        kind = root.get("distributed_type")
        stage_node = block.get("zero_stage")
        if (kind is not None and kind.value != "DEEPSPEED") or stage_node is None:
            return
        stage = stage_node.value
        if not isinstance(stage, int) or isinstance(stage, bool):
            return
        for key, limit, why in (
            ("offload_param_device", 3, "parameter offload is implemented by ZeRO stage 3 only"),
            ("offload_optimizer_device", 1, "optimizer offload needs ZeRO stage 1, 2 or 3"),
        ):
            entry = block.entry(key)
            if entry is None or stage >= limit or entry[1].value in ("none", None):
                continue
            yield self.finding(
                ctx.span(entry[0]),
                f"{key}: {entry[1].value} under zero_stage {stage} has no effect: {why}; accelerate passes it to "
                f"DeepSpeed, which accepts it silently, so nothing is offloaded",
                related=[Related(ctx.span(stage_node), f"zero_stage {stage} is set here")],
            )

    def check_config(self, ctx, root):
        zero = zero_block(root)
        if zero is None or zero.get("stage") is None:
            return  # no explicit stage: leave it to the reader
        stage = zero_stage(zero)
        if stage is None:
            return
        for block, limit, why in (
            ("offload_param", 3, "parameter offload is implemented by ZeRO stage 3 only"),
            ("offload_optimizer", 1, "optimizer offload needs ZeRO stage 1, 2 or 3"),
        ):
            if stage >= limit:
                continue
            # the block, or the deprecated boolean DeepSpeed maps onto it (cpu_offload_param: true)
            for key, value in zero_entries(zero, block):
                if key.value == block:
                    if not _offloads(value):
                        continue
                    what = block
                elif value.truthy() is True:
                    what = f"{key.value}: true (deprecated: DeepSpeed maps it to {block} on cpu)"
                else:
                    continue
                yield self.finding(
                    ctx.span(key),
                    f"{what} under ZeRO stage {stage} has no effect: {why}, and DeepSpeed accepts "
                    f"it silently, so nothing is offloaded",
                    related=[Related(ctx.span(zero.get("stage")), f"stage {stage} is set here")],
                )

    _ACC = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
            "  gradient_accumulation_steps: 1\n  offload_optimizer_device: cpu\n  zero_stage: {stage}\n"
            "  offload_param_device: {param}\nnum_processes: 2\n")
    VALID = [
        Example('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "train_batch_size": 8}',
                "stage 3 offloads parameters", path=DS),
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_batch_size": 8}',
                "optimizer offload under stage 2 works", path=DS),
        Example('{"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}, "train_batch_size": 8}',
                "device none: nothing is offloaded, nothing promised", path=DS),
        Example('{"zero_optimization": {"stage": "auto", "offload_param": {"device": "cpu"}}, "train_batch_size": 8}',
                "stage not known from the file", path=DS),
        Example('{"zero_optimization": {"stage": 2, "cpu_offload": true}, "train_batch_size": 8}',
                "the deprecated cpu_offload under stage 2: optimizer offload works (CFX504 reports the name)",
                path=DS),
        Example('{"zero_optimization": {"stage": 2, "cpu_offload_param": false}, "train_batch_size": 8}',
                "cpu_offload_param false: nothing offloaded, nothing promised", path=DS),
        Example(_ACC.format(stage=3, param="cpu"), "accelerate's inline parameter offload under ZeRO-3",
                path="accelerate.yaml"),
        Example(_ACC.format(stage=2, param="none"), "accelerate's default offload_param_device: none",
                path="accelerate.yaml"),
    ]
    INVALID = [
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "offload_param": {"device": "cpu"}\n  },\n'
                '  "train_batch_size": 8\n}\n', "parameter offload under stage 2", path=DS, line=4),
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "cpu_offload_param": true\n  },\n'
                '  "train_batch_size": 8\n}\n', "the deprecated cpu_offload_param under stage 2", path=DS, line=4),
        Example("zero_optimization:\n  stage: 0\n  offload_optimizer:\n    device: cpu\ntrain_batch_size: 8\n",
                "optimizer offload with ZeRO off", path="ds_config.yaml", line=3),
        Example(_ACC.format(stage=2, param="cpu"), "accelerate's inline parameter offload under ZeRO-2",
                path="accelerate.yaml", line=7),
    ]


def _offloads(block) -> bool:
    if block.kind != "mapping":
        return False
    device = block.get("device")
    return device is None or device.value not in ("none", None)
