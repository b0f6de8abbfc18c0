"""What a rule sees: one parsed document, its shared analyses (computed once, lazily), and
the project's library versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from cfgfix.analysis.versions import Versions
from cfgfix.documents.python import PythonDocument
from cfgfix.documents.text import SourceText


@dataclass
class PythonContext:
    document: PythonDocument
    versions: Versions
    notes: dict = field(default_factory=dict)

    @property
    def source(self) -> SourceText:
        return self.document.source

    @cached_property
    def models(self):
        from cfgfix.analysis.models import analyze_models

        return analyze_models(self.document.tree, self.source.text)
