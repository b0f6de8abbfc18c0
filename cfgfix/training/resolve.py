"""One resolved training setup per launch, every value with its origin.

Sources, read through the project model (each file parsed once per run):
- the launch's script flags (`--per_device_train_batch_size 4 --bf16 True`);
- a training config the flags name (`--config configs/x.yaml`, any YAML/JSON argument that
  holds training keys), and the local Python config modules the script imports;
- the script itself (literal `TrainingArguments(...)` keywords, load dtype, LoRA rank, ...);
- the accelerate config (`--config_file`), and the DeepSpeed config (`--deepspeed F`, the
  accelerate config's `deepspeed_config_file`, `TrainingArguments(deepspeed=...)`, or a
  training config's `deepspeed:` key).

Which source wins follows the tools: a DeepSpeed value that is not "auto" is what trains
(for the batch sizes, HF raises when it disagrees with TrainingArguments, CFX511; accelerate
silently takes the JSON's, CFX404); otherwise flags beat config files beat literals in the
script beat the accelerate config (whose YAML keys accelerate's own launch options replace
one by one, `_accelerate_options`); `TrainingArguments` defaults fill in only for a script
that parses them from the command line. Anything else is "unknown".
"""

from __future__ import annotations

from pathlib import Path

from cfgfix.analysis.deepspeed_config import offload_device, zero_entry
from cfgfix.analysis.training_keys import (
    FULL_TRAINING_METHODS,
    NAME_TO_SETTING,
    TRAINING_ARGUMENT_DEFAULTS,
    TRAINING_MARKERS,
)
from cfgfix.documents.launches import TOOL_COMMANDS
from cfgfix.records import dataclass, field
from cfgfix.training.placeholders import placeholder_constants
from cfgfix.training.values import Value, from_args, from_config, from_python, normalise

# The order `cfgfix explain` shows, and the settings the memory model reads.
SETTINGS = (
    "model", "weights", "mixed_precision", "precision", "micro_batch", "grad_accum", "world_size",
    "effective_batch", "seq_len", "target_len", "resolution", "gradient_checkpointing", "optimizer", "zero_stage",
    "offload_optimizer", "offload_param", "fsdp", "lora_rank", "lora_targets", "quantization", "attention", "optimizer_impl", "head", "frozen_models", "gpu",
)
LABELS = {
    "model": "model", "weights": "weights dtype", "mixed_precision": "autocast (mixed precision)",
    "precision": "precision", "micro_batch": "micro batch per GPU", "grad_accum": "gradient accumulation",
    "world_size": "processes (GPUs)", "effective_batch": "effective batch", "seq_len": "sequence length", "target_len": "target length",
    "resolution": "resolution", "gradient_checkpointing": "gradient checkpointing", "optimizer": "optimizer",
    "zero_stage": "ZeRO stage", "offload_optimizer": "optimizer offload", "offload_param": "parameter offload",
    "fsdp": "FSDP sharding", "lora_rank": "LoRA rank", "lora_targets": "LoRA targets", "quantization": "quantized base", "gpu": "target GPU",
    "attention": "attention kernel", "optimizer_impl": "optimizer implementation", "head": "model head", "frozen_models": "frozen models on the GPU",
}
# Training tools driven by one YAML (`llamafactory-cli train`, `axolotl train`,
# `accelerate launch -m axolotl.cli.train`): an HF Trainer underneath, every setting in the YAML.
TOOL_MODULES = frozenset({"llamafactory.train", "axolotl.cli.train", "axolotl.cli.train.do_cli"})

# Where a setting is looked up, first source first: what a YAML-driven tool decides whatever
# the generic keys say ("framework"), then the launch's flags, the files, the script, and the
# defaults of the script's argument dataclasses or of the tool ("framework defaults").
_GENERAL = ("framework", "flags", "training config", "config module", "script", "argument defaults", "framework defaults")

# settings a script's argument dataclass default may give (the rest need an explicit value)
_DEFAULTABLE = frozenset({"model", "micro_batch", "grad_accum", "seq_len", "target_len", "optimizer", "bf16", "fp16",
                          "gradient_checkpointing"})
_SHARDING = {"FULL_SHARD": "full", "1": "full", "HYBRID_SHARD": "full", "SHARD_GRAD_OP": "grad-op", "2": "grad-op",
             "_HYBRID_SHARD_ZERO2": "grad-op", "NO_SHARD": "none", "3": "none"}


@dataclass
class TrainingSetup:
    launch: object  # LaunchFacts
    launch_file: Path
    script: Path | None
    files: dict[str, Path] = field(default_factory=dict)  # role -> real path
    values: dict[str, Value] = field(default_factory=dict)
    sources: dict[str, dict[str, Value]] = field(default_factory=dict)  # source name -> its values
    trainer: bool = False  # the script trains with an HF / TRL Trainer
    trains: bool | None = None  # the script shows a training step; None: no script read
    parses_training_arguments: bool = False
    # the script's one TrainingArguments / *Config call shows every value (no `**`, nothing
    # positional, not mutated afterwards), or a TRL trainer builds its own config: the
    # class's defaults hold for what it leaves out
    arguments_literal: bool = False
    # The script's TrainingArguments(...) keywords resolved for this launch: HF name -> Value,
    # None where the value is unknown (computed, or a reference this launch leaves open);
    # `arguments_file`: the values of an HfArgumentParser.parse_yaml_file argument
    argument_refs: dict = field(default_factory=dict)
    arguments_resolved: bool = True  # every `**spread` and reference of the call resolved
    arguments_file: dict | None = None
    # the script's own model class sized as the sum of its parts (training/custom_model.py Sized)
    composite: object = None
    # `TrainingArguments(**cfg["training"])`: the (document, mapping node) the keywords come
    # from, where `fix --fit` adds a setting the launch does not state yet
    spread: tuple | None = None
    # the exact transformers release of the script's project (its pin, else the installed
    # one): what the memory model reads for version-dependent defaults; None: unknown
    transformers_version: str | None = None
    # a launch of a tool driven by one YAML (LLaMA-Factory, axolotl): the tool, its release and
    # its YAML (training/frameworks/yaml_tools.py ToolRun); None for any other launch
    framework: object = None
    # settings the files state that disagree, with which one wins and why (in words)
    conflicts: list[str] = field(default_factory=list)
    # "dpo": a TRL DPOTrainer / DPOConfig run (chosen and rejected per sample, a reference
    # model: memory_setup.dpo_setup); None: a plain training step
    task: str | None = None

    def get(self, setting: str):
        value = self.values.get(setting)
        return value.value if value is not None else None

    def to_dict(self, display) -> dict:
        return {
            "launch": {"path": display(self.launch_file), "line": self.launch.span.line,
                       "launcher": self.launch.launcher, "script": self.launch.script, "module": self.launch.module},
            "files": {role: display(path) for role, path in self.files.items()},
            "settings": {s: (self.values[s].to_dict() if s in self.values else None) for s in SETTINGS},
            "framework": self.framework.to_dict() if self.framework is not None else None,
            "conflicts": list(self.conflicts),
        }


