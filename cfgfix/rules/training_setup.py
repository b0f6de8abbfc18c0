"""Rules over a launch's resolved training setup: CFX511 (DeepSpeed values that the HF
Trainer rejects), CFX601-CFX603 (training configs) [B10, C12].

They read `training_setups(project)`: one setup per launch, with every value's origin, so a
finding points at the line that sets the wrong value and lists the others as related."""

from __future__ import annotations

import re

from cfgfix.analysis.training_keys import TRAINING_ARGUMENT_DEFAULTS
from cfgfix.core import Applicability, Edit, Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.project import ProjectRule
from cfgfix.rules.base import Example, register

# (DeepSpeed key path, TrainingArguments name(s) whose value HF compares it with) — HF's
# `HfTrainerDeepSpeedConfig.trainer_config_process` (transformers integrations/deepspeed.py).
_HF_CHECKS = (
    (("train_micro_batch_size_per_gpu",), "per_device_train_batch_size"),
    (("gradient_accumulation_steps",), "gradient_accumulation_steps"),
    (("gradient_clipping",), "max_grad_norm"),
    (("optimizer", "params", "lr"), "learning_rate"),
    (("optimizer", "params", "weight_decay"), "weight_decay"),
    (("fp16", "enabled"), "fp16"),
    (("bf16", "enabled"), "bf16"),
)
HF_SCRIPT = (
    "from transformers import HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "trainer = Trainer(model=model, args=args)\ntrainer.train()\n"
)


def _node_at(root, path):
    node = root
    for key in path:
        if node is None or node.kind != "mapping":
            return None
        node = node.get(key)
    return node


class _HfArguments:
    """The TrainingArguments values of one launch, where they are all visible: the flags of a
    launch whose script parses them from the command line, or the script's one literal
    `TrainingArguments(...)` call. Defaults fill in what neither states."""

    def __init__(self, setup, script) -> None:
        self.values: dict[str, object] = {}
        self.origins: dict[str, object] = {}  # name -> Value (None for a default)
        self.complete = False
        self.overrides = script.argument_defaults if script is not None else {}
        self.own_defaults = bool(script is not None and script.own_defaults)
        flags = setup.sources.get("flags", {})
        if setup.parses_training_arguments and setup.launch.args and not any(
                "$" in text for text, _ in setup.launch.args):
            written = [text for text, _ in setup.launch.args]
            # a lone YAML/JSON argument is HfArgumentParser.parse_yaml_file/json_file: not flags
            if not (len(written) == 1 and written[0].endswith((".yaml", ".yml", ".json"))) and any(
                    text.startswith("--") for text in written):
                self.complete = True
                for value in flags.values():
                    self.values[value.name] = value.value
                    self.origins[value.name] = value
        elif script is not None and script.arguments_complete:
            self.complete = True
            for name, value in script.argument_values.items():
                self.values[name] = value.value
                self.origins[name] = value

    def get(self, name: str):
        if name in self.values:
            return self.values[name], self.origins[name]
        if name in self.overrides:  # the script's own dataclass changes the default
            value = self.overrides[name]
            return (value.value, value) if value is not None and self.complete else (None, None)
        if self.complete and name in TRAINING_ARGUMENT_DEFAULTS and not self.own_defaults:
            return TRAINING_ARGUMENT_DEFAULTS[name], None
        return None, None


