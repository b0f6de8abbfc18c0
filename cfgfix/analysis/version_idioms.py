"""Lower bounds on a library's version read from the code's own idioms: an API that exists
only from some release on dates the code that calls it. A script that passes `dtype=` to
`from_pretrained` was written for transformers 4.56 or newer.

An API removed in some release bounds the version from above: `Trainer(tokenizer=...)` runs
only below transformers 5. Each idiom carries the release that added or removed it, checked
against the library's own source of the release before and after (docs/versions.md,
"Dating versions from the code"). Only keywords of calls on names imported from the
library count, and a local subclass of them without an `__init__` of its own (its keywords
reach the library's): a `dtype=` passed to a diffusers loader, a local `Trainer` subclass
with its own `__init__` or trl's `SFTTrainer(tokenizer=...)` dates nothing.
"""

from __future__ import annotations

import ast
import os

from cfgfix.analysis.names import ImportMap, child_nodes, dotted
from cfgfix.core import LazyRegex

# (library, call kind, keyword, bound, evidence in words); a bound is ">=X" for an API added
# in X, "<X" for one removed in X (code that uses it runs only below X).
#   call kind "load": `<library class>.from_pretrained(...)`;
#   "trainer": `<library>.Trainer(...)` / `Seq2SeqTrainer(...)` (a name imported from it);
#   "training_args": `<library>.TrainingArguments(...)` / `Seq2SeqTrainingArguments(...)`.
IDIOMS = (
    ("transformers", "load", "dtype", ">=4.56.0",
     "`dtype=` in `from_pretrained` exists from transformers 4.56 (4.55.4 reads only `torch_dtype`)"),
    ("transformers", "load", "attn_implementation", ">=4.36.0",
     "`attn_implementation=` exists from transformers 4.36 (absent from 4.35.2)"),
    ("transformers", "trainer", "processing_class", ">=4.46.0",
     "`Trainer(processing_class=...)` exists from transformers 4.46 (4.45.2 takes `tokenizer=`)"),
    ("transformers", "trainer", "tokenizer", "<5.0.0",
     "`Trainer(tokenizer=...)` was removed in transformers 5.0 (4.57.1 still maps it to `processing_class`)"),
    ("transformers", "training_args", "evaluation_strategy", "<4.51.0",
     "`TrainingArguments(evaluation_strategy=...)` was removed in transformers 4.51 (4.50.3 still reads it)"),
)

_KEYWORDS = frozenset(keyword for _, _, keyword, _, _ in IDIOMS)
# The text a file must contain for the walk to be worth it (most files hold none).
TOKENS = tuple(sorted({f"{keyword}=" for _, _, keyword, _, _ in IDIOMS}))


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


Bounds = dict[str, dict[str, tuple[str, str]]]  # package -> {">=" | "<": (version, why)}


def code_bounds(tree: ast.Module, text: str, imports: ImportMap | None = None,
                imported: dict[str, tuple[str, str]] | None = None) -> Bounds:
    """package -> {">=": (highest lower bound, why), "<": (lowest upper bound, why)}; the
    why names the line. `imported`: local names of library subclasses defined in other
    modules of the project (`project_bounds`), name -> (call kind, library)."""
    if not any(token in text for token in TOKENS):
        return {}
    lines = _keyword_lines(text)
    if not lines:
        return {}
    imports = imports or ImportMap(tree)
    found: Bounds = {}
    for node in _calls_on(tree, lines):
        if not node.keywords:
            continue
        keywords = {k.arg for k in node.keywords if k.arg in _KEYWORDS}
        if not keywords:
            continue  # the common case, before any name is resolved
        kind, library = _kind(node, imports)
        if kind is None:
            kind, library = _subclass_kind(node, tree, imports)
        if kind is None and imported and isinstance(node.func, ast.Name):
            kind, library = imported.get(node.func.id, (None, None))
        if kind is None:
            continue
        for package, idiom_kind, keyword, bound, why in IDIOMS:
            if package != library or idiom_kind != kind or keyword not in keywords:
                continue
            op, version = (">=", bound[2:]) if bound.startswith(">=") else ("<", bound[1:])
            tighten(found.setdefault(package, {}), op, version, f"{why}; used on line {node.lineno}")
    return found


