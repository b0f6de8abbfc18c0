"""CFX601 fp32-training."""

from __future__ import annotations

from cfgfix.core import Applicability, Fix, Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.decisions import Decisions
from cfgfix.rules.setup.common import CONFIG_SOURCES, flip_edit, gpu_bf16, is_int, weights_may_be_half


def _on_gpu(setup) -> bool:
    """The launch certainly trains on GPUs: several processes under a distributed launcher,
    CUDA_VISIBLE_DEVICES set, or a target GPU in the settings."""
    launch = setup.launch
    if launch.cuda_devices and launch.cuda_devices.strip() not in ("", "-1"):
        return True
    world = setup.values.get("world_size")
    if launch.launcher in ("torchrun", "deepspeed", "accelerate") and world is not None and is_int(world.value) and world.value > 1:
        return True
    return "gpu" in setup.values


@register
class Fp32Training(ProjectRule):
    """## What it does
    Flags a training config (YAML/JSON, or a Python config module the script imports) that
    makes a GPU launch train in full fp32: `mixed_precision: "no"`, or `bf16` and `fp16` both
    `false`, where nothing else gives the run a 16-bit precision (no 16-bit weights loaded or
    cast in the script, no DeepSpeed `fp16`/`bf16` block enabled, no quantized base).

    A launch counts as a GPU launch when it starts several processes under torchrun,
    deepspeed or accelerate, sets `CUDA_VISIBLE_DEVICES`, or when the settings name a target
    GPU. A config that no launch uses is not reported: nothing says where it runs.

    ## Why is this bad?
    fp32 activations take twice the memory of bf16/fp16 autocast, and fp32 matmuls run at a
    fraction of the tensor-core throughput of every GPU since Volta. Mixed precision keeps
    fp32 weights and optimizer states, so the model's numerics barely change.

    ## Example
    ```yaml
    per_device_train_batch_size: 4
    bf16: false
    fp16: false
    ```

    ## Use instead
    ```yaml
    per_device_train_batch_size: 4
    bf16: true
    fp16: false
    ```

    ## Fix safety
    Unsafe: mixed precision changes numerics, and bf16 needs an Ampere or newer GPU (the fix
    writes fp16 when the target GPU lacks bf16).

    ## References
    - facts.md A5, C15(a); HF "Model memory anatomy"; accelerate `mixed_precision`
    """

    code = "CFX601"
    name = "fp32-training"
    severity = Severity.WARNING
    fix_availability = "unsafe"

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        decisions = Decisions(self)  # a config read by several launches: one finding, each launch related
        for setup in training_setups(project):
            precision = setup.values.get("precision")
            mixed = setup.values.get("mixed_precision")
            if precision is None or precision.value != "fp32" or mixed is None or mixed.span is None:
                continue
            source = next((name for name in CONFIG_SOURCES
                           if any(v.span == mixed.span for v in setup.sources.get(name, {}).values())), None)
            if source is None or "quantization" in setup.values or not _on_gpu(setup):
                continue
            if weights_may_be_half(setup):
                continue  # the weights' dtype is decided elsewhere (a config key, a run-time value)
            if any(setup.values.get(k) is not None and setup.values[k].value is True for k in ("offload_param",)):
                continue
            target = _half_for(setup)
            found = setup.sources[source]
            if mixed.name == "mixed_precision":
                edit = flip_edit(project, found["mixed_precision"], target)
                change = f"mixed_precision {target}"
            else:
                edit = flip_edit(project, found[target], True) if target in found else None
                change = f"{target} true"
            decisions.add(
                mixed.span,
                f"{mixed.origin} makes this GPU launch train in full fp32: twice the activation memory of "
                f"{target} autocast and a fraction of the tensor-core speed; mixed precision keeps fp32 weights "
                f"and optimizer states",
                fix=Fix((edit,), f"Set {change}", Applicability.UNSAFE) if edit is not None else None,
                related=[Related(setup.launch.span, "launched here")],
            )
        yield from decisions.findings()

    _CONFIG = "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nbf16: {bf16}\nfp16: false\n"
    _SCRIPT = "from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained('org/m'{dtype})\n"
    _TORCHRUN = "torchrun --nproc_per_node 4 train.py --config train.yaml\n"
    VALID = [
        Example(_CONFIG.format(bf16="true"), "bf16 on", path="train.yaml",
                files={"train.sh": _TORCHRUN, "train.py": _SCRIPT.format(dtype="")}),
        Example(_CONFIG.format(bf16="false"), "a single CPU-or-GPU python launch: where it runs is unknown",
                path="train.yaml", files={"train.sh": "python train.py --config train.yaml\n",
                                          "train.py": _SCRIPT.format(dtype="")}),
        Example(_CONFIG.format(bf16="false"), "the script loads bf16 weights: pure bf16 training, not fp32",
                path="train.yaml", files={"train.sh": _TORCHRUN,
                                          "train.py": "import torch\n" + _SCRIPT.format(dtype=", torch_dtype=torch.bfloat16")}),
        Example(_CONFIG.format(bf16="false"), "no launch uses the config", path="train.yaml"),
        Example(_CONFIG.format(bf16="false") + "torch_dtype: bfloat16\n", "the config loads bf16 weights itself",
                path="train.yaml", files={"train.sh": _TORCHRUN, "train.py": _SCRIPT.format(dtype="")}),
        Example(_CONFIG.format(bf16="false"), "the load's dtype is computed at run time", path="train.yaml",
                files={"train.sh": _TORCHRUN,
                       "train.py": "import torch\n" + _SCRIPT.format(dtype=", torch_dtype=getattr(torch, cfg['dtype'])")}),
        Example("per_device_train_batch_size: 4\nlearning_rate: 1.0e-4\n", "precision not stated", path="train.yaml",
                files={"train.sh": _TORCHRUN, "train.py": _SCRIPT.format(dtype="")}),
        Example(_CONFIG.format(bf16="false"), "the launch's DeepSpeed config enables bf16", path="train.yaml",
                files={"train.sh": "deepspeed --num_gpus 4 train.py --config train.yaml --deepspeed ds.json\n",
                       "ds.json": '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n',
                       "train.py": _SCRIPT.format(dtype="")}),
    ]
    INVALID = [
        Example(_CONFIG.format(bf16="false"), "bf16 and fp16 off, 4 GPUs", path="train.yaml", line=3,
                files={"train.sh": _TORCHRUN, "train.py": _SCRIPT.format(dtype="")},
                fixed=_CONFIG.format(bf16="true")),
        Example("TRAINING = {\n    'per_device_train_batch_size': 4,\n    'mixed_precision': 'no',\n}\n",
                "a Python config module", path="config.py", line=3,
                files={"run.sh": "CUDA_VISIBLE_DEVICES=0 python train.py\n",
                       "train.py": "from config import TRAINING\n" + _SCRIPT.format(dtype="")},
                fixed="TRAINING = {\n    'per_device_train_batch_size': 4,\n    'mixed_precision': 'bf16',\n}\n"),
    ]


def _half_for(setup) -> str:
    """bf16 unless the target GPU is known to lack it."""
    gpu = setup.values.get("gpu")
    if gpu is not None:
        supports = gpu_bf16(gpu.value)
        if supports is False:
            return "fp16"
    return "bf16"
