"""CFX4xx: accelerate config YAML, single-file checks [B10]."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis import accelerate_keys as keys
from cfgfix.core import Finding, Fix, Related, Severity
from cfgfix.documents.config_edits import close_match, rename_key, replace_scalar
from cfgfix.project import ProjectRule
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


def _json_value(ds_root, paths, default):
    """What the DeepSpeed JSON says at the first of `paths` present (a scalar node's value),
    `default` when none is present, MISSING when a block on the way is not a mapping."""
    for path in paths:
        node = ds_root
        for name in path:
            if node.kind != "mapping":
                return keys.MISSING  # `"offload_param": true` and the like: not comparable
            node = node.get(name)
            if node is None:
                break  # absent here: try the next name, then DeepSpeed's default
        else:
            return node.value if node.kind == "scalar" else keys.MISSING
    return default


def _same(inline, stated) -> bool:
    """The inline YAML value and the JSON's agree (numbers by value, booleans only with
    booleans, "none" and null alike); "auto" in the JSON never agrees (it is filled later)."""
    if stated is keys.MISSING or stated == "auto":
        return False
    none = (None, "none")
    if inline in none or stated in none:
        return inline in none and stated in none
    if isinstance(inline, bool) or isinstance(stated, bool):
        return isinstance(inline, bool) and isinstance(stated, bool) and inline == stated
    return inline == stated


def _json_precision(ds_root) -> str | None:
    """"fp16", "bf16" or "no" as the JSON's enabled flags decide; None when a flag is
    "auto" or unreadable (accelerate fills it from mixed_precision) or both are on."""
    on = {}
    for fmt, names in (("fp16", ("fp16",)), ("bf16", ("bf16", "bfloat16"))):
        on[fmt] = False
        for name in names:
            block = ds_root.get(name)
            if block is None:
                continue
            enabled = block.get("enabled") if block.kind == "mapping" else None
            if enabled is None and block.kind == "mapping":
                continue  # a block without `enabled` is off
            state = enabled.truthy() if enabled is not None else None
            if state is None:
                return None
            on[fmt] = on[fmt] or state
    if on["fp16"] and on["bf16"]:
        return None  # CFX501's problem: nothing to agree with
    return "fp16" if on["fp16"] else "bf16" if on["bf16"] else "no"


def _precision_agrees(value, ds_root) -> bool:
    stated = _json_precision(ds_root)
    inline = "no" if value is False else value  # unquoted `no` loads as False
    return stated is not None and inline == stated


@register
class DeepSpeedFileWithInlineKeys(ProjectRule):
    """## What it does
    Flags accelerate config keys that accelerate rejects next to
    `deepspeed_config.deepspeed_config_file`: `gradient_accumulation_steps`,
    `gradient_clipping`, `zero_stage`, `offload_optimizer_device`, `offload_param_device`,
    the two `*_nvme_path` keys, `zero3_save_16bit_model`, and a top-level `mixed_precision`,
    in a config that runs DeepSpeed (`distributed_type: DEEPSPEED`, or a launch with
    `--use_deepspeed`).

    ## Why is this bad?
    With a DeepSpeed file, those settings must live in the JSON. `accelerate launch` stops
    with a `ValueError` ("When using `deepspeed_config_file`, the following accelerate config
    variables will be ignored: [...]"), and `mixed_precision` joins that list when it comes
    from the YAML, even `mixed_precision: 'no'`. `accelerate config` never writes these keys
    together; they appear when a generated file is edited by hand. A `deepspeed_config`
    block left in a config whose `distributed_type` is not `DEEPSPEED` is never read, and
    is not flagged.

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
    Safe, and only offered when the DeepSpeed JSON is found and already says the same: the
    same stage, accumulation, clipping, offload devices and paths, `zero3_save_16bit_model`
    matching `stage3_gather_16bit_weights_on_model_save` (false when absent), and a
    `mixed_precision` matching the JSON's `fp16`/`bf16` flags. The fix removes the key, so
    the run trains exactly as the JSON says, which is what it would do once accelerate
    accepted the file. No fix when the values differ or the JSON says `"auto"`: which value
    was meant is the author's call (CFX402 fixes a precision clash first).

    ## References
    - facts.md B10, C12; accelerate `utils/dataclasses.py` (DeepSpeedPlugin) and `commands/launch.py`
    """

    code = "CFX403"
    name = "deepspeed-file-with-inline-keys"
    severity = Severity.ERROR
    fix_availability = "sometimes"

    def check_project(self, project):
        from cfgfix.documents.config_edits import delete_entry

        for link in project.accelerate_links():
            if link.path not in project.displays:
                continue
            doc, root = link.doc, link.doc.root
            block = _ds_block(root)
            file_entry = block.entry("deepspeed_config_file") if block is not None else None
            if file_entry is None or file_entry[1].value in (None, "", "none"):
                continue
            if not self._runs_deepspeed(project, link):
                continue  # accelerate reads deepspeed_config for DeepSpeed runs only
            ds = project.read(link.deepspeed_path) if link.deepspeed_path is not None else None
            ds_name = project.display(link.deepspeed_path) if ds is not None else file_entry[1].value
            related = [Related(doc.span(file_entry[1]), "the DeepSpeed file is set here")]
            inline = [(block, k, v, f"the inline {k.value}") for k, v in block.entries
                      if k.value in keys.IGNORED_WITH_DS_FILE]
            precision = root.entry("mixed_precision")
            if precision is not None:
                inline.append((root, *precision, "mixed_precision"))
            for mapping, key, value, what in inline:
                agrees = ds is not None and value.kind == "scalar" and self._agrees(key.value, value.value, ds.root)
                fix = None
                if agrees and not (doc.fmt == "yaml" and doc.source.text[mapping.start:mapping.start + 1] == "{"):
                    fix = Fix((delete_entry(doc, mapping, key, value),),
                              f"Remove {key.value} ({ds_name} says the same)")
                tail = (f"; {ds_name} already says the same, so removing it changes nothing" if agrees
                        else f"; set it in {ds_name} instead")
                yield self.finding(
                    doc.span(key),
                    f"deepspeed_config_file is set, so accelerate rejects {what} at launch (ValueError){tail}",
                    fix=fix, related=related,
                )

    @staticmethod
    def _runs_deepspeed(project, link) -> bool:
        kind = link.doc.root.get("distributed_type")
        if kind is not None and kind.kind == "scalar" and kind.value == "DEEPSPEED":
            return True
        return any("--use_deepspeed" in (project.launch_text(launch) or "") for launch in link.launches)

    @staticmethod
    def _agrees(name, value, ds_root) -> bool:
        if name == "mixed_precision":
            return _precision_agrees(value, ds_root)
        paths, default = keys.IGNORED_KEY_IN_JSON[name]
        return _same(value, _json_value(ds_root, paths, default))

    _DS = '{"bf16": {"enabled": true}, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}\n'
    VALID = [
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n"
                "num_processes: 2\n", "zero3_init_flag is allowed next to the file", path=ACC),
        Example(HEAD + "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
                "mixed_precision: bf16\n", "inline keys without a file: the generated form", path=ACC),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\ndeepspeed_config:\n"
                "  deepspeed_config_file: ds.json\n  zero_stage: 2\nmixed_precision: bf16\nnum_processes: 2\n",
                "a leftover deepspeed_config block in a MULTI_GPU config is never read", path=ACC,
                files={"ds.json": _DS}),
    ]
    INVALID = [
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 2\nnum_processes: 2\n",
                "inline zero_stage, the JSON not found: no fix", path=ACC, line=5),
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nmixed_precision: 'no'\n",
                "even mixed_precision 'no'; the JSON enables bf16, so no fix", path=ACC, line=5,
                files={"ds.json": _DS}),
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 2  # as in the JSON\n"
                "num_processes: 2\n", "the same stage as the JSON: removed", path=ACC, line=5,
                files={"ds.json": _DS},
                fixed=HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n"),
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 3\n"
                "num_processes: 2\n", "a different stage than the JSON: no fix", path=ACC, line=5,
                files={"ds.json": _DS}),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\ndeepspeed_config:\n"
                "  deepspeed_config_file: ds.json\n  offload_optimizer_device: none\nnum_processes: 2\n",
                "MULTI_GPU, but --use_deepspeed on the command line makes accelerate read the block",
                path=ACC, line=5,
                files={"ds.json": _DS, "train.sh": "accelerate launch --use_deepspeed --config_file accelerate.yaml "
                                                  "train.py\n"}),
    ]


@register
class PrecisionConflictWithDeepSpeed(ProjectRule):
    """## What it does
    Flags an accelerate config whose `mixed_precision` (`fp16` or `bf16`) contradicts the
    DeepSpeed JSON its `deepspeed_config.deepspeed_config_file` points at, where that JSON
    enables the other format with `"enabled": true`.

    ## Why is this bad?
    accelerate refuses the pair at launch: "`--mixed_precision` arg cannot be set to `fp16`
    when `bf16` is set in the DeepSpeed config file." (`DeepSpeedPlugin.set_mixed_precision`).
    The DeepSpeed JSON is what decides the training precision, so the YAML's value is the
    wrong one. `"enabled": "auto"` in the JSON is not a conflict: accelerate fills it from
    `mixed_precision`. The DeepSpeed file is found relative to the accelerate config's
    folder, then the project root, then the launched script's folder.

    ## Example
    ```yaml
    # accelerate.yaml, with ds.json saying "bf16": {"enabled": true}
    deepspeed_config:
      deepspeed_config_file: ds.json
    distributed_type: DEEPSPEED
    mixed_precision: fp16
    ```

    ## Use instead
    ```yaml
    deepspeed_config:
      deepspeed_config_file: ds.json
    distributed_type: DEEPSPEED
    ```
    (accelerate also rejects `mixed_precision` next to `deepspeed_config_file` even when it
    agrees, CFX403: the precision lives in the JSON.)

    ## Fix safety
    Safe: the fix writes the JSON's format into `mixed_precision`, which is what the run
    trains with once it starts; CFX403's fix then removes the key, which now agrees with
    the JSON (`cfgfix fix` applies both).

    ## References
    - facts.md B10 (rejected combination 2); accelerate `utils/dataclasses.py`
      (`DeepSpeedPlugin.set_mixed_precision`)
    """

    code = "CFX402"
    name = "precision-conflict-with-deepspeed"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_project(self, project):
        for link in project.accelerate_links():
            if link.deepspeed_path is None or link.path not in project.displays:
                continue
            doc = link.doc
            precision = doc.root.get("mixed_precision")
            if precision is None or precision.kind != "scalar" or precision.value not in ("fp16", "bf16"):
                continue
            ds = project.read(link.deepspeed_path)
            if ds is None:
                continue
            other = "bf16" if precision.value == "fp16" else "fp16"
            block = ds.root.get(other)
            enabled = block.get("enabled") if block is not None and block.kind == "mapping" else None
            if enabled is None or enabled.truthy() is not True:
                continue  # absent, false or "auto": accelerate fills or agrees
            ds_name = project.display(link.deepspeed_path)
            yield self.finding(
                doc.span(precision),
                f"mixed_precision {precision.value} contradicts {other}.enabled=true in {ds_name}: "
                f"accelerate stops at launch ('--mixed_precision arg cannot be set to {precision.value} when "
                f"{other} is set in the DeepSpeed config file'); the DeepSpeed file decides the precision, "
                f"so this run trains in {other}",
                fix=Fix((replace_scalar(doc, precision, other),), f"Set mixed_precision to {other} (as {ds_name})"),
                related=[Related(ds.span(enabled), f"{other} is enabled here"),
                         Related(doc.span(link.deepspeed_node), "the DeepSpeed file is named here")],
            )

    _BF16 = '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "train_batch_size": "auto"}\n'
    _FILE = HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\n"
    VALID = [
        Example(_FILE + "mixed_precision: bf16\n", "the same format as the JSON (CFX403 still asks to remove it)",
                path=ACC, files={"ds.json": _BF16}),
        Example(_FILE + "mixed_precision: fp16\n", "JSON \"auto\": accelerate fills it from mixed_precision",
                path=ACC, files={"ds.json": '{"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},'
                                            ' "zero_optimization": {"stage": 2}}\n'}),
        Example(_FILE + "mixed_precision: fp16\n", "JSON bf16 disabled: no conflict",
                path=ACC, files={"ds.json": '{"bf16": {"enabled": false}, "zero_optimization": {"stage": 2}}\n'}),
        Example(_FILE + "mixed_precision: fp16\n", "the DeepSpeed file does not exist here: nothing to compare",
                path=ACC),
        Example(_FILE + "mixed_precision: 'no'\n", "'no' is CFX403's (rejected next to the file), not a format clash",
                path=ACC, files={"ds.json": _BF16}),
        Example(HEAD + "deepspeed_config:\n  zero_stage: 2\nmixed_precision: fp16\n",
                "no deepspeed_config_file: accelerate builds the DeepSpeed config from the YAML",
                path=ACC, files={"ds.json": _BF16}),
    ]
    INVALID = [
        Example(_FILE + "mixed_precision: fp16  # from the old box\n", "fp16 against a bf16 JSON", path=ACC, line=5,
                files={"ds.json": _BF16},
                fixed=_FILE),  # CFX402 writes bf16, then CFX403 removes the agreeing key
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: configs/ds.json\nmixed_precision: 'bf16'\n",
                "bf16 against an fp16 JSON, the path relative to the project root",
                path="configs/accelerate.yaml", line=5,
                files={"configs/ds.json": '{\n  "fp16": {"enabled": "true"},\n  "train_batch_size": "auto",\n'
                                          '  "zero_optimization": {"stage": 1}\n}\n',
                       "train.sh": "accelerate launch --config_file configs/accelerate.yaml train.py\n"},
                fixed=HEAD + "deepspeed_config:\n  deepspeed_config_file: configs/ds.json\n"),
    ]


@register
class GradientAccumulationConflict(ProjectRule):
    """## What it does
    Flags an `accelerate launch` whose script is given `--gradient_accumulation_steps N`
    while the DeepSpeed settings the launch uses (the JSON named by the accelerate config's
    `deepspeed_config_file`, or the config's inline `deepspeed_config.gradient_accumulation_steps`)
    say a different number.

    ## Why is this bad?
    In a script with its own accelerate loop, accelerate takes the accumulation from the
    DeepSpeed config and overrides the script's: it only logs "Gradient accumulation steps
    mismatch: GradientAccumulationPlugin has 8, DeepSpeed config has 4. Using DeepSpeed's
    value." (`Accelerator._prepare_deepspeed`). In an HF / TRL Trainer script the Trainer
    compares the DeepSpeed value with its `TrainingArguments` and raises before the first
    step ("Please correct the following DeepSpeed config values that mismatch
    TrainingArguments values"). The effective batch, the learning-rate schedule and
    the number of optimizer steps are then not what the command line says. `"auto"` in the
    DeepSpeed config is filled from the script's value and is not flagged.

    ## Example
    ```sh
    accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 8
    ```
    with `"gradient_accumulation_steps": 4` in the DeepSpeed JSON that `accelerate.yaml` names.

    ## Use instead
    ```sh
    accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 4
    ```
    or `"gradient_accumulation_steps": "auto"` in the JSON, so the command line decides.

    ## Fix safety
    No fix: which of the two numbers the run was meant to use is the author's call.

    ## References
    - facts.md B10 (silent override); accelerate `accelerator.py` (`_prepare_deepspeed`)
    """

    code = "CFX404"
    name = "gradient-accumulation-conflict"
    severity = Severity.WARNING

    def check_project(self, project):
        for link in project.accelerate_links():
            for launch in link.launches:
                if launch.launcher != "accelerate" or launch.grad_accum is None or launch.grad_accum_span is None:
                    continue
                if launch.grad_accum_span.path not in project.displays.values():
                    continue
                where, node, doc = self._deepspeed_steps(project, link)
                if node is None or node.kind != "scalar":
                    continue
                value = node.value
                if isinstance(value, bool) or not isinstance(value, int) or value == launch.grad_accum:
                    continue  # "auto" (filled from the script), or the same number
                if self._hf_trainer(project, launch):
                    consequence = ("the HF Trainer compares DeepSpeed's value with its TrainingArguments and raises "
                                   "'Please correct the following DeepSpeed config values that mismatch "
                                   "TrainingArguments values' before the first step")
                else:
                    consequence = (f"accelerate uses DeepSpeed's value ('Gradient accumulation steps mismatch ... "
                                   f"Using DeepSpeed's value'), so the run accumulates {value} steps")
                yield self.finding(
                    launch.grad_accum_span,
                    f"--gradient_accumulation_steps {launch.grad_accum} disagrees with {where}, which says {value}: "
                    + consequence,
                    related=[Related(doc.span(node), f"gradient_accumulation_steps {value} here")],
                )

    @staticmethod
    def _hf_trainer(project, launch) -> bool:
        """The launch's script trains with an HF / TRL Trainer (which raises on the mismatch)."""
        from cfgfix.analysis.training_script import script_facts
        from cfgfix.project import _resolve

        for known, launch_file in project.launches:
            if known is launch and launch.script:
                script = _resolve(launch.script, launch_file, project.root)
                found = script_facts(project, script) if script is not None else None
                return bool(found and found[1].trainer)
        return False

    @staticmethod
    def _deepspeed_steps(project, link):
        if link.deepspeed_path is not None:
            ds = project.read(link.deepspeed_path)
            if ds is None:
                return "", None, None
            return project.display(link.deepspeed_path), ds.root.get("gradient_accumulation_steps"), ds
        block = link.doc.root.get("deepspeed_config")
        kind = link.doc.root.get("distributed_type")
        if kind is None or kind.value != "DEEPSPEED":
            return "", None, None  # deepspeed_config is read for DEEPSPEED runs only
        if block is None or block.kind != "mapping" or "deepspeed_config_file" in block:
            return "", None, None  # a file that cannot be found: nothing to compare
        return f"{project.display(link.path)} (deepspeed_config)", block.get("gradient_accumulation_steps"), link.doc

    _DS = '{"gradient_accumulation_steps": %s, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}\n'
    _YAML = HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n"
    VALID = [
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 4\n",
                "the same number in both", path="train.sh", files={"accelerate.yaml": _YAML, "ds.json": _DS % 4}),
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 8\n",
                "\"auto\": accelerate fills it from the script", path="train.sh",
                files={"accelerate.yaml": _YAML, "ds.json": _DS % '"auto"'}),
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps $GA\n",
                "a variable: not known", path="train.sh", files={"accelerate.yaml": _YAML, "ds.json": _DS % 4}),
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 8\n",
                "an accelerate config without DeepSpeed", path="train.sh",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                                          "num_processes: 2\n"}),
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps 8\n",
                "a leftover deepspeed_config block in a MULTI_GPU config is not read", path="train.sh",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                                          "deepspeed_config:\n  gradient_accumulation_steps: 4\nnum_processes: 2\n"}),
    ]
    INVALID = [
        Example("accelerate launch --config_file accelerate.yaml \\\n  train.py --gradient_accumulation_steps 8\n",
                "the DeepSpeed JSON says 4", path="train.sh", line=2,
                files={"accelerate.yaml": _YAML, "ds.json": _DS % 4}),
        Example("accelerate launch --config_file accelerate.yaml train.py --gradient_accumulation_steps=2\n",
                "the accelerate config's inline DeepSpeed settings", path="train.sh", line=1,
                files={"accelerate.yaml": HEAD + "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
                                              "num_processes: 2\n"}),
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
        Example(HEAD + "deepspeed_config:\n  offload_optimizer_devic: cpu\n  zero_stage: 2\nmixed_precision: bf16\n",
                "nested typo", path=ACC, line=4,
                fixed=HEAD + "deepspeed_config:\n  offload_optimizer_device: cpu\n  zero_stage: 2\nmixed_precision: bf16\n"),
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
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEP_SPEED\nmixed_precision: bf16\n", "DEEP_SPEED",
                path=ACC, line=2, fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"),
        Example(HEAD + "mixed_precision: 'bfloat16'\n", "bfloat16, quoting kept", path=ACC, line=3,
                fixed=HEAD + "mixed_precision: 'bf16'\n"),
    ]


