"""`python -m cfgfix`. Python put the current folder first on `sys.path`; run inside a
project, that folder's own `typing.py` or `click.py` would shadow the real module the
moment cfgfix imports it, running the project's code. The `cfgfix` entry point never has
that entry, so drop it here too, before importing anything else."""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from cfgfix.cli import main  # after the sys.path fix: that is this module's point

if __name__ == "__main__":
    main()
