"""A model the script builds from its own class: `model = MultimodalEncoder(cfg["model"])`
where `MultimodalEncoder(nn.Module).__init__` loads pretrained backbones and adds torch
layers. Its `__init__` is read statically, statement by statement, with the constructor's
arguments resolved for the launch (a config mapping from the training YAML, a flag, a
literal): each `self.x = ...` becomes a `Part` (memory/parts.py) sized from

- `X.from_pretrained(id)`: the catalog or the id's `config.json` (a local folder), without the
  LM head when X builds the base model (`AutoModel`, `BertModel`, `CLIPVisionModel`);
- a standard torch layer (`nn.Linear`, `nn.TransformerEncoderLayer`, `nn.Sequential`, ...)
  whose dimensions resolve from literals, config values, local names, arithmetic and the
  backbones' configs (`self.text.config.hidden_size`);
- another of the project's own `nn.Module` classes, read the same way.

What cannot be resolved is a part with a `problem`; the user may state its size (or the
whole model's) in the settings (`[tool.cfgfix.model]`, settings.py). Nothing is imported or
run: `estimate --simulate` instantiates the class on the meta device to compare.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from cfgfix.memory.parts import CONTAINERS, TORCH_LAYERS, Part, composite_shape, torch_layer_params
from cfgfix.records import dataclass, field

UNKNOWN = object()
# attributes of a pretrained model that are themselves modules (its encoder, its vision tower)
_SUBMODULES = frozenset({"encoder", "decoder", "model", "backbone", "vision_model", "text_model", "vision_tower",
                         "language_model", "visual", "transformer", "base_model"})
_MAX_DEPTH = 3  # nested user classes followed


@dataclass
class CustomModel:
    """The script's `name = Class(args)` with its class found in the project."""

    class_name: str
    module: Path  # the file defining the class
    call: ast.Call  # the construction in the script (for a factory: the call of the factory)
    span: object = None
    # `model = create_encoder(cfg)` with `def create_encoder(cfg): return Encoder(**cfg["model"])`:
    # (the factory's def, the class construction inside it)
    factory: tuple | None = None

    def constructor_arguments(self, args: list, kwargs: dict) -> tuple[list, dict]:
        """The class's constructor arguments from the resolved arguments of `call`: the same
        ones, or, through a factory, its `return Class(...)` read with its parameters bound."""
        if self.factory is None:
            return args, kwargs
        func, inner = self.factory
        names = [a.arg for a in func.args.args]
        env = {name: (args[i] if i < len(args) else kwargs.get(name)) for i, name in enumerate(names)}
        reader = _Reader(lambda path: None, [], self.module)

        def value(node):
            found = reader.value(node, env, {})
            return None if found is UNKNOWN or isinstance(found, _Module) else found

        inner_args = [value(a) for a in inner.args]
        inner_kwargs: dict = {}
        for kw in inner.keywords:
            if kw.arg:
                inner_kwargs[kw.arg] = value(kw.value)
            elif isinstance(spread := value(kw.value), dict):
                inner_kwargs.update({k: v for k, v in spread.items() if isinstance(k, str)})
        return inner_args, inner_kwargs


@dataclass
class Sized:
    parts: list[Part] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shape: object = None  # ModelShape, or None when nothing could be sized
    class_name: str = ""
    origin: str = ""
    checkpointed: set = field(default_factory=set)  # parts whose gradient checkpointing __init__ enables
    # how the class was built, for `estimate --simulate`'s meta-device count (memory/meta_count.py)
    module: Path | None = None
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    folders: list = field(default_factory=list)

    @property
    def main(self) -> Part | None:
        """The largest pretrained part: the one whose dimensions the activation model uses."""
        backbones = [p for p in self.parts if p.shape is not None and p.params is not None]
        return max(backbones, key=lambda p: p.params) if backbones else None

    @property
    def unresolved(self) -> list[Part]:
        return [p for p in self.parts if p.params is None]

    @property
    def frozen_params(self) -> int:
        return sum(p.params for p in self.parts if p.frozen and p.params is not None)