def training_setups(project) -> list[TrainingSetup]:
    """The setups of every launch of the project, memoised per run."""
    key = ("training-setups",)
    if key not in project._scripts:
        project._scripts[key] = [_Resolver(project, launch, launch_file).resolve()
                                 for launch, launch_file in project.launches
                                 if launch.script or launch.module]
    return project._scripts[key]


def is_training_config(doc) -> bool:
    """A YAML/JSON mapping with at least two different training settings (at any depth)."""
    if doc is None or doc.root is None or doc.root.kind != "mapping":
        return False
    return len(set(from_config(doc, "").keys()) & TRAINING_MARKERS) >= 2


def _trl_cli_facts(module: str | None):
    """The TrlFacts of a `trl <command>` launch (trl/scripts/<command>.py: a TrlParser over
    the command's *Config and ModelConfig, the model given to the trainer by name)."""
    if not module or not module.startswith("trl.scripts."):
        return None
    from cfgfix.training.frameworks.trl import CLI_CONFIGS
    from cfgfix.training.trl_script import TrlFacts

    config = CLI_CONFIGS.get(module.rsplit(".", 1)[-1])
    if config is None:
        return None
    return TrlFacts(config=config, config_origin=f"trl {module.rsplit('.', 1)[-1]}", named_model=True)


