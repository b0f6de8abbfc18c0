"""CFX405 unknown-accelerate-key."""

from __future__ import annotations

from cfgfix.analysis import accelerate_keys as keys
from cfgfix.core import Fix, Severity
from cfgfix.documents.config_edits import close_match, rename_key
from cfgfix.rules.accelerate.common import ACC, HEAD, AccelerateRule, ds_block
from cfgfix.rules.base import Example, register


@register
class UnknownAccelerateKey(AccelerateRule):
    """## What it does
    Flags keys accelerate does not know: at the top level of its config, and inside
    `deepspeed_config`. The legacy top-level `fp16` and `dynamo_backend` are known: accelerate's
    `ClusterConfig.process_config` still converts them (to `mixed_precision`, and to
    `dynamo_config.dynamo_backend`).

    ## Why is this bad?
    At the top level accelerate refuses the file ("The config file at ... had unknown
    keys ([...])"), so the launch fails. Inside `deepspeed_config` an unknown key is
    accepted silently and ignored: `offload_optimizer_devic: cpu` offloads nothing.
    That one is a warning.

    ## Example
    ```yaml
    distributed_type: MULTI_GPU
    mixed_precison: bf16
    ```

    ## Use instead
    ```yaml
    distributed_type: MULTI_GPU
    mixed_precision: bf16
    ```

    ## Fix safety
    Safe when exactly one known key is close and it is not already set: the fix renames
    the key. No fix otherwise.

    ## References
    - facts.md B10; accelerate `commands/config/config_args.py`, `commands/launch.py`
    """

    code = "CFX405"
    name = "unknown-accelerate-key"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_config(self, ctx, root):
        yield from self._check(ctx, root, keys.TOP_LEVEL, None)
        block = ds_block(root)
        if block is not None:
            yield from self._check(ctx, block, keys.DEEPSPEED_CONFIG_KEYS, Severity.WARNING)

    def _check(self, ctx, mapping, known, severity):
        for key, _ in mapping.entries:
            name = key.value
            if not isinstance(name, str) or name in known:
                continue
            match = close_match(name, known)
            fix = None
            if match and match not in mapping:
                fix = Fix((rename_key(ctx.document, key, match),), f"Rename to {match}")
            hint = f" (did you mean {match}?)" if match else ""
            where = ("accelerate refuses the config file at launch" if severity is None
                     else "accelerate ignores it silently inside deepspeed_config, so the setting never applies")
            yield self.finding(ctx.span(key), f"unknown accelerate key {name}{hint}: {where}",
                               fix=fix, severity=severity)

    VALID = [
        Example(HEAD + "mixed_precision: bf16\nnum_processes: 8\ndowncast_bf16: 'no'\n", "generated keys", path=ACC),
        Example("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 8\nmy_setting: 1\n"
                "learning_rate: 0.1\nepochs: 3\noutput_dir: out\n",
                "mostly not accelerate's keys: a training config, not checked", path="train.yaml"),
    ]
    INVALID = [
        Example(HEAD + "mixed_precison: bf16\nnum_processes: 8\n", "top-level typo", path=ACC, line=3,
                fixed=HEAD + "mixed_precision: bf16\nnum_processes: 8\n"),
        Example(HEAD + "deepspeed_config:\n  offload_optimizer_devic: cpu\n  zero_stage: 2\nmixed_precision: bf16\n",
                "nested typo", path=ACC, line=4,
                fixed=HEAD + "deepspeed_config:\n  offload_optimizer_device: cpu\n  zero_stage: 2\nmixed_precision: bf16\n"),
    ]
