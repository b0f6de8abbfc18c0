"""CFX309 continuation-cut-by-comment."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.rules.base import Example, Rule, register


@register
class ContinuationCutByComment(Rule):
    """## What it does
    Flags a comment line inside a backslash-continued command of a shell script, when the
    lines after it carry on with the command's options:

    ```bash
    deepspeed train.py \\
        --deepspeed ds_config.json \\
        # --gradient_checkpointing \\
        --bf16 true
    ```

    ## Why is this bad?
    A comment runs to the end of its line, backslash included, so the command ends at the
    comment: bash runs `deepspeed train.py --deepspeed ds_config.json` without the flags
    below it, then tries to run `--bf16 true` as a command of its own ("command not found",
    which a script without `set -e` ignores). The run starts with defaults where the
    author wrote values: often fp32 instead of bf16, or no DeepSpeed config at all.

    ## Example
    ```bash
    torchrun --nproc_per_node 4 train.py \\
        --per_device_train_batch_size 4 \\
        # --gradient_accumulation_steps 8 \\
        --bf16 true
    ```

    ## Use instead
    ```bash
    # --gradient_accumulation_steps 8 is off for now
    torchrun --nproc_per_node 4 train.py \\
        --per_device_train_batch_size 4 \\
        --bf16 true
    ```

    ## Fix safety
    Unsafe: the fix deletes the comment lines, so the flags below them reach the command,
    which changes what runs (as the author meant, but check the values).

    ## References
    - bash(1), "COMMENTS": a word beginning with # causes that word and all remaining
      characters on that line to be ignored; "QUOTING": a backslash-newline pair is a line
      continuation (inside a comment it is neither)
    """

    code = "CFX309"
    name = "continuation-cut-by-comment"
    severity = Severity.ERROR
    fix_availability = "unsafe"
    kinds = ("shell",)
    triggers = ((b"\\\n", b"\\\r\n"), (b"#",))

    def check(self, ctx) -> Iterable[Finding]:
        source = ctx.source
        starts = {command.span.line: command for command in ctx.document.commands}
        for line, command in sorted(starts.items()):
            words = [w.text for w in command.words]
            if not words or not words[0].startswith("-") or words[0] == "-":
                continue  # only a command that begins with an option is the rest of one
            first_comment = line - 1
            while first_comment >= 1 and source.line_text(first_comment).lstrip().startswith("#"):
                first_comment -= 1
            if first_comment == line - 1 or first_comment < 1:
                continue  # no comment line right above it
            if not _continues(source.line_text(first_comment)):
                continue  # the line above the comments ends a command of its own
            cut = first_comment + 1
            owner = ctx.document.command_covering(first_comment)
            dropped = " ".join(words)
            dropped = dropped if len(dropped) <= 80 else dropped[:77] + "..."
            start = source.line_starts[cut - 1]
            end = source.line_starts[line - 1]
            fix = Fix((Edit(source.path, start, end, ""),), "Delete the comment lines inside the command",
                      Applicability.UNSAFE)
            what = f"`{' '.join(w.text for w in owner.words[:3])} ...`" if owner is not None else "the command above"
            related = [Related(command.span, "run as a command of its own")]
            if owner is not None:
                related.insert(0, Related(owner.span, "the command ends here"))
            yield self.finding(
                source.span(start + _indent(source.line_text(cut)), start + len(source.line_text(cut))),
                f"this comment ends {what}: a comment runs to the end of its line, backslash included, so "
                f"`{dropped}` on line {line} is not passed to it and bash runs it as a command of its own; "
                f"move the comment above the command",
                fix=fix, related=related)

    VALID = [
        Example("#!/bin/bash\n# the learning rate is tuned\ntorchrun train.py \\\n    --lr 1e-4\n", path="run.sh",
                why="a comment above the command"),
        Example("#!/bin/bash\ntorchrun train.py \\\n    --lr 1e-4\n# --bf16 true\necho done\n", path="run.sh",
                why="a comment after the command ended, then a new command"),
        Example("#!/bin/bash\ncat <<'EOF' > run2.sh\ntorchrun train.py \\\n  # --bf16 \\\n  --lr 1\nEOF\n",
                path="run.sh", why="inside a heredoc body: text, not commands"),
        Example("#!/bin/bash\necho 'a \\\n# b' \\\n  --flag\n", path="run.sh",
                why="the # is inside a quoted string that spans lines"),
        Example("#!/bin/bash\necho done \\\\\n# note\n--version\n", path="run.sh",
                why="an escaped backslash (two) at the end of a line is not a continuation"),
    ]
    INVALID = [
        Example("#!/bin/bash\ndeepspeed train.py \\\n    --deepspeed ds_config.json \\\n"
                "    # --gradient_checkpointing \\\n    --bf16 true \\\n    --output_dir out\n",
                path="run.sh", line=4,
                fixed="#!/bin/bash\ndeepspeed train.py \\\n    --deepspeed ds_config.json \\\n"
                      "    --bf16 true \\\n    --output_dir out\n",
                why="the flags after the comment line, the DeepSpeed file before it"),
        Example("#!/bin/bash\ntorchrun --nproc_per_node 4 train.py \\\n  --per_device_train_batch_size 4 \\\n"
                "  # --gradient_accumulation_steps 8 \\\n  # --max_steps 10 \\\n  --bf16 true\n",
                path="train.sh", line=4,
                fixed="#!/bin/bash\ntorchrun --nproc_per_node 4 train.py \\\n  --per_device_train_batch_size 4 \\\n"
                      "  --bf16 true\n",
                why="several comment lines in a row"),
        Example("#!/bin/bash\naccelerate launch --config_file acc.yaml train.py \\\n"
                "# --mixed_precision bf16\n  --learning_rate 2e-5\n",
                path="launch.sh", line=3,
                fixed="#!/bin/bash\naccelerate launch --config_file acc.yaml train.py \\\n  --learning_rate 2e-5\n",
                why="a comment line without a backslash of its own"),
    ]


def _continues(text: str) -> bool:
    """Whether a line ends in a backslash that escapes the newline (an odd run of them),
    outside a comment."""
    stripped = text.rstrip("\r\n")
    run = len(stripped) - len(stripped.rstrip("\\"))
    if run % 2 == 0:
        return False
    return not stripped.lstrip().startswith("#")


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())