class _Resolver:
    def __init__(self, project, launch, launch_file: Path) -> None:
        from cfgfix.project import script_path

        self.project = project
        self.launch = launch
        self.launch_file = launch_file
        script = script_path(launch, launch_file, project.root)
        self.setup = TrainingSetup(launch, launch_file, script)
        self.distributed: Value | None = None  # accelerate's distributed_type, flags over its YAML

    def display(self, path: Path) -> str:
        return self.project.display(path)

    def resolve(self) -> TrainingSetup:
        from cfgfix.training.script import script_setup

        setup, project, launch = self.setup, self.project, self.launch
        launch_name = self.display(self.launch_file)
        sources = setup.sources
        sources["flags"] = from_args(launch.args, launch_name)
        script = script_setup(project, setup.script) if setup.script is not None else None
        if launch.module in TOOL_MODULES:
            setup.trainer = setup.trains = True  # the tool trains with an HF Trainer
        cli = _trl_cli_facts(launch.module)
        if cli is not None:  # `trl sft ...`: trl/scripts/sft.py parses SFTConfig from the flags
            setup.trainer = setup.trains = setup.parses_training_arguments = True
        if script is not None:
            setup.trainer = script.trainer
            setup.trains = script.trains
            setup.parses_training_arguments = script.parses_training_arguments and not script.mutates_arguments
            setup.arguments_literal = (len(script.argument_calls) == 1 and script.arguments_complete
                                       and not script.mutates_arguments and not script.parses_training_arguments)
            if cli is not None:  # trl's own script (the trl repository itself): it parses its flags
                setup.trainer = setup.trains = setup.parses_training_arguments = True
        self._training_config()
        tool = self._framework()
        if script is not None:
            sources["script"] = dict(script.values)
            self._references(script)
            if script.custom_model is not None:
                self._custom_model(script)
            for module in script.config_modules:
                parsed = project.script(module)
                if parsed is None:
                    continue
                found = from_python(parsed[0], parsed[1], self.display(module))
                if set(found) & TRAINING_MARKERS or "lora_rank" in found:
                    # a builder's placeholder that the launch's code assigns again states nothing
                    placeholders = placeholder_constants(parsed[1], module, [setup.script, *script.config_modules])
                    found = {k: v for k, v in found.items() if v.name not in placeholders}
                    setup.files.setdefault("config module", module)
                    for setting, value in found.items():
                        sources.setdefault("config module", {}).setdefault(setting, value)
                self._imported_training(script_setup(project, module), script)
            if setup.parses_training_arguments:
                # the defaults of the script's argument dataclasses, for flags the launch leaves out
                # (not a LoRA rank: `lora_r: int = 64` beside `lora_enable: bool = False` says nothing)
                sources["argument defaults"] = {
                    value.setting: value for value in script.argument_defaults.values()
                    if value is not None and value.setting in _DEFAULTABLE}
        if script is not None or cli is not None:
            self._trl(script, cli)
        self._accelerate()
        self._deepspeed(script)
        if tool is not None:
            tool.decide(self, setup.framework)
        if script is not None and script.lightning is not None:
            from cfgfix.training.resolve_lightning import resolve_lightning

            resolve_lightning(self, script)
        self._combine()
        setup.transformers_version = self._transformers_version()
        return setup

    def _framework(self):
        """The YAML-driven tool this launch runs (LLaMA-Factory, axolotl): its module, with
        the YAML's keys and the launch's overrides read into the sources; None for others."""
        from cfgfix.training.frameworks import axolotl, llamafactory

        for tool in (llamafactory, axolotl):
            run = tool.read(self)
            if run is not None:
                self.setup.framework = run
                return tool
        return None

    def _versions(self):
        """The project's `Versions` for the training script (pins nearest it, the installed
        copies), memoised per run."""
        from cfgfix.analysis.versions import ProjectVersions

        key = ("project-versions",)
        cache = self.project._scripts
        if key not in cache:
            cache[key] = ProjectVersions(self.project.root)
        return cache[key].for_file(self.setup.script or self.launch_file)

    def _trl(self, script, cli=None) -> None:
        """A TRL trainer's setup: the model it is given by name, and its config class's
        defaults for the trl release the project uses (its pin, the installed copy, else the
        current release, docs/versions.md) where the launch leaves a setting to them."""
        from cfgfix.training.frameworks import trl

        facts = cli or script.trl
        for module in script.config_modules if cli is None and (facts is None or facts.trainer is None) else ():
            imported = self._imported_setup(module)
            if imported is not None and imported.trl is not None and imported.trl.trainer is not None:
                facts = imported.trl
                break
        if facts is not None and "DPOConfig" in (facts.config, trl.CONFIG_OF_TRAINER.get(facts.trainer or "")):
            self.setup.task = "dpo"
        if facts is None or (facts.config is None and not facts.named_model):
            return
        try:
            versions = self._versions().resolve("trl")
        except (OSError, ValueError):
            return
        sources = self.setup.sources
        found: dict[str, Value] = {}
        release = versions.describe()
        if facts.model is not None:
            sources["script"].setdefault("model", facts.model)
        elif facts.model_ref is not None:
            self._trl_model_ref(script, facts)
        if facts.named_model:
            weights = facts.model_dtype or self._trl_load_dtype(versions, cli is not None)
            if weights is not None:
                sources.setdefault("script", {}).setdefault("weights", weights)
        config = facts.config
        if config is None:
            return
        origin = f"{config} default ({release})"

        def put(setting: str, rows, note: str = "") -> None:
            known, value = trl.value_for(rows, versions) if rows is not None else (False, None)
            if known and value is not None:
                found[setting] = Value(setting, value, origin + note)

        put("gradient_checkpointing", trl.table_for(trl.GRADIENT_CHECKPOINTING, config))
        if config == "GRPOConfig":
            self._grpo_length(versions, origin, found)
            known, batch = trl.value_for(trl.GRPO_BATCH, versions)
            if known and batch is not None:
                found["micro_batch"] = Value("micro_batch", batch[0], origin + " (per_device_train_batch_size)")
                found["grad_accum"] = Value("grad_accum", batch[1], origin + " (gradient_accumulation_steps)")
        else:
            put("seq_len", trl.table_for(trl.SEQUENCE_LENGTH, config), " (max_length)")
        stated = [sources.get(name, {}) for name in ("flags", "training config", "config module", "script",
                                                      "argument defaults")]
        if not any(s.get("bf16") is not None or (s.get("fp16") is not None and s["fp16"].value is True)
                   for s in stated):
            known, on = trl.value_for(trl.table_for(trl.BF16_UNLESS_FP16, config), versions)
            if known:
                found["bf16"] = Value("bf16", on, origin + (": bf16 when fp16 is not set" if on else ""))
        put("learning_rate", trl.table_for(trl.LEARNING_RATE, config))
        for setting, value in found.items():  # a YAML tool's own defaults (frameworks/) stay first
            sources.setdefault("framework defaults", {}).setdefault(setting, value)
        if facts.built_by_trainer:
            self.setup.arguments_literal = True

    def _trl_load_dtype(self, versions, cli: bool) -> Value | None:
        """The dtype a TRL trainer loads a model given by name in, without model_init_kwargs
        (`cli`: trl's own scripts, which pass ModelConfig's `--dtype`)."""
        from cfgfix.training.frameworks import trl

        if cli:
            words = [text for text, _ in self.launch.args]
            for index, text in enumerate(words[:-1]):
                if text in ("--dtype", "--torch_dtype"):  # ModelConfig's (`dtype` from trl 0.24)
                    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(words[index + 1])
                    return Value("weights", dtype, f"{text} {words[index + 1]} on the launch") if dtype else None
            stated = self._first("weights_config", ("flags", "training config"))
            if stated is not None:
                dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(stated.value))
                return Value("weights", dtype, stated.origin, stated.span, stated.name) if dtype else None
        known, dtype = trl.value_for(trl.CLI_MODEL_DTYPE if cli else trl.NAMED_MODEL_DTYPE, versions)
        if not known or dtype == "auto":
            return None  # the checkpoint's own dtype
        if dtype == "transformers":  # transformers' default: float32 below 5
            below = self._versions().get("transformers").below("5.0.0")
            if below is not True:
                return None
            return Value("weights", "fp32", f"the model loaded by name by the trainer ({versions.describe()}): "
                         "transformers' default dtype float32 below 5")
        return Value("weights", dtype, f"the model loaded by name by the trainer ({versions.describe()}): "
                     "create_model_from_path's default dtype float32")

    def _grpo_length(self, versions, origin: str, found: dict) -> None:
        """GRPO trains on prompt + completion tokens: each from the launch, else its default."""
        from cfgfix.training.frameworks import trl

        total = 0
        for setting, rows in (("prompt_len", trl.GRPO_PROMPT_LENGTH), ("completion_len", trl.GRPO_COMPLETION_LENGTH)):
            stated = self._first(setting, ("flags", "training config", "config module", "script", "argument defaults"))
            if stated is not None and isinstance(stated.value, int) and not isinstance(stated.value, bool):
                total += stated.value
                continue
            known, value = trl.value_for(rows, versions)
            if not known or value is None:
                return
            total += value
        found["seq_len"] = Value("seq_len", total, f"{origin}: max_prompt_length + max_completion_length")

    def _trl_model_ref(self, script, facts) -> None:
        from cfgfix.training.resolve_refs import UNKNOWN, RefResolver

        resolver = RefResolver(self.project, self.launch, self.launch_file, self.setup.script, script.refs)
        resolved = resolver.resolve(facts.model_ref)
        if resolved is None or resolved is UNKNOWN or not isinstance(resolved.value, str) or "/" not in resolved.value:
            return
        self.setup.sources["script"].setdefault("model", Value("model", resolved.value, f"model= from {resolved.origin}",
                                                               resolved.span, "model"))

    def _imported_setup(self, module):
        from cfgfix.training.script import script_setup

        return script_setup(self.project, module)

    def _default_optimizer(self) -> None:
        """The HF Trainer's `optim` default for the transformers (and torch) release the project
        uses (training/frameworks/hf_trainer.py): AdamW in every release; its implementation
        fused only where transformers >= 4.54 runs on torch >= 2.8."""
        from cfgfix.training.frameworks import hf_trainer
        from cfgfix.training.frameworks.trl import value_for

        values = self.setup.values
        try:
            versions = self._versions()
            transformers = versions.resolve("transformers")
            torch = versions.resolve("torch")
        except (OSError, ValueError):
            values["optimizer"] = Value("optimizer", "adamw", "the HF Trainer's default (AdamW in every release)")
            return
        known, name = value_for(hf_trainer.DEFAULT_OPTIMIZER, transformers)
        impl = None
        if known and name == "adamw_torch_fused if torch>=2.8":
            fused = torch.at_least(hf_trainer.FUSED_FROM_TORCH)
            name = "adamw_torch_fused" if fused else "adamw_torch" if fused is False else "adamw_torch(_fused)"
            impl = "fused" if fused else None
            where = f"{transformers.describe()}, {torch.describe()}"
        else:
            where = transformers.describe()
        origin = f"the HF Trainer's default optim {name if known else '(an AdamW)'} ({where})"
        values["optimizer"] = Value("optimizer", "adamw", origin)
        if impl is not None:
            values.setdefault("optimizer_impl", Value("optimizer_impl", impl, origin))

    def _transformers_version(self) -> str | None:
        """The project's exact transformers pin for the training script, else the installed
        release (the versions module's order); a range gives None."""
        from cfgfix.analysis.versions import ProjectVersions
        from cfgfix.memory.transformers_versions import exact_version

        key = ("project-versions",)
        cache = self.project._scripts
        if key not in cache:
            cache[key] = ProjectVersions(self.project.root)
        where = self.setup.script or self.launch_file
        try:
            info = cache[key].for_file(where).get("transformers")
        except (OSError, ValueError):
            return None
        return exact_version(info.specifier)

    def _references(self, script) -> None:
        """Values the script takes from its flags and its own config file, for this launch."""
        from cfgfix.training.resolve_refs import UNKNOWN, RefResolver

        setup = self.setup
        if script.parses_argument_file and script.refs is not None:
            self._argument_file()
        if not (script.pending or script.argument_spreads or script.argument_refs):
            return
        resolver = RefResolver(self.project, self.launch, self.launch_file, setup.script, script.refs)
        found = setup.sources["script"]
        for setting, name, ref in script.pending:
            resolved = resolver.resolve(ref)
            if resolved is None or resolved is UNKNOWN or isinstance(resolved.value, (dict, list)) or hasattr(resolved.value, "kind"):
                continue
            if setting == "model" and not (isinstance(resolved.value, str) and "/" in resolved.value):
                continue  # a local folder or a name we cannot size: as for a literal
            found.setdefault(setting, Value(setting, normalise(setting, resolved.value),
                                            f"{name}= from {resolved.origin}", resolved.span, name))
        for name, ref in script.argument_refs.items():
            resolved = resolver.resolve(ref)
            ok = resolved is not None and resolved is not UNKNOWN and not hasattr(resolved.value, "kind")
            setup.argument_refs[name] = (Value(NAME_TO_SETTING.get(name, name), resolved.value,
                                               f"{name}= from {resolved.origin}", resolved.span, name) if ok else None)
        for ref in script.argument_spreads:
            resolved = resolver.resolve(ref)
            node = resolved.value if resolved is not None and resolved is not UNKNOWN else None
            if getattr(node, "kind", None) != "mapping":
                setup.arguments_resolved = False
                continue
            if setup.spread is None:
                setup.spread = (resolved.doc, node)
            for key, value in node.entries:
                if not isinstance(key.value, str) or value.kind != "scalar":
                    continue
                setting = NAME_TO_SETTING.get(key.value)
                entry = Value(setting or key.value, normalise(setting or key.value, value.value),
                              f"{key.value} in {resolved.doc.source.path} (TrainingArguments(**...) of {self.display(setup.script)})",
                              resolved.doc.span(value), key.value)
                setup.argument_refs[key.value] = entry
                if setting is not None:
                    found.setdefault(setting, entry)

    def _custom_model(self, script) -> None:
        """`model = MyModel(cfg["model"])`: the class's parts sized with the arguments this
        launch gives it (a config mapping, a flag, a literal) and the settings' overrides."""
        from cfgfix.training.custom_model import size_custom_model
        from cfgfix.training.resolve_refs import UNKNOWN, RefResolver
        from cfgfix.training.values import literal

        setup, custom = self.setup, script.custom_model
        resolver = RefResolver(self.project, self.launch, self.launch_file, setup.script, script.refs)

        def resolve(node):
            try:
                return literal(node, {})
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
            ref = script.refs.ref(node) if script.refs is not None else None
            found = resolver.resolve(ref) if ref is not None else None
            if found is None or found is UNKNOWN:
                return None
            return found.value.to_python() if hasattr(found.value, "kind") else found.value

        args = [resolve(a) for a in custom.call.args]
        kwargs = {}
        for kw in custom.call.keywords:
            if kw.arg:
                kwargs[kw.arg] = resolve(kw.value)
            elif isinstance(spread := resolve(kw.value), dict):  # `MultimodalEncoder(**cfg["model"])`
                kwargs.update({k: v for k, v in spread.items() if isinstance(k, str)})

        def parse(module):
            found = self.project.script(module)
            return found[1] if found is not None else None

        args, kwargs = custom.constructor_arguments(args, kwargs)
        folders = [self.launch_file.parent, self.project.root]
        if setup.script is not None:
            folders.insert(0, setup.script.parent)
        overrides = getattr(self.project, "target_model", None) or {}
        sized = size_custom_model(custom, args, kwargs, parse, folders, overrides)
        sized.origin = f"{custom.class_name}(...) in {self.display(setup.script)} (line {custom.call.lineno})"
        setup.composite = sized
        if sized.shape is not None:
            self.setup.sources["script"].setdefault("model", Value(
                "model", f"{custom.class_name} (the script's own class)",
                sized.origin))

    def _argument_file(self) -> None:
        """`HfArgumentParser.parse_yaml_file(sys.argv[1])` with one YAML/JSON argument: its
        top-level keys are the TrainingArguments fields (the rest keep their defaults)."""
        from cfgfix.project import _resolve

        written = [text for text, _ in self.launch.args]
        if len(written) != 1 or not written[0].lower().endswith((".yaml", ".yml", ".json")):
            return
        path = _resolve(written[0], self.launch_file, self.project.root)
        doc = self.project.read(path) if path is not None else None
        if doc is None:
            return
        name = self.display(path)
        values = {}
        for key, value in doc.root.entries:
            if isinstance(key.value, str) and value.kind == "scalar":
                setting = NAME_TO_SETTING.get(key.value, key.value)
                values[key.value] = Value(setting, normalise(setting, value.value), f"{key.value} in {name}",
                                          doc.span(value), key.value)
        self.setup.arguments_file = values

    def _imported_training(self, module, script) -> None:
        """A launched script that only calls into a local module (`from llava.train.train
        import train; train()`): the module's Trainer, argument parsing, argument defaults
        and literals count for the launch (one level of imports)."""
        if module is None:
            return
        setup = self.setup
        if module.trainer or module.trains:
            setup.trainer = setup.trainer or module.trainer
            setup.trains = setup.trains or module.trains
            if module.parses_training_arguments and not module.mutates_arguments:
                setup.parses_training_arguments = True
            for name, value in module.argument_defaults.items():
                script.argument_defaults.setdefault(name, value)
            for setting, value in module.values.items():
                setup.sources["script"].setdefault(setting, value)

    # -- files ----------------------------------------------------------------------------
    def _training_config(self) -> None:
        from cfgfix.project import _resolve

        candidates = []
        if self.launch.training_config:
            candidates.append(self.launch.training_config)
        candidates += [text for text, _ in self.launch.args
                       if text.lower().endswith((".yaml", ".yml", ".json")) and text not in candidates]
        for written in candidates:
            path = _resolve(written, self.launch_file, self.project.root)
            if path is None or path == self.setup.files.get("deepspeed"):
                continue
            doc = self.project.read(path)
            if doc is None or not is_training_config(doc) or self.project.configs.get(path):
                continue  # an accelerate / DeepSpeed config, or not a training config
            self.setup.files["training config"] = path
            self.setup.sources["training config"] = from_config(doc, self.display(path))
            return

    def _accelerate(self) -> None:
        """The accelerate config's values, then accelerate's own launch options over them."""
        from cfgfix.project import _resolve, accelerate_world_size

        found: dict[str, Value] = {}
        doc = None
        if self.launch.accelerate_config:
            path = _resolve(self.launch.accelerate_config, self.launch_file, self.project.root)
            doc = self.project.read(path) if path is not None else None
            if doc is not None:
                self.setup.files["accelerate"] = path
        if doc is not None:
            name = self.display(self.setup.files["accelerate"])
            root = doc.root
            node = root.get("mixed_precision")
            if node is not None and node.kind == "scalar":
                found["mixed_precision"] = Value("mixed_precision", node.value, f"mixed_precision in {name}",
                                                 doc.span(node), "mixed_precision")
            world, world_node = accelerate_world_size(doc)
            if world is not None:
                found["world_size"] = Value("world_size", world, f"{world_node and 'num_processes'} in {name}",
                                            doc.span(world_node), "num_processes")
            kind = root.get("distributed_type")
            if kind is not None and kind.kind == "scalar" and isinstance(kind.value, str):
                found["distributed_type"] = Value("distributed_type", kind.value, f"distributed_type in {name}",
                                                  doc.span(kind), "distributed_type")
            block = root.get("deepspeed_config")
            if block is not None and block.kind == "mapping":
                if "deepspeed_config_file" in block:
                    found["deepspeed_file"] = Value("deepspeed_file", True, f"deepspeed_config_file in {name}")
                for key, setting in (("gradient_accumulation_steps", "grad_accum"), ("zero_stage", "zero_stage")):
                    value = block.get(key)
                    if value is not None and value.kind == "scalar" and isinstance(value.value, int):
                        found[setting] = Value(setting, value.value, f"{key} in {name}", doc.span(value), key)
                for key, setting in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
                    value = block.get(key)
                    if value is not None and value.kind == "scalar" and isinstance(value.value, str):
                        found[setting] = Value(setting, value.value in ("cpu", "nvme"), f"{key} {value.value} in {name}",
                                               doc.span(value), key)
            fsdp = root.get("fsdp_config")
            strategy = fsdp.get("fsdp_sharding_strategy") if fsdp is not None and fsdp.kind == "mapping" else None
            if strategy is not None and strategy.kind == "scalar" and str(strategy.value) in _SHARDING:
                found["fsdp"] = Value("fsdp", _SHARDING[str(strategy.value)], f"fsdp_sharding_strategy in {name}",
                                      doc.span(strategy), "fsdp_sharding_strategy")
        self._accelerate_options(found)
        kind = found.pop("distributed_type", None)
        self.distributed = kind
        deepspeed = kind is not None and kind.value == "DEEPSPEED"
        for setting in ("grad_accum", "zero_stage", "offload_optimizer", "offload_param"):
            if not deepspeed:  # accelerate reads its deepspeed_config only for a DeepSpeed run
                found.pop(setting, None)
        if not (kind is not None and kind.value == "FSDP"):
            found.pop("fsdp", None)
        file_given = found.pop("deepspeed_file", None) is not None or bool(self.launch.deepspeed_config)
        if deepspeed and not file_given:
            found["deepspeed_inline"] = Value("deepspeed_inline", True, kind.origin, kind.span, kind.name)
        if deepspeed:
            found["deepspeed_on"] = kind
        if found or doc is not None:
            self.setup.sources["accelerate config"] = found

    def _accelerate_options(self, found: dict[str, Value]) -> None:
        """accelerate's launch options over its YAML, as `_validate_launch_command` applies
        them (accelerate 1.15.0, commands/launch.py): a YAML key fills only an option the
        command line left unset, and any of `--use_deepspeed`, `--use_fsdp`, `--multi_gpu`,
        `--cpu`, `--tpu`, `--use_megatron_lm` replaces the YAML's `distributed_type`. The
        script's own choice still wins (`_mixed` reads these last): TrainingArguments take
        ACCELERATE_MIXED_PRECISION only when neither --bf16 nor --fp16 is set (transformers
        5.24 training_args.py), and `Accelerator(mixed_precision=...)` beats the environment."""
        launch = self.launch
        if launch.launcher != "accelerate" or not launch.options:
            return
        where = self.display(self.launch_file)

        def flag(key: str, value: str | None, span) -> str:
            return f"--{key}{' ' + value if value is not None else ''} in {where}"

        kinds = {"use_deepspeed": "DEEPSPEED", "use_fsdp": "FSDP", "multi_gpu": "MULTI_GPU", "cpu": "NO",
                 "tpu": "XLA", "use_megatron_lm": "MEGATRON_LM"}
        for key, kind in kinds.items():
            if (given := launch.option(key)) is not None:
                found["distributed_type"] = Value("distributed_type", kind, flag(key, *given), given[1], f"--{key}")
                break
        if (given := launch.option("mixed_precision")) is not None and given[0] is not None:
            value = given[0].strip("'\"").lower()
            if value in ("no", "fp16", "bf16", "fp8"):
                found["mixed_precision"] = Value("mixed_precision", value, flag("mixed_precision", *given), given[1],
                                                 "--mixed_precision")
        if launch.option("deepspeed_config_file") is not None:
            found["deepspeed_file"] = Value("deepspeed_file", True, flag("deepspeed_config_file", *launch.option("deepspeed_config_file")))
        for key, setting in (("gradient_accumulation_steps", "grad_accum"), ("zero_stage", "zero_stage")):
            given = launch.option(key)
            if given is not None and given[0] is not None and given[0].isdigit() and len(given[0]) < 10:
                found[setting] = Value(setting, int(given[0]), flag(key, *given), given[1], f"--{key}")
        for key, setting in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
            given = launch.option(key)
            if given is not None and given[0] is not None and "$" not in given[0]:
                device = given[0].lower()
                found[setting] = Value(setting, device in ("cpu", "nvme"), flag(key, *given), given[1], f"--{key}")
        given = launch.option("fsdp_sharding_strategy")
        if given is not None and given[0] is not None and given[0] in _SHARDING:
            found["fsdp"] = Value("fsdp", _SHARDING[given[0]], flag("fsdp_sharding_strategy", *given), given[1],
                                  "--fsdp_sharding_strategy")

    def _deepspeed(self, script) -> None:
        from cfgfix.project import _launch_folders, _resolve_in

        setup, project = self.setup, self.project
        path = None
        bases = [*_launch_folders(self.launch_file, project.root), project.root] + (
            [setup.script.parent] if setup.script else [])
        # accelerate reads a DeepSpeed config (its --deepspeed_config_file, its YAML's
        # deepspeed_config_file) only for a DeepSpeed run: `--multi_gpu` over a DEEPSPEED YAML is none
        kind = self.distributed
        accelerate_off = self.launch.launcher == "accelerate" and kind is not None and kind.value != "DEEPSPEED"
        by_option = self.launch.launcher == "accelerate" and self.launch.option("deepspeed_config_file") is not None
        if self.launch.deepspeed_config and not (accelerate_off and by_option):
            path = _resolve_in(self.launch.deepspeed_config, bases)
        if path is None and "accelerate" in setup.files and not accelerate_off:
            for link in project.accelerate_links():
                if link.path == setup.files["accelerate"] and link.deepspeed_path is not None:
                    path = link.deepspeed_path
        if path is None:
            for source in ("training config", "config module", "script"):
                written = setup.sources.get(source, {}).get("deepspeed")
                if written is not None and isinstance(written.value, str):
                    path = _resolve_in(written.value, bases)
                    if path is not None:
                        break
        if path is None:  # `deepspeed.initialize(config=...)`, `DeepSpeedPlugin(hf_ds_config=...)`, an argparse default
            bound = project.bound_in_code(self.launch, setup.script, bases)
            path = bound[0][0] if bound else None
        doc = project.read(path) if path is not None else None
        if doc is None:
            if path is None and script is not None:
                self._deepspeed_dict()
            return
        setup.files["deepspeed"] = path
        setup.sources["deepspeed config"] = self._deepspeed_values(doc, self.display(path))

    def _deepspeed_dict(self) -> None:
        """`TrainingArguments(deepspeed={...})`, `deepspeed.initialize(config=ds_config)`: a dict
        built in the script (a literal, or what a function of the script or of another project
        module returns, with the keys the script assigns before use: training/bound_dict.py) is
        the DeepSpeed config, read as one; its values point at the dict."""
        import json

        from cfgfix.analysis.training_script import script_facts
        from cfgfix.documents.config import ConfigError, parse_config
        from cfgfix.documents.text import SourceText
        from cfgfix.training.bound_dict import built_dict

        found = script_facts(self.project, self.setup.script)
        bound = next((b for b in found[1].bound_configs if b.inline), None) if found is not None else None
        parsed = self.project.script(self.setup.script) if bound is not None else None
        if bound is None or parsed is None:
            return
        try:
            built = built_dict(self.project, self.setup.script, parsed[1], bound)
            if built is None:
                return
            data = json.dumps(built[0])
            doc = parse_config(SourceText.from_bytes("<dict>", data.encode()), "json")
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError, ConfigError):
            return
        if doc.root is None or doc.root.kind != "mapping":
            return
        span = found[0].span_of_node(bound.node)
        values = self._deepspeed_values(doc, f"the dict of {bound.call} in {self.display(self.setup.script)}")
        self.setup.sources["deepspeed config"] = {
            setting: Value(value.setting, value.value, value.origin, span, value.name) for setting, value in values.items()}
        self.setup.sources["accelerate config"] = {**self.setup.sources.get("accelerate config", {}),
                                                   "deepspeed_inline": Value("deepspeed_inline", True, bound.call, span)}

    def _deepspeed_values(self, doc, name: str) -> dict[str, Value]:
        return deepspeed_settings(doc, name)

    # -- combining ------------------------------------------------------------------------
    def _first(self, setting: str, order: tuple[str, ...]) -> Value | None:
        for source in order:
            value = self.setup.sources.get(source, {}).get(setting)
            if value is not None and value.value != "auto":
                return value
        return None

    def _combine(self) -> None:
        setup = self.setup
        values = setup.values
        general = ("lightning",) + _GENERAL  # a Lightning Trainer's own arguments decide first
        for setting in ("model", "seq_len", "target_len", "resolution", "gradient_checkpointing", "lora_rank", "lora_targets",
                        "precompute_ref_log_probs", "group_by_length"):
            value = self._first(setting, general)
            if value is not None:
                values[setting] = value
        if "model" in values and not isinstance(values["model"].value, str):
            del values["model"]
        self._training_method(general)
        if "lora_rank" in values and values["lora_rank"].value is None:
            del values["lora_rank"]  # a YAML tool that trains no adapter here (a full fine-tune) whatever lora_r says
        quant = self._first("load_in_4bit", general) or self._first("load_in_8bit", general)
        if quant is not None and quant.value is True:
            values["quantization"] = Value("quantization", "4bit" if quant.setting == "load_in_4bit" else "8bit",
                                           quant.origin, quant.span, quant.name)
        elif (bits := self._first("quantization_bit", general)) is not None and bits.value in (4, 8):
            values["quantization"] = Value("quantization", f"{bits.value}bit", bits.origin, bits.span, bits.name)
        elif (script_quant := self._first("quantization", ("script",))) is not None:
            values["quantization"] = script_quant
        for setting in ("attention", "head", "frozen_models"):
            if (found := self._first(setting, ("script",))) is not None:
                values[setting] = found
        self._batch(general)
        self._precision(general)
        self._optimizer(general)
        for setting in ("zero_stage", "offload_optimizer", "offload_param"):
            value = self._first(setting, ("deepspeed config", "accelerate config", "framework"))
            if value is not None:
                values[setting] = value
        value = self._first("fsdp", ("lightning", "accelerate config"))
        hf = self._first("fsdp", general[2:])
        decided = self._first("fsdp", ("framework",))  # a YAML tool's own FSDP keys, already read as a mode
        if decided is not None:
            value = decided
        elif hf is not None and isinstance(hf.value, str):  # TrainingArguments(fsdp="full_shard auto_wrap")
            words = hf.value.lower().split()
            mode = "grad-op" if "shard_grad_op" in words else "full" if {"full_shard", "hybrid_shard"} & set(words) else None
            value = Value("fsdp", mode, hf.origin, hf.span, hf.name) if mode else value
        if value is not None:
            values["fsdp"] = value
        gpu = getattr(self.project, "target_gpu", None)
        if gpu:
            values["gpu"] = Value("gpu", gpu, getattr(self.project, "target_gpu_origin", "gpu in the cfgfix settings"))

    def _training_method(self, general) -> None:
        """`training_method: full` beside a leftover `lora_rank: 64`: the method says what is
        trained (scripts branch on it: `if cfg["training_method"] == "lora": add_adapter(...)`),
        so the rank is dropped and the conflict reported."""
        method = self._first("training_method", general)
        rank = self.setup.values.get("lora_rank")
        if method is None or rank is None or rank.value is None or not isinstance(method.value, str):
            return  # nothing stated, or a YAML tool's own model already decided (training/frameworks/)
        if method.value.strip().lower() in FULL_TRAINING_METHODS:
            del self.setup.values["lora_rank"]
            def line(v):
                return f" (line {v.span.line})" if v.span is not None else ""

            self.setup.conflicts.append(
                f"{rank.name or 'lora_rank'} {rank.value} ({rank.origin}{line(rank)}) is not used: "
                f"{method.name or 'training_method'}: {method.value} ({method.origin}{line(method)}) trains every weight")

    def _batch(self, general) -> None:
        setup, values = self.setup, self.setup.values
        defaults = setup.trainer and (setup.parses_training_arguments or setup.arguments_literal)
        micro = self._first("micro_batch", ("deepspeed config",) + general)
        if micro is None and defaults:
            micro = Value("micro_batch", TRAINING_ARGUMENT_DEFAULTS["per_device_train_batch_size"],
                          "TrainingArguments default (per_device_train_batch_size)")
        # the accumulation DeepSpeed runs with: its JSON, else accelerate's inline deepspeed_config
        # (an accelerate loop takes it over the script's flag; the HF Trainer raises, CFX404)
        accum = self._first("grad_accum", ("deepspeed config", "accelerate config") + general)
        if accum is None and defaults:
            accum = Value("grad_accum", 1, "TrainingArguments default (gradient_accumulation_steps)")
        world = None
        lightning = setup.sources.get("lightning")
        if lightning is not None and self.launch.launcher in ("python", None):
            # Lightning starts its processes itself: devices x num_nodes ("auto": the machine's GPUs)
            world = lightning.get("world_size")
        elif (tool_world := self._first("world_size", ("framework",))) is not None and self.launch.launcher in TOOL_COMMANDS:
            world = tool_world  # the tool's own count, with how it reads the environment (frameworks/)
        elif self.launch.world_size is not None:
            world = Value("world_size", self.launch.world_size, f"{self.launch.launcher} launch in {self.display(self.launch_file)}",
                          self.launch.span)
        else:
            world = self._first("world_size", ("accelerate config", "framework"))
        if (world is None or world.value is None) and getattr(self.project, "target_gpus", None):
            world = Value("world_size", self.project.target_gpus, "gpus in the cfgfix settings")
        for setting, value in (("micro_batch", micro), ("grad_accum", accum), ("world_size", world)):
            if value is not None:
                values[setting] = value
        if micro is not None and accum is not None and world is not None and all(
                isinstance(v.value, int) and not isinstance(v.value, bool) for v in (micro, accum, world)):
            total = micro.value * accum.value * world.value
            values["effective_batch"] = Value("effective_batch", total,
                                              f"{micro.value} × {accum.value} × {world.value} (micro × accumulation × processes)")

    def _precision(self, general) -> None:
        values = self.setup.values
        deepspeed = self.setup.sources.get("deepspeed config", {})
        weights = (self._first("weights_cast", ("lightning", "script")) or self._guarded_cast()
                   or self._first("weights", ("framework", "script")))
        if weights is not None:
            values["weights"] = Value("weights", weights.value, weights.origin, weights.span, weights.name)
        mixed = self._mixed(general)
        if mixed is None and self.setup.trainer and (self.setup.parses_training_arguments or self.setup.arguments_literal):
            mixed = Value("mixed_precision", "no", "TrainingArguments default (bf16 and fp16 off)")
        if mixed is not None:
            values["mixed_precision"] = mixed
        engine = next((deepspeed[k] for k in ("bf16", "fp16") if k in deepspeed and deepspeed[k].value is True), None)
        inline = self.setup.sources.get("accelerate config", {}).get("deepspeed_inline")
        uses_deepspeed = "deepspeed" in self.setup.files or inline is not None
        integrated = self.setup.trainer or self.launch.launcher == "accelerate"
        if engine is None and uses_deepspeed and integrated and mixed is not None and mixed.value in ("bf16", "fp16"):
            # HF / accelerate fill an "auto" block, and add a missing one, from the launch's
            # precision (accelerate DeepSpeedPlugin.set_mixed_precision)
            block = deepspeed.get(mixed.value)
            if block is None or block.value == "auto":
                how = f"{block.origin} = \"auto\"" if block is not None else (
                    "no fp16/bf16 block" if "deepspeed" in self.setup.files else inline.origin)
                engine = Value(mixed.value, True, f"{how}, filled from {mixed.origin}", block.span if block else mixed.span)
        adapters = "lora_rank" in values or "quantization" in values
        if engine is not None:
            kind = engine.setting
            values["precision"] = Value("precision", f"deepspeed-{kind}", f"{engine.origin}: 16-bit weights, fp32 master copy",
                                        engine.span, engine.name)
        elif weights is not None and weights.value in ("bf16", "fp16") and not (
                adapters and mixed is not None and mixed.value in ("bf16", "fp16")):
            what = "a 16-bit frozen base" if adapters else "pure 16-bit weights"
            values["precision"] = Value("precision", weights.value, f"{weights.origin}: {what}", weights.span)
        elif mixed is not None and mixed.value in ("bf16", "fp16"):
            what = ("fp32 weights, 16-bit autocast" if weights is not None and weights.value == "fp32"
                    else "fp32 adapters, 16-bit autocast" if adapters
                    else "16-bit autocast (the weights' dtype is not stated: fp32 unless the load says otherwise)")
            values["precision"] = Value("precision", f"amp-{mixed.value}", f"{mixed.origin}: {what}", mixed.span)
        elif mixed is not None and mixed.value == "no":
            values["precision"] = Value("precision", "fp32", mixed.origin, mixed.span)

    def _guarded_cast(self) -> Value | None:
        """`if torch.cuda.is_bf16_supported(): model = model.bfloat16()`: the guard decided by
        the target GPU (the GPU catalog's bf16 flag); without a target GPU, unknown."""
        from cfgfix.memory.gpus import find_gpu

        cast = self._first("weights_guarded", ("script",))
        gpu_name = getattr(self.project, "target_gpu", None)
        gpu = find_gpu(gpu_name) if cast is not None and gpu_name else None
        if gpu is None:
            return None
        if gpu.bf16:
            return Value("weights", cast.value, f"{cast.origin}: the {gpu.name} supports bf16", cast.span, cast.name)
        return None  # the guard fails there: the load's dtype stands

    def _mixed(self, general) -> Value | None:
        """The autocast dtype the launch asks for: "bf16", "fp16", "no", or None (unknown)."""
        for source in general + ("accelerate config",):
            found = self.setup.sources.get(source, {})
            for setting in ("bf16", "fp16"):
                value = found.get(setting)
                if value is not None and value.value is True:
                    return Value("mixed_precision", setting, value.origin, value.span, value.name)
            value = found.get("mixed_precision") or found.get("autocast")
            if value is not None and value.value in ("bf16", "fp16", "fp8"):
                return Value("mixed_precision", value.value, value.origin, value.span, value.name)
            if value is not None and value.value in ("no", False):
                return Value("mixed_precision", "no", value.origin, value.span, value.name)
            if all(found.get(s) is not None and found[s].value is False for s in ("bf16", "fp16")):
                return Value("mixed_precision", "no", f"{found['bf16'].origin} and {found['fp16'].origin}",
                             found["bf16"].span, "bf16")
        return None

    def _optimizer(self, general) -> None:
        value = self._first("use_8bit_adam", general)
        if value is not None and value.value is True:
            self.setup.values["optimizer"] = Value("optimizer", "adamw-8bit", value.origin, value.span, value.name)
            return
        impl = self._first("optimizer_impl", ("script",))
        if impl is not None:
            self.setup.values["optimizer_impl"] = impl
        value = self._first("optimizer", ("deepspeed config",) + general)
        if value is None:
            if self.setup.trainer:
                self._default_optimizer()
            return
        if isinstance(value.value, str) and value.setting == "optimizer":
            lowered = value.value.lower()
            # paged_adamw_8bit / paged_adamw_32bit / paged_adamw (bitsandbytes' paged optimizers)
            paged = "paged" in lowered and "adam" in lowered
            mapped = ("paged-adamw-8bit" if paged and "8bit" in lowered else "paged-adamw" if paged
                      else "adamw-8bit" if "8bit" in lowered else "adafactor" if "adafactor" in lowered
                      else "sgd" if lowered.startswith("sgd") else "adamw" if "adam" in lowered else value.value)
            self.setup.values["optimizer"] = Value("optimizer", mapped, value.origin, value.span, value.name)
            if "fused" in lowered and mapped == "adamw":  # adamw_torch_fused: no foreach temporaries
                self.setup.values["optimizer_impl"] = Value("optimizer_impl", "fused", value.origin, value.span, value.name)