def tighten(bounds: dict[str, tuple[str, str]], op: str, version: str, why: str) -> None:
    """Keep (version, why) under `op` in one package's bounds when it is tighter than what is
    there: the highest lower bound (">="), the lowest upper bound ("<")."""
    old = bounds.get(op)
    if old is None or (_release(old[0]) < _release(version) if op == ">=" else _release(version) < _release(old[0])):
        bounds[op] = (version, why)


def _keyword_lines(text: str) -> frozenset[int]:
    """1-based lines where one of the idioms' keywords is written as `name=` (found with
    `str.find`: a regular expression over a 5,000-line file costs tens of milliseconds)."""
    hits = []
    for keyword in _KEYWORDS:
        at = text.find(keyword)
        while at >= 0:
            end = at + len(keyword)
            before = text[at - 1] if at else " "
            rest = text[end:end + 8].lstrip(" \t")
            if not (before.isalnum() or before == "_") and rest.startswith("=") and not rest.startswith("=="):
                hits.append(at)
            at = text.find(keyword, end)
    # Lines counted from one hit to the next, not each from the start of the text (a
    # trainer module with 40 `dtype=` counted its newlines 40 times; issue 15).
    found, line, counted = set(), 1, 0
    for at in sorted(hits):
        line += text.count("\n", counted, at)
        counted = at
        found.add(line)
    return frozenset(found)


def _calls_on(tree: ast.AST, lines: frozenset[int]):
    """The calls whose lines include one of `lines`, visiting only the statements and
    expressions that span such a line (a keyword-heavy 5,000-line file costs a few
    branches, not a walk of every node)."""
    import bisect

    ordered = sorted(lines)
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in child_nodes(node):  # ast.iter_child_nodes' order, without its generators
            start = getattr(child, "lineno", None)
            if start is not None:
                end = getattr(child, "end_lineno", start) or start
                at = bisect.bisect_left(ordered, start)
                if at == len(ordered) or ordered[at] > end:
                    continue  # no keyword line inside this node
            if isinstance(child, ast.Call):
                yield child
            stack.append(child)


def _kind(call: ast.Call, imports: ImportMap) -> tuple[str | None, str | None]:
    """(call kind, the library the called name is imported from), or (None, None) for a
    name that no import binds (a local class or subclass, a parameter)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "from_pretrained":
        kind, target = "load", func.value
    else:
        target = func
        last = (imports.qualify(func) or "").rsplit(".", 1)[-1]  # `A` after `... import X as A`
        if last in ("Trainer", "Seq2SeqTrainer"):
            kind = "trainer"
        elif last in ("TrainingArguments", "Seq2SeqTrainingArguments"):
            kind = "training_args"
        else:
            return None, None
    root = (dotted(target) or "").split(".")[0]
    if root not in imports.aliases:
        return None, None
    return kind, (imports.qualify(target) or "").split(".")[0]


def _subclass_kind(call: ast.Call, tree: ast.Module, imports: ImportMap) -> tuple[str | None, str | None]:
    """`_kind` for a class of this module that subclasses the library's Trainer (or
    TrainingArguments) without an `__init__` of its own (`class Seq2SeqTrainer(_Seq2SeqTrainer):
    def prediction_step(...)`): its keywords go to the library's own `__init__`, so they date
    the library as a direct call does. A subclass with its own `__init__` may take
    `tokenizer=` itself and dates nothing."""
    if not isinstance(call.func, ast.Name):
        return None, None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == call.func.id), None)
    return _class_kind(cls, imports) if cls is not None else (None, None)


def _class_kind(cls: ast.ClassDef, imports: ImportMap) -> tuple[str | None, str | None]:
    """(call kind, library) when `cls` subclasses the library's Trainer or TrainingArguments
    and has no `__init__` of its own, else (None, None)."""
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__" for n in cls.body):
        return None, None
    for base in cls.bases:
        kind, library = _kind(ast.Call(func=base, args=[], keywords=[]), imports)
        if kind in ("trainer", "training_args"):
            return kind, library
    return None, None


# `class X(Trainer):`, `class X(Base):` after `import Seq2SeqTrainer as Base`: a file that
# defines a class with a base and names a Trainer or TrainingArguments is worth parsing for
# library subclasses that other modules call.
_CLASS_WITH_BASE = LazyRegex(rb"\bclass\s+\w+\s*\(\s*\w")


def _may_subclass(data: bytes) -> bool:
    return (b"Trainer" in data or b"TrainingArguments" in data) and _CLASS_WITH_BASE.search(data) is not None


def _project_subclasses(files: list[tuple[str, bytes]]) -> dict[tuple[str, str], tuple[str, str]]:
    """(file, class name) -> (call kind, library) for the top-level library subclasses
    without their own `__init__` in the project's files."""
    found = {}
    for path, data in files:
        if not _may_subclass(data):
            continue
        try:
            tree = ast.parse(data.decode("utf-8"))
        except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        imports = ImportMap(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                kind, library = _class_kind(node, imports)
                if kind is not None:
                    found[(os.path.normpath(path), node.name)] = (kind, library)
    return found


def _imported_subclasses(path: str, root: str, imports: ImportMap, subclasses) -> dict[str, tuple[str, str]]:
    """This file's local names for the project's library subclasses it imports
    (`from trainers.seq2seq import MyTrainer`, `from .trainer import T as X`)."""
    if not subclasses:
        return {}
    here = os.path.dirname(path)
    found = {}
    wanted = [(local, level, module, name) for local, (level, module, name) in imports.relative.items()]
    wanted += [(local, 0, *target.rpartition(".")[::2]) for local, target in imports.aliases.items() if "." in target]
    for local, level, module, name in wanted:
        parts = module.split(".") if module else []
        if level:
            base = here
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases = [base]
        else:
            bases = [root, here]
        for base in bases:
            for candidate in (os.path.join(base, *parts) + ".py", os.path.join(base, *parts, "__init__.py")):
                kind = subclasses.get((os.path.normpath(candidate), name))
                if kind is not None:
                    found[local] = kind
    return found


# Folders a project scan never enters: environments, caches, builds, other tools' trees.
_SKIPPED_FOLDERS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "env", ".tox", ".nox", "node_modules",
                              "site-packages", "__pycache__", "build", "dist", ".mypy_cache", ".ruff_cache",
                              ".cfgfix_cache", ".eggs"})
