"""Writing a changed setting back into the files that configure a launch (`fix --fit`).

A setting is written where the launch already states it (every place, so the files keep
agreeing: a DeepSpeed micro batch and the flag the HF Trainer checks it against change
together), as a minimal edit of that value. Where nothing states it, it is added to the
file that owns such settings: the DeepSpeed JSON for ZeRO, the accelerate config for mixed
precision, the training config for training keys, else a flag appended to a launch whose
script parses its flags with `HfArgumentParser`. A DeepSpeed config that does not exist is
created beside the launch script and referenced with `--deepspeed`. When none of these
applies the change is advice only (`None`).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from cfgfix.analysis.deepspeed_config import zero_entries
from cfgfix.core import Edit
from cfgfix.documents.config_edits import insert_entry, replace_scalar, replace_text
from cfgfix.records import dataclass, field

# The HF TrainingArguments name / training-config key for each setting written.
HF_NAMES = {
    "micro_batch": "per_device_train_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_checkpointing": "gradient_checkpointing",
    "bf16": "bf16",
    "fp16": "fp16",
    "optimizer": "optim",
}
# fix --fit for a Lightning run: the settings written as Trainer arguments, and the precision
# each autocast choice is (lightning 2.x unified precision names)
LIGHTNING_SETTINGS = frozenset({"mixed_precision", "grad_accum", "zero_stage", "offload_optimizer", "offload_param"})
LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "no": "32-true"}
HF_OPTIMIZERS = {"adamw-8bit": "adamw_bnb_8bit", "adamw": "adamw_torch", "adafactor": "adafactor",
                 "paged-adamw-8bit": "paged_adamw_8bit", "paged-adamw": "paged_adamw_32bit"}


@dataclass
class Change:
    edits: list[Edit] = field(default_factory=list)
    created: dict[str, str] = field(default_factory=dict)  # new file path (display) -> its text
    where: list[str] = field(default_factory=list)  # "configs/ds.json: zero_optimization.stage 3"


class SetupWriter:
    """Edits for one launch's setup; `project` reads the files (memoised)."""

    def __init__(self, project, setup) -> None:
        self.project = project
        self.setup = setup
        self.reason: str | None = None  # why the last `set` returned None, when known
        self._tool_deepspeed = None  # (shown path, config) of the DeepSpeed JSON this plan creates for a YAML tool

    # -- values that are already written ----------------------------------------------------
    def _stated(self, setting: str):
        for source, found in self.setup.sources.items():
            value = found.get(setting)
            if value is None or value.span is None or value.value == "auto":
                continue
            if source == "script" and "TrainingArguments in" not in value.origin \
                    and "(TrainingArguments(**...) of" not in value.origin:
                # a call in the code (gradient_checkpointing_enable()), not a literal value (a
                # key of the mapping `TrainingArguments(**cfg["training"])` spreads is one)
                continue
            yield source, value

    def _replace(self, source, value, new) -> Edit | None:
        return replace_value(self.project, source, value, new)

    # -- writing one setting ---------------------------------------------------------------
    def set(self, setting: str, value) -> Change | None:
        """A change that makes `setting` equal `value` for this launch, or None (advice only)."""
        if "lightning" in self.setup.sources and setting in LIGHTNING_SETTINGS:
            return self._lightning(setting, value)
        if setting in ("zero_stage", "offload_optimizer", "offload_param"):
            return self._deepspeed(setting, value)
        if getattr(self.setup, "framework", None) is not None:
            return self._tool(setting, value)
        if setting == "mixed_precision":
            return self._mixed_precision(value)
        composite = getattr(self.setup, "composite", None)
        if setting == "gradient_checkpointing" and value and composite is not None and self.setup.trainer:
            # the Trainer's gradient_checkpointing calls model.gradient_checkpointing_enable(),
            # which a plain nn.Module does not have: the run would stop with an AttributeError
            backbones = [p.name for p in composite.parts if p.shape is not None]
            self.reason = (f"{composite.class_name} is a plain nn.Module: the Trainer's gradient_checkpointing would call "
                           f"its missing gradient_checkpointing_enable(); call it on the backbones in __init__ instead"
                           + (f" (self.{backbones[0]}.gradient_checkpointing_enable())" if backbones else ""))
            return None
        written = HF_OPTIMIZERS.get(value) if setting == "optimizer" else value
        if written is None:
            return None
        if setting == "optimizer":
            built = self._optimizer_in_code(value)
            if built is not None:
                return built
        change = Change()
        for source, stated in self._stated(setting):
            if setting == "optimizer" and source not in ("flags", "training config", "config module"):
                return None  # an optimizer built in code that is not torch's AdamW: advice only
            edit = self._replace(source, stated, written)
            if edit is None:
                return None
            change.edits.append(edit)
            change.where.append(f"{stated.origin}: {_flag_text(written)}")
        if change.edits:
            return change
        return self._add(HF_NAMES.get(setting), written)

    def _lightning(self, setting: str, value) -> Change | None:
        """A Lightning run's setting is the Trainer's (or Fabric's) argument: `precision=`,
        `accumulate_grad_batches=`, `strategy="deepspeed_stage_N[_offload]"` (Lightning builds
        the DeepSpeed config from it). The value is replaced where the call, its config file or
        its Hydra node states it, else the keyword is added to the script's one Trainer call."""
        lightning = self.setup.sources["lightning"]
        if setting == "mixed_precision":
            argument, written = "precision", LIGHTNING_PRECISION.get(value)
            stated = lightning.get("lightning_precision")
        elif setting == "grad_accum":
            argument, written, stated = "accumulate_grad_batches", value, lightning.get("grad_accum")
            if self.setup.script is not None and _fabric(self.project, self.setup.script):
                self.reason = "Fabric has no accumulation argument: the script's own loop accumulates"
                return None
        else:
            argument, stated = "strategy", lightning.get("strategy")
            written = self._lightning_strategy(setting, value)
        if written is None:
            return None
        if stated is not None and stated.span is not None and stated.name == argument:
            if argument == "strategy" and not self._written_as_string(stated):
                self.reason = "the strategy is an object (DeepSpeedStrategy(...)): set its stage / offload there"
                return None
            # `--trainer.precision 16` on the launch is a word of the launch script
            source = "lightning" if stated.span.path.endswith((".py", ".yaml", ".yml", ".json")) else "flags"
            edit = replace_value(self.project, source, stated, written)
            return Change([edit], where=[f"{stated.origin}: {argument}={json.dumps(written)}"]) if edit is not None else None
        target = lightning.get("hydra_trainer")
        if target is not None:
            return self._hydra_key(target, argument, written)
        return self._lightning_keyword(argument, written)

    def _hydra_key(self, target, argument: str, written) -> Change | None:
        """A key the composed Trainer node lacks: added to the file that holds its `_target_`
        (no config of the composition sets it, or it would be stated)."""
        path = self.project.real_path(target.span.path)
        doc = self.project.read(path)
        node = next((n for n in doc.root.walk() if n.kind == "mapping" and any(
            v.start == target.span.start and v.end == target.span.end for _, v in n.entries)), None) if doc else None
        edit = insert_entry(doc, node, argument, written) if node is not None else None
        shown = self.project.display(path)
        return Change([edit], where=[f"{shown}: {argument}: {written}"]) if edit is not None else None

    def _written_as_string(self, stated) -> bool:
        """The strategy is written as a name (`"ddp"`, `strategy: deepspeed`), not an object."""
        text = _text(self.project, stated.span.path)
        if text is None:
            return False
        written = text[stated.span.start:stated.span.end].strip()
        if stated.span.path.endswith(".py"):
            return written[:1] in ("'", '"')
        return bool(written) and written[:1] not in "{[" and "\n" not in written

    def _lightning_strategy(self, setting: str, value) -> str | None:
        """The registered DeepSpeed strategy name for the planned ZeRO stage and offload
        (lightning 2.5.0 strategies/deepspeed.py register_strategies)."""
        get = self.setup.values.get
        stage = value if setting == "zero_stage" else getattr(get("zero_stage"), "value", None) or 0
        optimizer = value if setting == "offload_optimizer" else getattr(get("offload_optimizer"), "value", False) is True
        params = value if setting == "offload_param" else getattr(get("offload_param"), "value", False) is True
        if stage not in (1, 2, 3):
            self.reason = "Lightning's DeepSpeed strategies are ZeRO stages 1-3"
            return None
        if params and stage != 3 or (stage == 3 and optimizer != params) or (stage == 1 and optimizer):
            self.reason = (f"no registered Lightning strategy runs ZeRO-{stage} with this offload: use "
                           "DeepSpeedStrategy(stage=..., offload_optimizer=..., offload_parameters=...)")
            return None
        return f"deepspeed_stage_{stage}" + ("_offload" if optimizer else "")

    def _lightning_keyword(self, argument: str, written) -> Change | None:
        """`argument=written` added to the script's one literal Trainer/Fabric call."""
        from cfgfix.documents.python_edits import add_keyword
        from cfgfix.training.script import script_setup

        script = self.setup.script
        found = script_setup(self.project, script) if script is not None else None
        facts = getattr(found, "lightning", None)
        parsed = self.project.script(script) if script is not None else None
        if facts is None or facts.call is None or parsed is None or facts.opaque & {"**", "*"} or facts.spread is not None:
            self.reason = "the Trainer is not one literal call of the script: set it where the Trainer's arguments are"
            return None
        if argument == "strategy" and argument in facts.opaque:
            return None
        text = f"{argument}={json.dumps(written)}"
        edit = add_keyword(parsed[0], facts.call, text)
        shown = self.project.display(script)
        return Change([edit], where=[f"{shown}: Trainer({text})"]) if edit is not None else None

    def _optimizer_in_code(self, value) -> Change | None:
        """`optimizer = torch.optim.AdamW(model.parameters(), lr=...)` in the script: a patch that
        builds bitsandbytes' 8-bit AdamW (or its paged variant) with the same arguments, and
        imports bitsandbytes. bnb.optim.AdamW8bit / Adam8bit take torch's arguments `params, lr,
        betas, eps, weight_decay, amsgrad` (bitsandbytes 0.45.0 optim/adamw.py, optim/adam.py);
        a call with any other keyword (`fused=True`, `foreach=...`) is left as advice."""
        stated = self.setup.sources.get("script", {}).get("optimizer")
        if stated is None or stated.span is None or not is_torch_adamw(stated):
            return None
        kind = ast_text(stated).split("(", 1)[0]  # Adam keeps L2 in the gradient, AdamW decouples it
        written = {"adamw-8bit": f"bnb.optim.{kind}8bit", "paged-adamw-8bit": f"bnb.optim.Paged{kind}8bit"}.get(value)
        if written is None:
            return None
        if any(source != "script" and "optimizer" in found for source, found in self.setup.sources.items()):
            return None  # also stated elsewhere (a flag, a config): that one is written
        path = self.setup.script
        parsed = self.project.script(path) if path is not None else None
        if parsed is None:
            return None
        text, tree = parsed[0].text, parsed[1]
        call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func.lineno == stated.span.line
                     and n.func.col_offset == stated.span.column - 1), None)
        if call is None or len(call.args) > 1 or any(
                kw.arg not in ("lr", "betas", "eps", "weight_decay", "amsgrad") for kw in call.keywords):
            self.reason = "the optimizer call passes arguments bitsandbytes' 8-bit Adam does not take"
            return None
        shown = self.project.display(path)
        edits = [Edit(shown, stated.span.start, stated.span.end, written)]
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        if not any(isinstance(n, ast.Import) and any(a.name == "bitsandbytes" and a.asname == "bnb" for a in n.names)
                   for n in imports):
            after = imports[-1].end_lineno if imports else 0
            offset = _line_offset(text, after)
            edits.append(Edit(shown, offset, offset, "import bitsandbytes as bnb\n"))
        return Change(edits, where=[f"{shown}: {ast_text(stated)} -> {written}(...) (import bitsandbytes as bnb)"])

    def _add(self, name: str | None, value) -> Change | None:
        """Add a training setting where none is written: the training config, else a flag."""
        if name is None:
            return None
        if self.setup.spread is not None:  # TrainingArguments(**cfg["training"]): into that mapping
            edit = self._into_spread(name, value)
            if edit is not None:
                return edit
        path = self.setup.files.get("training config")
        if path is not None and self._is_deepspeed_config(path):
            # DeepSpeed ignores a top-level `gradient_checkpointing` or `optim` (CFX507 flags
            # them): a setting goes where the tool that reads it looks, else a flag, else advice
            self.reason = f"{self.project.display(path)} is a DeepSpeed config, which does not read {name}"
            path = None
        if path is not None:
            doc = self.project.read(path)
            edit = insert_entry(doc, doc.root, name, value) if doc is not None else None
            if edit is not None:
                return Change([edit], where=[f"{self.project.display(path)}: {name}: {_flag_text(value)}"])
        return self._append_flag(name, value)

    def _into_spread(self, name: str, value) -> Change | None:
        """Add `name: value` to the YAML/JSON mapping a `TrainingArguments(**cfg[...])` call
        spreads: a minimal text edit, so the file keeps its comments, quoting and key order."""
        doc, node = self.setup.spread
        edit = insert_entry(doc, node, name, value)
        if edit is None:
            return None
        shown = self.project.display(Path(doc.source.path)) if os.path.isabs(str(doc.source.path)) else doc.source.path
        return Change([edit], where=[f"{shown}: {name}: {_flag_text(value)}"])

    def _is_deepspeed_config(self, path: Path) -> bool:
        if path == self.setup.files.get("deepspeed") or "deepspeed" in self.project.configs.get(path, ()):
            return True
        from cfgfix.analysis.config_kinds import config_kinds

        doc = self.project.read(path)
        try:
            return doc is not None and "deepspeed" in config_kinds(doc)
        except Exception:  # noqa: BLE001 - unknown: not a DeepSpeed config
            return False

    def _append_flag(self, name: str, value) -> Change | None:
        setup = self.setup
        if not (setup.trainer and setup.parses_training_arguments) or not setup.launch.args:
            return None
        last = setup.launch.args[-1][1]
        text = f" --{name} {_flag_text(value)}"
        return Change([Edit(last.path, last.end, last.end, text)], where=[f"{last.path}: --{name} {_flag_text(value)}"])

    def _mixed_precision(self, value: str) -> Change | None:
        change = Change()
        accelerate = self.setup.files.get("accelerate")
        for source, stated in self._stated("mixed_precision"):
            edit = self._replace(source, stated, value)
            if edit is None:
                return None
            change.edits.append(edit)
            change.where.append(f"{stated.origin}: {value}")
        other = "fp16" if value == "bf16" else "bf16"
        for source, stated in self._stated(other):
            if stated.value is True and source not in ("deepspeed config",):
                edit = self._replace(source, stated, False)
                if edit is None:
                    return None
                change.edits.append(edit)
        for source, stated in self._stated(value):
            if stated.value is False and source not in ("deepspeed config",):
                edit = self._replace(source, stated, True)
                if edit is None:
                    return None
                change.edits.append(edit)
                change.where.append(f"{stated.origin}: true")
        if change.edits:
            return change
        if accelerate is not None and "deepspeed" not in self.setup.files:
            doc = self.project.read(accelerate)
            edit = insert_entry(doc, doc.root, "mixed_precision", value) if doc is not None else None
            if edit is not None:
                return Change([edit], where=[f"{self.project.display(accelerate)}: mixed_precision: {value}"])
        return self._add(value, True)

    def _deepspeed(self, setting: str, value) -> Change | None:
        path = self.setup.files.get("deepspeed")
        if path is None:
            return self._new_deepspeed(setting, value)
        doc = self.project.read(path)
        if doc is None:
            return None
        shown = self.project.display(path)
        zero = doc.root.get("zero_optimization")
        if zero is None and any(k.startswith("zero_optimi") and k != "zero_optimization" for k in doc.root.keys()):
            self.reason = f"{shown} misspells zero_optimization (CFX507): run `cfgfix fix` first"
            return None
        if zero is None or zero.kind != "mapping":
            if zero is not None:
                return None
            block = {"stage": value if setting == "zero_stage" else self.setup.get("zero_stage") or 0}
            if setting != "zero_stage" and value:
                block["offload_optimizer" if setting == "offload_optimizer" else "offload_param"] = {"device": "cpu", "pin_memory": True}
            edit = insert_entry(doc, doc.root, "zero_optimization", block)
            return Change([edit], where=[f"{shown}: zero_optimization {json.dumps(block)}"]) if edit else None
        if setting == "zero_stage":
            stage = zero.get("stage")
            edit = replace_scalar(doc, stage, value) if stage is not None and stage.kind == "scalar" else insert_entry(doc, zero, "stage", value)
            return Change([edit], where=[f"{shown}: zero_optimization.stage {value}"]) if edit else None
        key = setting if setting == "offload_optimizer" else "offload_param"
        block = zero.get(key)
        device = "cpu" if value else "none"
        old = next((e for e in zero_entries(zero, key) if e[0].value != key), None)
        if old is not None:
            # the deprecated cpu_offload / cpu_offload_param: the block is written in its place
            # (beside it DeepSpeed asserts), as CFX504's fix does
            if block is not None:
                self.reason = f"{shown} sets both {old[0].value} and {key} (DeepSpeed asserts): choose one first"
                return None
            content = ('"%s": {"device": "%s", "pin_memory": true}' % (key, device) if doc.fmt == "json"
                       else "%s: {device: %s, pin_memory: true}" % (key, device))
            edit = replace_text(doc, old[0].start, old[1].end, content)
            return Change([edit], where=[f"{shown}: zero_optimization.{key}.device {device} "
                                         f"(replaces the deprecated {old[0].value})"])
        if block is not None and block.kind == "mapping":
            node = block.get("device")
            edit = replace_scalar(doc, node, device) if node is not None and node.kind == "scalar" else insert_entry(doc, block, "device", device)
        elif block is None:
            edit = insert_entry(doc, zero, key, {"device": device, "pin_memory": True})
        else:
            return None
        return Change([edit], where=[f"{shown}: zero_optimization.{key}.device {device}"]) if edit else None

    # -- a tool driven by one YAML (LLaMA-Factory, axolotl) -----------------------------------
    def _tool(self, setting: str, value) -> Change | None:
        """`setting` written as the tool's own keys (frameworks/<tool>.py write_plan): each key
        replaced where the launch's overrides or the YAML state it, else added to the YAML (one
        edit at its end, the rest of the file byte for byte), else a `--key value` flag."""
        from cfgfix.training.frameworks import axolotl, llamafactory

        run = self.setup.framework
        tool = llamafactory if run.tool == "llamafactory" else axolotl
        written = HF_OPTIMIZERS.get(value) if setting == "optimizer" else value
        plan = tool.write_plan(setting, written, run) if written is not None else None
        if isinstance(plan, str) or plan is None:
            self.reason = plan if isinstance(plan, str) else f"{run.tool} has no key for {setting}"
            return None
        change, added = Change(), []
        for key, new in plan:
            stated = run.keys.get(key)
            if stated is not None and stated.value == new:
                continue
            if stated is not None and stated.span is not None:
                source = "flags" if not stated.span.path.endswith((".yaml", ".yml", ".json")) else "training config"
                edit = replace_value(self.project, source, stated, new)
                if edit is None:
                    return None
                change.edits.append(edit)
                change.where.append(f"{stated.origin}: {_flag_text(new)}")
            else:
                added.append((key, new))
        if added:
            more = self._tool_add(run, added)
            if more is None:
                return None
            change.edits.extend(more.edits)
            change.where.extend(more.where)
        return change if change.edits else None

    def _tool_add(self, run, entries: list) -> Change | None:
        doc = run.doc
        if doc is not None:
            first = insert_entry(doc, doc.root, *entries[0])
            if first is None:
                self.reason = f"{run.origin}: a layout cfgfix does not add keys to"
                return None
            content = first.content
            for key, new in entries[1:]:
                nxt = insert_entry(doc, doc.root, key, new)
                if nxt is None or nxt.start != first.start:
                    return None
                content += nxt.content
            shown = ", ".join(f"{k}: {_flag_text(v).lower() if isinstance(v, bool) else v}" for k, v in entries)
            return Change([Edit(first.path, first.start, first.end, content)], where=[f"{run.origin}: {shown}"])
        args = self.setup.launch.args
        if not args:
            return None
        last = args[-1][1]
        text = "".join(f" --{k} {_flag_text(v)}" for k, v in entries)
        return Change([Edit(last.path, last.end, last.end, text)], where=[f"{last.path}:{text}"])

    def _new_tool_deepspeed(self, config: dict, stage: int) -> Change | None:
        """A new DeepSpeed JSON beside the tool's YAML, named by its `deepspeed:` key (a path the
        tool opens from the folder it runs in, where the launch's YAML path starts)."""
        run = self.setup.framework
        path = self.setup.files.get("training config")
        if run.doc is None or path is None or not run.written_path:
            return None
        if self._tool_deepspeed is not None:
            # a later rung of the same plan (ZeRO-3, then parameter offload): the JSON this plan
            # creates takes it, rather than a second file and a second `deepspeed:` key
            shown, created = self._tool_deepspeed
            zero = created["zero_optimization"]
            added = [k for k in config["zero_optimization"] if k not in zero]
            zero.update({k: v for k, v in config["zero_optimization"].items() if k != "stage" or v > zero["stage"]})
            return Change(created={shown: json.dumps(created, indent=2) + "\n"},
                          where=[f"{shown} (new): also zero_optimization {', '.join(added) or f'stage {stage}'}"])
        name = f"ds_zero{stage}.json"
        written = Path(run.written_path).parent.joinpath(name).as_posix()
        change = self._tool_add(run, [("deepspeed", written)])
        if change is None:
            return None
        shown = self.project.display(path.parent / name)
        self._tool_deepspeed = (shown, config)
        change.created[shown] = json.dumps(config, indent=2) + "\n"
        change.where.insert(0, f"{shown} (new): ZeRO-{stage}")
        if run.tool == "llamafactory" and self.setup.launch.launcher == "llamafactory-cli":
            # hparams/parser.py: DeepSpeed needs a distributed launch ("Please use FORCE_TORCHRUN=1")
            change.where.append("run it as FORCE_TORCHRUN=1 llamafactory-cli train ... (LLaMA-Factory refuses DeepSpeed "
                                "without torchrun)")
        return change

    def _new_deepspeed(self, setting: str, value) -> Change | None:
        """No DeepSpeed config yet: create one beside the launch script for an HF Trainer launch
        that parses its flags (every batch and precision value "auto", so the Trainer fills
        them), and pass it with `--deepspeed`."""
        setup = self.setup
        if getattr(setup, "framework", None) is not None:
            stage = value if setting == "zero_stage" else max(setup.get("zero_stage") or 0, 2)
            return self._new_tool_deepspeed(_deepspeed_template(setting, value, stage), stage)
        spread = setup.trainer and setup.spread is not None
        if not spread and (not (setup.trainer and setup.parses_training_arguments) or not setup.launch.args):
            return None
        stage = value if setting == "zero_stage" else max(setup.get("zero_stage") or 0, 2)
        config = _deepspeed_template(setting, value, stage)
        launch_dir = setup.launch_file.parent
        name = f"ds_zero{stage}.json"
        shown = self.project.display(launch_dir / name)
        written = _as_launch_sees(launch_dir / name, setup, self.project.root)
        if spread:  # `deepspeed: ds_zero2.json` in the mapping TrainingArguments(**...) reads
            change = self._into_spread("deepspeed", written)
            if change is None:
                return None
            change.created[shown] = json.dumps(config, indent=2) + "\n"
            change.where.insert(0, f"{shown} (new): ZeRO-{stage}")
            return change
        last = setup.launch.args[-1][1]
        return Change([Edit(last.path, last.end, last.end, f" --deepspeed {written}")],
                      created={shown: json.dumps(config, indent=2) + "\n"},
                      where=[f"{shown} (new): ZeRO-{stage}", f"{last.path}: --deepspeed {written}"])


