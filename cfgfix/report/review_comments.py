"""What a review is made of, as the reporters read it: the placed comments (a finding, the
lines it is commented on, its suggestion) and the review around them. `review/review.py`
places them; `report/github_review.py` renders them; `review/post.py` finds its own
earlier ones by `MARKER`. Here, below both, so that no reporter imports the review command."""

from __future__ import annotations

from cfgfix.core import Finding, Span
from cfgfix.records import dataclass, field

MARKER = "<!-- cfgfix-review -->"


@dataclass
class Comment:
    finding: Finding
    path: str  # repository-relative, posix
    start_line: int
    line: int  # the last commented line
    span: Span  # the span commented on (primary, or the related one)
    related_note: str | None = None  # why a finding elsewhere is reported here
    suggestion: str | None = None  # the fixed lines replacing start_line..line
    unsafe: bool = False


@dataclass
class Review:
    commit_id: str
    comments: list[Comment] = field(default_factory=list)
    changed: list = field(default_factory=list)  # review.gitdiff.ChangedFile, one per changed file
    linted: int = 0
    errors: list[str] = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    # findings in a changed notebook that no line of its JSON can show (a cell cfgfix cannot
    # map): listed in the review body, never commented on a guessed line
    unplaced: list[Finding] = field(default_factory=list)
    # id(finding) -> "cell 3:2:5" for a notebook finding placed on its JSON lines
    cells: dict[int, str] = field(default_factory=dict)
