"""What a training script does with DeepSpeed, read once per script per run for the
project rules (CFX505, CFX506, CFX508): which integration runs it (HF Trainer, accelerate,
or a bare `deepspeed.initialize`), how it saves, which optimizer it hands to DeepSpeed, and
the DeepSpeed configs it binds in code (`bound_configs`). Names are resolved through the
script's imports (`import deepspeed as ds`)."""

from __future__ import annotations

import ast

from cfgfix.analysis.names import ImportMap
from cfgfix.records import dataclass, field


@dataclass(frozen=True)
class BoundConfig:
    """A DeepSpeed config a script binds in code: `TrainingArguments(deepspeed=...)` (and
    any transformers/trl `*Arguments`/`*Config`), `deepspeed.initialize(config=...)` or its
    deprecated `config_params=`, accelerate's `DeepSpeedPlugin(hf_ds_config=...)`, or
    `HfDeepSpeedConfig(...)`. `path` is the file name as written (a string literal, a name
    bound once to one, an argparse / argument-dataclass default); `flag` the command-line
    option that replaces that default (`--deepspeed`), if any; `inline` a dict built in code:
    a literal, or the call of a function that returns one (`builder`: `ds_config =
    get_train_ds_config(offload=args.offload)`); `updates` the keys the module assigns to that
    dict after building it and before the binding call (`ds_config["train_batch_size"] = ...`,
    `ds_config["zero_optimization"]["stage"] = 3`, `.update({...})`), in order."""

    call: str  # "TrainingArguments(deepspeed=...)" as the code spells it
    node: ast.expr  # the value as written
    path: str | None = None
    flag: str | None = None
    inline: bool = False
    builder: ast.Call | None = None
    updates: tuple = ()  # ((key, ...), value expression)


@dataclass
class ScriptFacts:
    trainer: list[ast.Call] = field(default_factory=list)  # HF / TRL `...Trainer(...)` constructions
    accelerator: list[ast.Call] = field(default_factory=list)  # `Accelerator(...)`
    initialize: list[ast.Call] = field(default_factory=list)  # `deepspeed.initialize(...)`
    hf_saves: list[tuple[ast.Call, str]] = field(default_factory=list)  # (call, "trainer" | "accelerate")
    save_checkpoint: bool = False  # `engine.save_checkpoint(...)`: the full ZeRO checkpoint
    fills_auto: bool = False  # the script handles the string "auto" itself (not `device_map="auto"`)
    torch_optimizers: dict[str, ast.Call] = field(default_factory=dict)  # variable -> torch.optim.X(...)
    # DeepSpeed configs the code names (`TrainingArguments(deepspeed="ds.json")`, ...)
    bound_configs: list[BoundConfig] = field(default_factory=list)

    @property
    def integrated(self) -> bool:
        """HF Trainer or accelerate runs DeepSpeed: they fill "auto" and adapt the optimizer."""
        return bool(self.trainer or self.accelerator)

    def torch_optimizer_passed(self, call: ast.Call) -> ast.Call | None:
        """The torch optimizer construction passed as `optimizer=` to this initialize call."""
        for kw in call.keywords:
            if kw.arg != "optimizer":
                continue
            value = kw.value
            if isinstance(value, ast.Call) and self._imports is not None and _is_torch_optim(value, self._imports):
                return value
            if isinstance(value, ast.Name):
                return self.torch_optimizers.get(value.id)
        return None

    _imports: ImportMap | None = None


def _is_torch_optim(call: ast.Call, imports: ImportMap) -> bool:
    name = imports.qualify(call.func) or ""
    return name.startswith("torch.optim.") and name.count(".") == 2 and name.split(".")[2][:1].isupper()


def analyse(tree: ast.Module) -> ScriptFacts:
    imports = ImportMap(tree)
    facts = ScriptFacts()
    facts._imports = imports
    libraries = {value.split(".")[0] for value in imports.aliases.values()}
    hf = bool(libraries & {"transformers", "trl"})
    assigned: list[tuple[ast.expr, ast.Call]] = []
    other_autos = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "auto" and not facts.fills_auto:
            if other_autos is None:
                other_autos = _other_autos(tree)
            facts.fills_auto = id(node) not in other_autos
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            assigned.append((node.targets[0], node.value))
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        if name == "deepspeed.initialize":
            facts.initialize.append(node)
        elif last.endswith("Trainer") and hf:
            facts.trainer.append(node)
        elif name == "accelerate.Accelerator" or (last == "Accelerator" and "accelerate" in libraries):
            facts.accelerator.append(node)
        if isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method == "save_checkpoint":
                facts.save_checkpoint = True
            elif method in ("save_model", "get_state_dict", "save_pretrained"):
                facts.hf_saves.append((node, method))
    for target, call in assigned:
        if isinstance(target, ast.Name) and _is_torch_optim(call, imports):
            facts.torch_optimizers[target.id] = call
    facts.bound_configs = bound_configs(tree, imports, hf)
    # keep only the saves that go through the Trainer or accelerate
    kept = []
    for call, method in facts.hf_saves:
        receiver = ast.unparse(call.func.value).lower()
        if method == "save_model" and (facts.trainer or facts.accelerator):
            kept.append((call, "trainer" if facts.trainer and "accelerator" not in receiver else "accelerate"))
        elif method == "get_state_dict" and facts.accelerator:
            kept.append((call, "accelerate"))
        elif (method == "save_pretrained" and facts.trainer and "model" in receiver
              and not receiver.endswith(("config", "tokenizer", "processor"))
              and not any(kw.arg == "state_dict" for kw in call.keywords)):
            # an explicit state_dict was gathered by the script itself (LLaVA's *_maybe_zero_3)
            kept.append((call, "trainer"))
    facts.hf_saves = kept
    return facts