_SCAN_FILES = 20_000  # a bound on the walk: a project larger than this is read up to it
_SCAN_BYTES = 1_000_000  # as the analysis reads Python files


def project_bounds(root) -> Bounds:
    """The code bounds of every Python file under `root` together: an idiom anywhere in the
    project dates the project (issue 25: a sibling module's `Trainer(tokenizer=...)` shows the
    project runs transformers 4.x). Only files whose text holds an idiom's `keyword=` are
    parsed (and, for the library subclasses other modules call, those whose text defines a
    class on a Trainer or TrainingArguments base); a file that does not parse dates nothing.
    The tightest bound wins, and its why names the file."""
    root = os.fspath(root)
    found: Bounds = {}
    seen = 0
    keyworded: list[tuple[str, bytes]] = []  # files whose text holds an idiom's keyword
    defining: list[tuple[str, bytes]] = []  # files that may define a library subclass
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
        if seen > _SCAN_FILES:
            break
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            seen += 1
            if seen > _SCAN_FILES:
                break
            path = os.path.join(folder, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > _SCAN_BYTES:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if any(token.encode() in data for token in TOKENS):
                keyworded.append((path, data))
            elif _may_subclass(data):
                defining.append((path, data))
    # A library subclass defined in one module and called in another (`from trainers import
    # MyTrainer`; `MyTrainer(..., tokenizer=tok)`) dates the project like a direct call.
    subclasses = _project_subclasses(keyworded + defining) if keyworded else {}
    for path, data in keyworded:
        try:
            text = data.decode("utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        where = os.path.relpath(path, root)
        imports = ImportMap(tree)
        imported = _imported_subclasses(path, root, imports, subclasses)
        for package, bounds in code_bounds(tree, text, imports, imported).items():
            target = found.setdefault(package, {})
            for op, (version, why) in bounds.items():
                tighten(target, op, version, why.replace("used on line", f"used in {where} on line"))
    return found


def excludes_from(bounds: Bounds, package: str, version: str) -> str | None:
    """Why the project's code shows `package` is below `version` (an API removed at or
    before it is used), or None when its bounds admit `version` and newer."""
    upper = bounds.get(package, {}).get("<")
    if upper is not None and _release(upper[0]) <= _release(version):
        return upper[1]
    return None
