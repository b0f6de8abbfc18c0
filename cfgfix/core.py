"""The core types every layer shares: spans, edits, fixes and findings.

Everything here is a frozen dataclass with no behaviour beyond small helpers, so rules,
the fixer, the reporters and the cache can pass them around (and serialise them) freely.
"""

from __future__ import annotations

from enum import Enum

from cfgfix.records import dataclass, field


class LazyRegex:
    """A regular expression compiled on first use. Modules on every run's import path hold
    their patterns this way: a run that never needs one (a cached run decodes no file,
    most files hold no suppression) does not pay for compiling it. After the first use
    its methods are the compiled pattern's own, bound on the instance: a hot pattern
    pays no lookup through `__getattr__` per call."""

    def __init__(self, pattern, flags: int = 0) -> None:
        self._pattern, self._flags = pattern, flags

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)  # copy/pickle probing, before any compile
        import re

        compiled = re.compile(self._pattern, self._flags)
        for method in _PATTERN_METHODS:
            setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)


_PATTERN_METHODS = ("search", "match", "fullmatch", "finditer", "findall", "sub", "subn", "split",
                    "pattern", "flags", "groups", "groupindex")


def is_huge_number_error(exc: BaseException) -> bool:
    """Python refuses to convert integers of more than 4,300 digits (to or from text). Such a
    number in a user's file is ordinary (if absurd) input that no tool can read, never a bug."""
    return isinstance(exc, ValueError) and "integer string conversion" in str(exc)


def _span_typed(span: "Span") -> bool:
    return isinstance(span.path, str) and all(
        type(v) is int for v in (span.line, span.column, span.end_line, span.end_column, span.start, span.end))


def well_typed(finding: "Finding") -> bool:
    """Every field of the type the code writes (a cache file read back may hold anything)."""
    fix = finding.fix
    return (
        all(isinstance(v, str) for v in (finding.code, finding.name, finding.message))
        and _span_typed(finding.span)
        and all(_span_typed(r.span) and isinstance(r.message, str) for r in finding.related)
        and (fix is None or (isinstance(fix.description, str) and all(
            isinstance(e.path, str) and type(e.start) is int and type(e.end) is int and isinstance(e.content, str)
            and 0 <= e.start <= e.end for e in fix.edits)))
    )


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Applicability(str, Enum):
    SAFE = "safe"  # training behaviour is unchanged
    UNSAFE = "unsafe"  # numerics or semantics change


@dataclass(frozen=True, order=True)
class Span:
    """A region of one file: 1-based lines and columns (columns count characters),
    plus byte offsets into the file's bytes as read (after decoding, see Document)."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    start: int = 0  # offset into the decoded text
    end: int = 0

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "start": self.start,
            "end": self.end,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Span":
        return cls(**data)


@dataclass(frozen=True, order=True)
class Edit:
    """Replace text[start:end] of one file with `content` (offsets into the decoded text)."""

    path: str
    start: int
    end: int
    content: str

    def to_dict(self) -> dict:
        return {"path": self.path, "start": self.start, "end": self.end, "content": self.content}

    @classmethod
    def from_dict(cls, data: dict) -> "Edit":
        return cls(**data)


@dataclass(frozen=True)
class Fix:
    """The edits that repair one finding, what they do, and how safe they are."""

    edits: tuple[Edit, ...]
    description: str
    applicability: Applicability = Applicability.SAFE

    def to_dict(self) -> dict:
        return {
            "edits": [e.to_dict() for e in self.edits],
            "description": self.description,
            "applicability": self.applicability.value,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Fix":
        return cls(
            edits=tuple(Edit.from_dict(e) for e in data["edits"]),
            description=data["description"],
            applicability=Applicability(data["applicability"]),
        )


@dataclass(frozen=True)
class Related:
    """A span that explains a finding (the load that makes a later `.to()` wrong)."""

    span: Span
    message: str

    def to_dict(self) -> dict:
        return {"span": self.span.to_dict(), "message": self.message}

    @classmethod
    def from_dict(cls, data: dict) -> "Related":
        return cls(span=Span.from_dict(data["span"]), message=data["message"])


@dataclass(frozen=True)
class Finding:
    """One diagnostic: the rule, where it points, why, and an optional fix."""

    code: str
    name: str
    message: str
    severity: Severity
    span: Span
    related: tuple[Related, ...] = field(default=())
    fix: Fix | None = None

    @property
    def path(self) -> str:
        return self.span.path

    def sort_key(self) -> tuple:
        return (self.span.path, self.span.line, self.span.column, self.code)

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "severity": self.severity.value,
            "span": self.span.to_dict(),
            "related": [r.to_dict() for r in self.related],
            "fix": self.fix.to_dict() if self.fix else None,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        return cls(
            code=data["code"],
            name=data["name"],
            message=data["message"],
            severity=Severity(data["severity"]),
            span=Span.from_dict(data["span"]),
            related=tuple(Related.from_dict(r) for r in data["related"]),
            fix=Fix.from_dict(data["fix"]) if data["fix"] else None,
        )
