#!/usr/bin/env python3
"""Score cfgfix against DeepSpeed's own config tests (`cases.jsonl`, see build_cases.py).

Each case becomes a project of its own: `ds_config.json` (the case's config), a
`requirements.txt` pinning the DeepSpeed release the tests belong to, a `train.py` that hands
the config to `deepspeed.initialize`, and `run.sh`: `deepspeed --num_gpus W train.py
--deepspeed --deepspeed_config ds_config.json` (W the test's world size). cfgfix "refuses" a
case when `cfgfix check` reports an error-severity finding on `ds_config.json`.

    python bench/deepspeed_tests/score.py [--cfgfix "python -m cfgfix"] [--details]

It prints the confusion matrix (DeepSpeed accepts/refuses x cfgfix silent/error) and each
disagreement with cfgfix's codes. Only the standard library is needed; CI does not run it."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = """import argparse
import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
model = torch.nn.Linear(8, 8)
engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
"""


def project(root: Path, row: dict, release: str) -> None:
    root.mkdir(parents=True)
    text = row.get("text")
    if text is None:
        text = json.dumps(row["config"], indent=2) + "\n"
    (root / "ds_config.json").write_text(text)
    (root / "requirements.txt").write_text(f"deepspeed=={release}\ntorch==2.9.1\n")
    (root / "train.py").write_text(TRAIN)
    gpus = f"--num_gpus {row['world_size']} " if row.get("world_size") else ""  # None: a world size not stated
    (root / "run.sh").write_text(f"deepspeed {gpus}train.py --deepspeed --deepspeed_config ds_config.json\n")


def errors(cfgfix: list[str], root: Path) -> list[str]:
    out = subprocess.run([*cfgfix, "check", ".", "--no-cache", "--output-format", "json"], cwd=root,
                         capture_output=True, text=True)
    if out.returncode not in (0, 1):
        return [f"cfgfix failed ({out.returncode}): {out.stderr.strip()[-300:]}"]
    found = json.loads(out.stdout or "[]")
    return [f"{f['code']}: {f['message']}" for f in found
            if f["filename"] == "ds_config.json" and f["severity"] == "error"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfgfix", default=f"{sys.executable} -m cfgfix", help="command that runs cfgfix")
    parser.add_argument("--release", default="0.19.6", help="the DeepSpeed release the cases belong to")
    parser.add_argument("--details", action="store_true", help="list every case")
    parser.add_argument("--cases", default=str(HERE / "cases.jsonl"),
                        help="cases.jsonl (the tests' own verdicts) or accepted.jsonl (configs the tests run)")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.cases).read_text().splitlines() if line.strip()]
    cfgfix = shlex.split(args.cfgfix)
    matrix = {(e, c): 0 for e in ("accept", "refuse") for c in ("silent", "error")}
    wrong = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            root = Path(tmp) / row["id"]
            project(root, row, args.release)
            found = errors(cfgfix, root)
            said = "error" if found else "silent"
            matrix[(row["expected"], said)] += 1
            agree = (row["expected"] == "refuse") == bool(found)
            if not agree or args.details:
                wrong.append((row, found, agree))
    agree = matrix[("accept", "silent")] + matrix[("refuse", "error")]
    print(f"DeepSpeed {args.release} config tests: {len(rows)} cases, {agree} agree\n")
    print("| DeepSpeed \\ cfgfix | silent | error |\n| --- | --- | --- |")
    for expected in ("accept", "refuse"):
        print(f"| {expected} | {matrix[(expected, 'silent')]} | {matrix[(expected, 'error')]} |")
    if wrong:
        print("\n| case | DeepSpeed | cfgfix | source |\n| --- | --- | --- | --- |")
        for row, found, ok in wrong:
            said = "; ".join(found) if found else "silent"
            mark = "" if ok else " ✗"
            print(f"| {row['id']}{mark} | {row['expected']} | {said[:160]} | {row['source']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
