"""README launches: the shell commands in a Markdown file's fenced code blocks.

Many repositories document their training launch only in the README
(```` ```bash\\ntorchrun --nproc_per_node 8 train.py ... ```` ````). The text outside shell
blocks is blanked (newlines kept), so the shell reader sees only the commands and every
position still points into the README itself."""

from __future__ import annotations

import re

from cfgfix.documents.text import SourceText

# A fence inside a list item is indented under the item's text (`1.  Start:` then
# `    ```bash`): up to 8 columns, not CommonMark's 3 for a top-level fence.
_FENCE = re.compile(r"^(?P<indent>[ \t]{0,8})(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$", re.M)
_SHELL_INFO = {"", "sh", "bash", "shell", "console", "zsh", "shell-session", "shellsession"}


def shell_blocks_only(source: SourceText) -> SourceText:
    """The same text with everything but shell code blocks replaced by spaces."""
    text = source.text
    keep = [False] * len(text)
    position = 0
    while True:
        opening = _FENCE.search(text, position)
        if opening is None:
            break
        fence = opening.group("fence")
        info = opening.group("info").strip().split()[0].lower() if opening.group("info").strip() else ""
        closing = re.compile(rf"^[ \t]{{0,8}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        body_start = opening.end() + 1
        end = closing.search(text, body_start)
        body_end = end.start() if end else len(text)
        if info in _SHELL_INFO:
            for index in range(body_start, min(body_end, len(text))):
                keep[index] = True
        position = end.end() if end else len(text)
    blanked = "".join(ch if keep[i] or ch in "\r\n" else " " for i, ch in enumerate(text))
    blanked = re.sub(r"(?m)^( *)\$ ", r"\1  ", blanked)  # console prompts: `$ torchrun ...`
    # documentation placeholders (`--master_port=<your_random_port>`, `<path_to_data>`) are
    # not redirections: keep them as one unresolved variable of the same length
    blanked = _PLACEHOLDER.sub(lambda m: "$" + "_" * (len(m.group(0)) - 1), blanked)
    return SourceText(source.path, blanked, source.bom)


_PLACEHOLDER = re.compile(r"<[A-Za-z][\w .\-/]*>")
