"""Model loads and the calls on them, as the rules word and fix them: the text prefilter
for a model class's `from_pretrained(`, a call's name and source text, the related span
of a load, the edit that drops a call (CFX101-CFX105, CFX203, CFX205)."""

from __future__ import annotations

import ast
import functools
import re

from cfgfix.analysis.model_values import ModelCall, ModelLoad
from cfgfix.analysis.names import dotted
from cfgfix.analysis.project_modules import (
    _MODEL_TARGET,
    SELF_MOVE,
    may_call_project_loader,
    may_subclass_project_class,
)
from cfgfix.core import Edit, LazyRegex, Related
from cfgfix.documents import python_edits
from cfgfix.documents.text import SourceText

LOAD_TRIGGERS = (b"from_pretrained",)
# A load here, or a loader imported from the project's own modules (`from models.build
# import build_model`): the text test `may_hold_model` decides which.
LOAD_OR_LOADER_TRIGGERS = (b"from_pretrained", b"import")
_MODEL_CLASS = re.compile(
    rb"(?:AutoModel\w*|AutoPeftModel\w*|\w+For[A-Z]\w*|\w*Model|UNet\w*|AutoencoderKL\w*|\w+Pipeline)$"
)
_IDENTIFIER_END = re.compile(rb"(\w+)\s*\.\s*$")
_LOAD_CALL = re.compile(rb"from_pretrained\s*\(")


@functools.lru_cache(maxsize=32)  # six rules ask of the same bytes
def may_load_model(data: bytes) -> bool:
    """Cheap text test run before parsing: a model class's `from_pretrained(` on a code
    line (not a doctest `>>>`/`...` line or a comment), or a model class imported under
    an alias. Library files mention loads mostly in docstrings; they are not parsed."""
    for match in _LOAD_CALL.finditer(data):
        line_start = data.rfind(b"\n", 0, match.start()) + 1
        prefix = data[line_start:match.start()]
        head = prefix.lstrip()
        if head.startswith((b">>>", b"...", b"#")):
            continue
        owner = _IDENTIFIER_END.search(prefix[-80:])
        if owner and _MODEL_CLASS.match(owner.group(1)):
            return True
    start = data.find(b" as ")
    while start >= 0:
        line_start = data.rfind(b"\n", 0, start) + 1
        words = data[line_start:start].split()
        if words and b"import" in data[line_start:start] and _MODEL_CLASS.match(words[-1].rstrip(b",")):
            return True
        start = data.find(b" as ", start + 4)
    return False


def may_hold_model(data: bytes) -> bool:
    """A model class's `from_pretrained(` here, a call of a project function that may
    return one, or a class built on one of the project's classes, whose `__init__` may load
    it (both followed into their modules by the model analysis), or a class that casts or
    moves a model-like `self.x` (`self.model.to(...)`) that another module may build with
    a model."""
    return may_load_model(data) or may_call_project_loader(data) or may_subclass_project_class(data) \
        or may_move_self_model(data)


def may_move_self_model(data: bytes) -> bool:
    """A class with its own `__init__` that binds a model-like `self.x` and casts or moves
    it (`self.model = model` ... `self.model.to(...)`): another module may build it with a
    model. A library trainer's subclass that moves the `self.model` the library set is not."""
    if b"def __init__(" not in data:
        return False
    return any(_MODEL_TARGET.search(m.group(1)) and re.search(rb"self\.%s\s*=[^=]" % m.group(1), data)
               for m in SELF_MOVE.finditer(data))


def may_hold_model_with(*words: bytes):
    """`may_hold_model`, where a load in this file must also mention one of `words`
    (`device_map`): a load in another module is checked by the analysis itself."""
    def check(data: bytes) -> bool:
        if any(word in data for word in words) and may_load_model(data):
            return True
        return may_call_project_loader(data) or may_subclass_project_class(data) or may_move_self_model(data)
    return check


MOVE_TRIGGERS = (b".to(", b".cuda(", b".half(", b".bfloat16(", b".float(")


def name_of(src: SourceText, mc: ModelCall) -> str:
    """How the message names the model: `model`, `self.model`, or for a chained call
    (`X.from_pretrained(...).to(d)`) the class it loads."""
    return f"`{mc.key}`" if mc.key else f"the `{mc.state.load.class_name}`"


def call_text(src: SourceText, mc: ModelCall) -> str:
    """`.to(torch.bfloat16)`: the method call without its receiver, on one line."""
    text = src.text[python_edits.drop_method_call(src, mc.call).start:python_edits.node_range(src, mc.call)[1]]
    return " ".join(text.split())


def load_related(src: SourceText, load: ModelLoad, message: str) -> Related:
    """The load's span, in the module that holds it (another one for a project loader)."""
    return Related((load.source or src).span_of_node(load.call), message)


def load_text(src: SourceText, load: ModelLoad, node: ast.AST) -> str:
    """Source text of a node of the load (`torch_dtype=torch.bfloat16`), from its module."""
    return (load.source or src).node_text(node)


def drop_call_edits(src: SourceText, mc: ModelCall) -> list[Edit] | None:
    """Edits that remove a cast/move entirely: the statement when it only re-binds the
    model (`model = model.to(x)`, `model.to(x)`), else just `.to(x)` from the chain."""
    stmt = mc.stmt
    receiver = dotted(mc.receiver)
    whole = False
    if isinstance(stmt, ast.Expr) and stmt.value is mc.call and receiver is not None or (
        isinstance(stmt, ast.Assign)
        and stmt.value is mc.call
        and len(stmt.targets) == 1
        and receiver is not None
        and dotted(stmt.targets[0]) == receiver
    ):
        whole = True
    if whole:
        edit = python_edits.delete_statement(src, stmt, mc.sole_in_block)
        return [edit] if edit else None
    return [python_edits.drop_method_call(src, mc.call)]


_CLAIMS_A_MOVE = LazyRegex(r"\b(gpu|cuda|device|moved?|moving|placed)\b", re.IGNORECASE)
_ANNOUNCERS = {"print", "info", "debug", "warning", "log", "write"}  # print, logger.info, tqdm.write


def announcing_line(tree: ast.AST, stmt: ast.stmt) -> int | None:
    """The line of a `print(...)` / `logger.info(...)` among the two statements right after
    `stmt` in its block whose text claims a move ("Model moved to GPU"): once a fix removes
    `stmt`, that line says something that no longer happens."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or stmt not in block:
                continue
            for after in block[block.index(stmt) + 1: block.index(stmt) + 3]:
                call = after.value if isinstance(after, ast.Expr) else None
                if not isinstance(call, ast.Call):
                    continue
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name not in _ANNOUNCERS:
                    continue
                texts = [c.value for arg in call.args for c in ast.walk(arg)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any(_CLAIMS_A_MOVE.search(t) for t in texts):
                    return after.lineno
            return None
    return None


def dtype_source_text(analysis, dtype: str) -> str:
    """`torch.bfloat16` spelled as this module can (`th.bfloat16`), else the string form."""
    alias = analysis.imports.local_name_for("torch")
    return f"{alias}.{dtype}" if alias else repr(dtype).replace("'", '"')


def keyword_text(load: ModelLoad) -> str:
    if load.dtype_keyword is None:
        return ""
    return f"{load.dtype_keyword.arg}="
