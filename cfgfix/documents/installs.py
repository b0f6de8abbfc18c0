"""What a `pip install` command line installs: the requirement arguments, without options
and their values. Shared by notebooks (`%pip install ...` cells), Dockerfile `RUN` lines and
README code blocks, which are version evidence when a project pins nothing else."""

from __future__ import annotations

import re

from cfgfix.core import LazyRegex

# `pip install`, `pip3 install`, `python -m pip install`, `uv pip install`, after `!`/`%` or `RUN`
_INSTALL = LazyRegex(r"(?:^|[\s;&|(!%])(?:(?:\S*python3?(?:\.\d+)?)\s+-m\s+)?(?:uv\s+)?pip3?\s+install\s+([^\n;&|)#]*)")
# options whose value is the next word (a file, an index): never a requirement
_VALUE_OPTIONS = {"-r", "-c", "-e", "-i", "-f", "-t", "--index-url", "--extra-index-url", "--find-links",
                  "--requirement", "--constraint", "--target", "--prefix", "--root", "--editable",
                  "--platform", "--python-version", "--implementation", "--abi", "--cache-dir", "--src"}


def pip_install_requirements(text: str) -> list[str]:
    """The requirements every `pip install` command in `text` names (`transformers==4.44.2`,
    `'peft>=0.12'`), in order; lines joined where a backslash continues them."""
    text = re.sub(r"\\\r?\n", " ", text)
    found = []
    for match in _INSTALL.finditer(text):
        skip = False
        for word in match.group(1).split():
            word = word.strip("'\"")
            if skip:
                skip = False
                continue
            if word in _VALUE_OPTIONS:
                skip = True
                continue
            if not word or word.startswith(("-", "$", "{", ".", "/", "git+", "http")):
                continue  # options, variables, local paths and URLs pin nothing we can read
            found.append(word)
    return found
