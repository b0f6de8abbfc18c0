"""CFX401 fp32-mixed-precision."""

from __future__ import annotations

from cfgfix.core import Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.rules.accelerate.common import ACC, HEAD, ds_block
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.setup.common import weights_may_be_half

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
    Trainer (whose `TrainingArguments` set the precision). `Accelerator(mixed_precision=
    args.mixed_precision)` does not decide when the launch leaves that flag out and its
    argparse default is None (also in the project module whose `parse_args()` the script
    calls): accelerate then reads the config. The config is the file the launch passes as
    `--config_file`, whatever its name ends with (accelerate reads any name but `.json` as
    YAML). Nor when the launched script trains 16-bit weights (a `from_pretrained(...,
    torch_dtype=torch.bfloat16)` load under FSDP or DDP, a dtype computed at run time): the run
    is pure bf16 then, not fp32, as CFX601 reads it.

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
            block = ds_block(root)
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
        from cfgfix.training.resolve import training_setups

        for setup in training_setups(project):
            if not any(setup.launch is launch for launch in link.launches):
                continue
            precision = setup.values.get("precision")
            if precision is not None and precision.value != "fp32" or weights_may_be_half(setup):
                return True  # the script trains 16-bit weights (a bf16 load): pure bf16, not fp32
        for launch in link.launches:
            text = project.launch_text(launch)
            if text is None or any(flag in text for flag in _PRECISION_FLAGS):
                return True  # unreadable, or the command line sets the precision
            script = own_file = None
            for known, launch_file in project.launches:
                if known is launch:
                    own_file = launch_file
                if known is launch and launch.module:
                    from cfgfix.project import script_path

                    script = script_path(launch, launch_file, project.root)
                elif known is launch and launch.script:
                    script = resolve(launch.script, [launch_file.parent, project.root])
            found = script_facts(project, script) if script is not None else None
            if found is None:
                continue
            facts = found[1]
            if facts.trainer or any(kw.arg == "mixed_precision" and not Fp32MixedPrecision._unset(
                    project, launch, own_file, script, kw.value) for call in facts.accelerator for kw in call.keywords):
                return True
        return False

    @staticmethod
    def _unset(project, launch, launch_file, script, value) -> bool:
        """`Accelerator(mixed_precision=args.mixed_precision)` where this launch does not pass
        the flag and its argparse default is None: accelerate then takes the config's value."""
        from cfgfix.training.resolve_refs import RefResolver
        from cfgfix.training.script import script_setup

        setup = script_setup(project, script)
        ref = setup.refs.ref(value) if setup is not None and setup.refs is not None else None
        if ref is None or ref.is_config:
            return False
        return RefResolver(project, launch, launch_file, script, setup.refs).unset(ref.flag)

    _GPU = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n"
    _FLAG_SCRIPT = ("from accelerate import Accelerator\nfrom options import parse_args\n\n"
                    "def main(args):\n    accelerator = Accelerator(mixed_precision=args.mixed_precision)\n\n"
                    "if __name__ == '__main__':\n    args = parse_args()\n    main(args)\n")
    _PARSER = ("import argparse\n\ndef parse_args():\n    parser = argparse.ArgumentParser()\n"
               "    parser.add_argument('--mixed_precision', default={default}, choices=['no', 'fp16', 'bf16'])\n"
               "    return parser.parse_args()\n")
    VALID = [
        Example(_GPU.replace("MULTI_GPU", "FSDP") + "mixed_precision: 'no'\n",
                "the script trains bf16 weights under FSDP: pure bf16, not fp32 (issue 22)", path=ACC,
                files={"run.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "import torch\nfrom accelerate import Accelerator\n"
                                   "from transformers import AutoModelForCausalLM\n\naccelerator = Accelerator()\n"
                                   "model = AutoModelForCausalLM.from_pretrained('org/m', torch_dtype=torch.bfloat16)\n"
                                   "optimizer = torch.optim.AdamW(model.parameters())\n"
                                   "model, optimizer = accelerator.prepare(model, optimizer)\n"}),
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
        Example(_GPU + "mixed_precision: 'no'\n", "the script's own flag defaults to bf16 (in the module that parses it)",
                path=ACC, files={"train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                                 "train.py": _FLAG_SCRIPT, "options.py": _PARSER.format(default="'bf16'")}),
    ]
    INVALID = [
        Example(_GPU + "mixed_precision: 'no'\n",
                "`Accelerator(mixed_precision=args.mixed_precision)`: the flag's default is None and the launch "
                "does not pass it, so accelerate takes the config's; the config saved as `.sh`",
                path="accelerate.sh", line=4,
                files={"train.sh": "accelerate launch --config_file accelerate.sh train.py\n",
                       "train.py": _FLAG_SCRIPT, "options.py": _PARSER.format(default="None")},
                fixed=_GPU + "mixed_precision: 'bf16'\n"),
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