@dataclass
class _Module:
    """A module value while reading `__init__`: its parameters (None: unknown), its config
    (a backbone's config.json, for `.config.hidden_size`) and how it was built."""

    params: int | None
    what: str
    shape: object = None
    config: dict | None = None
    problem: str | None = None
    children: list = field(default_factory=list)  # parts of a nested user class


def find_custom_model(tree: ast.Module, path: Path, local_modules: list[Path], parse) -> CustomModel | None:
    """The script's construction of one of the project's own `nn.Module` classes, preferring
    the one bound to `model` or handed to a Trainer / optimizer. `parse(path)` gives a
    module's tree (memoised by the project)."""
    classes = _module_classes(tree, path, local_modules, parse)
    if not classes:
        return None
    found: list[tuple[int, ast.Call, str, Path]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in classes:
            continue
        target = node.targets[0]
        bound = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        found.append((0 if bound == "model" else 1, node.value, name, classes[name][1]))
    if not found:
        return _factory_model(tree, path, local_modules, parse, classes)
    found.sort(key=lambda item: (item[0], item[1].lineno))
    _, call, name, module = found[0]
    return CustomModel(name, module, call)


def _factory_model(tree, path, local_modules, parse, classes) -> CustomModel | None:
    """`model = create_encoder(cfg)` where the factory (in the script or a project module,
    re-exports followed) returns one of the project's nn.Module classes."""
    functions = module_functions(tree, path, local_modules, parse)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id in functions):
            continue
        func, module = functions[node.value.func.id]
        returned = [n.value for n in ast.walk(func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)]
        for inner in returned:
            name = inner.func.id if isinstance(inner.func, ast.Name) else inner.func.attr if isinstance(inner.func, ast.Attribute) else None
            defined = _defined(parse(module), module, parse, {"classes"}, 0) if name not in classes else {name: classes[name]}
            if name in defined:
                return CustomModel(name, defined[name][1], node.value, factory=(func, inner))
    return None


def _module_classes(tree, path, local_modules, parse) -> dict[str, tuple[ast.ClassDef, Path]]:
    """The nn.Module subclasses defined in the script or in the project modules it imports,
    and those a package's `__init__` re-exports (`from .encoder import MultimodalEncoder`),
    followed down to the file that defines them."""
    out: dict[str, tuple[ast.ClassDef, Path]] = {}
    for module_path, module_tree in [(path, tree)] + [(p, parse(p)) for p in local_modules]:
        for name, found in _defined(module_tree, module_path, parse, {"classes"}, 0).items():
            out.setdefault(name, found)
    return out


def module_functions(tree, path, local_modules, parse) -> dict[str, tuple[ast.FunctionDef, Path]]:
    """The functions defined in the script or re-exported by the project modules it imports
    (a factory: `def create_encoder(cfg): return MultimodalEncoder(**cfg["model"])`)."""
    out: dict[str, tuple[ast.FunctionDef, Path]] = {}
    for module_path, module_tree in [(path, tree)] + [(p, parse(p)) for p in local_modules]:
        for name, found in _defined(module_tree, module_path, parse, {"functions"}, 0).items():
            out.setdefault(name, found)
    return out


def _defined(tree, path: Path, parse, kinds: set, depth: int) -> dict:
    """{name: (node, file)} of the nn.Module classes or the functions `tree` defines or imports
    from the project (relative imports, or absolute ones that resolve to a file beside it)."""
    out: dict = {}
    if tree is None:
        return out
    for node in tree.body:
        if "classes" in kinds and isinstance(node, ast.ClassDef) and _is_nn_module(node) or "functions" in kinds and isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, (node, path))
        elif isinstance(node, ast.ImportFrom) and depth < _MAX_DEPTH:
            source = _import_file(node, path)
            if source is None:
                continue
            found = _defined(parse(source), source, parse, kinds, depth + 1)
            for alias in node.names:
                if alias.name in found:
                    out.setdefault(alias.asname or alias.name, found[alias.name])
    return out


