"""CFX504 deprecated-deepspeed-key."""

from __future__ import annotations

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.analysis.deepspeed_config import zero_block, zero_entries
from cfgfix.core import Applicability, Fix, Severity
from cfgfix.documents.config_edits import rename_key, replace_text
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class DeprecatedDeepSpeedKey(DeepSpeedRule):
    """## What it does
    Flags deprecated DeepSpeed forms: `cpu_offload`, `cpu_offload_param`,
    `cpu_offload_use_pin_memory` and `stage3_gather_fp16_weights_on_model_save` under
    `zero_optimization`, and the legacy `"zero_optimization": true`.

    ## Why is this bad?
    They still work, with a deprecation warning, but they are mapped to the current forms
    behind the author's back (`cpu_offload: true` → `offload_optimizer.device: cpu`,
    `cpu_offload_param: true` → `offload_param.device: cpu`, `"zero_optimization": true` →
    stage 1; `cpu_offload_use_pin_memory` sets nothing), and a deprecated field together with
    the one it replaces makes DeepSpeed assert (`cpu_offload` with `offload_optimizer`; the
    fp16 gather name with `stage3_gather_16bit_weights_on_model_save` or its field name
    `gather_16bit_weights_on_model_save`). Writing the current form says what runs.

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
    # b"cpu_offload" also matches cpu_offload_param and cpu_offload_use_pin_memory
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
            # the current option under any of its names (alias or pydantic field name)
            present = [k.value for k, _ in zero_entries(zero, new, deprecated=False)]
            fix = None if present else Fix((rename_key(doc, found[0], new),), f"Rename to {new}")
            extra = (f". Together with {present[0]} DeepSpeed asserts ('Cannot provide deprecated parameter "
                     f"... and replacing parameter ... together'); remove one" if present else "")
            yield self.finding(ctx.span(found[0]), f"{old} is deprecated; the current name is {new}" + extra,
                               fix=fix)
        for old, block in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
            found = zero.entry(old)
            if found is None:
                continue
            on = found[1].truthy()
            fix = None
            if on is not None and block not in zero:
                device = "cpu" if on else "none"
                if doc.fmt == "json":
                    content = '"%s": {"device": "%s"}' % (block, device)
                else:
                    content = "%s: {device: %s}" % (block, device)
                fix = Fix((replace_text(doc, found[0].start, found[1].end, content),),
                          f"Write {block}.device = {device}")
            extra = f" Together with {block} DeepSpeed asserts; remove one." if block in zero else ""
            yield self.finding(
                ctx.span(found[0]),
                f"{old} is deprecated: DeepSpeed maps it to {block}.device; write that instead." + extra,
                fix=fix,
            )
        found = zero.entry("cpu_offload_use_pin_memory")
        if found is not None:
            yield self.finding(
                ctx.span(found[0]),
                "cpu_offload_use_pin_memory is deprecated and sets nothing: DeepSpeed only warns; "
                "write pin_memory inside offload_optimizer / offload_param instead",
            )

    VALID = [
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_batch_size": 8}',
                "the current form", path=DS),
        Example('{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true},'
                ' "train_batch_size": 8}', "the current gather name", path=DS),
        Example('{"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": true},'
                ' "train_batch_size": 8}', "the gather option's pydantic field name, also current", path=DS),
        Example('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true}},'
                ' "train_batch_size": 8}', "offload_param with pin_memory: the current forms", path=DS),
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
        Example('{\n  "zero_optimization": {\n    "stage": 3,\n    "stage3_gather_fp16_weights_on_model_save": true,\n'
                '    "gather_16bit_weights_on_model_save": true\n  },\n  "train_batch_size": 8\n}\n',
                "the fp16 gather name beside the current option's field name: DeepSpeed asserts, no rename",
                path=DS, line=4),
        Example('{\n  "zero_optimization": {\n    "stage": 3,\n    "cpu_offload_param": true\n  },\n'
                '  "train_batch_size": 8\n}\n', "cpu_offload_param", path=DS, line=4,
                fixed='{\n  "zero_optimization": {\n    "stage": 3,\n    "offload_param": {"device": "cpu"}\n'
                      '  },\n  "train_batch_size": 8\n}\n'),
        Example('{"zero_optimization": {"stage": 2, "cpu_offload_use_pin_memory": true}, "train_batch_size": 8}',
                "cpu_offload_use_pin_memory sets nothing", path=DS, line=1),
        Example('{\n  "zero_optimization": true,\n  "train_batch_size": 8\n}\n', "the legacy boolean",
                path=DS, line=2, fixed='{\n  "zero_optimization": {"stage": 1},\n  "train_batch_size": 8\n}\n'),
        Example("zero_optimization:\n  stage: 2\n  cpu_offload: true  # old\ntrain_batch_size: 8\n",
                "YAML: comment kept", path="ds_config.yaml", line=3,
                fixed="zero_optimization:\n  stage: 2\n  offload_optimizer: {device: cpu}  # old\ntrain_batch_size: 8\n"),
    ]
