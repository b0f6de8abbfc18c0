"""The calls that build an optimizer or a library trainer: where the parameter flow
(analysis/parameters.py) starts, and without which it finds nothing. A module of its own
so that CFX204 can ask before importing the flow or the autocast facts (analysis/amp.py):
those imports were ~4.5 and ~2.2 ms of a 5-file pre-commit run, on a trainer module that
builds no optimizer (issue 15)."""

from __future__ import annotations

import ast
import re

from cfgfix.core import LazyRegex

OPTIMIZER = LazyRegex(
    r"(^|\.)(Adam\w*|AdamW\w*|SGD\w*|RMSprop|Adagrad|Adadelta|Adamax|NAdam|RAdam|ASGD|Rprop|LBFGS|"
    r"Adafactor|Lion\w*|LAMB|Lamb|PagedAdam\w*|AdEMAMix\w*)$"
)
PARAM_METHODS = {"parameters", "named_parameters"}
# A library trainer that builds its own optimizer over the model it is given.
LIBRARY_TRAINER = re.compile(r"^(transformers|trl)\.(\w+\.)*\w*Trainer$")


def flow_may_report(ctx) -> bool:
    """False when the parameter flow surely records no step and no library trainer. A step
    is a `.step(...)` or `.unscale_(...)` call; without one, only a transformers/trl
    `*Trainer` call gives the flow something to record. Either callee's last name is a word
    on a line the call spans (`step`, a word ending with `Trainer`, an alias of such a
    class), so only the statements spanning such a line are walked (analysis/word_lines.py),
    not the whole module: on trl's GRPO trainer, which has neither, the module index's
    whole walk was ~11 ms of CFX204 (issue 15)."""
    if "optimizer-sites" in ctx.notes:
        return bool(ctx.notes["optimizer-sites"])
    imports = ctx.imports
    aliases = [local for local, target in imports.aliases.items() if LIBRARY_TRAINER.match(target)]
    lines = _word_lines(ctx.source.text, aliases)
    if lines is None:
        return bool(optimizer_sites(ctx))
    from cfgfix.analysis.word_lines import calls_on_lines

    trainer = False
    for call in calls_on_lines(ctx.document.tree, lines) if lines else ():
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in ("step", "unscale_"):
            return bool(optimizer_sites(ctx))  # a step: the flow starts from every optimizer
        trainer = trainer or bool(LIBRARY_TRAINER.match(imports.qualify(func) or ""))
    return trainer


def _word_lines(text: str, aliases: list[str]) -> list[int] | None:
    """The lines (sorted) where `step` or `unscale_` or an alias stands as a word, or a word
    ends with `Trainer`; None when
    some character's NFKC form holds an ASCII letter, digit or `_` (Python would read
    `Ｔrainer` as `Trainer`), or the text has a lone carriage return."""
    if "\r" in text:
        return None
    if not text.isascii():
        import unicodedata

        rest = text.encode("utf-8", "surrogatepass").translate(None, _ASCII).decode("utf-8", "surrogatepass")
        for char in set(rest):
            if any(c.isascii() and (c.isalnum() or c == "_") for c in unicodedata.normalize("NFKC", char)):
                return None
    hits = []
    for word, whole in [("Trainer", False), ("step", True), ("unscale_", True), *((a, True) for a in aliases)]:
        at = text.find(word)
        while at >= 0:
            end = at + len(word)
            if (end == len(text) or not _identifier_char(text[end])) and (
                not whole or at == 0 or not _identifier_char(text[at - 1])
            ):
                hits.append(at)
            at = text.find(word, end)
    lines, line, counted = [], 1, 0
    for at in sorted(hits):
        line += text.count("\n", counted, at)
        counted = at
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


_ASCII = bytes(range(128))


def _identifier_char(char: str) -> bool:
    return char.isalnum() or char == "_" or (not char.isascii() and ("_" + char).isidentifier())


def optimizer_sites(ctx) -> list:
    """The index's calls of an optimizer class or a transformers/trl `*Trainer`."""
    sites = ctx.notes.get("optimizer-sites")
    if sites is None:
        sites = ctx.notes["optimizer-sites"] = [
            s for s in ctx.index.calls if s.name and (OPTIMIZER.search(s.name) or LIBRARY_TRAINER.match(s.name))
        ]
    return sites
