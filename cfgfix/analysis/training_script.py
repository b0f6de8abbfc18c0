"""What a training script does with DeepSpeed, read once per script per run for the
project rules (CFX505, CFX506, CFX508): which integration runs it (HF Trainer, accelerate,
or a bare `deepspeed.initialize`), how it saves, and which optimizer it hands to DeepSpeed.
Names are resolved through the script's imports (`import deepspeed as ds`)."""

from __future__ import annotations

import ast

from cfgfix.analysis.names import ImportMap
from cfgfix.records import dataclass, field


@dataclass
class ScriptFacts:
    trainer: list[ast.Call] = field(default_factory=list)  # HF / TRL `...Trainer(...)` constructions
    accelerator: list[ast.Call] = field(default_factory=list)  # `Accelerator(...)`
    initialize: list[ast.Call] = field(default_factory=list)  # `deepspeed.initialize(...)`
    hf_saves: list[tuple[ast.Call, str]] = field(default_factory=list)  # (call, "trainer" | "accelerate")
    save_checkpoint: bool = False  # `engine.save_checkpoint(...)`: the full ZeRO checkpoint
    fills_auto: bool = False  # the script handles the string "auto" itself (not `device_map="auto"`)
    torch_optimizers: dict[str, ast.Call] = field(default_factory=dict)  # variable -> torch.optim.X(...)

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
