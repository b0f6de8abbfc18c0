"""What a training script says about its TRL trainer: which config class holds its
settings (`SFTConfig(...)`, `TrlParser((..., GRPOConfig, ...))`, or the one a trainer builds
when `args` is left out), the model a trainer is given by name (`SFTTrainer(model="Qwen/...")`)
and the dtype `model_init_kwargs` loads it in.

Only TRL's own classes count: a name imported from `trl`, or a class of the script or of
the project's modules it imports whose base is one (`class GRPOConfig(trl.GRPOConfig)`). A
project's own `SFTConfig(TrainingArguments)` or `SFTTrainer` wrapper is not TRL's.
"""

from __future__ import annotations

import ast

from cfgfix.records import dataclass
from cfgfix.training.frameworks.trl import CONFIG_OF_TRAINER, CONFIGS
from cfgfix.training.values import Value, literal

# HfArgumentParser and the subclasses TRL and its users parse *Config classes with
_PARSERS = frozenset({"HfArgumentParser", "TrlParser", "H4ArgumentParser"})
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.half": "fp16", "torch.float32": "fp32",
           "torch.float": "fp32", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass
class TrlFacts:
    config: str | None = None  # SFTConfig, DPOConfig, ... (the TRL class the settings land in)
    config_origin: str = ""
    trainer: str | None = None  # SFTTrainer, ... (a TRL trainer the script builds)
    model: Value | None = None  # the model a trainer is given by name
    model_ref: object = None  # a Ref when the name comes from the flags or a config file
    model_dtype: Value | None = None  # model_init_kwargs' dtype / torch_dtype
    named_model: bool = False  # the trainer loads the model itself from a name
    built_by_trainer: bool = False  # no `args`: the trainer builds its config with every default


def trl_class(name: str, node: ast.AST, imports, local_bases: dict[str, str]) -> str | None:
    """The TRL class `node` (a call's function or a parser's argument) names: `SFTConfig`
    from `trl`, or a project class built on one (`local_bases`: class name -> TRL base)."""
    qualified = imports.qualify(node) or ""
    last = qualified.rsplit(".", 1)[-1] if qualified else name
    if qualified.split(".")[0] == "trl" and (last in CONFIGS or last in CONFIG_OF_TRAINER):
        return last
    return local_bases.get(last)


def local_trl_bases(trees, imports_of) -> dict[str, str]:
    """Classes of these modules built on a TRL config or trainer class: name -> TRL class."""
    found: dict[str, str] = {}
    for tree in trees:
        imports = imports_of(tree)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                qualified = imports.qualify(base) or ""
                last = qualified.rsplit(".", 1)[-1]
                if qualified.split(".")[0] == "trl" and (last in CONFIGS or last in CONFIG_OF_TRAINER):
                    found[node.name] = last
    return found


def read_trl(tree: ast.Module, imports, source, consts, refs, local_bases: dict[str, str],
             conditional: set[int]) -> TrlFacts:
    facts = TrlFacts()
    where = source.path
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = imports.qualify(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last in _PARSERS or last.endswith("ArgumentParser") and last != "ArgumentParser":
            for arg in _parser_classes(node):
                found = trl_class(ast.unparse(arg).rsplit(".", 1)[-1], arg, imports, local_bases)
                if found in CONFIGS and facts.config is None:
                    facts.config, facts.config_origin = found, f"{last}(({found}, ...)) in {where}"
            continue
        found = trl_class(last, node.func, imports, local_bases)
        if found in CONFIGS:
            if facts.config is None:
                facts.config, facts.config_origin = found, f"{found}(...) in {where}"
            dtype = _init_dtype(node, source, consts)
            if dtype is not None and id(node) not in conditional:
                facts.model_dtype = facts.model_dtype or dtype
        elif found in CONFIG_OF_TRAINER:
            facts.trainer = facts.trainer or found
            keywords = {kw.arg: kw.value for kw in node.keywords if kw.arg}
            if "args" not in keywords and len(node.args) < 2 and not any(kw.arg is None for kw in node.keywords):
                # TRL builds `SFTConfig(f"{model_name}-SFT")` (its defaults) without `args`
                if facts.config is None:
                    facts.built_by_trainer = True
                facts.config = facts.config or CONFIG_OF_TRAINER[found]
                facts.config_origin = facts.config_origin or f"{found}(...) without args in {where}"
            model = keywords.get("model", node.args[0] if node.args else None)
            if model is not None and id(node) not in conditional:
                _named_model(model, found, where, source, consts, refs, facts)
    return facts


def _parser_classes(call: ast.Call) -> list[ast.expr]:
    """The classes a parser is built over: `P((A, B, C))`, `P([A, B])`, `P(A)`."""
    first = call.args[0] if call.args else next((kw.value for kw in call.keywords if kw.arg == "dataclass_types"), None)
    if isinstance(first, (ast.Tuple, ast.List)):
        return list(first.elts)
    return [first] if isinstance(first, (ast.Name, ast.Attribute)) else []


def _named_model(node, trainer: str, where, source, consts, refs, facts: TrlFacts) -> None:
    try:
        value = literal(node, consts)
    except _LITERAL_ERRORS:
        ref = refs.ref(node) if refs is not None else None
        if ref is not None:
            facts.model_ref, facts.named_model = ref, True
        return
    if isinstance(value, str) and value.strip():
        facts.named_model = True
        if "/" in value:
            facts.model = Value("model", value, f"{trainer}(model=) in {where}", source.span_of_node(node), "model")


def _init_dtype(call: ast.Call, source, consts) -> Value | None:
    """`model_init_kwargs={"dtype": "bfloat16"}` (or `dict(torch_dtype=torch.bfloat16)`)."""
    kwargs = next((kw.value for kw in call.keywords if kw.arg == "model_init_kwargs"), None)
    pairs: list[tuple[str, ast.expr]] = []
    if isinstance(kwargs, ast.Dict):
        pairs = [(k.value, v) for k, v in zip(kwargs.keys, kwargs.values)
                 if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    elif isinstance(kwargs, ast.Call) and isinstance(kwargs.func, ast.Name) and kwargs.func.id == "dict":
        pairs = [(kw.arg, kw.value) for kw in kwargs.keywords if kw.arg]
    for key, value in pairs:
        if key in ("dtype", "torch_dtype"):
            try:
                written = literal(value, consts)
            except _LITERAL_ERRORS:
                return None
            dtype = _DTYPES.get(written) if isinstance(written, str) else None
            if dtype is not None:
                return Value("weights", dtype, f"model_init_kwargs {key} in {source.path}", source.span_of_node(value), key)
    return None
