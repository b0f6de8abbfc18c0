"""CFX506 zero3-save-without-gather."""

from __future__ import annotations

from cfgfix.analysis.deepspeed_config import ast_name, checked_docs, script_uses, zero_block, zero_entry, zero_stage
from cfgfix.core import Applicability, Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.rules.base import Example, ProjectRule, register

GATHER = "stage3_gather_16bit_weights_on_model_save"  # the name accelerate's error message uses


def _insert_true(doc, mapping, key: str):
    """An edit that adds `key: true` as the last entry of `mapping`, in its style."""
    from cfgfix.documents.config_edits import insert_entry

    return insert_entry(doc, mapping, key, True)


@register
class Zero3SaveWithoutGather(ProjectRule):
    """## What it does
    Flags a ZeRO-3 DeepSpeed config without `"stage3_gather_16bit_weights_on_model_save":
    true` when a launch runs it with a training script that saves the model through the HF
    Trainer (`trainer.save_model`, or `save_pretrained` on the model in a script that builds
    a `Trainer`) or accelerate (`accelerator.save_model`, `accelerator.get_state_dict`).

    ## Why is this bad?
    Under ZeRO-3 every GPU holds a shard of each weight; a weights file needs them gathered
    first, and DeepSpeed gathers only when this key is true (its default is false, and
    accelerate's generated configs write false). accelerate's `get_state_dict` (and so
    `accelerator.save_model`) raises "Cannot get 16bit model weights because
    `stage3_gather_16bit_weights_on_model_save` in DeepSpeed config is False". The HF
    Trainer catches that error, logs it and writes a DeepSpeed checkpoint instead: the run
    finishes, and the output folder has no usable weights file, only shards to recover
    with `zero_to_fp32.py`.

    The option is read under every name DeepSpeed accepts: the alias
    `stage3_gather_16bit_weights_on_model_save`, its pydantic field name
    `gather_16bit_weights_on_model_save` (DeepSpeed populates its config models by name too)
    and the deprecated `stage3_gather_fp16_weights_on_model_save`. Nothing is reported when
    the key is `"auto"` (what fills it depends on the integration),
    when the script saves with `engine.save_checkpoint` (the full ZeRO checkpoint, on
    purpose), or when no launch links the config to a script that saves this way.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "overlap_comm": true}, "bf16": {"enabled": "auto"}}
    ```
    used by `deepspeed train.py --deepspeed ds.json`, where `train.py` ends with
    `trainer.save_model(out)`.

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "overlap_comm": true,
                           "stage3_gather_16bit_weights_on_model_save": true},
     "bf16": {"enabled": "auto"}}
    ```

    ## Fix safety
    Safe: the fix sets the key to true (or adds it to `zero_optimization`). Training is
    unchanged; saving gathers the 16-bit weights onto one process, as the save call expects.

    ## References
    - facts.md C12 (Saving with ZeRO-3); accelerate `Accelerator.get_state_dict`;
      transformers `Trainer.save_model`; DeepSpeed 0.19.8 `runtime/zero/config.py`
      (`gather_16bit_weights_on_model_save`, alias `stage3_...`) and `runtime/config_utils.py`
      (`populate_by_name=True`)
    """

    code = "CFX506"
    name = "zero3-save-without-gather"
    severity = Severity.WARNING
    fix_availability = "safe"

    def check_project(self, project):
        for path, uses, doc in checked_docs(project):
            zero = zero_block(doc.root)
            if zero is None or zero.get("stage") is None or zero_stage(zero) != 3:
                continue
            # any name DeepSpeed reads: the alias, the field name, the deprecated fp16 name
            gather = zero_entry(zero, GATHER)
            if gather is not None and gather[1].truthy() is not False:
                continue  # true, "auto" or something unknown: stay silent
            saves = [(use, source, facts.hf_saves[0]) for use, source, facts in script_uses(project, uses)
                     if facts.hf_saves and not facts.save_checkpoint]
            if not saves:
                continue
            use, source, (call, how) = saves[0]
            where = f"{source.path}:{call.lineno}"
            saved = ast_name(call)
            if how == "trainer":
                what = ("the HF Trainer catches accelerate's 'Cannot get 16bit model weights' error and writes a "
                        "DeepSpeed checkpoint instead: no usable weights file, only shards for zero_to_fp32.py")
            else:
                what = ("accelerate's get_state_dict raises 'Cannot get 16bit model weights because "
                        "stage3_gather_16bit_weights_on_model_save in DeepSpeed config is False'")
            related = [Related(source.span_of_node(call), f"saved here through {'the HF Trainer' if how == 'trainer' else 'accelerate'}")]
            related += [r for use, _, _ in saves for r in use.related]
            if gather is not None:
                span = doc.span(gather[1])
                state = f"{gather[0].value} is false"
                edit = replace_scalar(doc, gather[1], True)
            else:
                span = doc.span(zero.entry("stage")[0])
                state = f"ZeRO-3 without {GATHER}: true (the default is false)"
                edit = _insert_true(doc, zero, GATHER)
            yield self.finding(
                span,
                f"{state}, and {where} saves the model with {saved}: {what}",
                fix=Fix((edit,), f"Set {GATHER} to true", Applicability.SAFE) if edit is not None else None,
                related=related,
            )

    _DS3 = '{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {\n    "stage": 3,\n' \
           '    "overlap_comm": true%s\n  }\n}\n'
    _TRAINER = ("from transformers import Trainer\n\ntrainer = Trainer(model=model, args=args)\ntrainer.train()\n"
                "trainer.save_model(args.output_dir)\n")
    _ACCEL = ("from accelerate import Accelerator\n\naccelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
              "accelerator.save_model(model, 'out')\n")
    _LAUNCH = {"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.json\n"}
    VALID = [
        Example(_DS3 % ',\n    "stage3_gather_16bit_weights_on_model_save": true', "the key is true", path="ds.json",
                files={**_LAUNCH, "train.py": _TRAINER}),
        Example(_DS3 % ',\n    "gather_16bit_weights_on_model_save": true',
                "the option's pydantic field name, which DeepSpeed also reads", path="ds.json",
                files={**_LAUNCH, "train.py": _TRAINER}),
        Example(_DS3 % ',\n    "stage3_gather_fp16_weights_on_model_save": true',
                "the deprecated fp16 name, which DeepSpeed maps to the option (CFX504 reports it)", path="ds.json",
                files={**_LAUNCH, "train.py": _TRAINER}),
        Example(_DS3 % ',\n    "stage3_gather_16bit_weights_on_model_save": "auto"',
                "\"auto\": filled by the integration, not known from the files", path="ds.json",
                files={**_LAUNCH, "train.py": _TRAINER}),
        Example(_DS3.replace('"stage": 3', '"stage": 2') % "", "ZeRO-2 keeps whole weights on every GPU",
                path="ds.json", files={**_LAUNCH, "train.py": _TRAINER}),
        Example(_DS3 % "", "no launch links the config to a script", path="ds.json"),
        Example(_DS3 % "", "the script saves the full ZeRO checkpoint with save_checkpoint", path="ds.json",
                files={**_LAUNCH, "train.py": _TRAINER + "trainer.model_wrapped.save_checkpoint('ckpt')\n"}),
        Example(_DS3 % "", "the script never saves the model (tokenizer.save_pretrained only)", path="ds.json",
                files={**_LAUNCH, "train.py": "from transformers import Trainer\n\ntrainer = Trainer(model=model)\n"
                                              "trainer.train()\ntokenizer.save_pretrained('out')\n"}),
        Example(_DS3 % "", "a bare deepspeed.initialize script, not the HF Trainer or accelerate", path="ds.json",
                files={**_LAUNCH, "train.py": "import deepspeed\n\nengine, _, _, _ = deepspeed.initialize(model=model)\n"
                                              "engine.save_16bit_model('out')\n"}),
    ]
    INVALID = [
        Example(_DS3 % "", "HF Trainer saving, key absent: inserted", path="ds.json", line=4,
                files={**_LAUNCH, "train.py": _TRAINER},
                fixed=_DS3 % ',\n    "stage3_gather_16bit_weights_on_model_save": true'),
        Example(_DS3 % ',\n    "stage3_gather_16bit_weights_on_model_save": false', "accelerate saving, key false",
                path="ds.json", line=6,
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                          "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n",
                       "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": _ACCEL},
                fixed=_DS3 % ',\n    "stage3_gather_16bit_weights_on_model_save": true'),
        Example(_DS3 % ',\n    "gather_16bit_weights_on_model_save": false',
                "the field name, false: the value is set where it is written", path="ds.json", line=6,
                files={**_LAUNCH, "train.py": _TRAINER},
                fixed=_DS3 % ',\n    "gather_16bit_weights_on_model_save": true'),
        Example("zero_optimization:\n  stage: 3\n  overlap_comm: true  # keep\ntrain_micro_batch_size_per_gpu: 1\n",
                "a YAML config: the key is added with the block's indentation", path="ds.yaml", line=2,
                files={"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.yaml\n", "train.py": _TRAINER},
                fixed="zero_optimization:\n  stage: 3\n  overlap_comm: true  # keep\n"
                      "  stage3_gather_16bit_weights_on_model_save: true\ntrain_micro_batch_size_per_gpu: 1\n"),
    ]
