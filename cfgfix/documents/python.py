"""Python documents: the stdlib `ast` tree over a decoded source.

Detection runs on `ast` (about ten times faster than a concrete syntax tree, and its
positions are exact); fixes are text edits at those positions, so nothing here needs a
CST. A syntax error becomes a CFX901 finding in the engine, never a traceback.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from cfgfix.documents.text import SourceText


@dataclass
class PythonDocument:
    source: SourceText
    tree: ast.Module

    @classmethod
    def parse(cls, source: SourceText) -> "PythonDocument":
        with warnings.catch_warnings():  # invalid escape sequences etc. are not ours to report
            warnings.simplefilter("ignore")
            tree = ast.parse(source.text, filename=source.path)
        return cls(source=source, tree=tree)
