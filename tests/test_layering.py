"""The import graph of cfgfix flows one way: documents -> analysis -> project/training ->
rules -> engine -> CLI, with no circles. Every import counts, the lazy ones inside
functions included: a lazy import that points up is still a circle in the design.

Read from the source with `ast`, so the test imports nothing of cfgfix."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cfgfix"

# Lowest first. A module may import its own layer (without a cycle) and any layer below it.
LAYERS: list[tuple[str, ...]] = [
    ("cfgfix", "cfgfix.core", "cfgfix.records", "cfgfix.__main__", "cfgfix.interrupts", "cfgfix.pool",
     "cfgfix.git_command"),  # the version, the shared value types
    ("cfgfix.documents",),
    ("cfgfix.fixing",),  # edits applied to documents, atomic writes
    ("cfgfix.analysis",),
    ("cfgfix.memory",),
    ("cfgfix.project", "cfgfix.project_references"),
    ("cfgfix.training",),
    ("cfgfix.rules",),
    ("cfgfix.settings", "cfgfix.settings_tree", "cfgfix.workspace", "cfgfix.cache", "cfgfix.suppressions"),
    ("cfgfix.engine",),
    ("cfgfix.report", "cfgfix.rulepages"),  # reporters render findings and placed review comments
    ("cfgfix.review", "cfgfix.verify"),  # the review and verify commands, which use the reporters
    ("cfgfix.checking",),  # the check command and the plumbing every command shares, without click
    ("cfgfix.commands",),
    ("cfgfix.cli",),
]
# `python -m cfgfix` is the entry point above everything.
ENTRY = {"cfgfix.__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if "harness" not in path.relative_to(PACKAGE).parts  # copied into user runs, not imported
    }


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "cfgfix")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "cfgfix":
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    best, depth = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_no_upward_imports():
    upward = []
    for module, targets in _graph().items():
        if module in ENTRY:
            continue
        for target in targets:
            if _layer(target) > _layer(module):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that point up the layers:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(start: str) -> None:
        # Tarjan's strongly connected components, iterative (the graph is a few hundred modules).
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = counter[0]
                    counter[0] += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_training_does_not_reach_into_rules():
    offenders = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.startswith("cfgfix.training")
        for target in targets
        if target.startswith("cfgfix.rules")
    ]
    assert not offenders, offenders