@register
class TrainerDeepSpeedMismatch(ProjectRule):
    """## What it does
    Flags a value in a DeepSpeed config that is not `"auto"` and differs from the
    `TrainingArguments` of the HF Trainer launch that uses the file: the micro batch, the
    gradient accumulation, `train_batch_size` (micro × accumulation × processes), gradient
    clipping, the optimizer's learning rate and weight decay, and `fp16`/`bf16` `enabled`.

    The TrainingArguments side must be fully visible: the script parses them from the
    command line (`HfArgumentParser`) and the launch passes its flags literally, or the
    script builds one literal `TrainingArguments(...)`; then the defaults (micro batch 8,
    accumulation 1, fp16/bf16 off, learning rate 5e-5, `max_grad_norm` 1.0) count too.

    ## Why is this bad?
    The HF Trainer fills `"auto"` values from TrainingArguments and refuses any other value
    that disagrees: "Please correct the following DeepSpeed config values that mismatch
    TrainingArguments values: - ds fp16.enabled=True vs hf fp16|fp16_full_eval+fp16_backend(amp)=False".
    The run dies before the first step, often after minutes of model loading.

    ## Example
    ```json
    {"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": "auto"}
    ```
    with `deepspeed train.py --deepspeed ds.json --bf16 True`.

    ## Use instead
    ```json
    {"fp16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}
    ```

    ## Fix safety
    Safe: `"auto"` makes the Trainer write the value the launch already asks for, which is
    the only value it accepts.

    ## References
    - facts.md C12 ("HF Trainer and DeepSpeed"); transformers `integrations/deepspeed.py`
      (`HfTrainerDeepSpeedConfig.trainer_config_process`, `fill_match`)
    """

    code = "CFX511"
    name = "trainer-deepspeed-mismatch"
    severity = Severity.ERROR
    fix_availability = "safe"

    def check_project(self, project):
        from cfgfix.analysis.training_script import script_facts
        from cfgfix.training.resolve import training_setups
        from cfgfix.training.script import script_setup

        reported: set[tuple] = set()
        for setup in training_setups(project):
            path = setup.files.get("deepspeed")
            if path is None or not setup.trainer or setup.script is None:
                continue
            facts = script_facts(project, setup.script)
            if facts is None or facts[1].fills_auto:
                continue  # the script edits the DeepSpeed dict itself
            hf = _HfArguments(setup, script_setup(project, setup.script))
            doc = project.read(path)
            if doc is None:
                continue
            for keys, name in _HF_CHECKS:
                node = _node_at(doc.root, keys)
                if node is None or node.kind != "scalar" or node.value == "auto" or node.value is None:
                    continue
                hf_value, origin = hf.get(name)
                if hf_value is None or not _comparable(node.value, hf_value):
                    continue
                if node.value == hf_value:
                    continue
                key = (path, node.start)
                if key in reported:
                    continue
                reported.add(key)
                yield self._finding(doc, node, ".".join(keys), name, hf_value, origin, setup)
            yield from self._total(doc, hf, setup, reported, path)

    def _total(self, doc, hf, setup, reported, path):
        node = doc.root.get("train_batch_size")
        micro, micro_origin = hf.get("per_device_train_batch_size")
        accum, accum_origin = hf.get("gradient_accumulation_steps")
        world = setup.values.get("world_size")
        if (node is None or node.kind != "scalar" or not _is_int(node.value) or world is None
                or not _is_int(micro) or not _is_int(accum) or not _is_int(world.value)):
            return
        total = micro * accum * world.value
        if node.value == total or (path, node.start) in reported:
            return
        reported.add((path, node.start))
        related = [Related(v.span, v.origin) for v in (micro_origin, accum_origin, world) if v is not None and v.span]
        yield self.finding(
            doc.span(node),
            f"train_batch_size {node.value} != {micro} x {accum} x {world.value} processes = {total} from the "
            f"launch's TrainingArguments; the HF Trainer raises 'Please correct the following DeepSpeed config "
            f"values that mismatch TrainingArguments values'. Use \"auto\"",
            fix=Fix((replace_scalar(doc, node, "auto"),), "Set train_batch_size to \"auto\""),
            related=related + [Related(setup.launch.span, "launched here")],
        )

    def _finding(self, doc, node, ds_key, name, hf_value, origin, setup):
        shown = _show(node.value)
        if origin is None:
            where = f"{name}={_show(hf_value)}, the TrainingArguments default"
            related = [Related(setup.launch.span, f"launched here without --{name}")]
        else:
            where = f"{name}={_show(hf_value)} ({origin.origin})"
            related = [Related(origin.span, origin.origin)] if origin.span else []
            related.append(Related(setup.launch.span, "launched here"))
        return self.finding(
            doc.span(node),
            f"{ds_key}={shown} disagrees with the launch's TrainingArguments: {where}; the HF Trainer raises "
            f"'Please correct the following DeepSpeed config values that mismatch TrainingArguments values'. "
            f"Use \"auto\" and let the Trainer fill it",
            fix=Fix((replace_scalar(doc, node, "auto"),), f"Set {ds_key} to \"auto\""),
            related=related,
        )

    _DS = '{{\n  "fp16": {{"enabled": {fp16}}},\n  "bf16": {{"enabled": "auto"}},\n' \
          '  "train_micro_batch_size_per_gpu": {micro},\n  "zero_optimization": {{"stage": 2}}\n}}\n'
    _LAUNCH = "deepspeed --num_gpus 2 train.py --deepspeed ds.json --output_dir out {flags}\n"
    VALID = [
        Example(_DS.format(fp16='"auto"', micro='"auto"'), "everything \"auto\"", path="ds.json",
                files={"train.sh": _LAUNCH.format(flags="--bf16 True"), "train.py": HF_SCRIPT}),
        Example(_DS.format(fp16="false", micro=4), "values that agree with the flags", path="ds.json",
                files={"train.sh": _LAUNCH.format(flags="--bf16 True --per_device_train_batch_size 4"),
                       "train.py": HF_SCRIPT}),
        Example(_DS.format(fp16="true", micro='"auto"'), "a script without the HF Trainer (deepspeed.initialize)",
                path="ds.json", files={"train.sh": _LAUNCH.format(flags="--bf16 True"),
                                       "train.py": "import deepspeed\n\nengine, *_ = deepspeed.initialize(model=m, config='ds.json')\n"}),
        Example(_DS.format(fp16="true", micro='"auto"'), "flags from a variable: TrainingArguments not all visible",
                path="ds.json", files={"train.sh": _LAUNCH.format(flags="$EXTRA_ARGS"), "train.py": HF_SCRIPT}),
        Example(_DS.format(fp16="true", micro='"auto"'), "the script builds its own arguments (not from flags)",
                path="ds.json", files={"train.sh": _LAUNCH.format(flags=""),
                                       "train.py": "from transformers import Trainer, TrainingArguments\n\n"
                                                   "args = TrainingArguments(output_dir='o', **options)\n"
                                                   "Trainer(model=m, args=args).train()\n"}),
        Example(_DS.format(fp16='"auto"', micro=4), "TRL's SFTConfig has its own defaults: not HF's 8",
                path="ds.json", files={"train.sh": _LAUNCH.format(flags="--bf16 True"),
                                       "train.py": HF_SCRIPT.replace("TrainingArguments", "SFTConfig")
                                       .replace("from transformers import HfArgumentParser, Trainer, SFTConfig",
                                                "from transformers import HfArgumentParser\nfrom trl import SFTConfig, SFTTrainer as Trainer")}),
        Example(_DS.format(fp16="true", micro=8), "literal TrainingArguments that agree", path="ds.json",
                files={"train.sh": "deepspeed train.py\n",
                       "train.py": "from transformers import Trainer, TrainingArguments\n\n"
                                   "args = TrainingArguments(output_dir='o', fp16=True, deepspeed='ds.json')\n"
                                   "Trainer(model=m, args=args).train()\n"}),
    ]
    INVALID = [
        Example(_DS.format(fp16="true", micro='"auto"'), "fp16 on in the JSON, --bf16 on the command line",
                path="ds.json", line=2, files={"train.sh": _LAUNCH.format(flags="--bf16 True"), "train.py": HF_SCRIPT},
                fixed=_DS.format(fp16='"auto"', micro='"auto"')),
        Example(_DS.format(fp16='"auto"', micro=4), "micro batch 4 vs the TrainingArguments default 8",
                path="ds.json", line=4, files={"train.sh": _LAUNCH.format(flags="--bf16 True"), "train.py": HF_SCRIPT},
                fixed=_DS.format(fp16='"auto"', micro='"auto"')),
        Example(_DS.format(fp16='"auto"', micro=4), "literal TrainingArguments(per_device_train_batch_size=2)",
                path="ds.json", line=4,
                files={"train.sh": "deepspeed train.py\n",
                       "train.py": "from transformers import Trainer, TrainingArguments\n\n"
                                   "args = TrainingArguments(output_dir='o', per_device_train_batch_size=2,"
                                   " deepspeed='ds.json')\nTrainer(model=m, args=args).train()\n"},
                fixed=_DS.format(fp16='"auto"', micro='"auto"')),
    ]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _comparable(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value)
    return repr(value)


