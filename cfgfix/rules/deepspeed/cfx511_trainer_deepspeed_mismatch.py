"""CFX511 trainer-deepspeed-mismatch."""

from __future__ import annotations

from cfgfix.analysis.training_keys import TRAINING_ARGUMENT_DEFAULTS
from cfgfix.core import Fix, Related, Severity
from cfgfix.documents.config_edits import replace_scalar
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.setup.common import is_int

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
        self.unknown: set[str] = set()  # keywords set to something computed: never a default
        self.complete = False
        self.overrides = script.argument_defaults if script is not None else {}
        self.own_defaults = bool(script is not None and script.own_defaults)
        flags = setup.sources.get("flags", {})
        if setup.parses_training_arguments and setup.launch.args and not any(
                "$" in text for text, _ in setup.launch.args):
            written = [text for text, _ in setup.launch.args]
            # a lone YAML/JSON argument is HfArgumentParser.parse_yaml_file/json_file: not flags;
            # its top-level keys are the arguments when the script parses it so (resolve.py)
            if len(written) == 1 and written[0].endswith((".yaml", ".yml", ".json")):
                if setup.arguments_file is not None:
                    self.complete = True
                    for name, value in setup.arguments_file.items():
                        self.values[name] = value.value
                        self.origins[name] = value
            elif any(text.startswith("--") for text in written):
                self.complete = True
                for value in flags.values():
                    self.values[value.name] = value.value
                    self.origins[value.name] = value
        elif script is not None and _one_visible_call(setup, script):
            # one TrainingArguments(...) call whose every keyword is a literal or a value the
            # launch resolves (its flags, the script's own config file, `**cfg["training"]`)
            self.complete = True
            for name, value in script.argument_values.items():
                self.values[name] = value.value
                self.origins[name] = value
            for name, value in setup.argument_refs.items():
                if value is None:
                    self.unknown.add(name)
                else:
                    self.values[name] = value.value
                    self.origins[name] = value
            self.unknown |= {name for name in script.argument_opaque if name not in self.values}

    def get(self, name: str):
        if name in self.unknown:
            return None, None
        if name in self.values:
            return self.values[name], self.origins[name]
        if name in self.overrides:  # the script's own dataclass changes the default
            value = self.overrides[name]
            return (value.value, value) if value is not None and self.complete else (None, None)
        if self.complete and name in TRAINING_ARGUMENT_DEFAULTS and not self.own_defaults:
            return TRAINING_ARGUMENT_DEFAULTS[name], None
        return None, None


def _one_visible_call(setup, script) -> bool:
    """The script builds one `TrainingArguments(...)` with keywords only, and every `**`
    spread in it is a config mapping this launch resolved."""
    if len(script.argument_calls) != 1 or script.argument_calls[0].args:
        return False
    return "**" not in script.argument_opaque and setup.arguments_resolved


@register
class TrainerDeepSpeedMismatch(ProjectRule):
    """## What it does
    Flags a value in a DeepSpeed config that is not `"auto"` and differs from the
    `TrainingArguments` of the HF Trainer launch that uses the file: the micro batch, the
    gradient accumulation, `train_batch_size` (micro × accumulation × processes), gradient
    clipping, the optimizer's learning rate and weight decay, and `fp16`/`bf16` `enabled`.

    The TrainingArguments side must be fully visible: the script parses them from the
    command line (`HfArgumentParser`) and the launch passes its flags literally, or a single
    YAML/JSON argument that `HfArgumentParser.parse_yaml_file`/`parse_json_file` reads, or
    the script builds one `TrainingArguments(...)` whose keywords are literals or values the
    launch resolves (the script's argparse flags and their defaults, keys of the config file
    it loads itself: `bf16=cfg["bf16"]`, `**cfg["training"]`); then the defaults (micro
    batch 8, accumulation 1, fp16/bf16 off, learning rate 5e-5, `max_grad_norm` 1.0) count
    too. A keyword computed at run time is unknown, never its default.

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
        if (node is None or node.kind != "scalar" or not is_int(node.value) or world is None
                or not is_int(micro) or not is_int(accum) or not is_int(world.value)):
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
        Example('{\n  "bf16": {"enabled": true},\n  "train_micro_batch_size_per_gpu": "auto"\n}\n',
                "TRL's SFTConfig, whose bf16 defaults to on when fp16 is not set: not TrainingArguments' default",
                path="ds.json",
                files={"run.sh": "deepspeed train.py\n",
                       "train.py": "from trl import SFTConfig, SFTTrainer\n"
                                   "args = SFTConfig(output_dir='o', deepspeed='ds.json', per_device_train_batch_size=2)\n"
                                   "SFTTrainer(model=m, args=args, train_dataset=d).train()\n"}),
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


def _comparable(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value)
    return repr(value)
