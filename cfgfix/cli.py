"""Entry point. `cfgfix --version` answers before anything heavy is imported (the click
command tree, the engine and the rules load only for real commands)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        from cfgfix import __version__

        print(f"cfgfix {__version__}")
        raise SystemExit(0)
    from cfgfix.commands import cli

    cli.main(args=args, prog_name="cfgfix")
