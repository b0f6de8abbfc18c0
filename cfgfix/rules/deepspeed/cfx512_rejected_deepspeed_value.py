"""CFX512 rejected-deepspeed-value."""

from __future__ import annotations

from cfgfix.analysis import deepspeed_validation as checks
from cfgfix.analysis.deepspeed_fields import RELEASES
from cfgfix.analysis.deepspeed_config import zero_block, zero_stage
from cfgfix.core import Severity
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class RejectedDeepSpeedValue(DeepSpeedRule):
    """## What it does
    Flags a value DeepSpeed's own config validation refuses at start: an `fp16.loss_scale`
    that is not a finite number >= 0 (`true`, `-1`, `"abc"`); an `fp16.loss_scale_window`
    or `fp16.min_loss_scale` that is not an integer (`true`, `1.5`, `"abc"`), or is 0 or
    negative while fp16 runs with dynamic loss scaling; a `gradient_allreduce_op` other
    than `"mean"` or `"sum"`, and `"sum"` under ZeRO-3, ZenFlow or DeepCompile. Each check
    counts from the release that began to make it (see Versions).

    ## Why is this bad?
    `deepspeed.initialize` raises (`ValueError: fp16.loss_scale_window must be > 0 when
    dynamic loss scaling is enabled (loss_scale=0)`) before the first step; a window of 0
    used to pass and then divide by zero at the first overflow check.

    ## Example
    ```json
    {"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 0}, "train_batch_size": 8}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000}, "train_batch_size": 8}
    ```

    ## Fix safety
    No fix: which value was meant is the author's call.

    ## Versions
    `fp16.loss_scale` from DeepSpeed 0.18.8, `loss_scale_window` / `min_loss_scale` from
    0.19.3, `gradient_allreduce_op` from 0.19.6 (older releases do not read it). Speaks when
    the project's pinned or installed DeepSpeed is at least that release; silent on a pin
    that admits an older one. With nothing pinned or installed, the current release
    (0.19.8) is assumed and the message says so, unless the project pins torch below 2.0
    (0.19.3 and later require `torch>=2.0.0`: then DeepSpeed is older than 0.19.3).

    ## References
    - DeepSpeed `runtime/precision_config.py` (`DeepSpeedFP16Config` validators, PRs #7889
      and #8050), `runtime/config.py` (`get_gradient_allreduce_op`, `_do_error_check`, PR
      #8232); facts.md C12
    """

    code = "CFX512"
    name = "rejected-deepspeed-value"
    severity = Severity.ERROR
    triggers = DeepSpeedRule.triggers + ((b"loss_scale", b"gradient_allreduce_op", b"zero_optimization", b"fp16", b"bf16",
                                           b"bfloat16"),)

    def check_config(self, ctx, root):
        deepspeed = ctx.versions.resolve("deepspeed")
        if deepspeed.at_least(checks.LOSS_SCALE_SINCE) is not True:
            return
        problems = list(self._problems(root))
        seen = {id(node) for node, _, _ in problems}
        problems += [(node, message, checks.MODELS_SINCE) for node, message in checks.field_problems(root)
                     if id(node) not in seen]
        problems += list(self._master_weights(root))
        for node, message, since in problems:
            if deepspeed.at_least(since) is not True:
                continue
            if since == checks.MODELS_SINCE:
                releases = f"{RELEASES[0]}-{RELEASES[-1]}"
                yield self.finding(ctx.span(node), f"{message}: DeepSpeed's config validation refuses it at start "
                                                   f"(its models read from releases {releases}); this project uses "
                                                   f"{deepspeed.describe()}")
            else:
                yield self.finding(ctx.span(node), f"{message}: DeepSpeed {since} and newer refuse it at start; "
                                                   f"this project uses {deepspeed.describe()}")

    def _problems(self, root):
        fp16 = root.get("fp16")
        if fp16 is not None and fp16.kind == "mapping":
            yield from self._fp16(fp16)
        entry = root.entry("gradient_allreduce_op")
        if entry is not None and entry[1].kind == "scalar":
            zero = zero_block(root)
            stage = zero_stage(zero) if zero is not None else 0
            zenflow_block = zero.get("zenflow") if zero is not None else None
            # DeepSpeed tests `zero_config.zenflow is not None`: any block, `{}` too, turns ZenFlow on
            zenflow = zenflow_block is not None and not (zenflow_block.kind == "scalar" and zenflow_block.value is None)
            compile_block = root.get("compile")
            deepcompile = compile_block is not None and compile_block.kind == "mapping" \
                and compile_block.get("deepcompile") is not None and compile_block.get("deepcompile").truthy() is True
            why = checks.allreduce_op_problem(entry[1].value, stage, zenflow, deepcompile)
            if why:
                yield entry[1], f"gradient_allreduce_op {why}", checks.ALLREDUCE_OP_SINCE

    def _master_weights(self, root):
        """`DeepSpeedConfig._do_error_check`: 16-bit master weights and bf16 optimizer states
        need ZeRO stage 1-3, and bf16 optimizer states need bf16 master weights."""
        zero = zero_block(root)
        stage = zero_stage(zero) if zero is not None else 0
        needs = [("fp16", "fp16_master_weights_and_grads"), ("bf16", "bf16_master_weights_and_grads"),
                 ("bf16", "bf16_optimizer_states")]
        for block_name, key in needs:
            block = root.get(block_name) or (root.get("bfloat16") if block_name == "bf16" else None)
            entry = block.entry(key) if block is not None and block.kind == "mapping" else None
            if entry is None or entry[1].truthy() is not True or entry[1].value == "auto":
                continue
            if stage in (1, 2, 3):
                if key == "bf16_optimizer_states":
                    master = block.get("bf16_master_weights_and_grads")
                    if master is None or master.truthy() is not True:
                        yield entry[1], f"{block_name}.{key} needs bf16_master_weights_and_grads on", checks.MODELS_SINCE
                continue
            if stage is not None:
                yield entry[1], (f"{block_name}.{key} is only supported with ZeRO stage 1, 2 or 3 "
                                 f"(this config runs stage {stage})"), checks.MODELS_SINCE

    def _fp16(self, fp16):
        scale = fp16.entry("loss_scale")
        scale_value = 0.0  # DeepSpeed's default: dynamic loss scaling
        if scale is not None:
            why = checks.loss_scale_problem(scale[1].value) if scale[1].kind == "scalar" else "must be a number"
            if why:
                yield scale[1], f"fp16.loss_scale {why}", checks.LOSS_SCALE_SINCE
                scale_value = None  # DeepSpeed stops there; the positivity checks below cannot be told
            elif scale[1].value != "auto":
                scale_value = float(scale[1].value)
        enabled = fp16.get("enabled")
        dynamic = enabled is not None and enabled.value is True and scale_value == 0
        for name in ("loss_scale_window", "min_loss_scale"):
            entry = fp16.entry(name)
            if entry is None:
                continue
            value = entry[1].value if entry[1].kind == "scalar" else entry[1]
            why = checks.scale_param_type_problem(value) if entry[1].kind == "scalar" else "must be an integer"
            if why:
                yield entry[1], f"fp16.{name} {why}", checks.SCALE_PARAMS_SINCE
            elif dynamic and (checks.scale_param_value(value) or 0) <= 0 and value != "auto":
                yield entry[1], (f"fp16.{name} must be > 0 when fp16 runs with dynamic loss scaling "
                                 f"(loss_scale 0)"), checks.SCALE_PARAMS_SINCE

    _REQ = {"requirements.txt": "deepspeed==0.19.8\n"}
    VALID = [
        Example('{"zero_optimization": {"stage": "2", "overlap_comm": "yes", "reduce_bucket_size": 5e8,'
                ' "offload_optimizer": {"device": "cpu", "ratio": 1}, "leaf_module": {"classes": "MoEBlock"}},'
                ' "bf16": {"enabled": "true"}}', "values pydantic coerces: \"2\", \"yes\", 5e8, 1, a string list",
                path=DS, files=_REQ),
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": null, "reduce_bucket_size": "auto"}}',
                "null for an optional block, \"auto\" dropped", path=DS, files=_REQ),
        Example('{"zero_optimization": true}', "the legacy boolean form", path=DS, files=_REQ),
        Example('{"zero_optimization": {"stage": 2, "offload_param": {"device": "gpu"}}}',
                "a pin that admits releases whose models were not read", path=DS,
                files={"requirements.txt": "deepspeed>=0.14\n"}),
        Example('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true,'
                ' "bf16_optimizer_states": true}}', "bf16 master weights and states under ZeRO-2", path=DS, files=_REQ),
        Example('{"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "min_loss_scale": 1},'
                ' "train_batch_size": 8}', "the defaults", path=DS, files=_REQ),
        Example('{"fp16": {"enabled": true, "loss_scale": 128, "loss_scale_window": 0}, "train_batch_size": 8}',
                "a static loss scale: the window is never used, and DeepSpeed does not check it", path=DS, files=_REQ),
        Example('{"fp16": {"enabled": false, "loss_scale_window": 0}, "train_batch_size": 8}',
                "fp16 off: the positivity check does not run", path=DS, files=_REQ),
        Example('{"fp16": {"enabled": "auto", "loss_scale": "auto", "loss_scale_window": "auto"},'
                ' "train_batch_size": "auto"}', "\"auto\" values are dropped: the defaults hold", path=DS, files=_REQ),
        Example('{"fp16": {"enabled": true, "loss_scale_window": 0}, "train_batch_size": 8}',
                "0.19.2 did not check the window yet", path=DS, files={"requirements.txt": "deepspeed==0.19.2\n"}),
        Example('{"gradient_allreduce_op": "SUM", "zero_optimization": {"stage": 2}}',
                "sum (any case) under ZeRO-2", path=DS, files=_REQ),
        Example('{"gradient_allreduce_op": "max", "zero_optimization": {"stage": 2}}',
                "0.19.5 does not read the key", path=DS, files={"requirements.txt": "deepspeed==0.19.5\n"}),
        Example('{"fp16": {"enabled": true, "loss_scale": -1}, "train_batch_size": 8}',
                "a pin that admits releases before the check", path=DS, files={"requirements.txt": "deepspeed>=0.17\n"}),
        Example('{"fp16": {"enabled": true, "loss_scale": "1e3", "min_loss_scale": "2"}, "train_batch_size": 8}',
                "numeric strings pass float() and int()", path=DS, files=_REQ),
    ]
    INVALID = [
        Example('{\n  "zero_optimization": {\n    "stage": 3,\n    "offload_param": {"device": "gpu"}\n  }\n}\n',
                "an offload device DeepSpeed does not have (none, cpu, nvme)", path=DS, line=4, files=_REQ),
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "offload_optimizer": "cpu"\n  }\n}\n',
                "a block written as a string", path=DS, line=4, files=_REQ),
        Example('{\n  "zero_optimization": {"stage": 4}\n}\n', "ZeRO has stages 0 to 3", path=DS, line=2, files=_REQ),
        Example('{\n  "zero_optimization": {"stage": 2,\n    "reduce_bucket_size": 0}\n}\n',
                "a bucket size DeepSpeed requires > 0", path=DS, line=3, files=_REQ),
        Example('{\n  "zero_optimization": {"stage": 2,\n    "overlap_comm": "sometimes"}\n}\n',
                "not a boolean pydantic reads", path=DS, line=3, files=_REQ),
        Example('{\n  "train_batch_size": 8,\n  "bf16": {"enabled": true,\n    "bf16_master_weights_and_grads": true}\n}\n',
                "bf16 master weights without ZeRO (stage 0)", path=DS, line=4, files=_REQ),
        Example('{\n  "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.2}},\n'
                '  "gradient_allreduce_op": "sum"\n}\n', "sum with ZenFlow on", path=DS, line=3, files=_REQ),
        Example('{\n  "fp16": {\n    "enabled": true,\n    "loss_scale": 0,\n    "loss_scale_window": 0\n  },\n'
                '  "train_batch_size": 8\n}\n', "window 0 with dynamic scaling", path=DS, line=5, files=_REQ),
        Example('{\n  "fp16": {"enabled": true,\n    "min_loss_scale": -1},\n  "train_batch_size": 8\n}\n',
                "a negative floor (loss_scale defaults to 0)", path=DS, line=3, files=_REQ),
        Example('{\n  "fp16": {"enabled": false,\n    "loss_scale": true},\n  "train_batch_size": 8\n}\n',
                "a bool loss scale is refused even with fp16 off", path=DS, line=3, files=_REQ),
        Example('{\n  "fp16": {"enabled": true,\n    "loss_scale": -1},\n  "train_batch_size": 8\n}\n',
                "a negative loss scale", path=DS, line=3, files={"requirements.txt": "deepspeed==0.18.8\n"}),
        Example('{\n  "fp16": {"enabled": true, "loss_scale_window": "abc"},\n  "train_batch_size": 8\n}\n',
                "not an integer", path=DS, line=2, files=_REQ),
        Example('{\n  "fp16": {"enabled": false, "min_loss_scale": 1.5},\n  "train_batch_size": 8\n}\n',
                "a fraction", path=DS, line=2, files=_REQ),
        Example('{\n  "gradient_allreduce_op": "max",\n  "zero_optimization": {"stage": 1}\n}\n',
                "an op DeepSpeed does not know", path=DS, line=2, files=_REQ),
        Example('{\n  "gradient_allreduce_op": "sum",\n  "zero_optimization": {"stage": 3}\n}\n',
                "sum under ZeRO-3", path=DS, line=2),
    ]