def _import_file(node: ast.ImportFrom, path: Path) -> Path | None:
    """The project file a `from X import Y` reads: relative to the importing file's package
    for `from .x import Y`, else beside it or up to three folders above (`giblet.models`)."""
    parts = node.module.split(".") if node.module else []
    if node.level:
        bases = [path.parents[node.level - 1]] if node.level - 1 < len(path.parents) else []
    else:
        bases = [path.parent, *list(path.parents)[1:4]]
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py") if parts else None,
                          base.joinpath(*parts, "__init__.py")):
            if candidate is not None and candidate != path and os.path.isfile(candidate):
                return candidate
    return None


def _is_nn_module(node: ast.ClassDef) -> bool:
    bases = [ast.unparse(b) for b in node.bases]
    # a PreTrainedModel subclass loads with transformers' semantics (the shared model analysis)
    return any(b in ("nn.Module", "torch.nn.Module", "Module") for b in bases)


def size_custom_model(custom: CustomModel, args: list, kwargs: dict, parse, model_folders: list[Path],
                      overrides: dict | None = None) -> Sized:
    """The parts of `custom` built with these (resolved) constructor arguments.
    `overrides`: {"params": int | None, "modules": {attribute: int | model id}} from the settings."""
    overrides = overrides or {}
    reader = _Reader(parse, model_folders, custom.module)
    classes = reader.classes(custom.module)
    cls = classes.get(custom.class_name)
    sized = Sized(class_name=custom.class_name, module=custom.module, args=list(args), kwargs=dict(kwargs),
                  folders=[str(f) for f in model_folders])
    if cls is None:
        sized.notes.append(f"{custom.class_name}: class not found")
        return sized
    parts = reader.instantiate(cls, args, kwargs, 0)
    stated = overrides.get("modules") or {}
    out = []
    for part in parts:
        if part.name in stated:
            part = reader.stated_part(part.name, stated[part.name], part)
        out.append(part)
    for name, value in stated.items():
        if not any(p.name == name for p in out):
            out.append(reader.stated_part(name, value, None))
    sized.parts = out
    sized.notes.extend(reader.notes)
    sized.checkpointed = set(reader.checkpointed)
    source = f"{custom.class_name} in {custom.module.name}: sum of its parts"
    checkpointed = frozenset(reader.checkpointed)
    if overrides.get("params"):
        from cfgfix.memory.shapes import params_only

        base = composite_shape(out, source, checkpointed) if any(p.params for p in out) else params_only(overrides["params"])
        from cfgfix.records import replace

        sized.shape = replace(base, params=int(overrides["params"]),
                              source=f"{custom.class_name}: {int(overrides['params']) / 1e9:.3g}B parameters stated in the cfgfix settings (model.params)")
    elif any(p.params for p in out):
        sized.shape = composite_shape(out, source, checkpointed)
    return sized


