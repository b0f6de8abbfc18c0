"""Where the project's other modules use this module's classes: the reverse of the imports
`FunctionTable` follows. A helper whose per-step caller lives elsewhere (a `MemoryManager`
in `utils/memory.py` that the trainer builds and calls every batch) is judged by that
caller. Asked only for such a helper: the project's files are listed once per process and
read only when their text names the class."""

from __future__ import annotations

from pathlib import Path

from cfgfix.analysis.names import ImportMap


def importers(project, path, name: str):
    """(ParsedModule, local name) for each project module that imports the class or function
    `name` from the module at `path` (`from utils.memory import MemoryManager`, `from .memory
    import MemoryManager as MM`)."""
    if project is None or path is None:
        return
    me = str(Path(path).resolve())
    word = name.encode("ascii", "replace")
    for file in project.python_files():
        if file == me:
            continue
        data = project.raw(Path(file))
        if data is None or word not in data or b"import" not in data:
            continue
        parsed = project.parse(Path(file))
        if parsed is None:
            continue
        imports = ImportMap(parsed.tree)
        for local, (level, module, imported) in imports.relative.items():
            if imported == name and _same(project.resolve(Path(file), module, level), me):
                yield parsed, local
        for local, qualified in imports.aliases.items():
            module, _, imported = qualified.rpartition(".")
            if imported == name and module and _same(project.resolve(Path(file), module, 0), me):
                yield parsed, local


def _same(found, me: str) -> bool:
    return found is not None and str(Path(found).resolve()) == me


def module_index(parsed):
    """The module index of another module (built once per process, kept on it)."""
    index = parsed.notes.get("module-index")
    if index is None:
        from cfgfix.analysis.structure import ModuleIndex

        index = parsed.notes["module-index"] = ModuleIndex.build(parsed.tree, ImportMap(parsed.tree), parsed.text)
    return index
