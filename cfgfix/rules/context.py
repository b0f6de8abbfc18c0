"""What a rule sees: one parsed document, its shared analyses (computed once, lazily), and
the project's library versions."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from cfgfix.analysis.versions import Versions
from cfgfix.documents.python import PythonDocument
from cfgfix.documents.text import SourceText
from cfgfix.records import dataclass, field


@dataclass
class PythonContext:
    """What a rule reads of one Python file: the document and the shared analyses."""

    document: PythonDocument
    versions: Versions
    notes: dict = field(default_factory=dict)
    # The file's absolute path and the project's other modules (`ProjectModules`), so the
    # analysis can follow a model built by a function imported from the project.
    path: object = None
    project: object = None

    @property
    def source(self) -> SourceText:
        return self.document.source

    @cached_property
    def imports(self):
        """Import aliases resolved to qualified names."""
        from cfgfix.analysis.names import ImportMap

        return ImportMap(self.document.tree)

    @cached_property
    def functions(self):
        """This module's functions and those it imports from the project, with summaries
        (shared by the model and loop analyses; `deps` lists the other files read)."""
        from cfgfix.analysis.model_functions import FunctionTable
        from cfgfix.analysis.model_wrappers import lora_takes_base_dtype

        table = FunctionTable(self.document.tree, self.imports, self.project, self.path)
        table.lora_in_base_dtype = lora_takes_base_dtype(self.versions)
        return table

    @cached_property
    def models(self):
        """Model loads and the casts/moves applied to them (CFX1xx)."""
        from cfgfix.analysis.models import analyze_models

        return analyze_models(self.document.tree, self.source.text, self.imports, functions=self.functions)

    @cached_property
    def index(self):
        """Every call with its qualified name and surroundings (loops, withs, function);
        function bodies are walked as queries need them (the text says which)."""
        from cfgfix.analysis.structure import ModuleIndex

        return ModuleIndex.build(self.document.tree, self.imports, self.call_text)

    @cached_property
    def call_text(self):
        """Where the text may call a name or define a function (analysis/call_text.py),
        shared by the module index and the rules that look before they ask it."""
        from cfgfix.analysis.call_text import CallText

        return CallText(self.source.text, self.source.line_starts)


@dataclass
class ShellContext:
    """A launch script (shell, Makefile, Dockerfile, .env), its commands and launches."""

    document: object  # cfgfix.documents.shell.ShellDocument
    kind: str  # "shell" | "makefile" | "dockerfile" | "env"
    versions: Versions
    path: Path | None = None  # the file, for the helper scripts it runs
    root: Path | None = None  # the project root: helpers outside it are never read
    deps: set = field(default_factory=set)  # the helper scripts read (the cache's dependencies)
    named: bool = False  # named on the command line: checked as a launch script, launched or not

    @property
    def source(self) -> SourceText:
        return self.document.source

    @cached_property
    def launches(self):
        from cfgfix.documents.launches import find_launches

        return find_launches(self.document)

    @cached_property
    def inner(self):
        """What the script runs elsewhere: helper scripts, trap actions, ssh commands
        (analysis/shell_helpers.py)."""
        from cfgfix.analysis.shell_helpers import inner_commands

        return inner_commands(self.document, self.path, self.source.path, self.root, deps=self.deps)


@dataclass
class ConfigContext:
    """An accelerate or DeepSpeed config (YAML/JSON) with positions for every key and value."""

    document: object  # cfgfix.documents.config.ConfigDocument
    kinds: frozenset  # {"accelerate"} | {"deepspeed"}
    versions: Versions
    notes: dict = field(default_factory=dict)

    @property
    def source(self) -> SourceText:
        return self.document.source

    @property
    def root(self):
        return self.document.root

    def span(self, node):
        return self.document.span(node)
