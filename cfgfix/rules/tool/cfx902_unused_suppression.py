"""CFX902 unused-suppression."""

from __future__ import annotations

from cfgfix.core import Severity
from cfgfix.rules.base import Rule, register


@register
class UnusedSuppression(Rule):
    """## What it does
    Reports a `# cfgfix: ignore[...]` comment that suppressed nothing: the codes it names
    produced no finding on that line. Off by default; enable it with
    `--extend-select CFX902`.

    ## Why is this bad?
    A stale suppression hides the next real finding on that line and tells readers about a
    problem that is no longer there.

    ## Example
    ```python
    model = AutoModel.from_pretrained("m")  # cfgfix: ignore[CFX103]
    ```

    ## Use instead
    ```python
    model = AutoModel.from_pretrained("m")
    ```

    ## Fix safety
    Safe: only the comment is removed.

    ## References
    - ruff's RUF100 (unused-noqa) works the same way.
    """

    code = "CFX902"
    name = "unused-suppression"
    severity = Severity.INFO
    fix_availability = "safe"
    default_enabled = False
    kinds = ("python", "shell", "yaml", "dockerfile", "makefile", "env")
    VALID = []
    INVALID = []

    def check(self, ctx):
        return ()
