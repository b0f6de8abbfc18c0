"""CFX603 effective-batch-mismatch."""

from __future__ import annotations

import re

from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.setup.common import CONFIG_SOURCES, is_int

_PARALLEL = re.compile(r"(tensor|pipeline|context|sequence)_(model_)?parallel|\btp_size\b|\bpp_size\b", re.IGNORECASE)


def _model_parallel(project, setup) -> bool:
    """The launch's training config or flags mention model parallelism (Megatron-style
    tensor / pipeline / context parallel sizes)."""
    if any(_PARALLEL.search(text) for text, _ in setup.launch.args):
        return True
    path = setup.files.get("training config")
    doc = project.read(path) if path is not None else None
    return bool(doc is not None and _PARALLEL.search(doc.source.text))


@register
class EffectiveBatchMismatch(ProjectRule):
    """## What it does
    Flags a launch whose configs imply different effective batch sizes: a per-GPU batch that
    one file sets and another file of the same launch silently overrides (a DeepSpeed
    `train_micro_batch_size_per_gpu` against the training config's), or a stated global batch
    (`global_batch_size`, `total_batch_size`, `effective_batch_size`) that is not micro batch ×
    accumulation × processes.

    Differences in gradient accumulation alone are CFX404's; a DeepSpeed value that the HF
    Trainer checks against TrainingArguments is CFX511's.

    ## Why is this bad?
    The learning rate, warm-up and schedule were tuned for one effective batch; the run
    trains with another, and the log or the config that people read says something else
    than what happens. When a DeepSpeed micro batch disagrees with the data loader's, the
    DeepSpeed throughput and sample counts are wrong too.

    ## Example
    ```yaml
    # train.yaml, launched on 8 GPUs
    per_device_train_batch_size: 4
    gradient_accumulation_steps: 4
    global_batch_size: 64
    ```

    ## Use instead
    ```yaml
    per_device_train_batch_size: 4
    gradient_accumulation_steps: 2
    global_batch_size: 64
    ```

    ## Fix safety
    No fix: which number is the intended one is the author's call.

    ## References
    - facts.md B10, C12 (batch arithmetic)
    """

    code = "CFX603"
    name = "effective-batch-mismatch"
    severity = Severity.WARNING

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        seen: set[tuple] = set()
        for setup in training_setups(project):
            for finding in self._stated_global(setup, project) + self._overridden_micro(setup):
                key = (finding.span.path, finding.span.start)
                if key not in seen:
                    seen.add(key)
                    yield finding

    def _stated_global(self, setup, project) -> list:
        micro, accum, world = (setup.values.get(k) for k in ("micro_batch", "grad_accum", "world_size"))
        effective = setup.values.get("effective_batch")
        if effective is None or micro.span is None or accum.span is None:
            return []  # a default in the product: the stated total may be what the author meant
        if _model_parallel(project, setup):
            return []  # tensor / pipeline parallel ranks share a batch: data-parallel size unknown
        out = []
        for source in ("flags",) + CONFIG_SOURCES:
            stated = setup.sources.get(source, {}).get("global_batch")
            if stated is None or not is_int(stated.value) or stated.value == effective.value:
                continue
            out.append(self.finding(
                stated.span,
                f"{stated.origin} says {stated.value}, but this launch trains with an effective batch of "
                f"{effective.value} ({micro.value} per GPU x {accum.value} accumulation x {world.value} processes)",
                related=[Related(v.span, v.origin) for v in (micro, accum, world) if v.span is not None],
            ))
        return out

    def _overridden_micro(self, setup) -> list:
        deepspeed = setup.sources.get("deepspeed config", {}).get("micro_batch")
        if deepspeed is None or setup.trainer:
            return []  # with the HF Trainer a disagreement raises (CFX511)
        for source in ("flags",) + CONFIG_SOURCES:
            other = setup.sources.get(source, {}).get("micro_batch")
            if other is None or not is_int(other.value) or other.value == deepspeed.value:
                continue
            return [self.finding(
                deepspeed.span,
                f"{deepspeed.origin} is {deepspeed.value} while {other.origin} is {other.value}: the two files of "
                f"this launch disagree on the per-GPU batch, so the effective batch is not what one of them says",
                related=[Related(other.span, other.origin), Related(setup.launch.span, "launched here")],
            )]
        return []

    _YAML = "per_device_train_batch_size: 4\ngradient_accumulation_steps: {accum}\nglobal_batch_size: 64\nbf16: true\n"
    VALID = [
        Example(_YAML.format(accum=2), "4 x 2 x 8 = 64", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n"}),
        Example(_YAML.format(accum=4), "world size unknown", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node $NGPU train.py --config train.yaml\n"}),
        Example(_YAML.format(accum=4), "no launch", path="train.yaml"),
        Example(_YAML.format(accum=4) + "tensor_model_parallel_size: 2\n",
                "tensor parallel ranks share a batch: 4 x 4 x 8 / 2 = 64", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n"}),
    ]
    INVALID = [
        Example(_YAML.format(accum=4), "4 x 4 x 8 = 128, not 64", path="train.yaml", line=3,
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n"}),
        Example('{\n  "train_micro_batch_size_per_gpu": 8,\n  "gradient_accumulation_steps": 2,\n'
                '  "zero_optimization": {"stage": 2}\n}\n',
                "the DeepSpeed micro batch vs the training config's (accelerate script)", path="ds.json", line=2,
                files={"train.sh": "accelerate launch --config_file acc.yaml train.py --config train.yaml\n",
                       "acc.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                   "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n",
                       "train.yaml": "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nbf16: true\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"}),
    ]