# -- CFX6xx: training configs ---------------------------------------------------------------
_CONFIG_SOURCES = ("training config", "config module")


def _on_gpu(setup) -> bool:
    """The launch certainly trains on GPUs: several processes under a distributed launcher,
    CUDA_VISIBLE_DEVICES set, or a target GPU in the settings."""
    launch = setup.launch
    if launch.cuda_devices and launch.cuda_devices.strip() not in ("", "-1"):
        return True
    world = setup.values.get("world_size")
    if launch.launcher in ("torchrun", "deepspeed", "accelerate") and world is not None and _is_int(world.value) and world.value > 1:
        return True
    return "gpu" in setup.values


def _flip_edit(project, value, new) -> Edit | None:
    """An edit that writes `new` (a bool or a string) where `value` is set, in the style of its
    file: a YAML/JSON scalar, or a Python literal (the same writer as `fix --fit`)."""
    from cfgfix.training.write_setup import replace_value

    return replace_value(project, "config", value, new)


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

        seen: set[tuple] = set()
        for setup in training_setups(project):
            precision = setup.values.get("precision")
            mixed = setup.values.get("mixed_precision")
            if precision is None or precision.value != "fp32" or mixed is None or mixed.span is None:
                continue
            source = next((name for name in _CONFIG_SOURCES
                           if any(v.span == mixed.span for v in setup.sources.get(name, {}).values())), None)
            if source is None or "quantization" in setup.values or not _on_gpu(setup):
                continue
            if _weights_may_be_half(setup):
                continue  # the weights' dtype is decided elsewhere (a config key, a run-time value)
            if any(setup.values.get(k) is not None and setup.values[k].value is True for k in ("offload_param",)):
                continue
            key = (mixed.span.path, mixed.span.start)
            if key in seen:
                continue
            seen.add(key)
            target = _half_for(setup)
            found = setup.sources[source]
            if mixed.name == "mixed_precision":
                edit = _flip_edit(project, found["mixed_precision"], target)
                change = f"mixed_precision {target}"
            else:
                edit = _flip_edit(project, found[target], True) if target in found else None
                change = f"{target} true"
            yield self.finding(
                mixed.span,
                f"{mixed.origin} makes this GPU launch train in full fp32: twice the activation memory of "
                f"{target} autocast and a fraction of the tensor-core speed; mixed precision keeps fp32 weights "
                f"and optimizer states",
                fix=Fix((edit,), f"Set {change}", Applicability.UNSAFE) if edit is not None else None,
                related=[Related(setup.launch.span, "launched here")],
            )

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