def _deepspeed_template(setting: str, value, stage: int) -> dict:
    """A DeepSpeed JSON whose batch and precision values are all "auto" (the HF Trainer fills
    them), with the ZeRO stage and offload asked for."""
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if setting == "offload_optimizer" and value:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setting == "offload_param" and value:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": zero,
    }


def _as_launch_sees(path: Path, setup, root: Path) -> str:
    """`path` relative to the folder the launch runs in: the one its script path is
    written from (`scripts/run.sh` running `train.py` runs in the folder above)."""
    import os

    from cfgfix.project import _launch_folders

    folders = [*_launch_folders(setup.launch_file, root), root]
    for folder in folders:
        if setup.launch.script and os.path.isfile(folder / setup.launch.script):
            return Path(os.path.relpath(path, folder)).as_posix()
    return Path(os.path.relpath(path, setup.launch_file.parent)).as_posix()


def replace_value(project, source: str, value, new) -> Edit | None:
    """An edit that writes `new` where `value` is stated: a flag's word in a launch script, a
    Python literal, or a YAML/JSON scalar (quoting kept)."""
    span = value.span
    if source == "flags":
        text = _text(project, span.path)
        if text is None:
            return None
        old = text[span.start:span.end]
        if old.startswith("--") and "=" in old:
            return Edit(span.path, span.start, span.end, f"{old.split('=', 1)[0]}={_flag_text(new)}")
        if old.startswith("--"):  # a bare boolean flag: `--gradient_checkpointing`
            return None if new is True else Edit(span.path, span.end, span.end, f" {_flag_text(new)}")
        return Edit(span.path, span.start, span.end, _flag_text(new))
    if span.path.endswith(".py"):
        text = _text(project, span.path)
        if text is None:
            return None
        old = text[span.start:span.end]
        if isinstance(new, bool) or isinstance(new, int):
            return Edit(span.path, span.start, span.end, repr(new))
        quote = old[0] if old[:1] in ("'", '"') else '"'
        return Edit(span.path, span.start, span.end, f"{quote}{new}{quote}")
    doc = project.read(project.real_path(span.path))
    node = _node_at_span(doc, span) if doc is not None else None
    return replace_scalar(doc, node, new) if node is not None else None


def _text(project, shown: str) -> str | None:
    try:
        return project.real_path(shown).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _flag_text(value) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _node_at_span(doc, span):
    for node in doc.root.walk():
        if node.kind == "scalar" and node.start == span.start and node.end == span.end:
            return node
    return None


def is_torch_adamw(stated) -> bool:
    """The script's optimizer is torch's own AdamW/Adam call (`torch.optim.AdamW(...)`,
    `AdamW(...)` imported from torch.optim): what an 8-bit patch can replace one for one."""
    return stated.value == "adamw" and stated.origin.split("(", 1)[0] in ("AdamW", "Adam")


def ast_text(stated) -> str:
    return stated.origin.split(" in ", 1)[0]


def _line_offset(text: str, line: int) -> int:
    """The offset where line `line + 1` (1-based) starts: after the first `line` lines."""
    offset = 0
    for _ in range(line):
        found = text.find("\n", offset)
        if found < 0:
            return len(text)
        offset = found + 1
    return offset


def _fabric(project, script: Path) -> bool:
    from cfgfix.training.script import script_setup

    found = script_setup(project, script)
    return bool(getattr(getattr(found, "lightning", None), "fabric", False))
