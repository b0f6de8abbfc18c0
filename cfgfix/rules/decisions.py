"""One finding per decision. A project rule that judges each launch's resolved setup sees
the same choice once per file that states it (fp16 in the accelerate config, the DeepSpeed
JSON, the training config and a `--fp16` flag) and once per launch that reads those files.
Reported per file and per launch, one choice became four findings (issue 23). A rule adds
each launch's verdict here instead, keyed by the place that decides; the other places and
launches become related locations of that one finding."""

from __future__ import annotations

from cfgfix.core import Finding, Fix, Related, Span


class Decisions:
    """Findings of one rule collected per deciding span, in the order first added."""

    def __init__(self, rule) -> None:
        self.rule = rule
        self._entries: dict[tuple, _Entry] = {}

    def add(self, span: Span, message: str, *, fix: Fix | None = None, related=()) -> None:
        """One launch's verdict on the decision made at `span`. A later launch with the same
        deciding span adds its related places; the fix stays only when every launch that
        shares the decision offers the same one (another launch may read a second file that
        the fix would leave contradicting it)."""
        key = (span.path, span.start, span.end)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(span, message, fix)
        elif entry.fix != fix:
            entry.fix = None
        for place in related:
            entry.related.setdefault((place.span.path, place.span.start, place.span.end), place)

    def findings(self) -> list[Finding]:
        return [self.rule.finding(e.span, e.message, fix=e.fix,
                                  related=[r for k, r in e.related.items() if k != (e.span.path, e.span.start, e.span.end)])
                for e in self._entries.values()]


class _Entry:
    __slots__ = ("fix", "message", "related", "span")

    def __init__(self, span: Span, message: str, fix: Fix | None) -> None:
        self.span, self.message, self.fix = span, message, fix
        self.related: dict[tuple, Related] = {}


def also(values, what: str) -> list[Related]:
    """The other places that state the same choice, as related locations."""
    return [Related(v.span, f"{v.origin} {what} too") for v in values if v.span is not None]


def listed(values) -> str:
    """"a", "a and b", "a, b and c": the origins of the other places, for a message."""
    names = [v.origin for v in values]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