def deepspeed_settings(doc, name: str) -> dict[str, Value]:
    """The settings a DeepSpeed config document states (`name`: where, for the origins); also
    `estimate --deepspeed-config`'s reader (training/estimate_flags.py)."""
    root = doc.root
    found: dict[str, Value] = {}
    for key, setting in (("train_micro_batch_size_per_gpu", "micro_batch"), ("gradient_accumulation_steps", "grad_accum"),
                         ("train_batch_size", "train_batch_size")):
        node = root.get(key)
        if node is not None and node.kind == "scalar" and isinstance(node.value, int) and not isinstance(node.value, bool):
            found[setting] = Value(setting, node.value, f"{key} in {name}", doc.span(node), key)
    for block_name in ("bf16", "fp16"):
        block = root.get(block_name)
        enabled = block.get("enabled") if block is not None and block.kind == "mapping" else None
        if enabled is not None:
            truth = enabled.truthy()
            value = truth if truth is not None else ("auto" if enabled.value == "auto" else None)
            if value is not None:
                found[block_name] = Value(block_name, value, f"{block_name}.enabled in {name}", doc.span(enabled), "enabled")
    zero = root.get("zero_optimization")
    if zero is None:
        found["zero_stage"] = Value("zero_stage", 0, f"no zero_optimization block in {name} (ZeRO off)", None)
        for key in ("offload_optimizer", "offload_param"):
            found[key] = Value(key, False, f"no zero_optimization block in {name} (no offload)", None)
    elif zero.kind == "mapping":
        stage = zero.get("stage")
        if stage is not None and isinstance(stage.value, int) and not isinstance(stage.value, bool):
            found["zero_stage"] = Value("zero_stage", stage.value, f"zero_optimization.stage in {name}", doc.span(stage), "stage")
        elif stage is None:
            found["zero_stage"] = Value("zero_stage", 0, f"zero_optimization without stage in {name}", doc.span(zero))
        for key in ("offload_optimizer", "offload_param"):
            # the block's device, or the deprecated cpu_offload / cpu_offload_param boolean
            device, node = offload_device(zero, key)
            if device is None and node is None:
                # DeepSpeed's DeepSpeedZeroConfig (runtime/zero/config.py, read at 0.16.5 and 0.19.8):
                # `offload_optimizer` / `offload_param` default None, no offload
                found[key] = Value(key, False, f"no zero_optimization.{key} in {name} (DeepSpeed's default: "
                                   "no offload)", None)  # nothing written to point at
                continue
            if device is None and node.kind == "mapping" and node.get("device") is None:
                # a block without `device`: DeepSpeedZeroOffload*Config.device defaults "none"
                # (runtime/zero/offload_config.py, 0.19.8)
                found[key] = Value(key, False, f"{key} without device in {name} (DeepSpeed's default "
                                   "device: none)", doc.span(node), key)
                continue
            if device not in ("cpu", "nvme", "none"):  # "auto", a value computed at run time, a typo (CFX512)
                continue
            written = zero_entry(zero, key)[0].value
            if written == key:
                found[key] = Value(key, device in ("cpu", "nvme"), f"{key}.device {device} in {name}",
                                   doc.span(node), "device")
            else:
                found[key] = Value(key, device == "cpu", f"deprecated {written} (DeepSpeed: {key}.device "
                                   f"{device}) in {name}", doc.span(node), str(written))
    optimizer = root.get("optimizer")
    kind = optimizer.get("type") if optimizer is not None and optimizer.kind == "mapping" else None
    if kind is not None and isinstance(kind.value, str):
        lowered = kind.value.lower()
        mapped = "adamw" if "adam" in lowered else "adafactor" if "adafactor" in lowered else "sgd" if "sgd" in lowered else None
        if mapped:
            found["optimizer"] = Value("optimizer", mapped, f"optimizer.type in {name}", doc.span(kind), "type")
    return found
