"""CFX4xx: accelerate config YAML, single-file checks [B10]."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis import accelerate_keys as keys
from cfgfix.core import Finding, Fix, Related, Severity
from cfgfix.documents.config_edits import close_match, rename_key, replace_scalar
from cfgfix.rules.base import Example, Rule, register

ACC = "accelerate.yaml"
HEAD = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"


class AccelerateRule(Rule):
    kinds = ("yaml", "json")
    triggers = ((b"distributed_type", b"compute_environment"),)

    def check(self, ctx) -> Iterable[Finding]:
        if "accelerate" not in ctx.kinds:
            return ()
        return self.check_config(ctx, ctx.root)

    def check_config(self, ctx, root) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


def _ds_block(root):
    block = root.get("deepspeed_config")
    return block if block is not None and block.kind == "mapping" else None


@register
class DeepSpeedFileWithInlineKeys(AccelerateRule):
    """## What it does
    Flags accelerate config keys that accelerate rejects next to
    `deepspeed_config.deepspeed_config_file`: `gradient_accumulation_steps`,
    `gradient_clipping`, `zero_stage`, `offload_optimizer_device`, `offload_param_device`,
    the two `*_nvme_path` keys, `zero3_save_16bit_model`, and a top-level `mixed_precision`.

    ## Why is this bad?
    With a DeepSpeed file, those settings must live in the JSON. `accelerate launch` stops
    with a `ValueError` ("When using `deepspeed_config_file`, the following accelerate config
    variables will be ignored: [...]"), and `mixed_precision` joins that list when it comes
    from the YAML, even `mixed_precision: 'no'`. `accelerate config` never writes these keys
    together; they appear when a generated file is edited by hand.

    ## Example
    ```yaml
    deepspeed_config:
      deepspeed_config_file: ds_zero2.json
      zero_stage: 2
    distributed_type: DEEPSPEED
    mixed_precision: bf16
    ```

    ## Use instead
    ```yaml
    deepspeed_config:
      deepspeed_config_file: ds_zero2.json
    distributed_type: DEEPSPEED
    ```
    with the stage and `"bf16": {"enabled": true}` in `ds_zero2.json`.

    ## Fix safety
    No fix yet: removing a key is safe only when the DeepSpeed JSON already says the same,
    and this check does not read the JSON.

    ## References
    - facts.md B10; accelerate `utils/dataclasses.py` (DeepSpeedPlugin) and `commands/launch.py`
    """

    code = "CFX403"
    name = "deepspeed-file-with-inline-keys"
    severity = Severity.ERROR
    triggers = AccelerateRule.triggers + ((b"deepspeed_config_file",),)

    def check_config(self, ctx, root):
        block = _ds_block(root)
        if block is None:
            return
        file_entry = block.entry("deepspeed_config_file")
        if file_entry is None or file_entry[1].value in (None, "", "none"):
            return
        related = [Related(ctx.span(file_entry[1]), "the DeepSpeed file is set here")]
        inline = [(k, f"the inline {k.value}") for k, _ in block.entries if k.value in keys.IGNORED_WITH_DS_FILE]
        precision = root.entry("mixed_precision")
        if precision is not None:
            inline.append((precision[0], "mixed_precision"))
        for key, what in inline:
            yield self.finding(
                ctx.span(key),
                f"deepspeed_config_file is set, so accelerate rejects {what} at launch (ValueError); "
                f"set it in {file_entry[1].value} instead",
                related=related,
            )

    VALID = [
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n"
                "num_processes: 2\n", "zero3_init_flag is allowed next to the file", path=ACC),
        Example(HEAD + "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
                "mixed_precision: bf16\n", "inline keys without a file: the generated form", path=ACC),
    ]
    INVALID = [
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 2\nnum_processes: 2\n",
                "inline zero_stage", path=ACC, line=5),
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nmixed_precision: 'no'\n",
                "even mixed_precision 'no'", path=ACC, line=5),
    ]


@register
class UnknownAccelerateKey(AccelerateRule):
    """## What it does
    Flags keys accelerate does not know: at the top level of its config, and inside
    `deepspeed_config`.

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
        block = _ds_block(root)
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
        Example(HEAD + "deepspeed_config:\n  offload_optimizer_devic: cpu\n  zero_stage: 2\n", "nested typo",
                path=ACC, line=4, fixed=HEAD + "deepspeed_config:\n  offload_optimizer_device: cpu\n  zero_stage: 2\n"),
    ]


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
        block = _ds_block(root)
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
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEP_SPEED\n", "DEEP_SPEED", path=ACC,
                line=2, fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"),
        Example(HEAD + "mixed_precision: 'bfloat16'\n", "bfloat16, quoting kept", path=ACC, line=3,
                fixed=HEAD + "mixed_precision: 'bf16'\n"),
    ]
