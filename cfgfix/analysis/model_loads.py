"""Reading one `from_pretrained` call for the model analysis (models.py): the model
class, its library, dtype, `device_map`, quantization (also under a condition:
`load_in_8bit=flag`), `trust_remote_code`; through names bound once in the scope
(`_Resolver`) and keyword dicts spread with `**`."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

from cfgfix.analysis.keyword_dicts import spread_keywords
from cfgfix.analysis.model_branches import _contradicts, _facts, _if_sides
from cfgfix.analysis.model_values import DeviceMap, ModelLoad
from cfgfix.analysis.names import DTYPE_ALIASES, ImportMap, dotted, gpu_branch, single_assignments
from cfgfix.core import LazyRegex
from cfgfix.records import replace

# Classes whose `from_pretrained` returns a model (transformers, diffusers, PEFT's Auto*).
_MODEL_CLASS = re.compile(
    r"^(?!Peft)(?:AutoModel\w*|AutoPeftModel\w*|\w+For[A-Z]\w*|\w*Model|UNet\w*|AutoencoderKL\w*|\w+Pipeline)$"
)
_PIPELINE = re.compile(r"Pipeline$")
_LIBRARIES = {"transformers": "transformers", "peft": "transformers", "modelscope": "transformers", "diffusers": "diffusers"}
MULTI_DEVICE_STRATEGIES = {"auto", "balanced", "balanced_low_0", "sequential"}
OFFLOAD_DEVICES = {"cpu", "disk"}


class _ScopeConsts(Mapping):
    """`{**outer, **single_assignments(body)}`, computed on first use: most functions a class
    analysis walks never resolve a dtype or device argument (they hold no model), and the
    scope's assignments were a third of the model analysis of a large trainer class."""

    def __init__(self, outer, body: list[ast.stmt]) -> None:
        self._outer, self._body, self._merged = outer, body, None

    def _all(self) -> dict:
        if self._merged is None:
            self._merged = {**self._outer, **single_assignments(self._body)}
        return self._merged

    def __getitem__(self, key):
        return self._all()[key]

    def __contains__(self, key) -> bool:
        return key in self._all()

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class _Resolver:
    """Resolves dtype, device and quantization arguments, through names bound once."""

    def __init__(self, imports: ImportMap, consts: dict[str, ast.expr], functions=None) -> None:
        self.imports = imports
        self.consts = consts
        self.functions = functions  # the module's `model_functions.FunctionTable`, when known

    def default_dtype_changed(self) -> bool:
        return self.functions is not None and self.functions.default_dtype_changed

    def deref(self, node: ast.expr, depth: int = 0) -> ast.expr:
        while isinstance(node, ast.Name) and node.id in self.consts and depth < 5:
            node, depth = self.consts[node.id], depth + 1
        return node

    def dtype(self, node: ast.expr) -> str | None:
        """Canonical dtype, "auto", or None when the expression is not a known dtype. The
        GPU side of `torch.bfloat16 if torch.cuda.is_available() else torch.float32`: the
        rules judge GPU runs (the CPU side is a fallback for machines without one)."""
        node = self.deref(node)
        if isinstance(node, ast.IfExp):
            side = gpu_branch(node, self.imports)
            return self.dtype(side) if side is not None else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value.removeprefix("torch.")
            return "auto" if value == "auto" else DTYPE_ALIASES.get(value)
        name = self.imports.qualify(node)
        if name and name.startswith("torch.") and name.count(".") == 1:
            return DTYPE_ALIASES.get(name.split(".")[1])
        return None

    def is_device(self, node: ast.expr) -> bool:
        name = dotted(node)
        if name and "device" in name.split(".")[-1].lower():
            return True  # `device`, `self.device`, `args.device`, whatever it was bound to
        if name and _RANK_NAME.fullmatch(name.split(".")[-1].lower()):
            return True  # `.to(rank)` in an `mp.spawn` worker, `.to(args.local_rank)`: a GPU index
        if isinstance(node, ast.Call) and self.imports.qualify(node.func) in ("int", "torch.cuda.current_device"):
            return True  # `.to(int(os.environ["LOCAL_RANK"]))`: an index, never a dtype
        node = self.deref(node)
        if isinstance(node, ast.IfExp):  # the GPU idiom: "cuda" if torch.cuda.is_available() else "cpu"
            return self.is_device(node.body) or self.is_device(node.orelse)
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and not isinstance(node.value, bool) or (
                isinstance(node.value, str) and self.dtype(node) is None
            )
        if isinstance(node, ast.JoinedStr):
            return True  # f"cuda:{rank}"
        if isinstance(node, ast.Call):
            return self.imports.qualify(node.func) == "torch.device"
        name = dotted(node)
        return bool(name) and "device" in name.split(".")[-1].lower()

    def device_map(self, node: ast.expr, offload_kwargs: bool) -> DeviceMap:
        value = self.deref(node)
        if isinstance(value, ast.Constant):
            if isinstance(value.value, str) and value.value in MULTI_DEVICE_STRATEGIES:
                return DeviceMap("multi", offload_kwargs, node)
            if isinstance(value.value, (str, int)) and not isinstance(value.value, bool):
                return DeviceMap("single", False, node)
        if isinstance(value, ast.Call) and self.imports.qualify(value.func) == "torch.device":
            return DeviceMap("single", False, node)
        if isinstance(value, ast.Dict) and None not in value.keys:
            if len(value.keys) == 1:
                return DeviceMap("single", False, node)
            places = [v.value for v in value.values if isinstance(v, ast.Constant)]
            if len(places) == len(value.values):
                offload = any(p in OFFLOAD_DEVICES for p in places)
                kind = "multi" if len(set(places)) > 1 else "single"
                return DeviceMap(kind, offload and kind == "multi", node)
        return DeviceMap("unknown", False, node)

    def plain_quant_keyword(self, name: str, value: ast.expr) -> bool:
        """True when a quantization keyword says "not quantized" through a literal, or a
        name bound once to one: `load_in_8bit=False` (or `None`), `quantization_config=None`.
        transformers reads those as no quantization; a value cfgfix cannot resolve
        (`load_in_8bit=args.int8`) is not plain."""
        value = self.deref(value)
        if not isinstance(value, ast.Constant):
            return False
        return value.value is None or (name != "quantization_config" and value.value is False)

    def quant_keywords(self, keywords: dict[str, ast.expr]) -> list[str]:
        """The quantization keywords a load passes that may quantize it (not plain ones)."""
        return [k for k in ("load_in_4bit", "load_in_8bit", "quantization_config")
                if k in keywords and not self.plain_quant_keyword(k, keywords[k])]

    def quantization(self, keywords: dict[str, ast.expr]) -> str | None:
        for bits in ("4bit", "8bit"):
            value = keywords.get(f"load_in_{bits}")
            if isinstance(value, ast.Constant) and value.value is True:
                return bits
        config = keywords.get("quantization_config")
        if config is None:
            return None
        config = self.deref(config)
        if isinstance(config, ast.Call) and (self.imports.qualify(config.func) or "").endswith("Config"):
            kw = {k.arg: k.value for k in config.keywords if k.arg}
            for bits in ("4bit", "8bit"):
                value = kw.get(f"load_in_{bits}")
                if isinstance(value, ast.Constant) and value.value is True:
                    return bits
            return "config"
        return None  # a variable that may hold None: unsure, stay silent

    def load_variants(self, call: ast.Call, load: ModelLoad) -> list[tuple[ModelLoad, frozenset]]:
        """The loads a call makes under a condition it is given, each with its facts:
        `load_in_8bit=flag` (8-bit when `flag`, plain when not), `quantization_config=bnb
        if args.q else None`, `device_map="auto" if multi_gpu else None`. Keywords on the
        same condition combine (`load_in_8bit=q, device_map="auto" if q else None`). An
        empty list when nothing is conditional."""
        if load.hidden_kwargs or load.pipeline:
            return []
        keywords = {k.arg: k.value for k in self.call_keywords(call) if k.arg}
        quant = self.quant_keywords(keywords)
        axes: list[list[tuple[dict, frozenset]]] = []
        if len(quant) == 1 and load.quantized is None:
            name = quant[0]
            value = self.deref(keywords[name])
            plain = {"quantized": None, "quant_keywords": False}
            if name != "quantization_config" and not isinstance(value, ast.Constant):
                yes, no = _facts(value)
                if yes or no:
                    axes.append([({"quantized": name[-4:]}, yes), (plain, no)])
            elif isinstance(value, ast.IfExp):
                yes, no = _facts(value.test)
                sides = []
                for expr, when in ((value.body, yes), (value.orelse, no)):
                    if isinstance(expr, ast.Constant) and expr.value is None:
                        sides.append((plain, when))
                    elif (bits := self.quantization({name: expr})) is not None:
                        sides.append(({"quantized": bits}, when))
                    elif expr is value.body and dotted(expr) is not None and dotted(expr) == dotted(value.test):
                        # `cfg if cfg else None`: where the test holds, a config is passed
                        sides.append(({"quantized": "config"}, when))
                if len(sides) == 2:
                    axes.append(sides)
        device_map = self.deref(keywords["device_map"]) if "device_map" in keywords else None
        if isinstance(device_map, ast.IfExp):
            offload = load.device_map.offload if load.device_map is not None else False
            axes.append([
                ({"device_map": None if isinstance(expr, ast.Constant) and expr.value is None
                  else self.device_map(expr, offload)}, when)
                for expr, when in _if_sides(device_map)
            ])
        dtype_kw = next((k for k in self.call_keywords(call) if k.arg in ("dtype", "torch_dtype")), None)
        dtype_value = self.deref(dtype_kw.value) if dtype_kw is not None else None
        if isinstance(dtype_value, ast.IfExp) and load.dtype == "?":
            # `torch_dtype=torch.bfloat16 if args.bf16 else None`: one load per side, so a
            # cast under `if args.bf16:` sees the bfloat16 load only (a dtype-tied branch)
            sides = [(None if isinstance(expr, ast.Constant) and expr.value is None else self.dtype(expr) or "?", when)
                     for expr, when in _if_sides(dtype_value)]
            if all(dtype is None or dtype in DTYPE_ALIASES.values() for dtype, _ in sides) \
                    and any(when for _, when in sides):
                axes.append([({"dtype": dtype, "dtype_side": True}, when) for dtype, when in sides])
        if not axes:
            return []
        variants: list[tuple[dict, frozenset]] = [({}, frozenset())]
        for axis in axes:
            variants = [
                ({**changes, **more}, when | also)
                for changes, when in variants for more, also in axis
                if not any(_contradicts(f, g) for f in when for g in also)
            ]
        return [(replace(load, **changes), when) for changes, when in variants]

    def call_keywords(self, call: ast.Call) -> list[ast.keyword]:
        """The call's keywords, with each `**name` of a keyword dict the scope builds and
        fills (`kw = dict(...)`; `kw["device_map"] = "auto"`) replaced by what it holds at
        the call (analysis/keyword_dicts.py); a `**` that cannot be followed stays."""
        if all(k.arg is not None for k in call.keywords):
            return call.keywords
        # the parsed part of a module in parts: the scope of a call is the function around it
        tree = self.functions._tree if self.functions is not None else None
        out: list[ast.keyword] = []
        for keyword in call.keywords:
            spread = None
            if keyword.arg is None and isinstance(keyword.value, ast.Name) and tree is not None:
                spread = spread_keywords(tree, keyword.value.id, call)
            if spread is None:
                out.append(keyword)
            else:
                out.extend(k for k in spread if all(k.arg != w.arg for w in call.keywords))
        return out

    def load(self, call: ast.Call) -> ModelLoad | None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "from_pretrained"):
            return None
        owner = self.imports.qualify(func.value)
        class_name = owner.split(".")[-1] if owner else ""
        if not _MODEL_CLASS.match(class_name):
            return None
        call_keywords = self.call_keywords(call)
        keywords = {k.arg: k.value for k in call_keywords if k.arg}
        hidden = any(k.arg is None for k in call_keywords)
        pipeline = bool(_PIPELINE.search(class_name))
        dtype_kw = next((k for k in call_keywords if k.arg in ("dtype", "torch_dtype")), None)
        if dtype_kw is not None:
            dtype = self.dtype(dtype_kw.value) or "?"
        else:
            dtype = "?" if hidden else None
        if pipeline:  # a pipeline mixes components (a fp32 VAE passed in): its dtype is not one value
            dtype = "?"
        device_map = None
        if "device_map" in keywords:
            offload = any(k in keywords for k in ("max_memory", "offload_folder", "offload_state_dict"))
            device_map = self.device_map(keywords["device_map"], offload)
        elif hidden:
            device_map = DeviceMap("unknown", False, call)
        quantized = None if pipeline else self.quantization(keywords)
        quant_keywords = bool(self.quant_keywords(keywords))  # `load_in_8bit=False` does not quantize
        library = _LIBRARIES.get(owner.split(".")[0]) if owner and "." in owner else None
        if library is None and self.functions is not None:
            library = self.functions.class_library(func.value)  # the project's own model class
        origin = self.functions.origin if self.functions is not None else None
        remote = keywords.get("trust_remote_code")
        return ModelLoad(
            call, class_name, dtype, dtype_kw, device_map, quantized, hidden, pipeline,
            library, quant_keywords,
            origin.display if origin is not None else None, origin.source_text() if origin is not None else None,
            remote_code=remote is not None and not (isinstance(remote, ast.Constant) and not remote.value)
            and not _native_model_id(call),
        )


# Hub ids of families transformers implements itself: their checkpoints carry no `auto_map`,
# so `trust_remote_code=True` changes nothing and transformers' own loading rules hold.
_NATIVE_FAMILY = LazyRegex(
    r"(?i)(?:^|/)(?:qwen(?:1\.5|2|2\.5|3)|(?:meta-)?llama|mistral|mixtral|gemma|gpt2|t5|flan-t5|bert|roberta|opt-|bloom)")


def _native_model_id(call: ast.Call) -> bool:
    first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "pretrained_model_name_or_path"), None)
    return isinstance(first, ast.Constant) and isinstance(first.value, str) and bool(_NATIVE_FAMILY.search(first.value))


# Names that hold a GPU index (a process's rank, `mp.spawn`'s first argument), never a dtype.
_RANK_NAME = LazyRegex(r"(local_|global_)?rank(_id)?|gpu(_id|_index|_idx)?|local_gpu|device_idx|cuda_id")
