"""Score `cfgfix explain` on framework projects against the fields written in manifest.jsonl.

Each manifest row names a public repository at a pinned commit, the file that holds the
launch (and its line when the file holds several), and the fields the framework resolves to
at that version, determined by reading the framework's code before cfgfix ran on it. A row
may add a launch (`add_launch`, written to `launch_file`) for a script its users run with
plain `python x.py` and whose repository states no launch.

    python bench/frameworks/score.py [--mirrors /work/.mirror] [--only trl] [--json out.json] [-v]

Repositories are read from bare mirrors (`<mirrors>/<owner>+<name>/repo`, as the session's
`fetch` leaves them) and exported with `git archive` into a temporary folder; nothing is
downloaded. A row whose repository or commit is missing is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.jsonl"


def load_rows(path: Path = MANIFEST) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def export(mirror: Path, commit: str, target: Path) -> bool:
    """The repository's tree at `commit` written under `target`. A snapshot may lack its
    largest blobs (images, data files): those files are left out, as no launch reads them."""
    listing = subprocess.run(["git", "-C", str(mirror), "ls-tree", "-r", "-z", commit],
                             capture_output=True, check=False)
    if listing.returncode != 0:
        return False
    entries = []
    for item in listing.stdout.split(b"\0"):
        if not item:
            continue
        meta, name = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode != b"120000":
            entries.append((sha.decode(), name.decode("utf-8", "surrogateescape")))
    batch = subprocess.run(["git", "-C", str(mirror), "cat-file", "--batch"], capture_output=True, check=False,
                           input="".join(sha + "\n" for sha, _ in entries).encode())
    out, at = batch.stdout, 0
    for sha, name in entries:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if header[-1] == b"missing":
            continue
        size = int(header[2])
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out[at:at + size])
        at += size + 1
    return True


def explain(root: Path, command: str = "explain") -> list[dict]:
    """`cfgfix explain --output-format json` (or `estimate`) on `root`, run from `root`."""
    run = subprocess.run([sys.executable, "-m", "cfgfix", command, "--no-cache", "--output-format", "json", "."],
                         cwd=root, capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(HERE.parent.parent))})
    try:
        return json.loads(run.stdout)
    except json.JSONDecodeError:
        return []


def pick(setups: list[dict], row: dict) -> dict | None:
    """The setup of the row's launch: in `launch_file`, the one starting nearest `launch_line`
    (a command's first line may be an environment prefix line above it)."""
    target = os.path.normpath(row["launch_file"])
    found = [s for s in setups if os.path.normpath(s["launch"]["path"]) == target]
    line = row.get("launch_line")
    if line is None:
        return found[0] if found else None
    near = [s for s in found if line - 3 <= s["launch"]["line"] <= line + 1]
    return min(near, key=lambda s: abs(s["launch"]["line"] - line)) if near else None


def same(expected, got) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return float(expected) == float(got)
    return expected == got


def score_row(row: dict, mirrors: Path, estimate: bool = False) -> dict:
    mirror = mirrors / row["repo"].replace("/", "+") / "repo"
    result = {"id": row["id"], "framework": row["framework"], "fields": {}, "error": None}
    if not mirror.is_dir():
        result["error"] = f"no mirror at {mirror}"
        return result
    with tempfile.TemporaryDirectory(prefix="cfgfix-fw-") as tmp:
        root = Path(tmp) / "repo"
        if not export(mirror, row["commit"], root):
            result["error"] = f"commit {row['commit']} not in {mirror}"
            return result
        if row.get("add_launch"):
            launch = root / row["launch_file"]
            launch.parent.mkdir(parents=True, exist_ok=True)
            launch.write_text(row["add_launch"] + "\n")
        setup = pick(explain(root), row)
        if estimate:  # does `cfgfix estimate` give this launch a figure, and if not, why
            entry = pick(explain(root, "estimate"), row)
            result["estimate"] = None if entry is None else (
                "estimated" if entry.get("estimate") else str(entry.get("problem") or "no estimate"))
    settings = setup["settings"] if setup is not None else {}
    if setup is None:
        result["error"] = "no setup for the launch"
    for field, expected in row["expected"].items():
        entry = settings.get(field)
        got = entry["value"] if isinstance(entry, dict) else None
        result["fields"][field] = {"expected": expected, "got": got, "ok": same(expected, got)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--only", help="one framework (trl, lightning, ...)")
    parser.add_argument("--json", type=Path, help="write the per-row results here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every field")
    parser.add_argument("--estimate", action="store_true", help="also run `cfgfix estimate` on each launch")
    args = parser.parse_args(argv)
    rows = [r for r in load_rows(args.manifest) if args.only in (None, r["framework"])]
    results = [score_row(row, args.mirrors, args.estimate) for row in rows]
    totals: dict[str, list[int]] = {}
    for result in results:
        right = sum(f["ok"] for f in result["fields"].values())
        total = len(result["fields"])
        counts = totals.setdefault(result["framework"], [0, 0, 0])
        counts[0] += right
        counts[1] += total
        counts[2] += 1
        note = f"  ({result['error']})" if result["error"] else ""
        if args.estimate:
            note += f"  estimate: {result.get('estimate')}"
        print(f"{result['id']:40s} {right:2d}/{total:2d}{note}")
        if args.verbose:
            for field, f in result["fields"].items():
                if not f["ok"]:
                    print(f"    {field}: expected {f['expected']!r}, got {f['got']!r}")
    for framework, (right, total, count) in sorted(totals.items()):
        print(f"{framework}: {right}/{total} fields right on {count} launches")
    if args.estimate:
        estimated = sum(r.get("estimate") == "estimated" for r in results)
        print(f"estimate: {estimated}/{len(results)} launches get a figure")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
