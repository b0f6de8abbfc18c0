"""Every runtime dependency pyproject.toml declares is imported by cfgfix (issue 23:
ruamel.yaml was declared, installed by every user, and never imported)."""

import ast
import re

import tomllib
from conftest import REPO

# distribution name -> the module it provides
MODULES = {"pyyaml": "yaml"}


def _imported() -> set[str]:
    names = set()
    for path in (REPO / "cfgfix").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_declared_dependency_is_imported():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    imported = _imported()
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        module = MODULES.get(name, name.replace("-", "_")).split(".")[0]
        assert module in imported, f"{requirement} is declared but cfgfix never imports {module}"
