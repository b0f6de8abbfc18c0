"""CFX504 deprecated-deepspeed-key."""

from __future__ import annotations

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.analysis.deepspeed_config import zero_block
from cfgfix.core import Applicability, Fix, Severity
from cfgfix.documents.config_edits import rename_key, replace_text
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class DeprecatedDeepSpeedKey(DeepSpeedRule):
    """## What it does
    Flags deprecated DeepSpeed forms: `cpu_offload` under `zero_optimization`,
    `stage3_gather_fp16_weights_on_model_save`, and the legacy `"zero_optimization": true`.

    ## Why is this bad?
    They still work, with a deprecation warning, but they are mapped to the current forms
    behind the author's back (`cpu_offload: true` → `offload_optimizer.device: cpu`,
    `"zero_optimization": true` → stage 1), and `cpu_offload` together with
    `offload_optimizer` makes DeepSpeed assert. Writing the current form says what runs.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "cpu_offload": true}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```

    ## Fix safety
    Safe: the fix writes exactly what DeepSpeed maps the old form to. No fix when
    `cpu_offload` sits next to `offload_optimizer` (the author has to choose) or when the
    current key is already present.

    ## References
    - facts.md C12; DeepSpeed `runtime/config_utils.py` (deprecated fields) and
      `read_zero_config_deprecated`
    """

    code = "CFX504"
    name = "deprecated-deepspeed-key"
    severity = Severity.INFO
    fix_availability = "safe"
    triggers = DeepSpeedRule.triggers + ((b"cpu_offload", b"gather_fp16_weights", b"zero_optimization"),)

    def check_config(self, ctx, root):
        doc = ctx.document
        entry = root.entry("zero_optimization")
        if entry is not None and isinstance(entry[1].value, bool) and entry[1].kind == "scalar":
            stage = 1 if entry[1].value else 0
            content = '{"stage": %d}' % stage
            yield self.finding(
                ctx.span(entry[1]),
                f'"zero_optimization": {str(entry[1].value).lower()} is the legacy boolean form; '
                f"DeepSpeed reads it as stage {stage}: write {content}",
                fix=Fix((replace_text(doc, entry[1].start, entry[1].end, content),),
                        f"Write {content}", Applicability.SAFE),
            )
        zero = zero_block(root)
        if zero is None:
            return
        for old, new in keys.DEPRECATED_ZERO_KEYS.items():
            found = zero.entry(old)
            if found is None:
                continue
            fix = None if new in zero else Fix((rename_key(doc, found[0], new),), f"Rename to {new}")
            yield self.finding(ctx.span(found[0]), f"{old} is deprecated; the current name is {new}", fix=fix)
        found = zero.entry("cpu_offload")
        if found is not None:
            on = found[1].truthy()
            fix = None
            if on is not None and "offload_optimizer" not in zero:
                device = "cpu" if on else "none"
                if doc.fmt == "json":
                    content = '"offload_optimizer": {"device": "%s"}' % device
                else:
                    content = "offload_optimizer: {device: %s}" % device
                fix = Fix((replace_text(doc, found[0].start, found[1].end, content),),
                          f"Write offload_optimizer.device = {device}")
            extra = (" Together with offload_optimizer DeepSpeed asserts; remove one."
                     if "offload_optimizer" in zero else "")
            yield self.finding(
                ctx.span(found[0]),
                "cpu_offload is deprecated: DeepSpeed maps it to offload_optimizer.device; "
                "write that instead." + extra,
                fix=fix,
            )

    VALID = [
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_batch_size": 8}',
                "the current form", path=DS),
        Example('{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true},'
                ' "train_batch_size": 8}', "the current gather name", path=DS),
    ]
    INVALID = [
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "cpu_offload": true\n  },\n'
                '  "train_batch_size": 8\n}\n', "cpu_offload", path=DS, line=4,
                fixed='{\n  "zero_optimization": {\n    "stage": 2,\n    "offload_optimizer": {"device": "cpu"}\n'
                      '  },\n  "train_batch_size": 8\n}\n'),
        Example('{\n  "zero_optimization": {\n    "stage": 3,\n    "stage3_gather_fp16_weights_on_model_save": true\n'
                '  },\n  "train_batch_size": 8\n}\n', "the fp16 gather name", path=DS, line=4,
                fixed='{\n  "zero_optimization": {\n    "stage": 3,\n    "stage3_gather_16bit_weights_on_model_save": '
                      'true\n  },\n  "train_batch_size": 8\n}\n'),
        Example('{\n  "zero_optimization": true,\n  "train_batch_size": 8\n}\n', "the legacy boolean",
                path=DS, line=2, fixed='{\n  "zero_optimization": {"stage": 1},\n  "train_batch_size": 8\n}\n'),
        Example("zero_optimization:\n  stage: 2\n  cpu_offload: true  # old\ntrain_batch_size: 8\n",
                "YAML: comment kept", path="ds_config.yaml", line=3,
                fixed="zero_optimization:\n  stage: 2\n  offload_optimizer: {device: cpu}  # old\ntrain_batch_size: 8\n"),
    ]
