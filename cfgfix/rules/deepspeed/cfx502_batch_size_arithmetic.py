"""CFX502 batch-size-arithmetic."""

from __future__ import annotations

from cfgfix.analysis.deepspeed_config import script_uses
from cfgfix.core import Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.rules.base import Example, ProjectRule, register


def _count(node) -> int | None:
    """A positive integer as written; None for "auto", strings, booleans and floats."""
    if node is None or node.kind != "scalar":
        return None
    value = node.value
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _data_parallel_world(root, world: int) -> tuple[int, str] | None:
    """The world size DeepSpeed's batch check multiplies by, and how a message says it: the
    processes, divided by `sequence_parallel_size` (Ulysses), or `data_parallel_size` when
    both are set (a device mesh); None when automatic tensor parallelism or a value this
    cannot read leaves it unknown. DeepSpeed 0.19 `runtime/config.py` (DeepSpeedConfig
    world_size) and `deepspeed/__init__.py` (initialize builds the mesh)."""
    tensor = root.get("tensor_parallel")
    if tensor is not None and tensor.kind == "mapping" and tensor.get("autotp_size") is not None:
        size = tensor.get("autotp_size")
        if not (size.kind == "scalar" and size.value in (0, 1) and not isinstance(size.value, bool)):
            return None
    if root.get("sequence_parallel_size") is None:
        return world, f"{world} processes"
    sequence = _count(root.get("sequence_parallel_size"))
    if sequence is None:
        return None
    if root.get("data_parallel_size") is not None:
        data = _count(root.get("data_parallel_size"))
        return (data, f"data_parallel_size {data}") if data is not None else None
    if world % sequence:
        return None
    return world // sequence, f"{world} processes / sequence_parallel_size {sequence}"


def _pipeline_stages(project, uses) -> int | None:
    """The pipeline stages of the launched scripts' `PipelineModule(..., num_stages=N)`
    (DeepSpeed counts data-parallel ranks: processes / stages); 1 without a pipeline, None
    when the count is not a literal or the scripts disagree."""
    import ast

    found: set[int | None] = set()
    for use in uses:
        parsed = project.script(use.script) if use.script is not None else None
        if parsed is None or "PipelineModule" not in parsed[0].text:
            continue
        for node in ast.walk(parsed[1]):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "PipelineModule":
                stages = next((kw.value for kw in node.keywords if kw.arg == "num_stages"), None)
                found.add(stages.value if isinstance(stages, ast.Constant) and isinstance(stages.value, int)
                          and not isinstance(stages.value, bool) and stages.value > 0 else None)
    if not found:
        return 1
    return found.pop() if len(found) == 1 else None


def _model_parallel(project, uses):
    """The model-parallel sizes the launches state (their flags, their script's --config),
    when they all agree; None when unknown or they disagree (analysis/model_parallel.py)."""
    from cfgfix.analysis.model_parallel import ModelParallel, from_sources

    found = []
    for use in uses:
        doc = project.read(use.training_config) if use.training_config is not None else None
        label = project.display(use.training_config) if doc is not None else ""
        found.append(from_sources(use.args, doc, label))
    if not found:
        return ModelParallel()
    first = found[0]
    if first.divisor is None or any((f.divisor, f.megatron) != (first.divisor, first.megatron) for f in found):
        return None
    return first


def _passes_mpu(project, uses) -> bool:
    """A launched script hands `mpu=` to deepspeed.initialize (Megatron-style model
    parallelism): DeepSpeed then takes the data-parallel size from it, not the processes."""
    return any(kw.arg == "mpu" for _, _, facts in script_uses(project, uses)
               for call in facts.initialize for kw in call.keywords)


