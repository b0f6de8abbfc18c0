"""CFX403 deepspeed-file-with-inline-keys."""

from __future__ import annotations

from cfgfix.analysis import accelerate_keys as keys
from cfgfix.core import Fix, Related, Severity
from cfgfix.rules.accelerate.common import ACC, HEAD, ds_block
from cfgfix.rules.base import Example, ProjectRule, register


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
    is not flagged. When every launch of the file passes `--mixed_precision`, the YAML's
    `mixed_precision` is not the config's (accelerate 1.x `launch.py`, `mp_from_config_flag`):
    it is latent, reported as a warning that names the launches, and rejected only at a
    launch without the flag. The `deepspeed_config` block's keys are rejected whatever the
    command line says.

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
            block = ds_block(root)
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
                if key.value == "mixed_precision" and link.launches and all(
                        launch.option("mixed_precision") is not None for launch in link.launches):
                    # accelerate 1.x counts mixed_precision as the config's only when the command
                    # line leaves it out (launch.py: mp_from_config_flag)
                    yield self.finding(
                        doc.span(key),
                        f"deepspeed_config_file is set, and every launch passes --mixed_precision, so this "
                        f"{what} is latent: accelerate ignores it now and rejects it (ValueError) at a launch "
                        f"without that flag{tail}",
                        fix=fix, related=related + [Related(launch.span, "passes --mixed_precision")
                                                    for launch in link.launches],
                        severity=Severity.WARNING,
                    )
                    continue
                yield self.finding(
                    doc.span(key),
                    f"deepspeed_config_file is set, so accelerate rejects {what} at launch (ValueError){tail}",
                    fix=fix, related=related,
                )

    @staticmethod
    def _runs_deepspeed(project, link) -> bool:
        """A launch of this config runs DeepSpeed: its `--use_deepspeed`, else the YAML's
        distributed_type when the command line names no other (`--multi_gpu`, `--use_fsdp`,
        `--cpu`, ... replace it: accelerate 1.15.0 `_validate_launch_command`)."""
        kind = link.doc.root.get("distributed_type")
        yaml_deepspeed = kind is not None and kind.kind == "scalar" and kind.value == "DEEPSPEED"
        if not link.launches:
            return yaml_deepspeed
        others = ("use_fsdp", "multi_gpu", "cpu", "tpu", "use_megatron_lm")
        return any(launch.option("use_deepspeed") is not None
                   or (yaml_deepspeed and not any(launch.option(other) is not None for other in others))
                   for launch in link.launches)

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
        Example(HEAD + "deepspeed_config:\n  deepspeed_config_file: ds.json\nmixed_precision: fp16\n",
                "every launch overrides mixed_precision on the command line: latent (a warning), not rejected",
                path=ACC, line=5, files={"ds.json": _DS, "train.sh": "accelerate launch --config_file accelerate.yaml "
                                                                      "--mixed_precision bf16 train.py\n"}),
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