def _weights_may_be_half(setup) -> bool:
    """A config's `torch_dtype: bfloat16`, or a load whose dtype is computed at run time:
    `bf16: false` alone then does not mean fp32 training."""
    if "weights_open" in setup.sources.get("script", {}):
        return True
    for found in setup.sources.values():
        value = found.get("weights_config")
        if value is not None and str(value.value).lower() not in ("float32", "fp32", "torch.float32"):
            return True
    return False


def _half_for(setup) -> str:
    """bf16 unless the target GPU is known to lack it."""
    gpu = setup.values.get("gpu")
    if gpu is not None:
        supports = _gpu_bf16(gpu.value)
        if supports is False:
            return "fp16"
    return "bf16"


def _gpu_bf16(name: str) -> bool | None:
    """Whether the named GPU computes in bf16 (None: not in the catalog)."""
    try:
        from cfgfix.memory.gpus import find_gpu
    except ImportError:
        return None
    gpu = find_gpu(name)
    return getattr(gpu, "bf16", None) if gpu is not None else None


@register
class Fp16OnBf16Hardware(ProjectRule):
    """## What it does
    Flags fp16 mixed precision (`mixed_precision: fp16`, `fp16: true`, `--fp16`, a DeepSpeed
    `fp16` block enabled) in a launch whose target GPU supports bf16: the `gpu` setting
    (`[tool.cfgfix] gpu = "A100 80GB"`, or `--gpu`) names a card of the catalog with bf16
    (Ampere and newer). Silent when no target GPU is set or the catalog does not know it,
    and for quantized models (an 8-bit load, a GPTQ / AWQ / Int4 checkpoint), whose kernels
    often need fp16.

    ## Why is this bad?
    fp16 has 5 exponent bits: gradients underflow and activations overflow unless a loss
    scaler hunts for a scale, skipping steps that overflowed and sometimes diverging to
    NaN. bf16 has fp32's range, needs no scaler, and on these GPUs runs at the same speed
    with the same memory.

    ## Example
    ```yaml
    # pyproject.toml: [tool.cfgfix] gpu = "A100 80GB"
    mixed_precision: fp16
    ```

    ## Use instead
    ```yaml
    mixed_precision: bf16
    ```

    ## Fix safety
    Unsafe: numerics change (bf16 has fewer mantissa bits than fp16), and a model trained
    or released in fp16 may want to stay there. Fixed only where one value decides
    (`mixed_precision`, or `fp16: true` next to an explicit `bf16: false`).

    ## References
    - facts.md A5 (GradScaler and bf16); the GPU catalog (`cfgfix/memory/data/gpus.json`)
    """

    code = "CFX602"
    name = "fp16-on-bf16-hardware"
    severity = Severity.INFO
    fix_availability = "unsafe"

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        seen: set[tuple] = set()
        for setup in training_setups(project):
            gpu = setup.values.get("gpu")
            if gpu is None or _gpu_bf16(gpu.value) is not True:
                continue
            precision, mixed = setup.get("precision"), setup.get("mixed_precision")
            if precision not in ("amp-fp16", "deepspeed-fp16", "fp16") or mixed == "bf16":
                continue  # the launch does not train in fp16, or its files disagree (CFX402/CFX501/CFX511)
            if setup.get("quantization") or _QUANTIZED_NAME.search(str(setup.get("model") or "")):
                continue  # int8 / GPTQ / AWQ kernels often want fp16: the choice may be forced
            for source, found in setup.sources.items():
                chosen = _fp16_choice(source, found)
                if chosen is None or chosen.span is None:
                    continue
                key = (chosen.span.path, chosen.span.start)
                if key in seen:
                    continue
                seen.add(key)
                yield self.finding(
                    chosen.span,
                    f"{chosen.origin} chooses fp16 while the target GPU ({gpu.value}) computes in bf16 at the same "
                    f"speed: fp16 needs loss scaling and can overflow to inf/NaN, bf16 has fp32's range and needs no scaler",
                    fix=self._fix(project, source, found, chosen),
                    related=[Related(setup.launch.span, "launched here")],
                )

    @staticmethod
    def _fix(project, source, found, chosen):
        if source in ("deepspeed config", "script"):
            return None
        if chosen.setting == "mixed_precision":
            if source == "flags":
                edit = Edit(chosen.span.path, chosen.span.start, chosen.span.end, "bf16")
            else:
                edit = _flip_edit(project, chosen, "bf16")
            return Fix((edit,), "Use bf16", Applicability.UNSAFE) if edit is not None else None
        bf16 = found.get("bf16")
        if source == "flags" or bf16 is None or bf16.value is not False:
            return None
        edits = (_flip_edit(project, chosen, False), _flip_edit(project, bf16, True))
        if None in edits:
            return None
        return Fix(edits, "Use bf16 instead of fp16", Applicability.UNSAFE)

    _GPU = '[tool.cfgfix]\ngpu = "{gpu}"\n'
    _CONFIG = "per_device_train_batch_size: 4\nfp16: true\nbf16: false\n"
    _FILES = {"train.sh": "torchrun --nproc_per_node 2 train.py --config train.yaml\n", "train.py": "print(1)\n"}
    VALID = [
        Example(_CONFIG, "no target GPU set", path="train.yaml", files=_FILES),
        Example(_CONFIG, "a V100 has no bf16", path="train.yaml", files={**_FILES, "pyproject.toml": _GPU.format(gpu="V100")}),
        Example(_CONFIG.replace("fp16: true\nbf16: false", "fp16: false\nbf16: true"), "bf16 already",
                path="train.yaml", files={**_FILES, "pyproject.toml": _GPU.format(gpu="A100 80GB")}),
        Example(_CONFIG, "a GPTQ Int4 checkpoint: its kernels want fp16", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 2 train.py --config train.yaml "
                                   "--model_name_or_path Qwen/Qwen-7B-Chat-Int4\n",
                       "train.py": "print(1)\n", "pyproject.toml": _GPU.format(gpu="A100 80GB")}),
    ]
    INVALID = [
        Example(_CONFIG, "fp16 on an A100", path="train.yaml", line=2,
                files={**_FILES, "pyproject.toml": _GPU.format(gpu="A100 80GB")},
                fixed=_CONFIG.replace("fp16: true\nbf16: false", "fp16: false\nbf16: true")),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: fp16\nnum_processes: 2\n",
                "accelerate's mixed_precision fp16 on an RTX 4090", path="acc.yaml", line=3,
                files={"train.sh": "accelerate launch --config_file acc.yaml train.py\n", "train.py": "print(1)\n",
                       "pyproject.toml": _GPU.format(gpu="RTX 4090")},
                fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n"),
    ]


