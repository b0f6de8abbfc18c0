"""The rule base: every rule is a small class with a code, a name, a severity, a docstring in
a fixed order, and embedded VALID / INVALID examples that one generic test runs.

Rules are pure: they read a context built by the engine (a parsed document and its shared
analysis) and yield findings. They never read files, print, or import the CLI.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator

from cfgfix.core import Finding, Fix, Related, Severity, Span
from cfgfix.records import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (issue 15)
if TYPE_CHECKING:
    from typing import ClassVar

    from cfgfix.project import ProjectModel

DOCS_URL = "https://github.com/cfgfix/cfgfix/blob/main/rules/{code}.md"
DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References")
# A rule whose verdict depends on a library's version also has "Versions" (after "Fix
# safety"): what it does on each version and where the project pins nothing
# (docs/versions.md).
OPTIONAL_SECTIONS = ("Versions",)
SECTION_ORDER = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "Versions", "References")


@dataclass(frozen=True)
class Example:
    """One embedded example. `code` is the primary file (`path`); `files` adds other files of
    the sample project (a launch script, a requirements.txt pin). INVALID examples name the
    expected `line` of the finding and, when the rule fixes it, the `fixed` text of `path`
    (unsafe fixes included). `why` says which near miss or case the example guards."""

    code: str
    why: str = ""
    path: str = "train.py"
    line: int | None = None
    fixed: str | None = None
    files: dict[str, str] = field(default_factory=dict)


# A finding of a rule with a `condition`, yielded with its own, narrower condition: the
# rule's, then `;`-separated qualifiers the project stage also checks
# (`"multi-process-launch;unless:--use_deepspeed"`: only the launches that do not turn that
# flag on count; project.py `condition_holds`). (collections.namedtuple: no `typing` import
# on the check path.)
Conditioned = namedtuple("Conditioned", "finding condition")


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    fix_availability: ClassVar[str] = "none"  # "safe", "unsafe", "mixed" (per case), "sometimes", "none"
    default_enabled: ClassVar[bool] = True
    kinds: ClassVar[tuple[str, ...]] = ("python",)
    # Prefilter: every group must have one of its byte strings in the file, or the rule
    # cannot match and the file is not parsed for it.
    triggers: ClassVar[tuple[tuple[bytes, ...], ...]] = ()
    # Optional, checked after the groups: a finer (still text-only) test of the bytes.
    trigger_check: ClassVar[Callable[[bytes], bool] | None] = None
    # A cross-file condition the project stage must confirm before a finding is reported
    # ("multi-process-launch": a launch script starts this file with more than one process).
    condition: ClassVar[str | None] = None
    VALID: ClassVar[list[Example]] = []
    INVALID: ClassVar[list[Example]] = []

    def check(self, ctx) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError

    # -- helpers for rules -------------------------------------------------------------
    def finding(
        self,
        span: Span,
        message: str,
        *,
        fix: Fix | None = None,
        related: Iterable[Related] = (),
        severity: Severity | None = None,
    ) -> Finding:
        return Finding(
            code=self.code,
            name=self.name,
            message=message,
            severity=severity or self.severity,
            span=span,
            related=tuple(related),
            fix=fix,
        )

    @classmethod
    def may_match(cls, data: bytes) -> bool:
        if not all(any(token in data for token in group) for group in cls.triggers):
            return False
        return cls.trigger_check is None or cls.trigger_check(data)

    # -- documentation -----------------------------------------------------------------
    @classmethod
    def doc(cls) -> str:
        import inspect  # documentation only: not on the check path
        import textwrap

        return textwrap.dedent(inspect.getdoc(cls) or "").strip()

    @classmethod
    def summary(cls) -> str:
        """The first sentence of "What it does"."""
        section = doc_sections(cls.doc()).get("What it does", "")
        first = re.split(r"(?<=\.)\s", " ".join(section.split()), maxsplit=1)[0]
        return first

    @classmethod
    def url(cls) -> str:
        return DOCS_URL.format(code=cls.code)


class ProjectRule(Rule):
    """A rule over the project model (several files at once). It runs after the per-file
    stage on every run (never cached: its inputs are other files), so it must stay cheap:
    it reads configs only through `project.read`, which parses each file once per run.
    Findings may be on any file of the run; the engine keeps those on files it checks."""

    scope: ClassVar[str] = "project"
    kinds = ("yaml", "json")
    triggers = ()

    def check(self, ctx):  # per-file stage: nothing to do
        return ()

    def check_project(self, project: ProjectModel) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


def doc_sections(doc: str) -> dict[str, str]:
    """Split a rule docstring into its `## Heading` sections."""
    sections: dict[str, str] = {}
    current = None
    lines: list[str] = []
    for line in doc.splitlines():
        match = re.match(r"^##\s+(.*?)\s*$", line)
        if match:
            if current:
                sections[current] = "\n".join(lines).strip()
            current, lines = match.group(1), []
        elif current:
            lines.append(line)
    if current:
        sections[current] = "\n".join(lines).strip()
    return sections


_REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    if cls.code in _REGISTRY:
        raise ValueError(f"duplicate rule code {cls.code}")
    _REGISTRY[cls.code] = cls
    return cls


def rule_modules() -> list[str]:
    """Every rule module, found on disk: `rules/<family>/cfxNNN_<name>.py`."""
    import os

    base = os.path.dirname(__file__)
    found = []
    for family in sorted(os.listdir(base)):
        folder = os.path.join(base, family)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        for name in sorted(os.listdir(folder)):
            if name.startswith("cfx") and name.endswith(".py"):
                found.append(f"cfgfix.rules.{family}.{name[:-3]}")
    return found


def all_rules() -> list[type[Rule]]:
    """Every rule, by code: imports every rule module (documentation, `rule --all`, SARIF,
    tests). A lint run imports only what it needs, through `rules.manifest`."""
    from importlib import import_module

    for module in rule_modules():
        import_module(module)  # registers its rule
    return [_REGISTRY[code] for code in sorted(_REGISTRY)]


def rule_by_code(code: str) -> type[Rule] | None:
    """One rule's class, importing only its module (named after its code)."""
    from importlib import import_module

    code = code.upper()
    if code not in _REGISTRY:
        prefix = "." + code.lower() + "_"
        for module in rule_modules():
            if prefix in module:
                import_module(module)
    return _REGISTRY.get(code)


def iter_codes() -> Iterator[str]:
    return (rule.code for rule in all_rules())
