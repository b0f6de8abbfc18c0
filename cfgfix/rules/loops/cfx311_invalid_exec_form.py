"""CFX311 invalid-exec-form."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable

from cfgfix.core import Applicability, Edit, Finding, Fix, Severity
from cfgfix.rules.base import Example, Rule, register


@register
class InvalidExecForm(Rule):
    """## What it does
    Flags a Dockerfile `RUN`, `CMD` or `ENTRYPOINT` written as an exec-form array that is
    not a JSON array of strings: single quotes (`CMD ['python', 'train.py']`), typographic
    quotes, a trailing comma, a number or `true` among the arguments.

    ## Why is this bad?
    Docker parses the exec form as JSON; when that fails it quietly takes the line as the
    shell form and runs `/bin/sh -c "['python', 'train.py']"`, which fails when the
    container starts (`/bin/sh: 1: [python,: not found`), after the image was built and
    pushed. An exec-form `ENTRYPOINT` that became the shell form also ignores `CMD`.

    ## Example
    ```dockerfile
    CMD ['torchrun', '--nproc_per_node', '8', 'train.py']
    ```

    ## Use instead
    ```dockerfile
    CMD ["torchrun", "--nproc_per_node", "8", "train.py"]
    ```

    ## Fix safety
    Safe when the array reads as a list of strings (quotes or a trailing comma): the fix
    writes it as JSON on one line, which is what the author meant and the only form that
    can run. No fix for a number or other value among the arguments.

    ## References
    - Dockerfile reference, "Shell and exec form": "The exec form is parsed as a JSON
      array, which means that you must use double-quotes (") around words, not
      single-quotes (')."
    """

    code = "CFX311"
    name = "invalid-exec-form"
    severity = Severity.ERROR
    fix_availability = "sometimes"
    kinds = ("dockerfile",)
    triggers = ((b"[",),)

    def check(self, ctx) -> Iterable[Finding]:
        source = ctx.source
        for keyword, start, end in getattr(ctx.document, "bad_exec_forms", ()):
            body = source.text[start:end]
            values = _as_strings(body)
            fix = None
            if values is not None:
                fix = Fix((Edit(source.path, start, end, json.dumps(values)),),
                          "Write the array as JSON (double quotes)", Applicability.SAFE)
            why = "its words are not all strings" if values is None and _is_json(body) else \
                "it is not JSON (exec form needs double quotes and no trailing comma)"
            yield self.finding(
                source.span(start, end),
                f"{keyword} is written as an exec-form array, but {why}: Docker runs it in the shell form, "
                f"`/bin/sh -c \"{_short(body)}\"`, which fails when the container starts",
                fix=fix)

    VALID = [
        Example('FROM python:3.11\nCMD ["torchrun", "--nproc_per_node", "8", "train.py"]\n', path="Dockerfile",
                why="JSON"),
        Example("FROM python:3.11\nRUN [ -f requirements.txt ] && pip install -r requirements.txt\n",
                path="Dockerfile", why="the shell's test command, not an array"),
        Example("FROM python:3.11\nCMD python train.py --tags '[\"a\"]'\n", path="Dockerfile",
                why="the shell form with a bracket inside"),
        Example('FROM python:3.11\nENTRYPOINT ["accelerate", "launch", \\\n    "train.py"]\n', path="Dockerfile",
                why="JSON continued over lines"),
    ]
    INVALID = [
        Example("FROM python:3.11\nCMD ['torchrun', '--nproc_per_node', '8', 'train.py']\n", path="Dockerfile",
                line=2, fixed='FROM python:3.11\nCMD ["torchrun", "--nproc_per_node", "8", "train.py"]\n',
                why="single quotes"),
        Example('FROM python:3.11\nENTRYPOINT ["python", "train.py",]\n', path="Dockerfile", line=2,
                fixed='FROM python:3.11\nENTRYPOINT ["python", "train.py"]\n', why="a trailing comma"),
        Example('FROM python:3.11\nCMD ["python", "train.py", "--epochs", 3]\n', path="Dockerfile", line=2,
                why="a number among the arguments (no fix)"),
    ]


def _as_strings(body: str) -> list[str] | None:
    """The array as a list of strings when Python reads it so (quotes, a trailing comma)."""
    text = re.sub(r"\\\r?\n", " ", body)
    if any(q in text for q in "\u2018\u2019\u201c\u201d"):
        text = text.translate(str.maketrans("\u2018\u2019\u201c\u201d", "''\"\""))
    try:
        values = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return values
    return None


def _is_json(body: str) -> bool:
    try:
        json.loads(re.sub(r"\\\r?\n", " ", body))
        return True
    except (ValueError, RecursionError):
        return False


def _short(body: str) -> str:
    flat = " ".join(body.split())
    return flat if len(flat) <= 60 else flat[:57] + "..."
