"""CFX5xx: DeepSpeed configs (JSON, or YAML), single-file checks [C12]."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents.config_edits import close_match, rename_key, replace_scalar, replace_text
from cfgfix.project import ProjectRule
from cfgfix.rules.base import Example, Rule, register

DS = "ds_config.json"


class DeepSpeedRule(Rule):
    kinds = ("json", "yaml")
    triggers = ((b"zero_optimi", b"train_micro_batch_size_per_gpu", b"train_batch_size",
                 b"gradient_accumulation_steps"),)

    def check(self, ctx) -> Iterable[Finding]:
        if "deepspeed" not in ctx.kinds:
            return ()
        return self.check_config(ctx, ctx.root)

    def check_config(self, ctx, root) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


def _zero(root):
    zero = root.get("zero_optimization")
    return zero if zero is not None and zero.kind == "mapping" else None


def _stage(zero) -> int | None:
    """The ZeRO stage as written; None when "auto" or not an integer (stay silent)."""
    stage = zero.get("stage")
    if stage is None:
        return 0  # DeepSpeed's default
    value = stage.value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@register
class Fp16AndBf16Enabled(ProjectRule):
    """## What it does
    Flags a DeepSpeed config whose `fp16` and `bf16` blocks are both `"enabled": true`, or
    where one is `true` and the other `"auto"` and a launch that uses the file asks for the
    other format (`--bf16 True` to the HF Trainer, accelerate's `mixed_precision: bf16`), so
    that the integration fills `"auto"` with `true`.

    ## Why is this bad?
    DeepSpeed asserts at start-up ("bfloat16 and fp16 modes cannot be simultaneously
    enabled"): one run can train in one 16-bit format only. An `"auto"` block is flagged only
    when a launch's own precision is known: with no launch, or a launch that leaves the
    format open, `"auto"` may well be filled with `false`.

    ## Example
    ```json
    {"fp16": {"enabled": true}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": false}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}
    ```
    (bf16 on Ampere and newer GPUs; fp16 with its loss scaling on older ones.)

    ## Fix safety
    No fix: which format to keep depends on the GPU and on how the model was trained.

    ## References
    - facts.md C12; DeepSpeed `runtime/config.py` (the bf16/fp16 assertion)
    """

    code = "CFX501"
    name = "fp16-and-bf16-enabled"
    severity = Severity.ERROR
    triggers = DeepSpeedRule.triggers + ((b"bf16", b"bfloat16"), (b"fp16",))

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        autos: dict = {}  # path -> (launch precision Value, its launch)
        for setup in training_setups(project):
            path = setup.files.get("deepspeed")
            mixed = setup.values.get("mixed_precision")
            if path is not None and mixed is not None and mixed.value in ("bf16", "fp16"):
                autos.setdefault(path, []).append((mixed, setup.launch))
        for path, kinds in project.configs.items():
            if "deepspeed" not in kinds or path not in project.displays:
                continue
            doc = project.read(path)
            if doc is None:
                continue
            root = doc.root
            fp16 = _enabled(root, "fp16")
            bf16 = _enabled(root, "bf16") or _enabled(root, "bfloat16")
            if not (fp16 and bf16):
                continue
            if fp16.truthy() is True and bf16.truthy() is True:
                yield self.finding(
                    doc.span(fp16),
                    "fp16.enabled and bf16.enabled are both true: DeepSpeed asserts 'bfloat16 and fp16 "
                    "modes cannot be simultaneously enabled'; keep one (bf16 on Ampere or newer)",
                    related=[Related(doc.span(bf16), "bf16 is enabled here")],
                )
                continue
            for on, auto, auto_name in ((fp16, bf16, "bf16"), (bf16, fp16, "fp16")):
                if on.truthy() is not True or auto.value != "auto":
                    continue
                launches = autos.get(path, [])
                if not launches or any(mixed.value != auto_name for mixed, _ in launches):
                    continue  # "auto" is filled with false by some launch, or nothing says
                mixed, launch = launches[0]
                yield self.finding(
                    doc.span(on),
                    f"{'fp16' if auto_name == 'bf16' else 'bf16'}.enabled is true while {auto_name}.enabled is "
                    f"\"auto\" and the launch asks for {auto_name} ({mixed.origin}), so both end up enabled: "
                    f"DeepSpeed asserts 'bfloat16 and fp16 modes cannot be simultaneously enabled'",
                    related=[Related(doc.span(auto), f"{auto_name} \"auto\" is filled from the launch")]
                    + ([Related(mixed.span, mixed.origin)] if mixed.span else []) + [Related(launch.span, "launched here")],
                )

    VALID = [
        Example('{"fp16": {"enabled": false}, "bf16": {"enabled": true}, "train_batch_size": 8}',
                "only bf16 enabled", path=DS),
        Example('{"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}, "train_batch_size": "auto"}',
                "\"auto\" under HF/accelerate: filled from the launch, never both", path=DS),
        Example('{"fp16": {"enabled": true}, "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}',
                "bf16 \"auto\" and no launch: not known from this file", path=DS),
        Example('{"fp16": {"enabled": true}, "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}',
                "bf16 \"auto\" and a launch that asks for fp16", path=DS,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds_config.json --fp16 True\n"}),
        Example('{"fp16": {"enabled": true}, "bf16": {"loss_scale": 0}, "train_batch_size": 8}',
                "a bf16 block without enabled is off", path=DS),
    ]
    INVALID = [
        Example('{\n  "fp16": {"enabled": true},\n  "bf16": {"enabled": true},\n  "train_batch_size": 8\n}\n',
                "both enabled", path=DS, line=2),
        Example("bfloat16:\n  enabled: true\nfp16:\n  enabled: true\ntrain_micro_batch_size_per_gpu: 1\n",
                "the legacy bfloat16 name, in a YAML DeepSpeed config", path="ds_config.yaml", line=4),
        Example('{\n  "fp16": {"enabled": true},\n  "bf16": {"enabled": "auto"},\n  "zero_optimization": {"stage": 2}\n}\n',
                "bf16 \"auto\" filled with true from the launch's --bf16", path=DS, line=2,
                files={"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds_config.json --bf16 True\n"}),
    ]


def _enabled(root, block: str):
    node = root.get(block)
    return node.get("enabled") if node is not None and node.kind == "mapping" else None


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


def _passes_mpu(project, uses) -> bool:
    """A launched script hands `mpu=` to deepspeed.initialize (Megatron-style model
    parallelism): DeepSpeed then takes the data-parallel size from it, not the processes."""
    return any(kw.arg == "mpu" for _, _, facts in _script_uses(project, uses)
               for call in facts.initialize for kw in call.keywords)


@register
class BatchSizeArithmetic(ProjectRule):
    """## What it does
    Flags a DeepSpeed config whose `train_batch_size` is not
    `train_micro_batch_size_per_gpu` × `gradient_accumulation_steps` × the world size, where
    all three numbers are known: the two keys are integers in the file and the world size
    comes from the launches that use it (`--num_processes`, `--nproc_per_node` × nodes,
    `--num_gpus`, or the accelerate config's `num_processes`).

    ## Why is this bad?
    DeepSpeed asserts before the first step: "Check batch related parameters.
    train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size
    16 != 2 * 4 * 4". The numbers are usually right for the machine the config was written
    on and wrong for the one it runs on. Nothing is reported when any of the three is
    `"auto"` (the HF Trainer or accelerate fills it) or unknown, or when the launches that
    use the file disagree about the world size. With `sequence_parallel_size` DeepSpeed
    counts data-parallel ranks only (the processes divided by it, or `data_parallel_size`
    when that is set too), and so does this check; with automatic tensor parallelism
    (`tensor_parallel.autotp_size` above 1) or an `mpu=` passed to `deepspeed.initialize`
    the data-parallel size is not known from the files, and nothing is reported.

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
      `DeepSpeedConfig.__init__`), `deepspeed/__init__.py` (`initialize`: the device mesh)
    """

    code = "CFX502"
    name = "batch-size-arithmetic"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_project(self, project):
        for path, uses in project.deepspeed_uses().items():
            if path not in project.displays:
                continue  # not a file of this run: reported when it is checked
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
            if None in numbers:
                continue
            total_n, micro_n, steps_n = numbers
            data_parallel = _data_parallel_world(root, world)
            if data_parallel is None or _passes_mpu(project, uses):
                continue  # model/sequence parallel groups this cannot size: no single right number
            world, processes = data_parallel
            product = micro_n * steps_n * world
            if total_n == product:
                continue
            related = [Related(doc.span(micro), f"micro batch {micro_n}"),
                       Related(doc.span(steps), f"gradient accumulation {steps_n}")]
            related += [r for use in uses for r in use.related]
            yield self.finding(
                doc.span(total),
                f"train_batch_size {total_n} != train_micro_batch_size_per_gpu {micro_n} x "
                f"gradient_accumulation_steps {steps_n} x {processes} = {product}: DeepSpeed asserts "
                f"'train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size' "
                f"before the first step",
                fix=Fix((replace_scalar(doc, total, product),), f"Set train_batch_size to {product}"),
                related=related,
            )

    _DS = '{{\n  "train_batch_size": {total},\n  "train_micro_batch_size_per_gpu": {micro},\n' \
          '  "gradient_accumulation_steps": 4,\n  "zero_optimization": {{"stage": 2}}\n}}\n'
    _ACC = HEAD_ACC = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                       "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: {n}\n")
    VALID = [
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
    INVALID = [
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


@register
class OffloadWithoutEffect(DeepSpeedRule):
    """## What it does
    Flags `offload_param` under ZeRO stage 0, 1 or 2, and `offload_optimizer` under stage 0,
    when the offload device is not `"none"`.

    ## Why is this bad?
    DeepSpeed accepts both silently and does nothing with them: parameter offload is
    implemented by ZeRO-3 only ("Valid only with stage 3"), and optimizer offload needs
    ZeRO to be on. The run keeps the parameters (or optimizer states) on the GPU while the
    config says they were moved to CPU, so memory estimates made from the config are wrong.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    ```
    or remove `offload_param` and keep stage 2 with `offload_optimizer`.

    ## Fix safety
    No fix: moving to stage 3 changes how the model is sharded and saved; removing the
    block changes what the author believed was offloaded.

    ## References
    - facts.md C12; DeepSpeed `runtime/zero/config.py` and `offload_config.py` docstrings
    """

    code = "CFX503"
    name = "offload-without-effect"
    severity = Severity.WARNING
    triggers = DeepSpeedRule.triggers + ((b"offload_param", b"offload_optimizer"),)

    def check_config(self, ctx, root):
        zero = _zero(root)
        if zero is None or zero.get("stage") is None:
            return  # no explicit stage: leave it to the reader
        stage = _stage(zero)
        if stage is None:
            return
        for block, limit, why in (
            ("offload_param", 3, "parameter offload is implemented by ZeRO stage 3 only"),
            ("offload_optimizer", 1, "optimizer offload needs ZeRO stage 1, 2 or 3"),
        ):
            entry = zero.entry(block)
            if entry is None or stage >= limit or not _offloads(entry[1]):
                continue
            yield self.finding(
                ctx.span(entry[0]),
                f"{block} under ZeRO stage {stage} has no effect: {why}, and DeepSpeed accepts "
                f"it silently, so nothing is offloaded",
                related=[Related(ctx.span(zero.get("stage")), f"stage {stage} is set here")],
            )

    VALID = [
        Example('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "train_batch_size": 8}',
                "stage 3 offloads parameters", path=DS),
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_batch_size": 8}',
                "optimizer offload under stage 2 works", path=DS),
        Example('{"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}, "train_batch_size": 8}',
                "device none: nothing is offloaded, nothing promised", path=DS),
        Example('{"zero_optimization": {"stage": "auto", "offload_param": {"device": "cpu"}}, "train_batch_size": 8}',
                "stage not known from the file", path=DS),
    ]
    INVALID = [
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "offload_param": {"device": "cpu"}\n  },\n'
                '  "train_batch_size": 8\n}\n', "parameter offload under stage 2", path=DS, line=4),
        Example("zero_optimization:\n  stage: 0\n  offload_optimizer:\n    device: cpu\ntrain_batch_size: 8\n",
                "optimizer offload with ZeRO off", path="ds_config.yaml", line=3),
    ]


def _offloads(block) -> bool:
    if block.kind != "mapping":
        return False
    device = block.get("device")
    return device is None or device.value not in ("none", None)


@register
class DeprecatedDeepSpeedKey(DeepSpeedRule):
    """## What it does
    Flags deprecated DeepSpeed forms: `cpu_offload` under `zero_optimization`,
    `stage3_gather_fp16_weights_on_model_save`, and the legacy `"zero_optimization": true`.

    ## Why is this bad?
    They still work, with a deprecation warning, but they are mapped to the current forms
    behind the author's back (`cpu_offload: true` → `offload_optimizer.device: cpu`,
    `"zero_optimization": true` → stage 1), and `cpu_offload` together with
    `offload_optimizer` makes DeepSpeed assert. Writing the current form says what runs.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "cpu_offload": true}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```

    ## Fix safety
    Safe: the fix writes exactly what DeepSpeed maps the old form to. No fix when
    `cpu_offload` sits next to `offload_optimizer` (the author has to choose) or when the
    current key is already present.

    ## References
    - facts.md C12; DeepSpeed `runtime/config_utils.py` (deprecated fields) and
      `read_zero_config_deprecated`
    """

    code = "CFX504"
    name = "deprecated-deepspeed-key"
    severity = Severity.INFO
    fix_availability = "safe"
    triggers = DeepSpeedRule.triggers + ((b"cpu_offload", b"gather_fp16_weights", b"zero_optimization"),)

    def check_config(self, ctx, root):
        doc = ctx.document
        entry = root.entry("zero_optimization")
        if entry is not None and isinstance(entry[1].value, bool) and entry[1].kind == "scalar":
            stage = 1 if entry[1].value else 0
            content = '{"stage": %d}' % stage
            yield self.finding(
                ctx.span(entry[1]),
                f'"zero_optimization": {str(entry[1].value).lower()} is the legacy boolean form; '
                f"DeepSpeed reads it as stage {stage}: write {content}",
                fix=Fix((replace_text(doc, entry[1].start, entry[1].end, content),),
                        f"Write {content}", Applicability.SAFE),
            )
        zero = _zero(root)
        if zero is None:
            return
        for old, new in keys.DEPRECATED_ZERO_KEYS.items():
            found = zero.entry(old)
            if found is None:
                continue
            fix = None if new in zero else Fix((rename_key(doc, found[0], new),), f"Rename to {new}")
            yield self.finding(ctx.span(found[0]), f"{old} is deprecated; the current name is {new}", fix=fix)
        found = zero.entry("cpu_offload")
        if found is not None:
            on = found[1].truthy()
            fix = None
            if on is not None and "offload_optimizer" not in zero:
                device = "cpu" if on else "none"
                if doc.fmt == "json":
                    content = '"offload_optimizer": {"device": "%s"}' % device
                else:
                    content = "offload_optimizer: {device: %s}" % device
                fix = Fix((replace_text(doc, found[0].start, found[1].end, content),),
                          f"Write offload_optimizer.device = {device}")
            extra = (" Together with offload_optimizer DeepSpeed asserts; remove one."
                     if "offload_optimizer" in zero else "")
            yield self.finding(
                ctx.span(found[0]),
                "cpu_offload is deprecated: DeepSpeed maps it to offload_optimizer.device; "
                "write that instead." + extra,
                fix=fix,
            )

    VALID = [
        Example('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_batch_size": 8}',
                "the current form", path=DS),
        Example('{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true},'
                ' "train_batch_size": 8}', "the current gather name", path=DS),
    ]
    INVALID = [
        Example('{\n  "zero_optimization": {\n    "stage": 2,\n    "cpu_offload": true\n  },\n'
                '  "train_batch_size": 8\n}\n', "cpu_offload", path=DS, line=4,
                fixed='{\n  "zero_optimization": {\n    "stage": 2,\n    "offload_optimizer": {"device": "cpu"}\n'
                      '  },\n  "train_batch_size": 8\n}\n'),
        Example('{\n  "zero_optimization": {\n    "stage": 3,\n    "stage3_gather_fp16_weights_on_model_save": true\n'
                '  },\n  "train_batch_size": 8\n}\n', "the fp16 gather name", path=DS, line=4,
                fixed='{\n  "zero_optimization": {\n    "stage": 3,\n    "stage3_gather_16bit_weights_on_model_save": '
                      'true\n  },\n  "train_batch_size": 8\n}\n'),
        Example('{\n  "zero_optimization": true,\n  "train_batch_size": 8\n}\n', "the legacy boolean",
                path=DS, line=2, fixed='{\n  "zero_optimization": {"stage": 1},\n  "train_batch_size": 8\n}\n'),
        Example("zero_optimization:\n  stage: 2\n  cpu_offload: true  # old\ntrain_batch_size: 8\n",
                "YAML: comment kept", path="ds_config.yaml", line=3,
                fixed="zero_optimization:\n  stage: 2\n  offload_optimizer: {device: cpu}  # old\ntrain_batch_size: 8\n"),
    ]


def _ignorable(key: str) -> bool:
    """Comment keys (`_comment`, `//`, `comment`): DeepSpeed ignores them, on purpose."""
    return key.startswith(("_", "/", "#")) or "comment" in key.lower()


@register
class UnknownDeepSpeedKey(DeepSpeedRule):
    """## What it does
    Flags a top-level key that no DeepSpeed version reads, such as `zero_optimisation` or
    `train_micro_batch_size`, and a key DeepSpeed rejects inside `zero_optimization`, its
    `offload_optimizer` / `offload_param` blocks, or (DeepSpeed 0.19 and newer) `fp16` /
    `bf16`.

    ## Why is this bad?
    DeepSpeed reads top-level keys one by one and silently ignores the rest. A misspelt
    `zero_optimisation` block is dropped and ZeRO stays at stage 0: every GPU holds the
    whole model, gradients and optimizer states, and the run that was sized for ZeRO-3
    runs out of memory with nothing in the logs pointing at the typo. (accelerate's
    DeepSpeed plugin stops with "Please specify the ZeRO optimization config".) Keys
    that start with `_` or mention `comment` are treated as comments.

    The nested blocks are pydantic models that forbid extra keys: `"overlap_com": true`
    under `zero_optimization` stops the run with "Extra inputs are not permitted". Before
    DeepSpeed 0.19, `fp16` and `bf16` were plain dicts whose unknown keys were ignored, so
    those are flagged only when the project's DeepSpeed is known to be 0.19 or newer; the
    ZeRO blocks are checked unless the project's DeepSpeed is known to be older than 0.19
    (the key lists follow 0.19.8 and newer). A key whose value is `"auto"` is dropped by
    DeepSpeed before validation and is not flagged.

    ## Example
    ```json
    {"zero_optimisation": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    ```

    ## Fix safety
    Safe when exactly one known key is close to the typo and it is not already present:
    the fix renames the key, so the block is read as the author meant. No fix otherwise.

    ## References
    - facts.md C12; DeepSpeed `runtime/config.py` (`get_scalar_param`), `runtime/config_utils.py`
      (`DeepSpeedConfigModel`, `extra="forbid"`), `runtime/zero/config.py`,
      `runtime/zero/offload_config.py`, `runtime/precision_config.py`
    """

    code = "CFX507"
    name = "unknown-deepspeed-key"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_config(self, ctx, root):
        for key, _ in root.entries:
            name = key.value
            if not isinstance(name, str) or name in keys.TOP_LEVEL or _ignorable(name):
                continue
            match = close_match(name, keys.TOP_LEVEL)
            fix = None
            hint = ""
            if match and match not in root:
                fix = Fix((rename_key(ctx.document, key, match),), f"Rename to {match}")
                hint = f" (did you mean {match}?)"
            consequence = (" so ZeRO stays at stage 0" if match == "zero_optimization"
                           else " so its setting never takes effect")
            yield self.finding(
                ctx.span(key),
                f"unknown top-level key {name}{hint}: DeepSpeed ignores unknown top-level keys "
                f"silently,{consequence}",
                fix=fix,
            )
        yield from self._nested(ctx, root)

    def _nested(self, ctx, root):
        from cfgfix.analysis import deepspeed_nested_keys as nested

        blocks = []
        recent = ctx.versions.get("deepspeed").at_least("0.19")
        if recent is False:
            return  # the key lists are checked against 0.19+; older versions had other keys
        zero = _zero(root)
        if zero is not None:
            blocks.append(("zero_optimization", zero, nested.ZERO))
            for name, known in (("offload_optimizer", nested.OFFLOAD_OPTIMIZER), ("offload_param", nested.OFFLOAD_PARAM)):
                block = zero.get(name)
                if block is not None and block.kind == "mapping":
                    blocks.append((f"zero_optimization.{name}", block, known))
        if recent is True:  # fp16/bf16 were plain dicts before 0.19: unknown keys ignored
            for name, known in (("fp16", nested.FP16), ("bf16", nested.BF16), ("bfloat16", nested.BF16)):
                block = root.get(name)
                if block is not None and block.kind == "mapping":
                    blocks.append((name, block, known))
        for where, block, known in blocks:
            for key, value in block.entries:
                name = key.value
                if not isinstance(name, str) or name in known or _ignorable(name):
                    continue
                if value.kind == "scalar" and value.value == "auto":
                    continue  # DeepSpeed drops "auto" values before validating the block
                match = close_match(name, known)
                fix = None
                hint = ""
                if match and match not in block:
                    fix = Fix((rename_key(ctx.document, key, match),), f"Rename to {match}")
                    hint = f" (did you mean {match}?)"
                yield self.finding(
                    ctx.span(key),
                    f"unknown key {name} in {where}{hint}: DeepSpeed validates this block strictly and "
                    f"refuses the config ('Extra inputs are not permitted')",
                    fix=fix,
                )

    VALID = [
        Example('{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",'
                ' "_comment": "ZeRO-3 for 8 GPUs"}', "comment keys", path=DS),
        Example('{"train_batch_size": 8, "gradient_clipping": 1.0, "steps_per_print": 10, "wall_clock_breakdown": false,'
                ' "zero_optimization": {"stage": 1}}', "all known", path=DS),
        Example('{"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "learning_rate": 1e-4}',
                "a training config, not DeepSpeed's", path="train_config.json"),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": true,'
                ' "stage3_max_live_parameters": 1e9, "stage3_gather_16bit_weights_on_model_save": true,'
                ' "offload_optimizer": {"device": "cpu", "pin_memory": true},'
                ' "offload_param": {"device": "cpu", "buffer_count": 5}}}',
                "nested keys, stage3_* aliases included, all known", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_sise": "auto"}}',
                "an \"auto\" value is dropped before validation", path=DS),
        Example('{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 1000}}',
                "fp16 was a plain dict before DeepSpeed 0.19", path=DS,
                files={"requirements.txt": "deepspeed==0.16.9\n"}),
        Example('{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_windw": 1000}}',
                "fp16 with the DeepSpeed version unknown", path=DS),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 2, "some_old_key": true}}',
                "DeepSpeed older than 0.19: its ZeRO keys are not the lists cfgfix checks", path=DS,
                files={"requirements.txt": "deepspeed==0.14.4\n"}),
    ]
    INVALID = [
        Example('{\n  "train_micro_batch_size_per_gpu": 2,\n  "monitor_config": {"tensorboard": {"enabled": true}}\n}\n',
                "monitor_config is not a DeepSpeed key: get_monitor_config reads tensorboard/wandb/csv_monitor/comet "
                "at the top level", path=DS, line=3),
        Example('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimisation": {"stage": 3}\n}\n',
                "British spelling", path=DS, line=3,
                fixed='{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {"stage": 3}\n}\n'),
        Example("train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: 2\ngradient_acumulation_steps: 4\n",
                "YAML, a letter missing", path="ds_config.yaml", line=4,
                fixed="train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: 2\ngradient_accumulation_steps: 4\n"),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_com": true\n'
                '  }\n}\n', "a typo inside zero_optimization", path=DS, line=5,
                fixed='{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": true\n'
                      '  }\n}\n'),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "offload_param": {"device": "cpu", "pin_memory": true, "nvme": "/local"}\n  }\n}\n',
                "an unknown key in offload_param, no close match", path=DS, line=5),
        Example('{\n  "train_batch_size": 8,\n  "bf16": {\n    "enabled": true,\n    "immediate_grad_updates": true\n'
                '  }\n}\n', "bf16 is strict from DeepSpeed 0.19", path=DS, line=5,
                files={"requirements.txt": "deepspeed==0.19.8\n"},
                fixed='{\n  "train_batch_size": 8,\n  "bf16": {\n    "enabled": true,\n    "immediate_grad_update": true\n'
                      '  }\n}\n'),
    ]


@register
class RemovedDeepSpeedFeature(DeepSpeedRule):
    """## What it does
    Flags config blocks that DeepSpeed 0.19 removed (`amp`, `elasticity`, `nebula`,
    `compression_training`, `quantize_training`, `sparse_gradients`, `eigenvalue`,
    `sparse_attention`, `graph_harvesting`, `curriculum_learning`,
    `progressive_layer_drop`, and `mics_*` / `zeropp_loco_param` under
    `zero_optimization`) when the project uses DeepSpeed 0.19 or newer.

    ## Why is this bad?
    DeepSpeed 0.19 raises `DeepSpeedConfigError` for them ("NVIDIA Apex AMP integration has
    been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' instead."). Older
    versions accept them, so the rule only speaks when the project's pinned or installed
    DeepSpeed is known to be 0.19 or newer.

    ## Example
    ```json
    {"amp": {"enabled": true, "opt_level": "O1"}, "train_batch_size": 8}
    ```
    with `deepspeed>=0.19` in requirements.txt.

    ## Use instead
    ```json
    {"bf16": {"enabled": true}, "train_batch_size": 8}
    ```

    ## Fix safety
    No fix: the replacement (bf16, fp16, torch_autocast, the new data-efficiency library)
    is a choice.

    ## References
    - facts.md C12; DeepSpeed 0.19 `runtime/config.py` (removed features)
    """

    code = "CFX509"
    name = "removed-deepspeed-feature"
    severity = Severity.ERROR
    triggers = DeepSpeedRule.triggers + ((b"amp", b"elasticity", b"nebula", b"compression_training",
                                          b"quantize_training", b"sparse_", b"eigenvalue", b"graph_harvesting",
                                          b"curriculum_learning", b"progressive_layer_drop", b"mics_",
                                          b"zeropp_loco_param"),)

    def check_config(self, ctx, root):
        if ctx.versions.get("deepspeed").at_least("0.19") is not True:
            return  # older or unknown: these keys still work
        hits = [(key, keys.REMOVED_IN_019[key.value]) for key, _ in root.entries if key.value in keys.REMOVED_IN_019]
        zero = _zero(root)
        if zero is not None:
            hits += [(key, f"{key.value} (MiCS / ZeRO++ LoCo) has been removed") for key, _ in zero.entries
                     if isinstance(key.value, str)
                     and (key.value.startswith(keys.REMOVED_ZERO_PREFIXES) or key.value in keys.REMOVED_ZERO_KEYS)]
        for key, why in hits:
            yield self.finding(ctx.span(key), f"{key.value}: {why} in DeepSpeed 0.19, which raises "
                                              f"DeepSpeedConfigError for it")

    _REQ = {"requirements.txt": "deepspeed==0.19.8\n"}
    VALID = [
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "DeepSpeed 0.16: still supported",
                path=DS, files={"requirements.txt": "deepspeed==0.16.9\n"}),
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "version unknown: silent", path=DS),
        Example('{"bf16": {"enabled": true}, "train_batch_size": 8}', "the replacement", path=DS, files=_REQ),
    ]
    INVALID = [
        Example('{\n  "amp": {"enabled": true},\n  "train_batch_size": 8\n}\n', "apex amp", path=DS, line=2,
                files=_REQ),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "mics_shard_size": 8\n  }\n}\n', "MiCS", path=DS, line=5, files=_REQ),
    ]


@register
class DuplicateKey(DeepSpeedRule):
    """## What it does
    Flags a key written twice in one object of a DeepSpeed config.

    ## Why is this bad?
    DeepSpeed refuses the file ("Duplicate keys in DeepSpeed config: [...]"), and other
    readers (the HF Trainer, `json.load`, PyYAML) keep the last value silently, so the
    author's tools and DeepSpeed disagree about what the config says.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "train_micro_batch_size_per_gpu": 8}
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 8}
    ```

    ## Fix safety
    No fix: which of the two values was meant is the author's call.

    ## References
    - facts.md C12
    """

    code = "CFX510"
    name = "duplicate-key"
    severity = Severity.ERROR

    def check_config(self, ctx, root):
        for node in root.walk():
            if node.kind != "mapping":
                continue
            for name, nodes in node.duplicates():
                for again in nodes[1:]:
                    yield self.finding(
                        ctx.span(again),
                        f"{name} is set twice in this object (first on line "
                        f"{ctx.span(nodes[0]).line}): DeepSpeed refuses duplicate keys, other readers keep "
                        f"the last one",
                        related=[Related(ctx.span(nodes[0]), "first set here")],
                    )

    VALID = [
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 2}, "fp16": {"enabled": true}}',
                "the same key name in different objects is fine", path=DS),
    ]
    INVALID = [
        Example('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2},\n'
                '  "train_micro_batch_size_per_gpu": 8\n}\n', "top level", path=DS, line=4),
    ]


# -- rules that read the training script a launch runs with the config ----------------------------
GATHER = "stage3_gather_16bit_weights_on_model_save"
OLD_GATHER = "stage3_gather_fp16_weights_on_model_save"


def _script_uses(project, uses):
    """(use, source, facts) for each use whose training script is a readable Python file."""
    from cfgfix.analysis.training_script import script_facts

    for use in uses:
        if use.script is None:
            continue
        found = script_facts(project, use.script)
        if found is not None:
            yield use, found[0], found[1]


def _checked_docs(project):
    """(path, uses, document) for each DeepSpeed config of this run that launches use."""
    for path, uses in project.deepspeed_uses().items():
        if path not in project.displays:
            continue  # not a file of this run: reported when it is checked
        doc = project.read(path)
        if doc is not None:
            yield path, uses, doc


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

    Nothing is reported when the key is `"auto"` (what fills it depends on the integration),
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
      transformers `Trainer.save_model`
    """

    code = "CFX506"
    name = "zero3-save-without-gather"
    severity = Severity.WARNING
    fix_availability = "safe"

    def check_project(self, project):
        for path, uses, doc in _checked_docs(project):
            zero = _zero(doc.root)
            if zero is None or zero.get("stage") is None or _stage(zero) != 3:
                continue
            gather = zero.entry(GATHER) or zero.entry(OLD_GATHER)
            if gather is not None and gather[1].truthy() is not False:
                continue  # true, "auto" or something unknown: stay silent
            saves = [(use, source, facts.hf_saves[0]) for use, source, facts in _script_uses(project, uses)
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
        Example("zero_optimization:\n  stage: 3\n  overlap_comm: true  # keep\ntrain_micro_batch_size_per_gpu: 1\n",
                "a YAML config: the key is added with the block's indentation", path="ds.yaml", line=2,
                files={"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.yaml\n", "train.py": _TRAINER},
                fixed="zero_optimization:\n  stage: 3\n  overlap_comm: true  # keep\n"
                      "  stage3_gather_16bit_weights_on_model_save: true\ntrain_micro_batch_size_per_gpu: 1\n"),
    ]


def ast_name(call) -> str:
    """`trainer.save_model(...)` as written, arguments elided."""
    import ast

    return ast.unparse(call.func) + "(...)"


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_STRICT_BLOCKS = ("zero_optimization", "activation_checkpointing", "comms_logger", "flops_profiler",
                  "aio", "tensorboard", "wandb", "csv_monitor", "comet", "data_types", "checkpoint")


def _autos(node, where=""):
    """(dotted key, value node) for every "auto" value in a mapping, depth first."""
    for key, value in node.entries:
        name = f"{where}.{key.value}" if where else str(key.value)
        if value.kind == "scalar" and value.value == "auto":
            yield name, value
        elif value.kind == "mapping":
            yield from _autos(value, name)


def _auto_consequence(where: str) -> str:
    if where == "zero_optimization.stage":
        return ("DeepSpeed drops \"auto\" inside zero_optimization, so the stage falls back to 0: ZeRO is off "
                "and every GPU holds the whole model, gradients and optimizer states")
    if where in _BATCH_KEYS:
        return "DeepSpeed compares it with integers and stops at start-up with a TypeError"
    if where in ("fp16.enabled", "bf16.enabled", "bfloat16.enabled"):
        return ("DeepSpeed 0.19 drops it and the run trains without fp16/bf16; older versions read the "
                "string as enabled")
    if where.split(".")[0] in _STRICT_BLOCKS:
        return "DeepSpeed drops \"auto\" values in this block and silently uses its default"
    return "nothing replaces it: DeepSpeed drops the value or keeps the string \"auto\""


@register
class AutoWithoutIntegration(ProjectRule):
    """## What it does
    Flags `"auto"` values in a DeepSpeed config that a launch hands to a training script
    calling `deepspeed.initialize` itself (`deepspeed train.py --deepspeed_config ds.json`
    read by `deepspeed.add_config_arguments`, or `config=`), with neither the HF Trainer
    nor accelerate in the script.

    ## Why is this bad?
    `"auto"` is not a DeepSpeed value: the HF Trainer and accelerate replace it from their
    own arguments before DeepSpeed sees the config. A bare `deepspeed.initialize` does not.
    DeepSpeed drops `"auto"` inside its validated blocks and uses the default, so
    `"stage": "auto"` means ZeRO stage 0 (ZeRO off, every GPU holds everything) and
    `"enabled": "auto"` under `bf16` means no bf16 in DeepSpeed 0.19; `"auto"` batch sizes
    stop the run with a TypeError. Nothing is reported when the script mentions the string
    `"auto"` itself (it may fill the values), or when the config reaches the script through
    accelerate.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": "auto"}}
    ```
    with `deepspeed --num_gpus 8 train.py --deepspeed --deepspeed_config ds.json` and
    `deepspeed.initialize(args=args, model=model, ...)` in `train.py`.

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    ```

    ## Fix safety
    No fix: the right number (stage, batch size, precision) is the author's choice.

    ## References
    - facts.md C12 (`"auto"` outside HF/accelerate); DeepSpeed `runtime/config_utils.py`
      (`DeepSpeedConfigModel.__init__` drops "auto")
    """

    code = "CFX505"
    name = "auto-without-integration"
    severity = Severity.ERROR

    def check_project(self, project):
        for path, uses, doc in _checked_docs(project):
            bare = [(use, source, facts) for use, source, facts in _script_uses(project, uses)
                    if use.via_accelerate is None and facts.initialize and not facts.integrated
                    and not facts.fills_auto]
            if not bare:
                continue
            use, source, facts = bare[0]
            call = facts.initialize[0]
            related = [Related(source.span_of_node(call), "deepspeed.initialize reads the config here")]
            related += [r for use, _, _ in bare for r in use.related]
            for where, value in _autos(doc.root):
                yield self.finding(
                    doc.span(value),
                    f'"{where}": "auto" is filled only by the HF Trainer or accelerate, but '
                    f"{source.path}:{call.lineno} passes this config to deepspeed.initialize directly: "
                    f"{_auto_consequence(where)}",
                    related=related,
                )

    _BARE = ("import deepspeed\n\nargs = parser.parse_args()\n"
             "engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model,"
             " model_parameters=model.parameters())\n")
    _LAUNCH = {"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed --deepspeed_config ds.json\n"}
    _DS = '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": %s\n  }\n}\n'
    VALID = [
        Example(_DS % '"auto"', "the HF Trainer fills \"auto\"", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json\n",
                       "train.py": "from transformers import Trainer\n\ntrainer = Trainer(model=model, args=args)\n"}),
        Example(_DS % '"auto"', "accelerate fills \"auto\"", path="ds.json",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                          "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 8\n",
                       "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"}),
        Example(_DS % "2", "no \"auto\" values", path="ds.json", files={**_LAUNCH, "train.py": _BARE}),
        Example(_DS % '"auto"', "no launch links the config to a script", path="ds.json"),
        Example(_DS % '"auto"', "the script fills \"auto\" values itself", path="ds.json",
                files={**_LAUNCH, "train.py": _BARE.replace("args = parser.parse_args()\n",
                                                            "args = parser.parse_args()\nfill(cfg, 'auto')\n")}),
    ]
    INVALID = [
        Example(_DS % '"auto"', "stage \"auto\": ZeRO off", path="ds.json", line=4,
                files={**_LAUNCH, "train.py": _BARE}),
        Example('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {"stage": 2}\n}\n',
                "an \"auto\" batch size: TypeError", path="ds.json", line=2,
                files={"run.sh": "deepspeed train.py --deepspeed_config=ds.json\n",
                       "train.py": "import deepspeed as ds\n\nengine, *_ = ds.initialize(args=args, model=net)\n"}),
    ]


@register
class OffloadWithTorchOptimizer(ProjectRule):
    """## What it does
    Flags optimizer offload (`zero_optimization.offload_optimizer.device` `cpu` or `nvme`)
    in a DeepSpeed config whose training script builds a torch optimizer
    (`torch.optim.AdamW(...)`) and passes it to `deepspeed.initialize(optimizer=...)`,
    while the config has no `optimizer` block and does not set
    `"zero_force_ds_cpu_optimizer": false`.

    ## Why is this bad?
    ZeRO-Offload steps the optimizer on the CPU; a torch optimizer there is slow, so
    DeepSpeed refuses it: `ZeRORuntimeException` "You are using ZeRO-Offload with a client
    provided optimizer (...) which in most cases will yield poor performance". The run
    stops during `deepspeed.initialize`, after the model was loaded. Not reported when
    accelerate or the HF Trainer runs the script (accelerate swaps in `DeepSpeedCPUAdam`
    for a torch Adam), or when the config has its own `optimizer` block.

    ## Example
    ```json
    {"train_batch_size": 16, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```
    with `optimizer = torch.optim.AdamW(model.parameters())` and
    `deepspeed.initialize(model=model, optimizer=optimizer, ...)`.

    ## Use instead
    `deepspeed.ops.adam.DeepSpeedCPUAdam(model.parameters())` in the script, or an
    `"optimizer": {"type": "AdamW", "params": {...}}` block in the config (and no
    `optimizer=`), or `"zero_force_ds_cpu_optimizer": false` to accept the slow step.

    ## Fix safety
    No fix: the choice between DeepSpeed's CPU Adam, a config optimizer and the slow torch
    step is the author's.

    ## References
    - facts.md C12 (Runtime-only checks); DeepSpeed `runtime/engine.py` (`_configure_optimizer`)
    """

    code = "CFX508"
    name = "offload-with-torch-optimizer"
    severity = Severity.ERROR

    def check_project(self, project):
        for path, uses, doc in _checked_docs(project):
            root = doc.root
            zero = _zero(root)
            offload = zero.get("offload_optimizer") if zero is not None else None
            device = offload.get("device") if offload is not None and offload.kind == "mapping" else None
            if device is None or device.value not in ("cpu", "nvme") or "optimizer" in root:
                continue
            force = root.get("zero_force_ds_cpu_optimizer")
            if force is not None and force.truthy() is not True:
                continue  # false (the documented opt-out) or not known
            for use, source, facts in _script_uses(project, uses):
                if use.via_accelerate is not None or facts.integrated:
                    continue  # accelerate swaps in DeepSpeedCPUAdam
                hit = next(((call, opt) for call in facts.initialize
                            if (opt := facts.torch_optimizer_passed(call)) is not None), None)
                if hit is None:
                    continue
                call, optimizer = hit
                kind = ast_name(optimizer).removesuffix("(...)")
                yield self.finding(
                    doc.span(device),
                    f"optimizer offload to {device.value} with the torch optimizer {kind} built at "
                    f"{source.path}:{optimizer.lineno} and passed to deepspeed.initialize: DeepSpeed raises "
                    f"ZeRORuntimeException 'You are using ZeRO-Offload with a client provided optimizer'; use "
                    f"deepspeed.ops.adam.DeepSpeedCPUAdam, an \"optimizer\" block in the config, or "
                    f"\"zero_force_ds_cpu_optimizer\": false",
                    related=[Related(source.span_of_node(optimizer), "torch optimizer built here"),
                             Related(source.span_of_node(call), "passed to deepspeed.initialize here")]
                    + use.related,
                )
                break

    _DS = ('{\n  "train_batch_size": 16,\n  "zero_optimization": {\n    "stage": 2,\n'
           '    "offload_optimizer": {"device": "cpu"}\n  }%s\n}\n')
    _SCRIPT = ("import torch\nimport deepspeed\n\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
               "engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)\n")
    _LAUNCH = {"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"}
    VALID = [
        Example(_DS % ',\n  "zero_force_ds_cpu_optimizer": false', "the documented opt-out", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % ',\n  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}', "the config has an optimizer",
                path="ds.json", files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % "", "DeepSpeedCPUAdam passed", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT.replace("torch.optim.AdamW", "deepspeed.ops.adam.DeepSpeedCPUAdam")}),
        Example(_DS % "", "accelerate swaps in DeepSpeedCPUAdam for a torch AdamW", path="ds.json",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                          "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n",
                       "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "import torch\nfrom accelerate import Accelerator\n\naccelerator = Accelerator()\n"
                                   "optimizer = torch.optim.AdamW(model.parameters())\n"
                                   "model, optimizer = accelerator.prepare(model, optimizer)\n"}),
        Example(_DS.replace('"cpu"', '"none"') % "", "offload device none", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % "", "no optimizer passed: DeepSpeed builds none, nothing to refuse here", path="ds.json",
                files={**_LAUNCH, "train.py": "import deepspeed\n\nengine, *_ = deepspeed.initialize(args=args, model=model)\n"}),
    ]
    INVALID = [
        Example(_DS % "", "torch AdamW passed to deepspeed.initialize with CPU offload", path="ds.json", line=5,
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS.replace('"cpu"', '"nvme"') % "", "from torch.optim import, passed inline", path="ds.json", line=5,
                files={**_LAUNCH, "train.py": "from torch.optim import SGD\nimport deepspeed\n\n"
                                               "engine, *_ = deepspeed.initialize(model=model, optimizer=SGD(model.parameters(), lr=0.1))\n"}),
    ]
