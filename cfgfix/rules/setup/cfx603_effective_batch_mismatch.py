"""CFX603 effective-batch-mismatch."""

from __future__ import annotations

from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.setup.common import CONFIG_SOURCES, is_int


def _script_missing(setup) -> bool:
    """The launch runs a `.py` file the project does not hold (CFX310 reports it): its flags'
    meaning is unknown here."""
    launch = setup.launch
    written = getattr(launch, "script", None)
    return setup.script is None and bool(written) and not getattr(launch, "module", None) \
        and written.endswith(".py") and "$" not in written and not written.startswith("/")


def _model_parallel(project, setup):
    """The launch's model-parallel sizes (its flags and its training config; Megatron-style
    tensor / pipeline / context parallel): a group of those ranks shares one batch."""
    from cfgfix.analysis.model_parallel import from_sources

    path = setup.files.get("training config")
    doc = project.read(path) if path is not None else None
    return from_sources(setup.launch.args, doc, project.display(path) if doc is not None else "")


@register
class EffectiveBatchMismatch(ProjectRule):
    """## What it does
    Flags a launch whose configs imply different effective batch sizes: a per-GPU batch that
    one file sets and another file of the same launch silently overrides (a DeepSpeed
    `train_micro_batch_size_per_gpu` against the training config's), or a stated global batch
    (`global_batch_size`, `total_batch_size`, `effective_batch_size`) that is not micro batch ×
    accumulation × data-parallel ranks: the processes, divided by the tensor, pipeline and
    context parallel sizes the launch's flags or training config state
    (`tensor_parallel_size: 2`, `--tensor-model-parallel-size 2`), whose ranks share a batch.
    A model-parallel size it cannot read (a variable, an expert-parallel size) leaves the
    data-parallel size unknown, and nothing is reported.

    The training `DataLoader(batch_size=...)` of a script with its own loop counts as a
    per-GPU batch too, literal or read from the script's config (`tcfg["batch_size_per_gpu"]`)
    or flags.

    Flags of a launch whose `.py` script the project does not hold are not compared (what
    they mean is up to that script; CFX310 reports the missing file).

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
    - Megatron `megatron/core/parallel_state.py` `initialize_model_parallel`: data-parallel
      size = world / (tensor x pipeline x context model-parallel sizes)
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
        flags = setup.sources.get("flags", {})
        if _script_missing(setup) and any(flags.get(k) is v for k, v in (("micro_batch", micro), ("grad_accum", accum))):
            return []  # what a flag means is up to a script the project does not hold
        parallel = _model_parallel(project, setup)
        if parallel.divisor is None:
            return []  # model-parallel sizes it cannot read: the data-parallel size is unknown
        ranks, how = world.value, f"{world.value} processes"
        if parallel.divisor > 1:
            if not is_int(ranks) or ranks % parallel.divisor:
                return []
            ranks, how = ranks // parallel.divisor, f"{world.value} processes / ({parallel.text})"
        total = effective.value if parallel.divisor == 1 else micro.value * accum.value * ranks
        out = []
        for source in ("flags",) + CONFIG_SOURCES:
            stated = setup.sources.get(source, {}).get("global_batch")
            if stated is None or not is_int(stated.value) or stated.value == total:
                continue
            out.append(self.finding(
                stated.span,
                f"{stated.origin} says {stated.value}, but this launch trains with an effective batch of "
                f"{total} ({micro.value} per GPU x {accum.value} accumulation x {how})",
                related=[Related(v.span, v.origin) for v in (micro, accum, world) if v.span is not None]
                + parallel.related,
            ))
        return out

    def _overridden_micro(self, setup) -> list:
        deepspeed = setup.sources.get("deepspeed config", {}).get("micro_batch")
        if deepspeed is None or setup.trainer:
            return []  # with the HF Trainer a disagreement raises (CFX511)
        for source in ("flags",) + CONFIG_SOURCES + ("script",):
            if source == "flags" and _script_missing(setup):
                continue  # what a flag means is up to a script the project does not hold
            other = setup.sources.get(source, {}).get("micro_batch")
            if source == "script" and (other is None or other.name != "batch_size"):
                continue  # of the script's own values, only its training DataLoader's batch_size
            if other is None or not is_int(other.value) or other.value == deepspeed.value:
                continue
            return [self.finding(
                deepspeed.span,
                f"{deepspeed.origin} is {deepspeed.value} while {other.origin} is {other.value}: the two files of "
                f"this launch disagree on the per-GPU batch, so the effective batch is not what one of them says",
                related=[Related(other.span, other.origin), Related(setup.launch.span, "launched here")],
            )]
        return []

    _OWN_LOOP = ("import yaml\nimport deepspeed\nfrom torch.utils.data import DataLoader\n"
                 "cfg = yaml.safe_load(open('train.yaml'))\ntcfg = cfg['training']\n"
                 "train_loader = DataLoader(train_set, batch_size=tcfg['batch_size_per_gpu'])\n"
                 "eval_loader = DataLoader(eval_set, batch_size=32)\n"
                 "engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config='ds.json')\n")
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
        Example(_YAML.format(accum=4), "a tensor-parallel size on the command line: 4 x 4 x (8 / 2) = 64",
                path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml --tensor_parallel_size 2\n"}),
        Example('{\n  "train_micro_batch_size_per_gpu": 4,\n  "gradient_accumulation_steps": 1,\n'
                '  "zero_optimization": {"stage": 2}\n}\n',
                "the training DataLoader agrees with DeepSpeed; the eval loader's 32 is not the training batch",
                path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 2 train.py --config train.yaml --deepspeed_config ds.json\n",
                       "train.yaml": "training:\n  batch_size_per_gpu: 4\n", "train.py": _OWN_LOOP}),
        Example('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2}\n}\n',
                "the launched script is not in the project: what --per_device_train_batch_size means is unknown",
                path="conf/ds.json",
                files={"scripts/pretrain.sh": "deepspeed --num_gpus=8 finetune/finetune.py --deepspeed_config conf/ds.json "
                                              "--per_device_train_batch_size 12 --gradient_accumulation_steps 2\n"}),
        Example(_YAML.format(accum=2) + "expert_model_parallel_size: 2\n",
                "an expert-parallel size: its effect is not read, unknown", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n"}),
    ]
    INVALID = [
        Example('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2}\n}\n',
                "the same launch with its script in the project: the flag and the JSON disagree",
                path="conf/ds.json", line=2,
                files={"scripts/pretrain.sh": "deepspeed --num_gpus=8 finetune/finetune.py --deepspeed_config conf/ds.json "
                                              "--per_device_train_batch_size 12 --gradient_accumulation_steps 2\n",
                       "finetune/finetune.py": "import deepspeed\nimport argparse\n"
                                               "p = argparse.ArgumentParser()\n"
                                               "p.add_argument('--per_device_train_batch_size', type=int)\n"
                                               "args = p.parse_args()\n"
                                               "loader = DataLoader(ds, batch_size=args.per_device_train_batch_size)\n"
                                               "engine, *_ = deepspeed.initialize(model=model, config=args.deepspeed_config)\n"}),
        Example('{\n  "train_micro_batch_size_per_gpu": 8,\n  "gradient_accumulation_steps": 1,\n'
                '  "zero_optimization": {"stage": 2}\n}\n',
                "the DeepSpeed micro batch vs the training DataLoader's, read from the script's own config",
                path="ds.json", line=2,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --config train.yaml --deepspeed_config ds.json\n",
                       "train.yaml": "training:\n  batch_size_per_gpu: 4\n", "train.py": _OWN_LOOP}),
        Example(_YAML.format(accum=2) + "tensor_parallel_size: 2\n",
                "tensor_parallel_size divides the data-parallel size: 4 x 2 x (8 / 2) = 32, not 64",
                path="train.yaml", line=3,
                files={"train.sh": "torchrun --nproc_per_node 8 train.py --config train.yaml\n"}),
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
