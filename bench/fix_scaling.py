"""`cfgfix fix` against `cfgfix check` on growing trees: N copies of the fixtures' projects.

    .venv/bin/python bench/fix_scaling.py [--copies 4 8 16 32] [--json]

Each size gets a fresh copy of the tree for each command; the figure is the CPU time
(user + system) of the cfgfix process, so a busy machine changes it little. `fix` runs with
`--unsafe-fixes` (the most edits) and `--no-cache`, like `check`. A fix pass re-lints each
fixed file a few times; it must not re-analyse the whole project each time (issue 14: 4 -> 32
projects cost 2.9 s -> 127 s before, while check cost 0.6 s -> 2.0 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CFGFIX = Path(sys.executable).parent / "cfgfix"


def make_tree(dest: Path, copies: int) -> None:
    projects = sorted((REPO / "fixtures").glob("*/project"))
    for i in range(copies):
        source = projects[i % len(projects)]
        shutil.copytree(source, dest / f"p{i:03d}-{source.parent.name}")


def cpu_seconds(args: list[str], cwd: Path) -> tuple[float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(CFGFIX), *args], cwd=cwd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"cfgfix {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def measure(copies: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cfgfix-fix-scaling-") as tmp:
        row = {"copies": copies}
        for name, args in (("check", ["check", "--no-cache", "-q"]),
                           ("fix", ["fix", "--unsafe-fixes", "--no-cache", "-q"])):
            tree = Path(tmp) / name
            tree.mkdir()
            make_tree(tree, copies)
            (tree / "cfgfix.toml").write_text('gpu = "RTX 4090"\n')  # one settings file for the tree
            row[f"{name}_cpu_s"] = round(cpu_seconds(args, tree)[0], 2)
        row["ratio"] = round(row["fix_cpu_s"] / row["check_cpu_s"], 1)
        return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(n) for n in args.copies]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'copies':>6} {'check CPU s':>12} {'fix CPU s':>10} {'fix/check':>10}")
        for r in rows:
            print(f"{r['copies']:>6} {r['check_cpu_s']:>12.2f} {r['fix_cpu_s']:>10.2f} {r['ratio']:>10.1f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    raise SystemExit(main())
