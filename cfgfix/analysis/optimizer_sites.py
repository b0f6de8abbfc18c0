"""The calls that build an optimizer or a library trainer: where the parameter flow
(analysis/parameters.py) starts, and without which it finds nothing. A module of its own
so that CFX204 can ask before importing the flow or the autocast facts (analysis/amp.py):
those imports were ~4.5 and ~2.2 ms of a 5-file pre-commit run, on a trainer module that
builds no optimizer (issue 15)."""

from __future__ import annotations

import re

OPTIMIZER = re.compile(
    r"(^|\.)(Adam\w*|AdamW\w*|SGD\w*|RMSprop|Adagrad|Adadelta|Adamax|NAdam|RAdam|ASGD|Rprop|LBFGS|"
    r"Adafactor|Lion\w*|LAMB|Lamb|PagedAdam\w*|AdEMAMix\w*)$"
)
PARAM_METHODS = {"parameters", "named_parameters"}
# A library trainer that builds its own optimizer over the model it is given.
LIBRARY_TRAINER = re.compile(r"^(transformers|trl)\.(\w+\.)*\w*Trainer$")


def optimizer_sites(ctx) -> list:
    """The index's calls of an optimizer class or a transformers/trl `*Trainer`."""
    sites = ctx.notes.get("optimizer-sites")
    if sites is None:
        sites = ctx.notes["optimizer-sites"] = [
            s for s in ctx.index.calls if s.name and (OPTIMIZER.search(s.name) or LIBRARY_TRAINER.match(s.name))
        ]
    return sites
