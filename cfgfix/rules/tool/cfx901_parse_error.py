"""CFX901 parse-error."""

from __future__ import annotations

from cfgfix.core import Severity
from cfgfix.rules.base import Example, Rule, register


@register
class ParseError(Rule):
    """## What it does
    Reports a file that cfgfix needs to read and cannot parse: a syntax error, invalid
    UTF-8, a binary file, an unreadable file. A Python file is parsed only when an enabled
    rule's trigger words appear in it, so a broken file that no rule could match is not
    reported (cfgfix is not a Python syntax checker). A DeepSpeed JSON with `//` or `/* */`
    comments or trailing commas is a warning, not an error: DeepSpeed's own loader (hjson, `deepspeed.initialize`)
    reads it, while `json.load` in the HF Trainer and accelerate rejects it; the other rules
    then check it as DeepSpeed reads it (a key written twice in it is still CFX510).
    Python newer than the interpreter running cfgfix (a PEP 701 f-string on Python 3.11) is
    not an error: libcst's parser, which knows current Python, reads it and the rules run;
    only code that no current Python accepts is. A notebook (`.ipynb`) that is not valid
    JSON, or whose joined code cells do not parse, is reported at its cell.

    ## Why is this bad?
    cfgfix cannot check what it cannot parse, and a training script with a syntax error will
    not run either. The finding says why, and the rest of the files are checked as usual.

    ## Example
    ```python
    model = AutoModel.from_pretrained("m"
    ```

    ## Use instead
    ```python
    model = AutoModel.from_pretrained("m")
    ```

    ## Fix safety
    No fix. A file that failed to parse is never written by `cfgfix fix`.

    ## References
    - Python's own `SyntaxError` message is repeated in the finding.
    """

    code = "CFX901"
    name = "parse-error"
    severity = Severity.ERROR
    kinds = ("python", "shell", "yaml", "json", "dockerfile", "makefile", "env")
    VALID = [
        Example("x = 1\n", why="a file that parses"),
        Example("print 'hello'\n", why="a Python 2 file no rule needs to read"),
    ]
    INVALID = [
        Example(
            "import torch\nmodel = AutoModel.from_pretrained(\nmodel.to('cuda')\n",
            why="an unclosed call in a file a rule needs to read",
            line=2,
        ),
    ]

    def check(self, ctx):
        return ()