_PARALLEL = re.compile(r"(tensor|pipeline|context|sequence)_(model_)?parallel|\btp_size\b|\bpp_size\b", re.IGNORECASE)


def _model_parallel(project, setup) -> bool:
    """The launch's training config or flags mention model parallelism (Megatron-style
    tensor / pipeline / context parallel sizes)."""
    if any(_PARALLEL.search(text) for text, _ in setup.launch.args):
        return True
    path = setup.files.get("training config")
    doc = project.read(path) if path is not None else None
    return bool(doc is not None and _PARALLEL.search(doc.source.text))


_QUANTIZED_NAME = re.compile(r"int4|int8|gptq|awq|4bit|8bit", re.IGNORECASE)


def _fp16_choice(source: str, found: dict):
    """The value in one source that chooses fp16 mixed precision, or None."""
    value = found.get("mixed_precision")
    if value is not None and value.value == "fp16":
        return value
    value = found.get("fp16")
    if value is not None and value.value is True:
        return value
    return None


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
        for source in ("flags",) + _CONFIG_SOURCES:
            stated = setup.sources.get(source, {}).get("global_batch")
            if stated is None or not _is_int(stated.value) or stated.value == effective.value:
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
        for source in ("flags",) + _CONFIG_SOURCES:
            other = setup.sources.get(source, {}).get("micro_batch")
            if other is None or not _is_int(other.value) or other.value == deepspeed.value:
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
