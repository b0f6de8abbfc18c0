"""CFX406 invalid-accelerate-value."""

from __future__ import annotations

from cfgfix.analysis import accelerate_keys as keys
from cfgfix.core import Fix, Severity
from cfgfix.documents.config_edits import close_match, replace_scalar
from cfgfix.rules.accelerate.common import ACC, HEAD, AccelerateRule, ds_block
from cfgfix.rules.base import Example, register


@register
class InvalidAccelerateValue(AccelerateRule):
    """## What it does
    Flags enum values accelerate rejects: `distributed_type`, `compute_environment`,
    `mixed_precision`, and the offload devices and multinode launcher in `deepspeed_config`.

    ## Why is this bad?
    `distributed_type: DEEP_SPEED` fails when the file is loaded ("'DEEP_SPEED' is not a
    valid DistributedType"); `mixed_precision: bfloat16` loads fine and fails at
    `accelerate launch` ("Unknown mixed_precision mode: bfloat16"), after the job was queued.

    ## Example
    ```yaml
    distributed_type: DEEP_SPEED
    mixed_precision: bfloat16
    ```

    ## Use instead
    ```yaml
    distributed_type: DEEPSPEED
    mixed_precision: bf16
    ```

    ## Fix safety
    Safe when exactly one allowed value is close: the fix writes it with the same quoting.
    No fix otherwise.

    ## References
    - facts.md B10; accelerate `utils/dataclasses.py` (DistributedType, PrecisionType),
      `utils/launch.py`
    """

    code = "CFX406"
    name = "invalid-accelerate-value"
    severity = Severity.ERROR
    fix_availability = "safe"
    _ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp32": "no", "float32": "no"}

    def check_config(self, ctx, root):
        yield from self._check(ctx, root, keys.VALUES)
        block = ds_block(root)
        if block is not None:
            yield from self._check(ctx, block, keys.DEEPSPEED_VALUES)

    def _check(self, ctx, mapping, allowed_by_key):
        for name, allowed in allowed_by_key.items():
            node = mapping.get(name)
            if node is None or node.kind != "scalar" or not isinstance(node.value, str):
                continue  # `no` unquoted loads as False, null: not this rule's business
            value = node.value
            if value.lower() in {a.lower() for a in allowed}:
                continue
            match = self._ALIASES.get(value.lower()) if name == "mixed_precision" else None
            match = match or close_match(value, allowed)
            fix = Fix((replace_scalar(ctx.document, node, match),), f"Write {match}") if match else None
            hint = f" (did you mean {match}?)" if match else ""
            yield self.finding(
                ctx.span(node),
                f"{name}: {value} is not a value accelerate accepts{hint}; allowed: {', '.join(allowed)}",
                fix=fix,
            )

    VALID = [
        Example(HEAD + "mixed_precision: 'no'\n", "quoted 'no'", path=ACC),
        Example(HEAD + "mixed_precision: bf16\ndeepspeed_config:\n  offload_optimizer_device: none\n", "allowed",
                path=ACC),
    ]
    INVALID = [
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEP_SPEED\nmixed_precision: bf16\n", "DEEP_SPEED",
                path=ACC, line=2, fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"),
        Example(HEAD + "mixed_precision: 'bfloat16'\n", "bfloat16, quoting kept", path=ACC, line=3,
                fixed=HEAD + "mixed_precision: 'bf16'\n"),
    ]