class _Reader:
    def __init__(self, parse, model_folders: list[Path], home: Path) -> None:
        self.parse = parse
        self.model_folders = model_folders
        self.home = home
        self.notes: list[str] = []
        self.checkpointed: set[str] = set()  # attributes whose gradient_checkpointing_enable() __init__ calls
        self._classes: dict[Path, dict] = {}

    # -- classes --------------------------------------------------------------------------
    def classes(self, module: Path) -> dict[str, ast.ClassDef]:
        if module not in self._classes:
            tree = self.parse(module)
            self._classes[module] = {n.name: n for n in (tree.body if tree is not None else ())
                                     if isinstance(n, ast.ClassDef) and _is_nn_module(n)}
        return self._classes[module]

    def instantiate(self, cls: ast.ClassDef, args: list, kwargs: dict, depth: int) -> list[Part]:
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return []
        env: dict[str, object] = {}
        params = [a.arg for a in init.args.args[1:]]
        defaults = init.args.defaults
        for i, name in enumerate(params):
            default_index = i - (len(params) - len(defaults))
            given = args[i] if i < len(args) else kwargs.get(name, UNKNOWN)
            if default_index >= 0 and given is not UNKNOWN and given is not None and depth == 0:
                default = self.value(defaults[default_index], {}, {})
                if default != given and default is not UNKNOWN:
                    # the launch's value, never the constructor's default without a word
                    self.notes.append(f"{cls.name}({name}={_short(given)}) from the launch, not the constructor's "
                                      f"default {_short(default)}")
            if i < len(args):
                env[name] = args[i]
            elif name in kwargs:
                env[name] = kwargs[name]
            elif default_index >= 0:
                env[name] = self.value(defaults[default_index], {}, {})
            else:
                env[name] = UNKNOWN
        attrs: dict[str, _Module] = {}
        frozen: set[str] = set()
        order: list[str] = []
        for stmt in init.body:
            self.statement(stmt, env, attrs, frozen, order, depth)
        parts = []
        for name in order:
            module = attrs[name]
            parts.append(Part(name, module.what, module.params, module.shape, name in frozen, module.problem))
        return parts

    def statement(self, stmt, env, attrs, frozen, order, depth) -> None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            value = self.value(stmt.value, env, attrs, depth)
            if isinstance(target, ast.Name):
                env[target.id] = value
            elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
                if isinstance(value, _Module):
                    if target.attr not in attrs:
                        order.append(target.attr)
                    attrs[target.attr] = value
                elif _looks_like_module(stmt.value):
                    if target.attr not in attrs:
                        order.append(target.attr)
                    attrs[target.attr] = _Module(None, ast.unparse(stmt.value)[:80], problem=f"could not size {ast.unparse(stmt.value)[:80]}")
                else:
                    env["self." + target.attr] = value
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            # self.vision.requires_grad_(False) / self.vision.eval() keeps it frozen
            if (isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_" and call.args
                    and isinstance(call.args[0], ast.Constant) and call.args[0].value is False):
                owner = _self_attr(call.func.value)
                if owner is not None:
                    frozen.add(owner)
            # self.text.gradient_checkpointing_enable(): that backbone recomputes its layers
            # (`activation_checkpointing_enable`, its name from transformers 5.2x on)
            if isinstance(call.func, ast.Attribute) and call.func.attr in ("gradient_checkpointing_enable",
                                                                           "activation_checkpointing_enable"):
                owner = _self_attr(call.func.value)
                if owner is not None:
                    self.checkpointed.add(owner)
        elif isinstance(stmt, ast.For):
            # for p in self.vision.parameters(): p.requires_grad = False
            it = stmt.iter
            if (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "parameters"
                    and any(isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Attribute)
                            and s.targets[0].attr == "requires_grad" and isinstance(s.value, ast.Constant)
                            and s.value.value is False for s in stmt.body)):
                owner = _self_attr(it.func.value)
                if owner is not None:
                    frozen.add(owner)
        elif isinstance(stmt, ast.If):
            self.notes.append(f"a branch in __init__ (line {stmt.lineno}) was not followed: its modules are not counted")

    # -- expressions ------------------------------------------------------------------------
    def value(self, node, env, attrs, depth: int = 0):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id, UNKNOWN)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e, env, attrs, depth) for e in node.elts]
        if isinstance(node, ast.Subscript):
            base = self.value(node.value, env, attrs, depth)
            key = self.value(node.slice, env, attrs, depth)
            if isinstance(base, dict) and isinstance(key, str):
                return base.get(key, UNKNOWN)
            if isinstance(base, list) and isinstance(key, int) and -len(base) <= key < len(base):
                return base[key]
            return UNKNOWN
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return attrs.get(node.attr) or env.get("self." + node.attr, UNKNOWN)
            base = self.value(node.value, env, attrs, depth)
            if isinstance(base, _Module) and node.attr in _SUBMODULES:
                # `WhisperModel.from_pretrained(id).encoder`: a part of a pretrained model, named
                # with what it is at most, never dropped without a word
                whole = f" (at most the whole {base.what}, {base.params / 1e6:.0f}M)" if base.params else ""
                return _Module(None, f"{base.what}.{node.attr}",
                               problem=f".{node.attr} of {base.what}: a part of a pretrained model, not sized{whole}")
            if isinstance(base, _Module):
                return base.config if node.attr == "config" and base.config is not None else UNKNOWN
            if isinstance(base, dict):  # cfg.text_backbone (OmegaConf / namespace style), config.hidden_size
                return base.get(node.attr, UNKNOWN)
            return UNKNOWN
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left, env, attrs, depth), self.value(node.right, env, attrs, depth)
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (left, right)):
                return UNKNOWN
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                   ast.FloorDiv: lambda a, b: a // b if b else UNKNOWN, ast.Div: lambda a, b: a / b if b else UNKNOWN,
                   # `2 ** 12`: bounded, so `cfg["x"] ** 10 ** 9` cannot stall a check
                   ast.Pow: lambda a, b: a ** b if isinstance(b, int) and 0 <= b <= 64 and abs(a) <= 2**20 else UNKNOWN}
            op = ops.get(type(node.op))
            return op(left, right) if op else UNKNOWN
        if isinstance(node, ast.Call):
            return self.call(node, env, attrs, depth)
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            count = _range_count(node.generators[0].iter, lambda n: self.value(n, env, attrs, depth))
            elt = self.value(node.elt, env, attrs, depth)
            if isinstance(elt, _Module) and count is not None:
                # one entry standing for all `count` copies: the same sum, and no list of a
                # million modules for `range(1_000_000)`
                total = elt.params * count if elt.params is not None else None
                return [_Module(total, f"{count} x {elt.what}", problem=elt.problem)]
            return UNKNOWN
        if isinstance(node, ast.Starred):
            return self.value(node.value, env, attrs, depth)
        return UNKNOWN

    def call(self, node: ast.Call, env, attrs, depth):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "from_pretrained" and isinstance(func, ast.Attribute):
            return self.pretrained(node, env, attrs, depth)
        if name in ("from_config", "_from_config") and isinstance(func, ast.Attribute):
            return self.from_config(node, env, attrs, depth)
        if name == "get" and isinstance(func, ast.Attribute) and node.args:
            base = self.value(func.value, env, attrs, depth)
            key = self.value(node.args[0], env, attrs, depth)
            if isinstance(base, dict) and isinstance(key, str):
                default = self.value(node.args[1], env, attrs, depth) if len(node.args) > 1 else None
                return base.get(key, default)
            return UNKNOWN
        if name in ("int", "float") and len(node.args) == 1:
            value = self.value(node.args[0], env, attrs, depth)
            return int(value) if name == "int" and isinstance(value, (int, float)) else value
        args = []
        for a in node.args:
            value = self.value(a, env, attrs, depth)
            if isinstance(a, ast.Starred) and isinstance(value, list):
                args.extend(value)
            else:
                args.append(value)
        kwargs = {kw.arg: self.value(kw.value, env, attrs, depth) for kw in node.keywords if kw.arg}
        text = ast.unparse(node)[:80]
        if name in CONTAINERS:
            members = args[0] if name == "ModuleList" and args and isinstance(args[0], list) else args
            return self.sum_modules(members, text)
        if name in ("TransformerEncoder", "TransformerDecoder"):
            layer = args[0] if args else kwargs.get("encoder_layer", kwargs.get("decoder_layer", UNKNOWN))
            count = args[1] if len(args) > 1 else kwargs.get("num_layers", UNKNOWN)
            norm = args[2] if len(args) > 2 else kwargs.get("norm")
            if isinstance(layer, _Module) and layer.params is not None and isinstance(count, int):
                extra = norm.params if isinstance(norm, _Module) and norm.params is not None else 0
                return _Module(layer.params * count + extra, f"nn.{name}({layer.what} x {count})")
            return _Module(None, text, problem=f"could not size {text}: its layer or number of layers is not known")
        if name in TORCH_LAYERS:
            clean_args = [None if v is UNKNOWN else v for v in args]
            clean_kwargs = {k: (None if v is UNKNOWN else v) for k, v in kwargs.items()}
            params = torch_layer_params(name, clean_args, clean_kwargs)
            if params is None:
                return _Module(None, text, problem=f"could not size {text}: a dimension is not known statically")
            return _Module(params, f"nn.{name}({', '.join(_short(v) for v in args)})")
        if depth < _MAX_DEPTH:
            cls = self.classes(self.home).get(name)
            if cls is not None:
                parts = self.instantiate(cls, [None if v is UNKNOWN else v for v in args], kwargs, depth + 1)
                return self.sum_modules([_Module(p.params, p.what, p.shape, problem=p.problem) for p in parts], f"{name}(...)")
        return UNKNOWN

    def sum_modules(self, members, text: str) -> _Module:
        modules = [m for m in members if isinstance(m, _Module)]
        if len(modules) != len(members):
            return _Module(None, text, problem=f"could not size {text}: a member is not a module cfgfix knows")
        unknown = [m for m in modules if m.params is None]
        if unknown:
            return _Module(None, text, problem=unknown[0].problem)
        return _Module(sum(m.params for m in modules), text)

    def from_config(self, node: ast.Call, env, attrs, depth):
        """`AutoModel.from_config(AutoConfig.from_pretrained(id))`, `BertModel.from_config(cfg)`:
        the architecture of that config with fresh weights, sized like a pretrained part."""
        from cfgfix.memory import shapes

        receiver = ast.unparse(node.func.value)
        config = self.value(node.args[0], env, attrs, depth) if node.args else UNKNOWN
        if not isinstance(config, dict):
            return _Module(None, f"{receiver}.from_config(...)",
                           problem=f"{receiver}.from_config({ast.unparse(node.args[0]) if node.args else ''}): the config is not known statically")
        try:
            shape = shapes.shape_from_config(config, source=f"{receiver}.from_config")
        except shapes.ShapeError as exc:
            try:
                shape = shapes.part_shape_from_config(config, f"{receiver}.from_config")
            except shapes.ShapeError:
                shape = None
            if shape is None:
                return _Module(None, f"{receiver}.from_config(...)", config=config, problem=f"{receiver}.from_config: {exc}")
        base = _base_model(receiver.rsplit(".", 1)[-1])
        if base and shape.head_params:
            shape = shapes.with_head(shape, "classification")
        return _Module(shape.params, f"{config.get('model_type', '?')} config ({receiver}.from_config{', no LM head' if base else ''})",
                       shape, config)

    def pretrained(self, node: ast.Call, env, attrs, depth):
        from cfgfix.memory import shapes

        receiver = ast.unparse(node.func.value)
        cls = receiver.rsplit(".", 1)[-1]
        if cls in ("AutoConfig",) or cls.endswith("Config"):
            model_id = self.value(node.args[0], env, attrs, depth) if node.args else UNKNOWN
            config = self.config_of(model_id) if isinstance(model_id, str) else None
            return config if config is not None else UNKNOWN
        if cls.endswith(("Tokenizer", "TokenizerFast", "Processor", "ImageProcessor", "FeatureExtractor")):
            return UNKNOWN
        model_id = self.value(node.args[0], env, attrs, depth) if node.args else UNKNOWN
        if not isinstance(model_id, str):
            return _Module(None, f"{receiver}.from_pretrained(...)",
                           problem=f"{receiver}.from_pretrained({ast.unparse(node.args[0]) if node.args else ''}): the model id is not known statically")
        where = self.local(model_id)
        try:
            shape = shapes.resolve_part_shape(where or model_id)
        except shapes.ShapeError as exc:
            config = self.config_of(model_id)
            return _Module(None, f"{model_id} ({receiver})", config=config, problem=str(exc))
        base = _base_model(cls)
        if base and shape.head_params:
            shape = shapes.with_head(shape, "classification")  # the base model: no vocabulary head
        return _Module(shape.params, f"{model_id} ({receiver}{', no LM head' if base else ''})", shape,
                       self.config_of(model_id))

    def local(self, model_id: str) -> str | None:
        for base in self.model_folders:
            candidate = base / model_id
            if os.path.exists(candidate):
                return str(candidate)
        return None

    def config_of(self, model_id: str) -> dict | None:
        """The config dict `.config` reads: a local folder's config.json, else the catalog's."""
        from cfgfix.memory.shapes import catalog_entry

        where = self.local(model_id)
        if where is not None:
            path = Path(where)
            path = path / "config.json" if os.path.isdir(path) else path
            try:
                data = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError, RecursionError):  # RecursionError: nested past the decoder's depth
                return None
            return data if isinstance(data, dict) else None
        row = catalog_entry(model_id)
        return dict(row["config"]) if row is not None and isinstance(row.get("config"), dict) else None

    def stated_part(self, name: str, value, found: Part | None) -> Part:
        """A part sized by the user's settings: a parameter count, or a model id / folder."""
        from cfgfix.memory import shapes

        if isinstance(value, int):
            return Part(name, f"{value / 1e6:.1f}M parameters stated in the cfgfix settings", value, None,
                        found.frozen if found else False, stated=True)
        where = self.local(value) or value
        try:
            shape = shapes.resolve_part_shape(where)
        except shapes.ShapeError as exc:
            return Part(name, str(value), None, None, found.frozen if found else False, problem=str(exc), stated=True)
        return Part(name, f"{value} (stated in the cfgfix settings)", shape.params, shape, found.frozen if found else False,
                    stated=True)