_GPU_TYPES = ("MULTI_GPU", "DEEPSPEED", "FSDP")
_PRECISION_FLAGS = ("--mixed_precision", "--bf16", "--fp16")


def _set_top_level(doc, key: str, value: str):
    """An edit that sets top-level `key` to `value`: the scalar replaced (quoting kept), or a
    new last line `key: value` when the key is absent; None for layouts this cannot write."""
    from cfgfix.documents.config_edits import replace_text

    root = doc.root
    node = root.get(key)
    if node is not None:
        return replace_scalar(doc, node, value) if node.kind == "scalar" else None
    if doc.fmt != "yaml" or not root.entries:
        return None
    text = doc.source.text
    if text[root.start:root.start + 1] == "{":
        return None
    last_key, _ = root.entries[-1]
    if text[text.rfind("\n", 0, last_key.start) + 1:last_key.start].strip():
        return None
    end = len(text.rstrip("\r\n"))
    tail = text[end:]
    newline = "\r\n" if tail.startswith("\r\n") else "\n"
    return replace_text(doc, end, end, f"{newline}{key}: {value}")


@register
class Fp32MixedPrecision(ProjectRule):
    """## What it does
    Flags an accelerate config that trains on GPUs (`distributed_type` `MULTI_GPU`,
    `DEEPSPEED` or `FSDP`, without `use_cpu: true`) in full fp32: `mixed_precision: 'no'`
    or no `mixed_precision` at all, where a launch uses it. A config no launch uses is not
    reported: an HF Trainer launch's `--bf16` would override the file's `'no'`.

    ## Why is this bad?
    Every launch that uses the file runs forward and backward in fp32: twice the activation
    memory of bf16/fp16 autocast, and a fraction of the tensor-core throughput of any GPU
    since Volta. Often the file was written by `accelerate config` with the default answer
    and nobody meant fp32.

    Not reported when something else decides the precision: a DeepSpeed file named by
    `deepspeed_config_file` (its `fp16`/`bf16` blocks decide, and accelerate rejects
    `mixed_precision` next to it), a launch that passes `--mixed_precision`, `--bf16` or
    `--fp16`, or a launched script that builds `Accelerator(mixed_precision=...)` or an HF
    Trainer (whose `TrainingArguments` set the precision).

    ## Example
    ```yaml
    compute_environment: LOCAL_MACHINE
    distributed_type: MULTI_GPU
    mixed_precision: 'no'
    num_processes: 4
    ```

    ## Use instead
    ```yaml
    compute_environment: LOCAL_MACHINE
    distributed_type: MULTI_GPU
    mixed_precision: 'bf16'
    num_processes: 4
    ```
    (`fp16` on GPUs older than Ampere, such as the V100 or T4.)

    ## Fix safety
    Unsafe: the fix writes `bf16`, which needs an Ampere or newer GPU (A100, RTX 30xx and
    later); cfgfix does not know the target GPU yet, and on a V100 or T4 `fp16` is the
    choice. Mixed precision also changes numerics: a run tuned in fp32 may need its loss
    scale or learning rate checked.

    ## References
    - facts.md B10 (`mixed_precision` values); accelerate `commands/config/config_args.py`
    """

    code = "CFX401"
    name = "fp32-mixed-precision"
    severity = Severity.WARNING
    fix_availability = "unsafe"

    def check_project(self, project):
        from cfgfix.analysis.training_script import script_facts
        from cfgfix.core import Applicability
        from cfgfix.project import _resolve_in

        for link in project.accelerate_links():
            if link.path not in project.displays or not link.launches:
                continue  # no launch: an HF Trainer launch's --bf16 would override the file's 'no'
            doc = link.doc
            root = doc.root
            kind = root.get("distributed_type")
            if kind is None or kind.kind != "scalar" or kind.value not in _GPU_TYPES:
                continue
            use_cpu = root.get("use_cpu")
            if use_cpu is not None and use_cpu.truthy() is not False:
                continue
            precision = root.get("mixed_precision")
            if precision is not None and (precision.kind != "scalar" or precision.value not in ("no", False)):
                continue  # fp16 / bf16 / fp8, or a value CFX406 reports
            if any(isinstance(k.value, str) and "precis" in k.value and k.value != "mixed_precision"
                   for k, _ in root.entries):
                continue  # a misspelt mixed_precision: CFX405's, and the author did set a precision
            if "fp16" in root and root.get("fp16").truthy() is not False:
                continue  # the legacy `fp16: true`, converted to mixed_precision fp16
            block = _ds_block(root)
            if kind.value == "DEEPSPEED" and block is not None and "deepspeed_config_file" in block:
                continue  # the DeepSpeed file decides the precision
            if self._decided_elsewhere(project, link, script_facts, _resolve_in):
                continue
            edit = _set_top_level(doc, "mixed_precision", "bf16")
            state = "mixed_precision: 'no'" if precision is not None else "no mixed_precision"
            yield self.finding(
                doc.span(precision) if precision is not None else doc.span(kind),
                f"{state} with distributed_type {kind.value}: every launch of this config trains in full "
                f"fp32 on GPUs, with twice the activation memory of bf16/fp16 and a fraction of the "
                f"tensor-core speed",
                fix=Fix((edit,), "Set mixed_precision to bf16 (Ampere or newer; fp16 on older GPUs)",
                        Applicability.UNSAFE) if edit is not None else None,
                related=[Related(launch.span, "launched here") for launch in link.launches],
            )

    @staticmethod
    def _decided_elsewhere(project, link, script_facts, resolve) -> bool:
        for launch in link.launches:
            text = project.launch_text(launch)
            if text is None or any(flag in text for flag in _PRECISION_FLAGS):
                return True  # unreadable, or the command line sets the precision
            script = None
            for known, launch_file in project.launches:
                if known is launch and launch.script:
                    script = resolve(launch.script, [launch_file.parent, project.root])
            found = script_facts(project, script) if script is not None else None
            if found is None:
                continue
            facts = found[1]
            if facts.trainer or any(kw.arg == "mixed_precision" for call in facts.accelerator for kw in call.keywords):
                return True
        return False

    _GPU = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n"
    VALID = [
        Example(_GPU + "mixed_precision: bf16\n", "bf16", path=ACC),
        Example(_GPU + "mixed_precision: 'no'\n", "no launch uses the config: a Trainer launch's --bf16 would decide",
                path=ACC),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'no'\n"
                "use_cpu: true\n", "use_cpu: true trains on the CPU", path=ACC),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: 'no'\n",
                "one process: GPU or CPU is not known from the file", path=ACC),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmixed_precision: 'no'\n",
                "CPU training", path=ACC),
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 4\n",
                "the DeepSpeed file decides the precision", path=ACC,
                files={"ds.json": '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n'}),
        Example(_GPU + "mixed_precison: bf16\n", "a misspelt key (CFX405): the author chose a precision", path=ACC),
        Example(_GPU + "mixed_precision: 'no'\n", "the launch passes --mixed_precision", path=ACC,
                files={"train.sh": "accelerate launch --config_file accelerate.yaml --mixed_precision bf16 train.py\n"}),
        Example(_GPU + "mixed_precision: 'no'\n", "the script asks Accelerator for bf16", path=ACC,
                files={"train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator(mixed_precision='bf16')\n"}),
        Example(_GPU + "mixed_precision: 'no'\n", "the launch passes --bf16 to TrainingArguments",
                path=ACC, files={"train.sh": "accelerate launch --config_file accelerate.yaml train.py --bf16\n"}),
    ]
    INVALID = [
        Example(_GPU + "mixed_precision: 'no'\n", "the accelerate config default", path=ACC, line=4,
                files={"train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"},
                fixed=_GPU + "mixed_precision: 'bf16'\n"),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n",
                "no mixed_precision at all", path=ACC, line=2,
                files={"train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"},
                fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n"
                      "mixed_precision: bf16\n"),
    ]
