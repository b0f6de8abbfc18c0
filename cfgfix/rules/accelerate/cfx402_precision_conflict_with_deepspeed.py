"""CFX402 precision-conflict-with-deepspeed."""

from __future__ import annotations

from cfgfix.core import Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.rules.accelerate.common import ACC, HEAD
from cfgfix.rules.base import Example, ProjectRule, register


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
    folder, then the project root, then the launched script's folder. Not reported when every
    launch of the YAML passes `--mixed_precision`: the command line's value is the one
    accelerate checks (its `launch.py` reads the YAML's only when the flag is absent).

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
            if link.launches and all(launch.option("mixed_precision") is not None for launch in link.launches):
                continue  # every launch's --mixed_precision beats the YAML's (accelerate's launch.py)
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
        Example(_FILE + "mixed_precision: fp16\n", "every launch passes --mixed_precision: the YAML's is not read",
                path=ACC, files={"ds.json": _BF16, "train.sh": "accelerate launch --config_file accelerate.yaml "
                                                              "--mixed_precision bf16 train.py\n"}),
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