def meta_count(sized: Sized, timeout: float = 600) -> dict:
    """Build the class on the meta device in a subprocess (memory/meta_count.py: it imports the
    user's module, every from_pretrained built from the catalog or a local config, nothing
    downloaded): {"params": N, "parts": {...}} or {"error": "..."}."""
    import subprocess
    import sys

    try:
        call = json.dumps({"args": sized.args, "kwargs": sized.kwargs})
    except (TypeError, ValueError) as exc:
        return {"error": f"the constructor's arguments are not plain values: {exc}"}
    try:
        done = subprocess.run([sys.executable, "-m", "cfgfix.memory.meta_count", str(sized.module), sized.class_name, call,
                               *sized.folders], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def meta_comparison(sized: Sized) -> tuple[str, dict]:
    """`estimate --simulate` for a composite: the meta-device count next to the static sum."""
    found = meta_count(sized)
    if "error" in found:
        return f"Meta-device count of {sized.class_name}: not run ({found['error']})\n", found
    static = sum(p.params for p in sized.parts if p.params is not None)
    counted = found["params"]
    error = (static - counted) / counted if counted else 0.0
    lines = [(f"Meta-device count of {sized.class_name}: {counted / 1e9:.4g}B parameters built by torch; the static "
              f"sum of its parts {static / 1e9:.4g}B ({error:+.1%})")]
    for part in sized.parts:
        real = found.get("parts", {}).get(part.name)
        if real is not None and part.params != real:
            shown = "not sized" if part.params is None else f"{part.params:,}"
            lines.append(f"  {part.name}: static {shown}, built {real:,}")
    return "\n".join(lines) + "\n", dict(found, static=static, error=error)


def _base_model(cls: str) -> bool:
    """`AutoModel`, `BertModel`, `CLIPVisionModel`, `Qwen2Model`: the model without a head."""
    return cls == "AutoModel" or (cls.endswith("Model") and "For" not in cls and cls != "PreTrainedModel")


def _self_attr(node) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _range_count(node, value) -> int | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" and len(node.args) == 1:
        count = value(node.args[0])
        return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
    return None


def _looks_like_module(node) -> bool:
    """`self.x = something(...)` that builds a module: a call whose name is a class (capitalised)
    or a project function (`build_adapter(cfg)`)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return bool(name) and (name[:1].isupper() or name.startswith(("build", "make", "create", "get_"))
                           or name in ("from_pretrained", "from_config"))


def _short(value) -> str:
    if value is UNKNOWN or value is None:
        return "?"
    if isinstance(value, _Module):
        return value.what
    return repr(value) if isinstance(value, str) else str(value)
