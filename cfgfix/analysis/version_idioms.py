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

from cfgfix.analysis.names import ImportMap, child_nodes, dotted

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


def code_bounds(tree: ast.Module, text: str, imports: ImportMap | None = None) -> Bounds:
    """package -> {">=": (highest lower bound, why), "<": (lowest upper bound, why)}; the
    why names the line."""
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
    if cls is None or any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"
                          for n in cls.body):
        return None, None
    for base in cls.bases:
        kind, library = _kind(ast.Call(func=base, args=[], keywords=[]), imports)
        if kind in ("trainer", "training_args"):
            return kind, library
    return None, None


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
    parsed; a file that does not parse dates nothing. The tightest bound wins, and its why
    names the file."""
    import os

    root = os.fspath(root)
    found: Bounds = {}
    seen = 0
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            seen += 1
            if seen > _SCAN_FILES:
                return found
            path = os.path.join(folder, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > _SCAN_BYTES:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            if not any(token.encode() in data for token in TOKENS):
                continue
            try:
                text = data.decode("utf-8")
                tree = ast.parse(text)
            except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            where = os.path.relpath(path, root)
            for package, bounds in code_bounds(tree, text).items():
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
