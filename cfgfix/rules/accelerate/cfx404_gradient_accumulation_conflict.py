"""CFX404 gradient-accumulation-conflict."""

from __future__ import annotations

from cfgfix.core import Related, Severity
from cfgfix.rules.accelerate.common import HEAD
from cfgfix.rules.base import Example, ProjectRule, register


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
        from cfgfix.project import script_path

        for known, launch_file in project.launches:
            if known is launch and (launch.script or launch.module):
                script = script_path(launch, launch_file, project.root)
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
