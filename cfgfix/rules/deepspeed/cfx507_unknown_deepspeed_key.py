"""CFX507 unknown-deepspeed-key."""

from __future__ import annotations

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.analysis.deepspeed_config import zero_block, zero_names
from cfgfix.core import Fix, Severity
from cfgfix.documents.config_edits import close_match, rename_key
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


def _ignorable(key: str) -> bool:
    """Comment keys (`_comment`, `//`, `comment`): DeepSpeed ignores them, on purpose."""
    return key.startswith(("_", "/", "#")) or "comment" in key.lower()


@register
class UnknownDeepSpeedKey(DeepSpeedRule):
    """## What it does
    Flags a top-level key that no DeepSpeed version reads, such as `zero_optimisation` or
    `train_micro_batch_size`, and a key DeepSpeed rejects inside `zero_optimization`, its
    `offload_optimizer` / `offload_param` blocks, or (DeepSpeed 0.19 and newer) `fp16` /
    `bf16`.

    ## Why is this bad?
    DeepSpeed reads top-level keys one by one and silently ignores the rest. A misspelt
    `zero_optimisation` block is dropped and ZeRO stays at stage 0: every GPU holds the
    whole model, gradients and optimizer states, and the run that was sized for ZeRO-3
    runs out of memory with nothing in the logs pointing at the typo. (accelerate's
    DeepSpeed plugin stops with "Please specify the ZeRO optimization config".) Keys
    that start with `_` or mention `comment` are treated as comments.

    The nested blocks are pydantic models that forbid extra keys: `"overlap_com": true`
    under `zero_optimization` stops the run with "Extra inputs are not permitted". Before
    DeepSpeed 0.19, `fp16` and `bf16` were plain dicts whose unknown keys were ignored, so
    those are flagged only when the project's DeepSpeed is known to be 0.19 or newer; the
    ZeRO blocks are checked unless the project's DeepSpeed is known to be older than 0.19
    (the key lists follow 0.19.8 and newer). A key whose value is `"auto"` is dropped by
    DeepSpeed before validation and is not flagged.

    The aliased ZeRO options are known under both names DeepSpeed reads: the `stage3_*`
    alias (`stage3_max_live_parameters`) and the pydantic field name (`max_live_parameters`;
    DeepSpeed populates its config models by name too). Setting one option under both names
    is flagged: pydantic reads the alias and refuses the field name as an extra input.

    ## Example
    ```json
    {"zero_optimisation": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    ```

    ## Fix safety
    Safe when exactly one known key is close to the typo and it is not already present:
    the fix renames the key, so the block is read as the author meant. No fix otherwise.

    ## Versions
    Unknown top-level keys are flagged on every version (no DeepSpeed reads them). Keys in
    `zero_optimization` and its offload blocks are checked against 0.19.8's lists unless
    the project's DeepSpeed is known to be older than 0.19 (0.14.4 and 0.16.9 forbid extra
    keys there too, but their lists differ); with no evidence they are checked, as on the
    current release. `fp16` / `bf16` keys are checked only when DeepSpeed is known to be
    0.19 or newer: with no evidence cfgfix stays silent there, since 0.18 and older ignore
    unknown keys in those blocks.

    ## References
    - facts.md C12; DeepSpeed `runtime/config.py` (`get_scalar_param`), `runtime/config_utils.py`
      (`DeepSpeedConfigModel`, `extra="forbid"`), `runtime/zero/config.py`,
      `runtime/zero/offload_config.py`, `runtime/precision_config.py`
    """

    code = "CFX507"
    name = "unknown-deepspeed-key"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_config(self, ctx, root):
        for key, _ in root.entries:
            name = key.value
            if not isinstance(name, str) or name in keys.TOP_LEVEL or _ignorable(name):
                continue
            match = close_match(name, keys.TOP_LEVEL)
            fix = None
            hint = ""
            if match and match not in root:
                fix = Fix((rename_key(ctx.document, key, match),), f"Rename to {match}")
                hint = f" (did you mean {match}?)"
            consequence = (" so ZeRO stays at stage 0" if match == "zero_optimization"
                           else " so its setting never takes effect")
            yield self.finding(
                ctx.span(key),
                f"unknown top-level key {name}{hint}: DeepSpeed ignores unknown top-level keys "
                f"silently,{consequence}",
                fix=fix,
            )
        yield from self._nested(ctx, root)

    def _nested(self, ctx, root):
        from cfgfix.analysis import deepspeed_nested_keys as nested

        blocks = []
        recent = ctx.versions.get("deepspeed").at_least("0.19")
        if recent is False:
            return  # the key lists are checked against 0.19+; older versions had other keys
        zero = zero_block(root)
        if zero is not None:
            blocks.append(("zero_optimization", zero, nested.ZERO))
            for name, known in (("offload_optimizer", nested.OFFLOAD_OPTIMIZER), ("offload_param", nested.OFFLOAD_PARAM)):
                block = zero.get(name)
                if block is not None and block.kind == "mapping":
                    blocks.append((f"zero_optimization.{name}", block, known))
        if recent is True:  # fp16/bf16 were plain dicts before 0.19: unknown keys ignored
            for name, known in (("fp16", nested.FP16), ("bf16", nested.BF16), ("bfloat16", nested.BF16)):
                block = root.get(name)
                if block is not None and block.kind == "mapping":
                    blocks.append((name, block, known))
        for where, block, known in blocks:
            for key, value in block.entries:
                name = key.value
                if not isinstance(name, str) or name in known or _ignorable(name):
                    continue
                if value.kind == "scalar" and value.value == "auto":
                    continue  # DeepSpeed drops "auto" values before validating the block
                match = close_match(name, known)
                fix = None
                hint = ""
                # the option the typo means may be present under its other name (alias or field name)
                taken = (match and where == "zero_optimization"
                         and any(other in block for other in zero_names(match, deprecated=False)))
                if match and match not in block and not taken:
                    fix = Fix((rename_key(ctx.document, key, match),), f"Rename to {match}")
                    hint = f" (did you mean {match}?)"
                yield self.finding(
                    ctx.span(key),
                    f"unknown key {name} in {where}{hint}: DeepSpeed validates this block strictly and "
                    f"refuses the config ('Extra inputs are not permitted')",
                    fix=fix,
                )
        if zero is not None:
            yield from self._two_names(ctx, zero)

    def _two_names(self, ctx, zero):
        """One ZeRO option under both its alias and its field name: pydantic reads the alias
        and refuses the field name as an extra input (checked with pydantic 2.13.4 on a model
        configured as DeepSpeedConfigModel: populate_by_name=True, extra="forbid")."""
        for option, alias in keys.ZERO_ALIASES.items():
            found = zero.entry(option)
            other = zero.entry(alias)
            if found is None or other is None:
                continue
            if any(value.kind == "scalar" and value.value == "auto" for _, value in (found, other)):
                continue  # DeepSpeed drops "auto" values before validating: no conflict left
            yield self.finding(
                ctx.span(found[0]),
                f"{option} is the field name of {alias}, which the block also sets: DeepSpeed reads "
                f"{alias} and refuses the config ('Extra inputs are not permitted' for {option}); keep one",
            )

    VALID = [
        Example('{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",'
                ' "_comment": "ZeRO-3 for 8 GPUs"}', "comment keys", path=DS),
        Example('{"train_batch_size": 8, "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": false,'
                ' "zero_optimization": {"stage": 1}}', "all known", path=DS),
        Example('{"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "learning_rate": 1e-4}',
                "a training config, not DeepSpeed's", path="train_config.json"),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": true,'
                ' "stage3_max_live_parameters": 1e9, "stage3_gather_16bit_weights_on_model_save": true,'
                ' "offload_optimizer": {"device": "cpu", "pin_memory": true},'
                ' "offload_param": {"device": "cpu", "buffer_count": 5}}}',
                "nested keys, stage3_* aliases included, all known", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "max_live_parameters": 1e9,'
                ' "gather_16bit_weights_on_model_save": true, "prefetch_bucket_size": 5e7,'
                ' "param_persistence_threshold": 1e5}}',
                "the pydantic field names of the stage3_* aliases: DeepSpeed reads them too", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto",'
                ' "stage3_prefetch_bucket_size": 5e7}}',
                "both names, one \"auto\": DeepSpeed drops it before validation", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_sise": "auto"}}',
                "an \"auto\" value is dropped before validation", path=DS),
        Example('{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 1000}}',
                "fp16 was a plain dict before DeepSpeed 0.19", path=DS,
                files={"requirements.txt": "deepspeed==0.16.9\n"}),
        Example('{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 1000}}',
                "fp16 with the DeepSpeed version unknown", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "some_old_key": true}}',
                "DeepSpeed older than 0.19: its ZeRO keys are not the lists cfgfix checks", path=DS,
                files={"requirements.txt": "deepspeed==0.14.4\n"}),
    ]
    INVALID = [
        Example('{\n  "train_micro_batch_size_per_gpu": 2,\n  "monitor_config": {"tensorboard": {"enabled": true}}\n}\n',
                "monitor_config is not a DeepSpeed key: get_monitor_config reads tensorboard/wandb/csv_monitor/comet "
                "at the top level", path=DS, line=3),
        Example('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimisation": {"stage": 3}\n}\n',
                "British spelling", path=DS, line=3,
                fixed='{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {"stage": 3}\n}\n'),
        Example("train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: 2\ngradient_acumulation_steps: 4\n",
                "YAML, a letter missing", path="ds_config.yaml", line=4,
                fixed="train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: 2\ngradient_accumulation_steps: 4\n"),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_com": true\n'
                '  }\n}\n', "a typo inside zero_optimization", path=DS, line=5,
                fixed='{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": true\n'
                      '  }\n}\n'),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "offload_param": {"device": "cpu", "pin_memory": true, "nvme": "/local"}\n  }\n}\n',
                "an unknown key in offload_param, no close match", path=DS, line=5),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "stage3_gather_16bit_weights_on_model_save": true,\n'
                '    "gather_16bit_weights_on_model_save": true\n  }\n}\n',
                "one option under its alias and its field name: pydantic refuses the field name", path=DS, line=6),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "max_live_parameters": 1e9,\n    "stage3_max_live_paramters": 1e9\n  }\n}\n',
                "a typo of an alias whose field name is already set: no rename, it would set the option twice",
                path=DS, line=6),
        Example('{\n  "train_batch_size": 8,\n  "bf16": {\n    "enabled": true,\n    "immediate_grad_updates": true\n'
                '  }\n}\n', "bf16 is strict from DeepSpeed 0.19", path=DS, line=5,
                files={"requirements.txt": "deepspeed==0.19.8\n"},
                fixed='{\n  "train_batch_size": 8,\n  "bf16": {\n    "enabled": true,\n    "immediate_grad_update": true\n'
                      '  }\n}\n'),
    ]