@register
class BatchSizeArithmetic(ProjectRule):
    """## What it does
    Flags a DeepSpeed config whose `train_batch_size` is not
    `train_micro_batch_size_per_gpu` × `gradient_accumulation_steps` × the world size, where
    all three numbers are known: the two keys are integers in the file and the world size
    comes from the launches that use it (`--num_processes`, `--nproc_per_node` × nodes,
    `--num_gpus`, `deepspeed --hostfile` (its first `--num_nodes` hosts, `--num_gpus` or
    their slots each), `--include host:0,1`, or the accelerate config's `num_processes`).
    Under pipeline parallelism (`PipelineModule(num_stages=N)` in the launched script) the
    world size is the data-parallel one, processes / N. Under Megatron's model parallelism
    (`--tensor-model-parallel-size T`, `--pipeline-model-parallel-size P`,
    `--context-parallel-size C` on the launch, whose groups Megatron hands to DeepSpeed) or
    with an `mpu=` passed to `deepspeed.initialize` and the sizes stated in the launch's flags
    or its script's `--config` (`tensor_parallel_size: 2`), it is processes / (T x P x C).
    When a key is missing, DeepSpeed
    derives it with floor division and asserts the same product: `train_batch_size` 33 with
    micro 17 on 2 GPUs derives 33 // 17 // 2 = 0 accumulation steps ("has to be greater
    than 0"); such a derived failure is reported too, without a fix. A JSON that a launch
    passes as its DeepSpeed config (`--deepspeed_config tiny.json`) is one, even when its
    keys alone (`{"train_batch_size": 8}`) do not say so.

    ## Why is this bad?
    DeepSpeed asserts before the first step: "Check batch related parameters.
    train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size
    16 != 2 * 4 * 4". The numbers are usually right for the machine the config was written
    on and wrong for the one it runs on. Nothing is reported when any of the three is
    `"auto"` (the HF Trainer or accelerate fills it) or unknown, or when the launches that
    use the file disagree about the world size. With `sequence_parallel_size` DeepSpeed
    counts data-parallel ranks only (the processes divided by it, or `data_parallel_size`
    when that is set too), and so does this check; with automatic tensor parallelism
    (`tensor_parallel.autotp_size` above 1), an `mpu=` passed to `deepspeed.initialize` whose
    sizes no launch states, model-parallel sizes that DeepSpeed is not told about (no
    Megatron flags and no `mpu=`: its own world may be every process), or a size it cannot
    read (`--tp_size $TP`, an expert-parallel size), the data-parallel size is not known from
    the files, and nothing is reported. A size of 1 changes nothing.

    ## Example
    ```json
    {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    ```
    launched with `accelerate launch --num_processes 4` (2 × 4 × 4 = 32).

    ## Use instead
    ```json
    {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
    ```
    or `"train_batch_size": "auto"` under the HF Trainer or accelerate, or leave it out:
    DeepSpeed derives it from the other two.

    ## Fix safety
    Safe: the fix writes the product, the only value DeepSpeed accepts for this launch; the
    per-GPU batch and the accumulation, which decide memory and the optimizer step, stay.

    ## References
    - facts.md C12; DeepSpeed `runtime/config.py` (`_batch_assertion`, and the world size in
      `DeepSpeedConfig.__init__`: `mpu.get_data_parallel_world_size()` when an mpu is
      given, else every process / `sequence_parallel_size`), `deepspeed/__init__.py`
      (`initialize`: the device mesh; a `PipelineModule` brings its own mpu)
    - Megatron `megatron/core/parallel_state.py` `initialize_model_parallel`: data-parallel
      size = world / (tensor x pipeline x context model-parallel sizes)
    """

    code = "CFX502"
    name = "batch-size-arithmetic"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_project(self, project):
        for path, uses in project.deepspeed_uses().items():
            if path not in project.displays:
                continue  # not a file of this run: reported when it is checked
            yield from self._no_batch_size(project, path, uses)
            worlds = {use.world_size for use in uses}
            if len(worlds) != 1 or None in worlds:
                continue  # unknown, or launches that disagree: no single right number
            world = worlds.pop()
            doc = project.read(path)
            if doc is None:
                continue
            root = doc.root
            total, micro, steps = (root.get(k) for k in
                                   ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
            numbers = [_count(total), _count(micro), _count(steps)]
            data_parallel = _data_parallel_world(root, world)
            parallel = _model_parallel(project, uses)
            if data_parallel is None or parallel is None:
                continue  # model/sequence parallel groups this cannot size: no single right number
            megatron = parallel.megatron and parallel.divisor > 1
            if _passes_mpu(project, uses) and not (parallel.divisor > 1):
                continue  # an mpu whose sizes no launch states
            if parallel.divisor > 1 and not (megatron or _passes_mpu(project, uses)):
                continue  # sizes DeepSpeed is not told about (no mpu): its own world may be all processes
            stages = _pipeline_stages(project, uses)
            if stages is None or (stages > 1 and parallel.divisor > 1):
                continue  # a computed stage count, or stages counted twice: the data-parallel size is unknown
            world, processes = data_parallel
            if stages > 1:
                if world % stages:
                    continue
                world, processes = world // stages, f"{processes} / {stages} pipeline stages"
            if parallel.divisor > 1:
                if world % parallel.divisor or data_parallel[1] != f"{world} processes":
                    continue  # not a whole number of groups, or sequence parallelism on top: unknown
                world, processes = world // parallel.divisor, f"{processes} / ({parallel.text})"
            if None in numbers:
                yield from self._derived(doc, (total, micro, steps), numbers, world, processes, uses)
                continue
            total_n, micro_n, steps_n = numbers
            product = micro_n * steps_n * world
            if total_n == product:
                continue
            related = [Related(doc.span(micro), f"micro batch {micro_n}"),
                       Related(doc.span(steps), f"gradient accumulation {steps_n}")]
            related += [r for use in uses for r in use.related] + parallel.related
            yield self.finding(
                doc.span(total),
                f"train_batch_size {total_n} != train_micro_batch_size_per_gpu {micro_n} x "
                f"gradient_accumulation_steps {steps_n} x {processes} = {product}: DeepSpeed asserts "
                f"'train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size' "
                f"before the first step",
                fix=Fix((replace_scalar(doc, total, product),), f"Set train_batch_size to {product}"),
                related=related,
            )

    def _no_batch_size(self, project, path, uses):
        """Neither `train_batch_size` nor `train_micro_batch_size_per_gpu`: DeepSpeed asserts
        whatever the world size, and neither the HF Trainer nor accelerate adds a missing key
        (they replace "auto" values only). Silent when a launched script names either key:
        it may set it in code before DeepSpeed reads the config."""
        doc = project.read(path)
        if doc is None or doc.root is None or doc.root.kind != "mapping":
            return
        root = doc.root
        if root.get("train_batch_size") is not None or root.get("train_micro_batch_size_per_gpu") is not None:
            return
        if any("train_batch_size" in source.text or "train_micro_batch_size_per_gpu" in source.text
               for _, source, _ in script_uses(project, uses)):
            return
        if any(use.script is None for use in uses):
            return  # a launch whose script this cannot read
        steps = root.get("gradient_accumulation_steps")
        anchor = steps if steps is not None else root
        related = [r for use in uses for r in use.related]
        yield self.finding(
            doc.span(anchor) if steps is not None else doc.source.span(root.start, root.start + 1),
            "neither train_batch_size nor train_micro_batch_size_per_gpu is set: DeepSpeed asserts 'Either "
            "train_batch_size or train_micro_batch_size_per_gpu needs to be provided' before the first step (the HF "
            "Trainer and accelerate fill only keys written as \"auto\")",
            related=related)

    def _derived(self, doc, nodes, numbers, world, processes, uses):
        """DeepSpeed derives a missing key from the others (`_set_batch_related_parameters`)
        with floor division, then asserts: `train_batch_size` 33 with micro 17 on 2 GPUs
        derives 33 // 17 // 2 = 0 accumulation steps."""
        total = nodes[0]
        total_n, micro_n, steps_n = numbers
        if any(node is not None and number is None for node, number in zip(nodes, numbers)):
            return  # "auto" or a value this cannot read: the tools fill or decide it
        if total_n is None:
            return  # derived as micro x accumulation x world: always consistent
        if micro_n is not None:
            steps_n, derived = total_n // micro_n // world, "gradient_accumulation_steps"
            how = f"{total_n} // {micro_n} // {world}"
        elif steps_n is not None:
            micro_n, derived = total_n // world // steps_n, "train_micro_batch_size_per_gpu"
            how = f"{total_n} // {world} // {steps_n}"
        else:
            steps_n, micro_n, derived = 1, total_n // world, "train_micro_batch_size_per_gpu"
            how = f"{total_n} // {world} (accumulation 1)"
        related = [r for use in uses for r in use.related]
        value = steps_n if derived == "gradient_accumulation_steps" else micro_n
        if value == 0:
            yield self.finding(
                doc.span(total),
                f"train_batch_size {total_n} on {processes}: DeepSpeed derives {derived} = {how} = 0 and asserts "
                f"'{'Gradient accumulation steps' if derived == 'gradient_accumulation_steps' else 'Micro batch size per gpu'}: "
                f"0 has to be greater than 0' before the first step",
                related=related)
        elif micro_n * steps_n * world != total_n:
            yield self.finding(
                doc.span(total),
                f"train_batch_size {total_n} on {processes}: DeepSpeed derives {derived} = {how} = {value}, and "
                f"{micro_n} x {steps_n} x {world} = {micro_n * steps_n * world} != {total_n}: it asserts 'train_batch_size "
                f"is not equal to micro_batch_per_gpu * gradient_acc_step * world_size' before the first step",
                related=related)

    _DS = '{{\n  "train_batch_size": {total},\n  "train_micro_batch_size_per_gpu": {micro},\n' \
          '  "gradient_accumulation_steps": 4,\n  "zero_optimization": {{"stage": 2}}\n}}\n'
    _ACC = HEAD_ACC = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                       "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: {n}\n")
    VALID = [
        Example('{"gradient_accumulation_steps": 4}', "the launched script sets the batch size in code", path="ds.json",
                files={"run.sh": "deepspeed train.py --deepspeed --deepspeed_config ds.json\n",
                       "train.py": "import json, deepspeed\nconfig = json.load(open(args.deepspeed_config))\n"
                                   "config['train_micro_batch_size_per_gpu'] = args.batch_size\n"
                                   "engine, *_ = deepspeed.initialize(model=m, config=config)\n"}),
        Example('{"gradient_accumulation_steps": 4}', "no launch uses it: another program may complete it",
                path="ds.json"),
        Example(_DS.format(total=16, micro=2), "Megatron flags: 2 x 4 x (8 / (2 x 2)) = 16, not 2 x 4 x 8",
                path="ds.json", files={"train.sh": "deepspeed --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                                                   "--pipeline-model-parallel-size 2 --deepspeed --deepspeed_config ds.json\n"}),
        Example(_DS.format(total=32, micro=2), "tensor_parallel_size in the script's config with an mpu: 2 x 4 x (8 / 2)",
                path="ds.json", files={"train.sh": "deepspeed --num_gpus 8 train.py --config cfg.yaml --deepspeed ds.json\n",
                                       "cfg.yaml": "tensor_parallel_size: 2\n",
                                       "train.py": "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, mpu=mpu, "
                                                   "config='ds.json')\n"}),
        Example(_DS.format(total=32, micro=2), "tensor_parallel_size DeepSpeed is not told about (no mpu, no Megatron "
                "flags): its world may be every process; unknown", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 train.py --config cfg.yaml --deepspeed ds.json\n",
                       "cfg.yaml": "tensor_parallel_size: 2\n"}),
        Example(_DS.format(total=16, micro=2), "an expert-parallel size: its effect on the data-parallel size is not read",
                path="ds.json", files={"train.sh": "deepspeed --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                                                   "--expert-model-parallel-size 4 --deepspeed --deepspeed_config ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "a tensor-parallel size from a variable: unknown", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size $TP "
                                   "--deepspeed --deepspeed_config ds.json\n"}),
        Example(_DS.format(total=32, micro=2), "2 x 4 x 4 processes = 32", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 4 train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "no launch uses the file: the world size is unknown", path="ds.json"),
        Example(_DS.format(total='"auto"', micro=2), "\"auto\": the HF Trainer fills it", path="ds.json",
                files={"train.sh": "torchrun --standalone --nproc_per_node 8 train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro='"auto"'), "micro batch \"auto\": not known from the files", path="ds.json",
                files={"train.sh": "torchrun --standalone --nproc_per_node 8 train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "two launches with different world sizes: no single right value",
                path="ds.json", files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.json\n"
                                            "deepspeed --num_gpus 4 train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "the world size is a variable: unknown", path="ds.json",
                files={"train.sh": "torchrun --nproc_per_node $NGPU train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "accelerate config with 2 processes: 2 x 4 x 2 = 16", path="ds.json",
                files={"accelerate.yaml": _ACC.format(n=2)}),
        Example(_DS.format(total=8, micro=2).replace('"zero_optimization"', '"sequence_parallel_size": 2,\n  '
                                                                             '"zero_optimization"'),
                "Ulysses sequence parallelism: 2 processes / sequence_parallel_size 2 = 1 data-parallel rank "
                "(DeepSpeedExamples benchmarks/autosp)", path="ds.json", files={"accelerate.yaml": _ACC.format(n=2)}),
        Example(_DS.format(total=16, micro=2).replace('"zero_optimization"', '"tensor_parallel": {"autotp_size": 4},'
                                                                              '\n  "zero_optimization"'),
                "automatic tensor parallelism: the data-parallel size is not the process count", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json\n"}),
        Example(_DS.format(total=16, micro=2), "Megatron-style mpu passed to deepspeed.initialize", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 pretrain.py --deepspeed --deepspeed_config ds.json\n",
                       "pretrain.py": "import deepspeed\n\nengine, *_ = deepspeed.initialize(model=model, args=args, "
                                      "mpu=mpu)\n"}),
    ]
    _MEGATRON = ("deepspeed --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                 "--pipeline-model-parallel-size 2 --deepspeed --deepspeed_config ds.json\n")
    INVALID = [
        Example('{\n  "gradient_accumulation_steps": 4,\n  "zero_optimization": {"stage": 2}\n}\n',
                "only the accumulation: DeepSpeed needs a batch size, on any world size", path="ds.json", line=2,
                files={"run.sh": "deepspeed train.py --deepspeed --deepspeed_config ds.json\n",
                       "train.py": "import deepspeed\nengine, *_ = deepspeed.initialize(args=args, model=m)\n"}),
        Example('{\n  "gradient_accumulation_steps": 4\n}\n', "the HF Trainer fills \"auto\" keys only, not missing ones",
                path="ds.json", line=2,
                files={"run.sh": "deepspeed train.py --deepspeed ds.json\n",
                       "train.py": "from transformers import Trainer, TrainingArguments\n"
                                   "args = TrainingArguments('out', deepspeed='ds.json')\nTrainer(model=m, args=args).train()\n"}),
        Example(_DS.format(total=64, micro=2), "Megatron flags: 8 processes / (TP 2 x PP 2) = 2 data-parallel ranks, "
                "2 x 4 x 2 = 16", path="ds.json", line=2, files={"train.sh": _MEGATRON},
                fixed=_DS.format(total=16, micro=2)),
        Example(_DS.format(total=16, micro=2), "sizes of 1 divide nothing (a vLLM engine's own TP of 1 included)",
                path="ds.json", line=2,
                files={"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json --vllm_tensor_parallel_size 1 "
                                   "--tp_size 1\n"},
                fixed=_DS.format(total=64, micro=2)),
        Example(_DS.format(total=16, micro=2), "torchrun on 8 GPUs with an HF --deepspeed file", path="ds.json", line=2,
                files={"train.sh": "torchrun --standalone --nproc_per_node 8 train.py --deepspeed=ds.json\n"},
                fixed=_DS.format(total=64, micro=2)),
        Example(_DS.format(total=16, micro=2).replace('"zero_optimization"', '"sequence_parallel_size": 2,\n  '
                                                                              '"zero_optimization"'),
                "sequence parallel: 8 processes / 2 = 4 data-parallel ranks, 2 x 4 x 4 = 32", path="ds.json", line=2,
                files={"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json\n"},
                fixed=_DS.format(total=32, micro=2).replace('"zero_optimization"', '"sequence_parallel_size": 2,\n  '
                                                                                    '"zero_optimization"')),
        Example(_DS.format(total=16, micro=2), "world size from the accelerate config the launch uses", path="ds.json",
                line=2, files={"accelerate.yaml": _ACC.format(n=4),
                               "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n"},
                fixed=_DS.format(total=32, micro=2)),
        Example("train_batch_size: 8\ntrain_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 4\n"
                "zero_optimization:\n  stage: 3\n", "a YAML DeepSpeed config, deepspeed.initialize launch",
                path="ds.yaml", line=1,
                files={"run.sh": "deepspeed --num_gpus 1 train.py --deepspeed --deepspeed_config ds.yaml\n"},
                fixed="train_batch_size: 4\ntrain_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 4\n"
                      "zero_optimization:\n  stage: 3\n"),
    ]
