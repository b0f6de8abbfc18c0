"""CFX312 backslash-before-trailing-space."""

from __future__ import annotations

import re
from collections.abc import Iterable

from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.rules.base import Example, Rule, register

# An odd run of backslashes, then blanks (and maybe a comment) to the end of the line: the
# last backslash escapes the blank after it, not the newline.
_BROKEN_END = re.compile(r"(?<!\\)(?:\\\\)*\\([ \t]+)(#.*)?$")


@register
class BackslashBeforeTrailingSpace(Rule):
    """## What it does
    Flags a line of a shell command that ends in a backslash followed by spaces or tabs
    (often invisible in an editor), or by a space and a `# comment`, when the next line
    carries on with the command's options:

    ```bash
    python -m lightning_cli fit \\
        --trainer.num_nodes 2 \\      # two machines
        --trainer.devices 4
    ```

    ## Why is this bad?
    A backslash escapes the one character after it. Followed by a space, it makes an
    escaped space, not a line continuation, so the newline ends the command there: bash
    runs it without the options below, then tries to run `--trainer.devices 4` as a
    command of its own ("command not found", which a script without `set -e` ignores).
    The run starts with the tool's defaults where the author wrote values (one GPU instead
    of four, fp32 instead of bf16).

    ## Example
    ```bash
    torchrun --nproc_per_node 4 train.py \\   # 4 GPUs
        --bf16 true
    ```

    ## Use instead
    ```bash
    # 4 GPUs
    torchrun --nproc_per_node 4 train.py \\
        --bf16 true
    ```

    ## Fix safety
    Safe when only blanks follow the backslash: the fix deletes them, and the command runs
    as written. Unsafe when a comment follows: the fix deletes the comment too.

    ## References
    - bash(1), "QUOTING": "A non-quoted backslash (\\) is the escape character. It preserves
      the literal value of the next character that follows, with the exception of
      <newline>."
    """

    code = "CFX312"
    name = "backslash-before-trailing-space"
    severity = Severity.ERROR
    fix_availability = "safe"
    kinds = ("shell",)
    triggers = ((b"\\ ", b"\\\t"),)

    def check(self, ctx) -> Iterable[Finding]:
        source = ctx.source
        for command in ctx.document.commands:
            words = [text for text in (w.text.strip() for w in command.words) if text]
            line = command.span.line
            if not words or not words[0].startswith("-") or words[0] == "-" or line < 2:
                continue  # only a command that begins with an option is the rest of one
            above = source.line_text(line - 1).rstrip("\r\n")
            match = _BROKEN_END.search(above)
            if match is None or above.lstrip().startswith("#"):
                continue
            owner = ctx.document.command_covering(line - 1)
            if owner is None or owner is command:
                continue  # the backslash is inside a string or a heredoc, not a command's end
            start = source.line_starts[line - 2] + match.start(1)
            end = source.line_starts[line - 2] + len(above)
            comment = match.group(2)
            fix = Fix((Edit(source.path, start, end, ""),),
                      "Delete the comment after the backslash" if comment else "Delete the blanks after the backslash",
                      Applicability.UNSAFE if comment else Applicability.SAFE)
            dropped = " ".join(words)
            dropped = dropped if len(dropped) <= 80 else dropped[:77] + "..."
            what = "a space and a comment" if comment else "blanks"
            head = " ".join([text for text in (w.text.strip() for w in owner.words) if text][:3])
            yield self.finding(
                source.span(start - 1, end),
                f"the backslash at the end of line {line - 1} is followed by {what}, so it escapes a space "
                f"instead of the newline: the command `{head} ...` ends "
                f"here, and `{dropped}` on line {line} runs as a command of its own",
                fix=fix, related=[Related(command.span, "run as a command of its own")])

    VALID = [
        Example("#!/bin/bash\ntorchrun train.py \\\n    --lr 1e-4\n", path="run.sh", why="a real continuation"),
        Example("#!/bin/bash\necho a\\ b\n--version\n", path="run.sh",
                why="an escaped space inside a line, not at its end"),
        Example("#!/bin/bash\ntorchrun train.py \\ \necho done\n", path="run.sh",
                why="the next line is a command of its own, not an option"),
        Example("#!/bin/bash\n# torchrun train.py \\ \n--bf16 true\n", path="run.sh", why="a comment line"),
        Example("#!/bin/bash\necho done \\\\ \n--version\n", path="run.sh",
                why="an escaped backslash (two) then a space: no continuation was meant"),
    ]
    INVALID = [
        Example("#!/bin/bash\ntorchrun --nproc_per_node 4 train.py \\  \n    --bf16 true\n", path="run.sh", line=2,
                fixed="#!/bin/bash\ntorchrun --nproc_per_node 4 train.py \\\n    --bf16 true\n",
                why="blanks after the backslash"),
        Example("#!/bin/bash\npython main.py fit \\\n  --trainer.num_nodes 2 \\      # two machines\n"
                "  --trainer.devices 4\n", path="run.sh", line=3,
                fixed="#!/bin/bash\npython main.py fit \\\n  --trainer.num_nodes 2 \\\n  --trainer.devices 4\n",
                why="a comment after the backslash (LightningCLI flags)"),
        Example("#!/bin/bash\ndeepspeed train.py \\\t\n\t--deepspeed ds.json\n", path="train.sh", line=2,
                fixed="#!/bin/bash\ndeepspeed train.py \\\n\t--deepspeed ds.json\n", why="a tab after the backslash"),
    ]
