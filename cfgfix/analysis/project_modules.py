"""The project's own Python modules, found from a file's imports and parsed on demand.

Real training code keeps its loader in `models/build.py` and its trainer in `train.py`:
to follow a model across that import, a rule's analysis asks this index for the module a
name was imported from. Only files inside the project that the import names are read,
each at most once per process (memoised on size and mtime), and the caller records every
file it read so that cached results are re-checked when one of them changes.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import warnings
from pathlib import Path

from cfgfix.core import LazyRegex
from cfgfix.records import dataclass, field

# A module file over this size is a vendored library or generated code, not a loader.
MAX_MODULE_BYTES = 2_000_000
# How many folders above the importing file a top-level package may live (repo/src/pkg/...).
MAX_PARENT_LEVELS = 4
# `python_files`: a bound on the listing, and folders that hold no project code.
MAX_LISTED = 3000
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist", "wandb"})


@dataclass
class ParsedModule:
    """Another module of the project, parsed once per process."""

    path: Path
    display: str
    text: str
    tree: ast.Module
    source: object = None  # SourceText, made when a finding needs a span in this file
    notes: dict = field(default_factory=dict)  # analyses of this module, keyed by their user

    def source_text(self):
        if self.source is None:
            from cfgfix.documents.text import SourceText

            self.source = SourceText.from_bytes(self.display, self.text.encode("utf-8"))
        return self.source


class ProjectModules:
    """Resolves `from models.build import build_model` (and relative imports) to files under
    `root`, and parses them. One instance per linter process."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(os.path.abspath(root)) if root is not None else None
        self._root = str(self.root) if self.root is not None else None
        self._root_prefix = self._root.rstrip(os.sep) + os.sep if self._root is not None else None
        self._parsed: dict[str, tuple[tuple[int, int], object]] = {}  # key -> (size+mtime, bytes or ParsedModule)
        self._resolved: dict[tuple[str, str, int], Path | None] = {}
        self._files: dict[str, bool] = {}  # is_file, asked once per candidate path
        self._listed: list[str] | None = None  # `python_files`

    def resolve(self, importer: Path, module: str, level: int = 0) -> Path | None:
        """The file that `import module` (or `from .module`, level > 0) names, seen from
        `importer`; None for libraries and for anything outside the project. Memoised per
        importer and module, on strings (pathlib made each lookup cost ~0.3 ms)."""
        if not module and level == 0:
            return None
        me = os.path.abspath(importer)
        key = (me, module, level)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(me, module, level)
        return self._resolved[key]

    def _resolve(self, me: str, module: str, level: int) -> Path | None:
        parts = module.split(".") if module else []
        folder = os.path.dirname(me)
        if level > 0:
            for _ in range(level - 1):
                folder = os.path.dirname(folder)
            bases = [folder]
        else:
            bases = []
            for _ in range(MAX_PARENT_LEVELS + 1):
                bases.append(folder)
                bases.append(os.path.join(folder, "src"))
                if self._root is not None and folder == self._root:
                    break
                parent = os.path.dirname(folder)
                if parent == folder:
                    break
                folder = parent
        for base in bases:
            candidate = os.path.join(base, *parts) if parts else base
            for path in (candidate + ".py" if parts else None, os.path.join(candidate, "__init__.py")):
                if path is not None and path != me and self._inside(path) and self._is_file(path):
                    return Path(path)
        return None

    def _inside(self, path: str) -> bool:
        if self._root is None:
            return True
        return path == self._root or path.startswith(self._root_prefix)

    def _is_file(self, path: str) -> bool:
        found = self._files.get(path)
        if found is None:
            found = self._files[path] = os.path.isfile(path)  # a str path: no pathlib object
        return found

    def parse(self, path: Path, needs: tuple[bytes, ...] = ()) -> ParsedModule | None:
        """The module at `path`, parsed once per process; None when it cannot be read or
        parsed (the file's own run reports that), or when its text has none of `needs` (a
        module with no `from_pretrained` cannot hold a loader: not worth a parse)."""
        if needs:
            data = self.raw(path)
            if data is None or not any(word in data for word in needs):
                return None
        return self._stamped(str(path), path, lambda: _parsed_module(path, self.raw(path)))

    def python_files(self) -> list[str]:
        """The project's Python files (hidden folders, virtualenvs and caches left out, at
        most MAX_LISTED), listed once per process: where a helper's callers may live."""
        if self._listed is None:
            found: list[str] = []
            if self._root is not None:
                for folder, dirs, files in os.walk(self._root):
                    dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
                    found.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
                    if len(found) >= MAX_LISTED:
                        break
            self._listed = found[:MAX_LISTED]
        return self._listed

    def raw(self, path: Path) -> bytes | None:
        return self._stamped("raw:" + str(path), path, lambda: _read_bytes(path))

    def _stamped(self, key: str, path: Path, build):
        """`build()`'s value for `path`, kept while the file's size and mtime stay the same;
        None for a file that is gone or over MAX_MODULE_BYTES."""
        try:
            info = path.stat()
        except OSError:
            return None
        stamp = (info.st_size, info.st_mtime_ns)
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        value = build() if info.st_size <= MAX_MODULE_BYTES else None
        self._parsed[key] = (stamp, value)
        return value


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _parsed_module(path: Path, data: bytes | None) -> ParsedModule | None:
    """The module's tree (the bytes come from the raw cache: a module is read once)."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8-sig")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text, filename=str(path))
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return ParsedModule(path, _display(path), text, tree)


def _display(path: Path) -> str:
    """The path as findings show it: relative to the current folder when under it."""
    try:
        return Path(os.path.relpath(path)).as_posix() if not os.path.relpath(path).startswith("..") else path.as_posix()
    except ValueError:
        return path.as_posix()


# Roots of imports that are libraries, never the project's own code: followed imports are
# only tried for the rest, and the prefilter below looks only at those.
_LIBRARY_ROOTS = frozenset({
    "torch", "torchvision", "torchaudio", "transformers", "diffusers", "peft", "trl", "accelerate",
    "deepspeed", "datasets", "evaluate", "tokenizers", "safetensors", "huggingface_hub", "bitsandbytes",
    "numpy", "scipy", "pandas", "sklearn", "tqdm", "wandb", "tensorboard", "yaml", "omegaconf", "hydra",
    "lightning", "pytorch_lightning", "lightning_fabric", "fire", "click", "typer", "einops", "timm",
    "open_clip", "sentencepiece", "tiktoken", "vllm", "xformers", "flash_attn", "apex", "jax", "flax",
    "tensorflow", "keras", "PIL", "cv2", "matplotlib", "requests", "rich", "loguru", "absl", "ml_collections",
    "modelscope", "swift", "llamafactory", "axolotl", "unsloth", "auto_gptq", "optimum", "awq", "gptqmodel",
})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
# `from x import a, b` at the start of a line (after indentation). The pattern starts with its
# literal, so `re` skips from one "from" to the next (a `^[ \t]*` first made it try every
# line start, 4x slower); `_from_imports` checks that only indentation comes before.
_FROM_IMPORT = re.compile(rb"from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([^\n#)]+)")


def _from_imports(data: bytes):
    """The `_FROM_IMPORT` matches that start their line (a match never leaves its line)."""
    for match in _FROM_IMPORT.finditer(data):
        start = match.start()
        if not data[data.rfind(b"\n", 0, start) + 1:start].strip(b" \t"):
            yield match


# `model = build_model(cfg)`, `self.model, tok = load(args)`: an assignment at the start of
# a line from a plain call (group 1: the targets, group 2: the callee). Anchored at line
# starts so the scan fails fast everywhere else. (`model = tools.build_model(cfg)` of a
# module imported whole is not read: following those loaders parsed a fifth more of a
# large repository's modules, sd-scripts' `train_util.load_target_model`.)
_ASSIGN_FROM_CALL = re.compile(
    rb"^[ \t]*([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)[ \t]*=[ \t]*([A-Za-z_]\w*)[ \t]*\(", re.MULTILINE
)
_MODEL_TARGET = re.compile(rb"(?i)model|net|unet|vae|encoder|policy|actor|critic|llm|transformer")


# A function named for what it returns: `build_model`, `load_llm`, `get_net`, `create_policy`.
_LOADER_CALLEE = re.compile(r"(?i)model|load|build|net|llm|policy|unet|vae|peft|lora")


@functools.lru_cache(maxsize=32)
def model_assignment_callees(data: bytes) -> frozenset[str]:
    """Plain functions (snake_case, named like loaders) whose result the text binds to a
    model-like name: `model = build_model(cfg)`. Cheap first: only the lines that hold
    `= name(` are matched, found by one scan that starts at each `=` (the line-anchored
    pattern tried every line start of a large file; the lines with a model-ish word were
    most lines of a trainer)."""
    if b"=" not in data:
        return frozenset()
    starts = {data.rfind(b"\n", 0, m.start()) + 1 for m in _CALL_AFTER_EQUALS.finditer(data)}
    found = set()
    for start in sorted(starts):
        match = _ASSIGN_FROM_CALL.match(data, start)  # a match never leaves its line
        if match is None:
            continue
        name = match.group(2).decode("ascii", "replace")
        if not name[:1].isupper() and _LOADER_CALLEE.search(name) and _MODEL_TARGET.search(match.group(1)):
            found.add(name)
    return frozenset(found)


# `= name(`: every line `_ASSIGN_FROM_CALL` matches holds one (a superset: `==`, keywords).
_CALL_AFTER_EQUALS = re.compile(rb"=[ \t]*[A-Za-z_]\w*[ \t]*\(")


def _project_imported_names(data: bytes):
    """The local names (bytes) that `from x import a, b as c` lines bind from the project's
    own modules: relative imports, and roots that are neither a library nor stdlib."""
    for match in _from_imports(data):
        dots, module = match.group(1), match.group(2)
        root = module.split(b".")[0].decode("ascii", "replace")
        if not dots and (root in _LIBRARY_ROOTS or root in _STDLIB or not root):
            continue
        for part in match.group(3).split(b","):
            words = part.split()
            if words:
                yield words[-1]


@functools.lru_cache(maxsize=32)
def may_call_project_loader(data: bytes) -> bool:
    """Text only, before parsing: the file assigns to a model-like name the result of a
    function it imports from the project (not a library): `model = build_model(cfg)` after
    `from models.build import build_model`. The imports are read first (most files import
    no loader-named function from their own project); memoised: several rules ask."""
    names = []
    for name in _project_imported_names(data):
        local = name.decode("ascii", "replace")
        if local.isidentifier() and not local[:1].isupper() and _LOADER_CALLEE.search(local):
            names.append(local)
    if not names:
        return False
    return bool(model_assignment_callees(data) & set(names))


# `self.model.to(`, `self.net.half(`: a cast or move of an attribute (group 1), which a base
# class may have loaded. Starts with its literal, so `re` skips from one `self.` to the next.
SELF_MOVE = re.compile(rb"self\.(\w+)\s*\.\s*(?:to|cuda|half|bfloat16|float)\s*\(")
# `class Name(` (then its bases); the line start is checked by hand, as for `_FROM_IMPORT`.
_CLASS_BASES = LazyRegex(rb"class[ \t]+\w+[ \t]*\(([^)\n]*)")


@functools.lru_cache(maxsize=32)
def may_subclass_project_class(data: bytes) -> bool:
    """Text only, before parsing: a class of this file builds on a class it imports from
    the project's own modules (`from trainers.base import BaseTrainer` then `class
    LoraTrainer(BaseTrainer):`), whose `__init__` may load the model the subclass's
    methods cast or move (`self.model.to(...)`, `self.policy.half()`: the file must say so,
    of an attribute named like a model). The model analysis decides, from the base's
    module."""
    if b"class" not in data or not any(_MODEL_TARGET.search(m.group(1)) for m in SELF_MOVE.finditer(data)):
        return False  # (a model-like attribute: `self.inv_freq.to(x.device)` in a rotary embedding is not one)
    names = {name for name in _project_imported_names(data) if name[:1].isupper()}
    if not names:
        return False
    for match in _CLASS_BASES.finditer(data):
        start = match.start()
        if data[data.rfind(b"\n", 0, start) + 1:start].strip(b" \t"):
            continue  # not at the start of a line
        if any(base.strip().split(b"[")[0] in names for base in match.group(1).split(b",")):
            return True
    return False