def script_facts(project, path):
    """(SourceText, ScriptFacts) for the training script at `path`, memoised on the project."""
    key = ("facts", path)
    cache = project._scripts  # reset with the model's other per-run reads (with_override)
    if key not in cache:
        parsed = project.script(path)
        cache[key] = (parsed[0], analyse(parsed[1])) if parsed is not None else None
    return cache[key]


# Keywords whose "auto" selects something other than a DeepSpeed value: a model's placement
# or dtype, Lightning's accelerator and devices, a tokenizer's padding.
_OTHER_AUTO = frozenset({
    "device_map", "torch_dtype", "dtype", "attn_implementation", "max_memory", "accelerator", "devices",
    "strategy", "precision", "padding", "mode", "report_to", "auto_find_batch_size",
})


def _other_autos(tree) -> set[int]:
    """The "auto" constants that are values of `_OTHER_AUTO` keywords or dict keys."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in _OTHER_AUTO:
            found.add(id(node.value))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value in _OTHER_AUTO:
                    found.add(id(value))
    return found


# (qualified name, keyword, position of the argument) of the calls that take a DeepSpeed config
_BINDERS = (
    ("deepspeed.initialize", "config", None),
    ("deepspeed.initialize", "config_params", None),
    ("accelerate.DeepSpeedPlugin", "hf_ds_config", 0),
    ("accelerate.utils.DeepSpeedPlugin", "hf_ds_config", 0),
    ("accelerate.utils.dataclasses.DeepSpeedPlugin", "hf_ds_config", 0),
    ("transformers.integrations.HfDeepSpeedConfig", "config_file_or_dict", 0),
    ("transformers.integrations.deepspeed.HfDeepSpeedConfig", "config_file_or_dict", 0),
    ("transformers.deepspeed.HfDeepSpeedConfig", "config_file_or_dict", 0),
)


def bound_configs(tree: ast.Module, imports: ImportMap | None = None, hf: bool | None = None) -> list[BoundConfig]:
    """The DeepSpeed configs the module binds in code (see `BoundConfig`), in source order."""
    imports = imports or ImportMap(tree)
    if hf is None:
        hf = bool({value.split(".")[0] for value in imports.aliases.values()} & {"transformers", "trl"})
    found: list[BoundConfig] = []
    values = _Values(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        candidates = []
        for qualified, keyword, position in _BINDERS:
            if name == qualified or (last == qualified.rsplit(".", 1)[-1] and last != "initialize"
                                     and name.split(".")[0] == qualified.split(".")[0]):
                candidates.append((keyword, position))
        if hf and last.endswith(("Arguments", "Config")) and last != "HfDeepSpeedConfig":
            candidates.append(("deepspeed", None))  # TrainingArguments, Seq2SeqTrainingArguments, SFTConfig, ...
        for keyword, position in candidates:
            value = next((kw.value for kw in node.keywords if kw.arg == keyword), None)
            if value is None and position is not None and len(node.args) > position:
                value = node.args[position]
            if value is None:
                continue
            spelled = f"{ast.unparse(node.func)}({keyword}=...)"
            updates: tuple = ()
            builder = None
            if isinstance(value, ast.Name) and len(bound := values.assigned().get(value.id, [])) == 1 \
                    and isinstance(bound[0], (ast.Dict, ast.Call)):
                updates = _dict_updates(tree, value.id, bound[0], node)
                if isinstance(bound[0], ast.Dict):
                    value = bound[0]  # `DS = {...}` then `deepspeed=DS`
                elif isinstance(bound[0].func, (ast.Name, ast.Attribute)) and not _is_open_or_load(bound[0]):
                    builder = bound[0]  # `ds_config = get_train_ds_config(...)` then `config=ds_config`
            if isinstance(value, ast.Dict) or builder is not None:
                found.append(BoundConfig(spelled, builder or value, inline=True, builder=builder, updates=updates))
                continue
            path, flag = values.text(value)
            if (path is not None and path.strip()) or flag is not None:  # a default the launch may pass
                found.append(BoundConfig(spelled, value, path, flag))
            break
    found.sort(key=lambda bound: (bound.node.lineno, bound.node.col_offset))
    return found


def _is_open_or_load(call: ast.Call) -> bool:
    """`json.load(open(p))`, `dict(...)`, `str(...)`: not a function that builds the config."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
    return name in ("load", "loads", "safe_load", "open", "dict", "str", "Path", "copy", "deepcopy", "get")


