"""What a training script itself says about its setup: literal `TrainingArguments(...)`
keywords, whether it parses `TrainingArguments` from the command line, the dtype and
quantization of its model loads, gradient checkpointing, LoRA rank, optimizer, autocast,
and the local config modules it imports (`from config import TRAINING_CONFIG`).

Read once per script per run through the project model (`script_setup`). Only literal
values count: a value computed at run time leaves the setting unknown.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from cfgfix.analysis.models import _is_training_call
from cfgfix.analysis.names import ImportMap, single_assignments
from cfgfix.analysis.training_keys import NAME_TO_SETTING
from cfgfix.records import dataclass, field
from cfgfix.training.values import Value, from_keywords, literal

_ARGUMENT_CLASSES = re.compile(r"(^|\.)(\w*TrainingArguments|SFTConfig|DPOConfig|ORPOConfig|KTOConfig|GRPOConfig|RewardConfig|\w*TrainerConfig)$")
_HF_LIBRARIES = ("transformers", "trl")
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.half": "fp16", "torch.float32": "fp32",
           "torch.float": "fp32", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass
class ScriptSetup:
    values: dict[str, Value] = field(default_factory=dict)  # settings stated in the script
    parses_training_arguments: bool = False  # HfArgumentParser over TrainingArguments: flags land there
    trainer: bool = False  # builds an HF / TRL *Trainer
    argument_calls: list[ast.Call] = field(default_factory=list)  # TrainingArguments(...) constructions
    config_modules: list[Path] = field(default_factory=list)  # local modules it imports, as files
    mutates_arguments: bool = False  # `training_args.bf16 = ...`: flags may not be final
    # the keywords of the script's one literal TrainingArguments(...) call (HF names), and
    # whether that call shows every value (no `**kwargs`, no positional arguments)
    argument_values: dict[str, Value] = field(default_factory=dict)
    arguments_complete: bool = False
    trains: bool = False  # calls backward(), builds a *Trainer or calls deepspeed.initialize
    own_defaults: bool = False  # parses a TRL-style *Config whose defaults are not TrainingArguments'
    # field defaults of the script's own argument dataclasses (`class TrainingArguments(
    # transformers.TrainingArguments): optim: str = field(default="adamw_torch")`), by field
    # name; a default that is not a literal is kept as None (then nothing is known)
    argument_defaults: dict[str, Value | None] = field(default_factory=dict)
    # what the script takes from its own flags and config file (training/references.py):
    # (setting, keyword, Ref) to resolve per launch, the TrainingArguments keywords that are
    # references, `**cfg["training"]` spreads, and keywords computed at run time
    refs: object = None  # ScriptRefs
    pending: list = field(default_factory=list)
    argument_refs: dict = field(default_factory=dict)  # HF name -> Ref
    argument_spreads: list = field(default_factory=list)  # Refs of `**` mappings
    argument_opaque: set = field(default_factory=set)  # HF names set to something computed
    parses_argument_file: bool = False  # HfArgumentParser.parse_yaml_file / parse_json_file
    # `model = MyModel(cfg["model"])` with MyModel one of the project's nn.Module classes
    # (training/custom_model.py): sized per launch as the sum of its parts
    custom_model: object = None
    # the script's TRL trainer and config class (training/trl_script.py TrlFacts), None
    # for a script that does not import trl
    trl: object = None
    # the script's Lightning Trainer arguments (training/lightning_script.py LightningFacts),
    # None for a script that builds no Lightning Trainer
    lightning: object = None


def script_setup(project, path: Path) -> ScriptSetup | None:
    """The `ScriptSetup` of the training script at `path`, memoised on the project."""
    key = ("setup", path)
    cache = project._scripts
    if key not in cache:
        parsed = project.script(path)
        parsers = _imported_parsers(project, parsed[1], path) if parsed is not None else {}
        cache[key] = read_script(parsed[0], parsed[1], path, frozenset(parsers)) if parsed is not None else None
        if cache[key] is not None:
            _merge_parsers(parsers, cache[key].refs)
        # the project's own nn.Module, here or in a module it imports (a package's __init__
        # re-exports it from a file the script does not name)
        if cache[key] is not None and ("Module" in parsed[0].text + "".join(
                _module_text(project, m) for m in cache[key].config_modules)
                or any(m.name == "__init__.py" for m in cache[key].config_modules)):
            from cfgfix.training.custom_model import find_custom_model

            def parse(module: Path):
                found = project.script(module)
                return found[1] if found is not None else None

            cache[key].custom_model = find_custom_model(parsed[1], path, cache[key].config_modules, parse)
        if cache[key] is not None and "trl" in parsed[0].text:
            cache[key].trl = _trl_facts(project, parsed[0], parsed[1], cache[key])
        text = parsed[0].text if parsed is not None else ""
        if cache[key] is not None and ("ightning" in text or "hydra" in text and "instantiate" in text):
            from cfgfix.training.lightning_script import read_lightning

            tree = parsed[1]
            cache[key].lightning = read_lightning(tree, ImportMap(tree), single_assignments(tree.body),
                                                  cache[key].refs, _conditional_nodes(tree))
    return cache[key]


def _trl_facts(project, source, tree: ast.Module, found: ScriptSetup):
    """The script's TRL trainer and config class; a class of the project's imported modules
    built on TRL's (`from open_r1.configs import GRPOConfig`) counts as TRL's."""
    from cfgfix.training.trl_script import local_trl_bases, read_trl

    trees = [tree]
    for module in found.config_modules:
        parsed = project.script(module)
        if parsed is not None and "trl" in parsed[0].text:
            trees.append(parsed[1])
    bases = local_trl_bases(trees, ImportMap)
    return read_trl(tree, ImportMap(tree), source, single_assignments(tree.body), found.refs, bases,
                    _conditional_nodes(tree))


def _imported_parsers(project, tree: ast.Module, path: Path) -> dict:
    """The functions imported from the project's own modules (`from utils.training_utils
    import parse_args`) whose call gives the parsed flags, by local name, each with (its
    module, the flags its parser declares): called as `args = parse_args()` or passed on as
    `main(parse_args())`."""
    from cfgfix.training.references import read_refs

    imported: dict[str, tuple[str, str]] = {}  # local name -> (module, function)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level <= 1:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    if not imported:
        return {}
    called: set[str] = set()  # imported names whose result is bound or passed on
    for node in ast.walk(tree):
        values = [node.value] if isinstance(node, ast.Assign) else \
            [*node.args, *(kw.value for kw in node.keywords)] if isinstance(node, ast.Call) else ()
        for value in values:
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in imported:
                called.add(value.func.id)
    found = {}
    for name in sorted(called):
        module, function = imported[name]
        module_path = next((c for base in [path.parent, *list(path.parents)[1:4]]
                            if os.path.isfile(c := base.joinpath(*module.split(".")).with_suffix(".py"))), None)
        parsed = project.script(module_path) if module_path is not None and module_path != path else None
        func = next((f for f in (parsed[1].body if parsed is not None else ())
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == function), None)
        if func is None:
            continue
        flags = read_refs(func)
        if flags.options:  # a parser
            found[name] = (module_path, flags)
    return found


def _merge_parsers(parsers: dict, refs) -> None:
    """The flags of the imported parsers into the script's: with their defaults (a flag the
    script itself declares keeps its own; one a function declares twice has no sure default
    and is left out)."""
    from cfgfix.records import replace

    for module_path, flags in parsers.values():
        for option, dest in flags.options.items():
            refs.options.setdefault(option, dest)
        for dest, default in flags.defaults.items():
            if dest not in refs.defaults and dest not in flags.repeated:
                refs.defaults[dest] = replace(default, module=module_path)


def _module_text(project, module: Path) -> str:
    found = project.script(module)
    return found[0].text if found is not None else ""


def read_script(source, tree: ast.Module, path: Path, parsers: frozenset[str] = frozenset()) -> ScriptSetup:
    """What the script at `path` says; `parsers`: its imported functions that return the
    parsed flags (`_imported_parsers`)."""
    imports = ImportMap(tree)
    consts = single_assignments(tree.body)
    found = ScriptSetup()
    origin = source.path
    libraries = {value.split(".")[0] for value in imports.aliases.values()}
    hf = bool(libraries & set(_HF_LIBRARIES))
    argument_names: set[str] = set()
    conditional = _conditional_nodes(tree)
    from cfgfix.training.references import read_refs

    found.refs = refs = read_refs(tree, parsers)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _local_modules(node, path, found)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.attr in ("bf16", "fp16", "per_device_train_batch_size", "gradient_accumulation_steps",
                                            "deepspeed", "gradient_checkpointing")):
                    found.mutates_arguments = True
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        if not found.trains and _is_training_call(node, imports):
            found.trains = True
        if hf and _ARGUMENT_CLASSES.search(name):
            found.argument_calls.append(node)
            argument_names.add(last)
            if not last.endswith("TrainingArguments"):
                found.own_defaults = True  # SFTConfig(...) & co: TRL's defaults, not TrainingArguments
        elif hf and last.endswith("Trainer") and last[:1].isupper():
            found.trainer = True
        elif last in ("HfArgumentParser", "TrlParser", "H4ArgumentParser"):  # TRL's and alignment-handbook's subclasses
            text = ast.unparse(node)
            if "TrainingArguments" in text or "Config" in text or "Arguments" in text:
                found.parses_training_arguments = True
            if re.search(r"\w+Config\b", text):
                found.own_defaults = True  # TRL's SFTConfig & co change HF's defaults (learning rate, ...)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("parse_yaml_file", "parse_json_file"):
            found.parses_argument_file = True
        arguments = hf and bool(_ARGUMENT_CLASSES.search(name))
        if arguments:  # what CFX511 may compare: every keyword, conditional call or not
            _call_refs(node, last, refs, consts, found, True)
        if id(node) not in conditional:  # `BitsAndBytesConfig(...) if args.q_lora else None`: unknown
            _call_values(node, name, last, source, consts, found.values)
            if not arguments:
                _call_refs(node, last, refs, consts, found, False)
    _model_casts(tree, source, imports, found.values)
    _variable_casts(tree, source, conditional, found.values)
    _frozen_models(tree, source, consts, found.values)
    if not found.argument_calls and not found.trainer:  # the HF Trainer's batch is per_device_train_batch_size
        _loader_batch(tree, source, imports, consts, conditional, found)
    found.argument_defaults = _argument_defaults(tree, source, consts)
    for call in found.argument_calls:
        for setting, value in from_keywords(call, source, f"TrainingArguments in {origin}", consts).items():
            found.values.setdefault(setting, value)
    if len(found.argument_calls) == 1:
        call = found.argument_calls[0]
        found.argument_values = {v.name: v for v in from_keywords(call, source, f"TrainingArguments in {origin}", consts).values()}
        found.arguments_complete = not call.args and all(kw.arg is not None for kw in call.keywords)
    # `HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))` where the class is a
    # local subclass of TrainingArguments is the LLaVA / FastChat shape.
    if not found.parses_training_arguments and "HfArgumentParser" in source.text and hf:
        found.parses_training_arguments = "TrainingArguments" in source.text
    return found


_EVAL_WORDS = ("val", "eval", "test", "dev")


def _loader_batch(tree, source, imports, consts, conditional, found: ScriptSetup) -> None:
    """The training `DataLoader`'s `batch_size` as the micro batch per process: the only
    DataLoader of the script, or the only one whose name or dataset says `train` (not
    `val`/`eval`/`test`). A literal is a value; `batch_size=tcfg["batch_size_per_gpu"]` or
    `=args.batch_size` is a reference resolved per launch (the config file, the flags).
    Built under a condition, or with no batch_size: unknown."""
    names: dict[int, str] = {}
    loaders = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            target = node.targets[0]
            names[id(node.value)] = ast.unparse(target).lower()
        if isinstance(node, ast.Call) and (imports.qualify(node.func) or "").startswith("torch.utils.data") \
                and (imports.qualify(node.func) or "").endswith(".DataLoader"):
            loaders.append(node)
    if len(loaders) > 1:
        def says_train(call) -> bool:
            dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
            words = names.get(id(call), "") + " " + (ast.unparse(dataset).lower() if dataset is not None else "")
            return "train" in words and not any(w in words for w in _EVAL_WORDS)
        loaders = [call for call in loaders if says_train(call)]
    if len(loaders) != 1 or id(loaders[0]) in conditional:
        return
    call = loaders[0]
    value = next((k.value for k in call.keywords if k.arg == "batch_size"), call.args[1] if len(call.args) > 1 else None)
    if value is None:
        return  # DataLoader's default of 1 is rarely what a training run means: unknown
    try:
        size = literal(value, consts)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        ref = found.refs.ref(value) if found.refs is not None else None
        if ref is not None:
            found.pending.append(("micro_batch", "batch_size", ref))
        return
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        found.values.setdefault("micro_batch", Value("micro_batch", size, f"DataLoader(batch_size=) in {source.path}",
                                                     source.span_of_node(value), "batch_size"))


def _argument_defaults(tree: ast.Module, source, consts) -> dict[str, Value | None]:
    """Field defaults of argument dataclasses: subclasses of TrainingArguments (and of
    SFTConfig & co), and `*Arguments` dataclasses (ModelArguments, DataArguments)."""
    from cfgfix.training.values import NAME_TO_SETTING, normalise

    found: dict[str, Value | None] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(base) for base in node.bases]
        if not (any(_ARGUMENT_CLASSES.search(base) for base in bases) or node.name.endswith("Arguments")):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name, value = stmt.target.id, stmt.value
            if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
                value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
            try:
                raw = literal(value, consts) if value is not None else None
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                found[name] = None
                continue
            setting = NAME_TO_SETTING.get(name, name)
            found[name] = Value(setting, normalise(setting, raw), f"the default of {node.name}.{name} in {source.path}",
                                source.span_of_node(value) if value is not None else None, name) if value is not None else None
    return found


def _conditional_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes that run only under a condition (an `if` or `x if c else y` branch,
    a `try`'s handlers); `if __name__ == "__main__":` counts as unconditional."""
    found: set[int] = set()

    def mark(nodes) -> None:
        for child in nodes:
            for sub in ast.walk(child):
                found.add(id(sub))

    for node in ast.walk(tree):
        if isinstance(node, ast.If) and not _is_main_guard(node.test):
            mark(node.body + node.orelse)
        elif isinstance(node, ast.IfExp):
            mark([node.body, node.orelse])
        elif isinstance(node, ast.Try):
            mark(node.handlers)
    return found


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _local_modules(node, path: Path, found: ScriptSetup) -> None:
    names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level <= 1 else []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    for name in names:
        # `from config import X` beside the script; `from llava.train.train import train` from
        # the package root above it (LLaVA's train_mem.py): the script's folder and 3 parents
        for base in [path.parent, *list(path.parents)[1:4]]:
            candidate = base.joinpath(*name.split(".")).with_suffix(".py")
            if not os.path.isfile(candidate):  # a package: `from giblet.models import X` re-exported by its __init__
                candidate = base.joinpath(*name.split("."), "__init__.py")
            if os.path.isfile(candidate):
                if candidate != path and candidate not in found.config_modules:
                    found.config_modules.append(candidate)
                break


def _call_values(node: ast.Call, name: str, last: str, source, consts, values: dict[str, Value]) -> None:
    """Settings a single call states: load dtype and quantization, checkpointing, LoRA rank,
    optimizer, autocast dtype."""
    where = source.path
    if last == "from_pretrained" and _loads_a_model(node) and not _conditioning_part(node):
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        dtype_node = kwargs.get("dtype", kwargs.get("torch_dtype"))
        dtype = _dtype(dtype_node, consts) if dtype_node is not None else None
        if dtype is not None:
            values.setdefault("weights", Value("weights", dtype, f"from_pretrained dtype in {where}",
                                               source.span_of_node(dtype_node), "dtype"))
        elif dtype_node is not None:  # `torch_dtype=getattr(torch, cfg.dtype)`: decided at run time
            values.setdefault("weights_open", Value("weights_open", True, f"from_pretrained dtype in {where}",
                                                    source.span_of_node(dtype_node), "dtype"))
        head = _head_of(node)
        if head is not None:
            values.setdefault("head", Value("head", head, f"{ast.unparse(node.func)} in {where}",
                                            source.span_of_node(node.func)))
        if "attn_implementation" in kwargs:  # the attention kernel: decides the s^2 score tensors
            try:
                impl = literal(kwargs["attn_implementation"], consts)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                impl = None
            kernel = ATTENTION_NAMES.get(impl) if isinstance(impl, str) else None
            if kernel is not None:
                values.setdefault("attention", Value("attention", kernel, f"from_pretrained attn_implementation in {where}",
                                                     source.span_of_node(kwargs["attn_implementation"]), "attn_implementation"))
        for flag, bits in (("load_in_4bit", "4bit"), ("load_in_8bit", "8bit")):
            if flag in kwargs and _truthy(kwargs[flag], consts):
                values.setdefault("quantization", Value("quantization", bits, f"{flag}= in {where}",
                                                        source.span_of_node(kwargs[flag]), flag))
        if node.args and "model" not in values:
            try:
                model = literal(node.args[0], consts)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                model = None
            if isinstance(model, str) and "/" in model:
                values["model"] = Value("model", model, f"from_pretrained in {where}", source.span_of_node(node.args[0]))
    elif last == "BitsAndBytesConfig":
        for kw in node.keywords:
            if kw.arg in ("load_in_4bit", "load_in_8bit") and _truthy(kw.value, consts):
                bits = "4bit" if kw.arg == "load_in_4bit" else "8bit"
                values.setdefault("quantization", Value("quantization", bits, f"BitsAndBytesConfig in {where}",
                                                        source.span_of_node(kw.value), kw.arg))
    elif last in ("gradient_checkpointing_enable", "enable_gradient_checkpointing"):  # transformers', diffusers' name
        values.setdefault("gradient_checkpointing", Value(
            "gradient_checkpointing", True, f"gradient_checkpointing_enable() in {where}", source.span_of_node(node)))
    elif last == "LoraConfig":
        if not node.args and all(kw.arg not in ("r", None) for kw in node.keywords):
            # peft LoraConfig `r: int = field(default=8)` (peft 0.21.2 tuners/lora/config.py,
            # 0.4.0 tuners/lora.py: the same default)
            values.setdefault("lora_rank", Value("lora_rank", 8, f"LoraConfig default r=8 (peft) in {where}",
                                                 source.span_of_node(node.func), "r"))
        if all(kw.arg not in ("target_modules", None) for kw in node.keywords):
            # PEFT picks the targets by model type (memory/lora_targets.py PEFT_DEFAULT_TARGETS)
            values.setdefault("lora_targets", Value("lora_targets", "peft-default",
                                                    f"LoraConfig without target_modules (peft's default for the "
                                                    f"model type) in {where}", source.span_of_node(node.func),
                                                    "target_modules"))
        for kw in node.keywords:
            if kw.arg == "target_modules":
                try:
                    targets = literal(kw.value, consts)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                if isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) for t in targets):
                    targets = ",".join(targets)
                if isinstance(targets, str) and targets:
                    values.setdefault("lora_targets", Value("lora_targets", targets, f"LoraConfig(target_modules=) in "
                                                            f"{where}", source.span_of_node(kw.value), "target_modules"))
            if kw.arg == "r":
                try:
                    rank = literal(kw.value, consts)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                if isinstance(rank, int):
                    values.setdefault("lora_rank", Value("lora_rank", rank, f"LoraConfig(r=) in {where}",
                                                         source.span_of_node(kw.value), "r"))
    elif name.startswith(("torch.optim.", "bitsandbytes.optim.")) or last in ("Adafactor", "AdamW8bit", "PagedAdamW8bit"):
        kind = _optimizer_kind(name, last, node)
        if kind is not None:
            values.setdefault("optimizer", Value("optimizer", kind, f"{last}(...) in {where}", source.span_of_node(node.func)))
            impl = _optimizer_impl(node, consts) if name.startswith("torch.optim.") else None
            if impl is not None:
                values.setdefault("optimizer_impl", Value("optimizer_impl", impl, f"{last}(...) in {where}",
                                                          source.span_of_node(node.func)))
    elif name in ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast"):
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        dtype = _dtype(kwargs["dtype"], consts) if "dtype" in kwargs else ("fp16" if name == "torch.cuda.amp.autocast" else None)
        if dtype in ("bf16", "fp16"):
            values.setdefault("autocast", Value("autocast", dtype, f"autocast in {where}", source.span_of_node(node)))
    elif last == "Accelerator":
        for kw in node.keywords:
            if kw.arg in ("mixed_precision", "gradient_accumulation_steps"):
                try:
                    value = literal(kw.value, consts)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                setting = "mixed_precision" if kw.arg == "mixed_precision" else "grad_accum"
                values.setdefault(setting, Value(setting, value, f"Accelerator({kw.arg}=) in {where}",
                                                 source.span_of_node(kw.value), kw.arg))


def _call_refs(node: ast.Call, last: str, refs, consts, found: ScriptSetup, arguments: bool) -> None:
    """Keywords whose values the script reads from its flags or its config file: kept as
    references, resolved per launch (training/resolve_refs.py)."""
    def is_literal(value) -> bool:
        try:
            literal(value, consts)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
        return True

    if arguments:
        for kw in node.keywords:
            if kw.arg is None:
                ref = refs.ref(kw.value)
                if ref is not None and ref.is_config:
                    found.argument_spreads.append(ref)
                else:
                    found.argument_opaque.add("**")
                continue
            if is_literal(kw.value):
                continue
            ref = refs.ref(kw.value)
            if ref is None:
                found.argument_opaque.add(kw.arg)
                continue
            found.argument_refs[kw.arg] = ref
            setting = NAME_TO_SETTING.get(kw.arg)
            if setting is not None:
                found.pending.append((setting, kw.arg, ref))
    elif last == "from_pretrained" and _loads_a_model(node) and node.args and not is_literal(node.args[0]):
        ref = refs.ref(node.args[0])
        if ref is not None:
            found.pending.append(("model", "from_pretrained", ref))
    elif last in ("Accelerator", "LoraConfig"):
        names = {"mixed_precision": "mixed_precision", "gradient_accumulation_steps": "grad_accum"} if last == "Accelerator" \
            else {"r": "lora_rank"}
        for kw in node.keywords:
            if kw.arg in names and not is_literal(kw.value):
                ref = refs.ref(kw.value)
                if ref is not None:
                    found.pending.append((names[kw.arg], kw.arg, ref))


def _model_casts(tree, source, imports, values: dict[str, Value]) -> None:
    """The last whole-model cast (`model.half()`, `model.to(torch.bfloat16)`) of a model the
    shared model analysis tracks from its `from_pretrained` load: it beats the load's dtype."""
    from cfgfix.analysis.models import analyze_models

    canonical = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    casts = [call for call in analyze_models(tree, source.text, imports).calls
             if call.target_dtype in canonical]
    if casts:
        last = max(casts, key=lambda call: (call.call.lineno, call.call.col_offset))
        values["weights_cast"] = Value("weights", canonical[last.target_dtype],
                                       f"{ast.unparse(last.call.func)}() in {source.path}", source.span_of_node(last.call))


_CAST_METHODS = {"bfloat16": "bf16", "half": "fp16", "float": "fp32"}
_TORCH_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def _variable_casts(tree, source, conditional: set[int], values: dict[str, Value]) -> None:
    """`model = model.bfloat16()` (or `.to(torch.bfloat16)`) of a model the shared analysis
    does not track from a `from_pretrained` load (the project's own nn.Module): the last
    unconditional one is the weights' dtype; one under a bf16 capability guard
    (`if torch.cuda.is_available() and torch.cuda.is_bf16_supported():`) is kept as
    `weights_guarded`, which the training setup resolves against the target GPU."""
    if "weights_cast" in values:
        return
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "is_bf16_supported" in ast.unparse(node.test):
            for stmt in node.body:
                guarded.update(id(sub) for sub in ast.walk(stmt))
    found: tuple[int, str, ast.AST, bool] | None = None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == node.targets[0].id):
            continue
        dtype = _CAST_METHODS.get(call.func.attr) if not call.args and not call.keywords else None
        if call.func.attr == "to":
            dtype = next((_TORCH_DTYPES.get(a.attr) for a in [*call.args, *(k.value for k in call.keywords if k.arg == "dtype")]
                          if isinstance(a, ast.Attribute)), None)
        if dtype is None:
            continue
        is_guarded = id(call) in guarded
        if id(call) in conditional and not is_guarded:
            continue  # `if args.bf16: model = model.bfloat16()`: unknown here
        if found is None or node.lineno > found[0]:
            found = (node.lineno, dtype, call, is_guarded)
    if found is None:
        return
    _, dtype, call, is_guarded = found
    where = f"{ast.unparse(call.func)}() in {source.path}"
    if is_guarded:
        values["weights_guarded"] = Value("weights", dtype, f"{where}, under torch.cuda.is_bf16_supported()",
                                          source.span_of_node(call))
    else:
        values["weights_cast"] = Value("weights", dtype, where, source.span_of_node(call))


# A diffusion pipeline's conditioning parts: the VAE and the CLIP text encoders. A script
# loads them next to the UNet it trains (often the VAE by a literal id, the UNet by a variable),
# so neither their id nor their load dtype is the trained model's; they are counted as frozen
# models on the GPU (`frozen_models`) when the script freezes them and moves them there.
_CONDITIONING_PARTS = re.compile(r"^(?:AutoencoderKL\w*|AutoencoderTiny|CLIPTextModel(?:WithProjection)?)$")


def _conditioning_part(call: ast.Call) -> bool:
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    name = receiver.attr if isinstance(receiver, ast.Attribute) else receiver.id if isinstance(receiver, ast.Name) else ""
    return bool(_CONDITIONING_PARTS.match(name))


def _loads_a_model(call: ast.Call) -> bool:
    """`AutoModelForCausalLM.from_pretrained(...)`, not a tokenizer's, a config's or a
    scheduler's (the same class-name test as the shared model analysis)."""
    from cfgfix.analysis.models import _MODEL_CLASS

    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    name = receiver.attr if isinstance(receiver, ast.Attribute) else receiver.id if isinstance(receiver, ast.Name) else ""
    return bool(_MODEL_CLASS.match(name))


def _dtype(node: ast.AST, consts) -> str | None:
    try:
        value = literal(node, consts)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return _DTYPES.get(value) if isinstance(value, str) else None


def _truthy(node: ast.AST, consts) -> bool:
    try:
        return literal(node, consts) is True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


# transformers' attn_implementation values -> the estimator's attention kernels
ATTENTION_NAMES = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
                   "kernels-community/flash-attn": "flash", "kernels-community/vllm-flash-attn3": "flash"}


def _frozen_models(tree, source, consts, values: dict[str, Value]) -> None:
    """Models the script loads, freezes (`x.requires_grad_(False)`) and moves to a device
    (`x.to(device, dtype=...)`, `x.cuda()`): text encoders, a VAE, a teacher. Each sits on
    every GPU besides the trained model (issue 13: SDXL's two text encoders and VAE)."""
    loads: dict[str, ast.Call] = {}
    frozen: set[str] = set()
    moved: dict[str, ast.Call] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "from_pretrained"
                and (_loads_a_model(node.value) or ast.unparse(node.value.func.value).endswith("ModelWithProjection"))):
            loads[node.targets[0].id] = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            var, method = node.func.value.id, node.func.attr
            if method == "requires_grad_" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value is False:
                frozen.add(var)
            elif method in ("to", "cuda"):
                moved[var] = node
    found = []
    for var, load in loads.items():
        if var not in frozen or var not in moved:
            continue
        receiver = load.func.value
        cls = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        try:
            model = literal(load.args[0], consts) if load.args else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            model = None
        move = moved[var]
        dtype_node = next((kw.value for kw in move.keywords if kw.arg == "dtype"), None)
        if dtype_node is None and len(move.args) > 1:
            dtype_node = move.args[1]
        dtype = _dtype(dtype_node, consts) if dtype_node is not None else None
        if dtype is None and dtype_node is not None:
            dtype = "run-time"  # `dtype=weight_dtype`: the mixed-precision dtype, decided at run time
        load_dtype = next((kw.value for kw in load.keywords if kw.arg in ("torch_dtype", "dtype")), None)
        if dtype is None and load_dtype is not None:  # moved without a cast: the dtype it was loaded in
            dtype = _dtype(load_dtype, consts) or "run-time"
        found.append({"name": var, "class": cls, "model": model if isinstance(model, str) else None,
                      "dtype": dtype or "load"})
    if found:
        values.setdefault("frozen_models", Value("frozen_models", found, f"frozen models moved to the device in {source.path}",
                                                 source.span_of_node(moved[found[0]["name"]])))


def _head_of(call: ast.Call) -> str | None:
    """The head a model class builds: `...ForSequenceClassification` / `...ForTokenClassification`
    (a num_labels classifier), `...ForMaskedLM`, `...ForCausalLM`; None for others."""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    name = receiver.attr if isinstance(receiver, ast.Attribute) else receiver.id if isinstance(receiver, ast.Name) else ""
    if name.endswith(("ForSequenceClassification", "ForTokenClassification")):
        return "classification"
    if name.endswith("ForMaskedLM"):
        return "masked-lm"
    if name.endswith("ForCausalLM"):
        return "causal-lm"
    return None


def _optimizer_impl(node: ast.Call, consts) -> str | None:
    """torch.optim's implementation when the call states it: `fused=True`, `foreach=False`/True."""
    flags = {}
    for kw in node.keywords:
        if kw.arg in ("fused", "foreach"):
            try:
                flags[kw.arg] = literal(kw.value, consts)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
    if flags.get("fused") is True:
        return "fused"
    if flags.get("foreach") is False:
        return "for-loop"
    if flags.get("foreach") is True:
        return "foreach"
    return None


def _optimizer_kind(name: str, last: str, node: ast.Call) -> str | None:
    lowered = last.lower()
    if lowered.startswith("paged") and "adam" in lowered:  # bitsandbytes PagedAdamW8bit / PagedAdamW32bit
        return "paged-adamw-8bit" if "8bit" in lowered else "paged-adamw"
    if "8bit" in lowered:
        return "adamw-8bit"
    if lowered in ("adamw", "adam"):
        return "adamw"
    if lowered == "adafactor":
        return "adafactor"
    if lowered == "sgd":
        momentum = next((kw.value for kw in node.keywords if kw.arg == "momentum"), None)
        if momentum is None:
            return "sgd"
        if isinstance(momentum, ast.Constant) and isinstance(momentum.value, (int, float)):
            return "sgd-momentum" if momentum.value else "sgd"
        return None
    return None