def _dict_updates(tree: ast.Module, name: str, built: ast.expr, use: ast.Call) -> tuple:
    """The keys assigned to the dict `name` holds between where it is built and `use`:
    `name["k"] = v`, `name["a"]["b"] = v`, `name.update({"k": v})` / `name.update(k=v)`."""
    start, end = (built.lineno, built.col_offset), (use.lineno, use.col_offset)
    found = []
    for node in ast.walk(tree):
        if not start < (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)) < end:
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
            keys, base = [], node.targets[0]
            while isinstance(base, ast.Subscript) and isinstance(base.slice, ast.Constant) \
                    and isinstance(base.slice.value, str):
                keys.append(base.slice.value)
                base = base.value
            if isinstance(base, ast.Name) and base.id == name and keys:
                found.append(((node.lineno, node.col_offset), tuple(reversed(keys)), node.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == name):
            items = list(zip(node.args[0].keys, node.args[0].values)) if node.args and isinstance(node.args[0], ast.Dict) else []
            items += [(ast.Constant(kw.arg), kw.value) for kw in node.keywords if kw.arg]
            if node.args and not isinstance(node.args[0], ast.Dict) or any(kw.arg is None for kw in node.keywords):
                found.append(((node.lineno, node.col_offset), None, node))  # an update we cannot read: all unknown
            for key, value in items:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.append(((node.lineno, node.col_offset), (key.value,), value))
    found.sort(key=lambda item: item[0])
    return tuple((keys, value) for _, keys, value in found)


class _Values:
    """The string a config argument holds: a literal, a name bound once to one, or the
    default of the argparse option / argument-dataclass field it reads (`args.deepspeed`)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self._assigned: dict[str, list[ast.expr]] | None = None
        self._defaults: dict[str, tuple[str | None, str]] | None = None

    def text(self, node: ast.expr, depth: int = 0) -> tuple[str | None, str | None]:
        """(the string, the option that sets it instead) for `node`; (None, None): unknown."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value, None
        if depth > 3:
            return None, None
        if isinstance(node, ast.Name):
            bound = self.assigned().get(node.id, [])
            return self.text(bound[0], depth + 1) if len(bound) == 1 else (None, None)
        if isinstance(node, ast.Attribute):
            found = self.defaults().get(node.attr)
            return found if found is not None else (None, None)
        return None, None

    def assigned(self) -> dict[str, list[ast.expr]]:
        if self._assigned is None:
            self._assigned = {}
            for node in ast.walk(self.tree):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None else [])
                for target in targets:
                    for name in ast.walk(target):
                        # `cfg["k"] = v` / `cfg.k = v` change what `cfg` holds, not which object
                        # (the keys: `_dict_updates`)
                        if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                            self._assigned.setdefault(name.id, []).append(
                                node.value if isinstance(target, ast.Name) and not isinstance(node, ast.AugAssign)
                                else ast.Constant(None))
        return self._assigned

    def defaults(self) -> dict[str, tuple[str | None, str]]:
        """attribute -> (default text, its option): `add_argument("--deepspeed", default="ds.json")`,
        `deepspeed: str = field(default="ds.json")` in a class (an HfArgumentParser dataclass)."""
        if self._defaults is not None:
            return self._defaults
        self._defaults = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                longs = [o for o in options if o.startswith("--")]
                dest = next((kw.value.value for kw in node.keywords if kw.arg == "dest"
                             and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)), None)
                if not longs and dest is None:
                    continue
                dest = dest or longs[0][2:].replace("-", "_")
                default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
                text = default.value if isinstance(default, ast.Constant) and isinstance(default.value, str) else None
                self._defaults.setdefault(dest, (text, longs[0] if longs else f"--{dest}"))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None):
                        continue
                    value = item.value
                    if isinstance(value, ast.Call) and (getattr(value.func, "id", None) == "field"
                                                        or getattr(value.func, "attr", None) == "field"):
                        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
                    text = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
                    self._defaults.setdefault(item.target.id, (text, f"--{item.target.id}"))
        return self._defaults
