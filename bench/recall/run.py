"""Precision and recall of cfgfix on labelled real-world training code.

The manifest (manifest.jsonl) names public files at recorded commits and, for each, the
findings a correct tool must report (code, line, reason). This script materialises those
projects from local git snapshots into a cache folder outside the repository (whole
projects, relative paths kept, so multi-module analysis sees the loader module and the
launch script), runs `cfgfix check --select CFX --output-format json --no-cache` in each
project root on the manifest's files, matches findings to labels, and prints TP / FP /
FN / precision / recall per rule code and per family. See README.md.

    python bench/recall/run.py --cfgfix /work/main/.venv/bin/cfgfix
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MIRROR = os.environ.get("CFGFIX_RECALL_MIRROR", "/work/.mirror")
DEFAULT_CACHE = os.environ.get("CFGFIX_RECALL_CACHE", str(Path.home() / ".cache" / "cfgfix-recall"))

# Only files cfgfix (or its project model) may read are materialised: source, launch
# scripts, configs, pins. Checkpoints, data and images are never needed and can be huge.
TEXT_SUFFIXES = {
    ".py", ".pyi", ".sh", ".bash", ".zsh", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini",
    ".txt", ".env", ".mk", ".slurm", ".sbatch", ".job", ".pbs", ".dockerfile", ".ipynb",
}
TEXT_NAMES = {"Makefile", "makefile", "GNUmakefile", "Dockerfile", "Containerfile", ".env"}
MAX_BYTES = 1_000_000
MAX_BARE_BYTES = 100_000  # files without a suffix: configs and launch scripts are small
MAX_NOTEBOOK_BYTES = 20_000_000  # a notebook's saved outputs can dwarf its code


def load_manifest(path: Path) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                sys.exit(f"{path}:{number}: not JSON: {exc}")
    return records


def git_dir(mirror: Path, repo: str) -> Path | None:
    base = mirror / repo.replace("/", "+") / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "objects").is_dir():
            return candidate
    return None


def materialise(repo: str, commit: str, mirror: Path, cache: Path) -> Path:
    """The project at `commit`, extracted once into the cache (text files only)."""
    target = cache / repo.replace("/", "+") / commit[:12]
    # The marker names the extraction format: a cache made before notebooks were extracted
    # (v1) lacks the .ipynb files, one made before files without a suffix were (v2) lacks
    # configs such as `config/accelerate_config/deepspeed`; both are extracted again.
    done = target / ".cfgfix-recall-complete-v3"
    if done.exists():
        return target
    gd = git_dir(mirror, repo)
    if gd is None:
        raise RuntimeError(f"no snapshot of {repo} under {mirror} (fetch it first, see README)")
    listing = subprocess.run(
        ["git", "--git-dir", str(gd), "ls-tree", "-r", "-l", "-z", commit],
        capture_output=True, check=True,
    ).stdout.decode("utf-8", "replace")
    wanted: list[tuple[str, str]] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, kind, sha, size = meta.split()
        name = path.rsplit("/", 1)[-1]
        limit = MAX_NOTEBOOK_BYTES if name.endswith(".ipynb") else MAX_BYTES
        if kind != "blob" or mode == "120000" or not size.isdigit() or int(size) > limit:
            continue
        suffix = os.path.splitext(name)[1].lower()
        if name in TEXT_NAMES or suffix in TEXT_SUFFIXES or (not suffix and int(size) <= MAX_BARE_BYTES):
            wanted.append((sha, path))  # a file without a suffix may be a config (`--config_file config/deepspeed`)
    target.mkdir(parents=True, exist_ok=True)
    batch = subprocess.Popen(
        ["git", "--git-dir", str(gd), "cat-file", "--batch"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert batch.stdin and batch.stdout
    for sha, path in wanted:
        batch.stdin.write(sha.encode() + b"\n")
        batch.stdin.flush()
        header = batch.stdout.readline().split()
        if len(header) < 3:
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)
        out = target / path
        if ".." in Path(path).parts:
            continue
        if not os.path.splitext(path)[1] and path.rsplit("/", 1)[-1] not in TEXT_NAMES and b"\0" in data[:8192]:
            continue  # a binary without a suffix
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    batch.stdin.close()
    batch.wait()
    done.write_text(commit + "\n")
    return target


def run_cfgfix(cfgfix: str, root: Path, paths: list[str], timeout: int) -> tuple[list[dict], str, float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [cfgfix, "check", "--select", "CFX", "--output-format", "json", "--no-cache", *paths],
            cwd=root, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout}s", time.perf_counter() - start
    elapsed = time.perf_counter() - start
    if not proc.stdout.strip():
        # `--output-format json` prints `[]` even when all checks pass: no output at all
        # (cfgfix failed to import, crashed) must not score as "no findings"
        return [], f"exit {proc.returncode}, no output: {proc.stderr.strip()[-300:]}", elapsed
    try:
        findings = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return [], f"exit {proc.returncode}, no JSON: {proc.stderr.strip()[-300:]}", elapsed
    # exit 2: findings were reported, and so were errors (a file or a rule that failed)
    return findings, (f"exit 2: {proc.stderr.strip()[-300:]}" if proc.returncode == 2 else ""), elapsed


def match(labels: list[dict], findings: list[dict], tolerance: int):
    """One-to-one: each label takes the nearest unused finding of its code within the
    tolerance. Returns (matched pairs, unmatched labels, unmatched findings). In a notebook
    a label names its cell (1-based among all cells, as cfgfix reports it) and a line
    inside that cell; a finding in another cell never matches it."""
    used: set[int] = set()
    pairs, missed = [], []
    for label in sorted(labels, key=lambda l: (l.get("cell") or 0, l["line"])):
        best = None
        for i, f in enumerate(findings):
            if i in used or f["code"] != label["code"]:
                continue
            if label.get("cell") != f.get("cell"):
                continue
            row = f["location"]["row"]
            # A label may span a multi-line statement (line..end_line): a chained
            # `from_pretrained(...)\n.half()` is one cast, reported at either end.
            end = label.get("end_line", label["line"])
            distance = 0 if label["line"] <= row <= end else min(abs(row - label["line"]), abs(row - end))
            if distance <= tolerance and (best is None or distance < best[0]):
                best = (distance, i)
        if best is None:
            missed.append(label)
        else:
            used.add(best[1])
            pairs.append((label, findings[best[1]]))
    extra = [f for i, f in enumerate(findings) if i not in used]
    return pairs, missed, extra


def position(cell, line) -> str:
    """`12`, or `cell 3:2` for a notebook (ruff's and cfgfix's way of naming a cell)."""
    return f"cell {cell}:{line}" if cell is not None else str(line)


def ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "–"


def table(counts: dict[str, collections.Counter], title: str) -> list[str]:
    rows = [f"| {title} | labels | TP | FP | FN | precision | recall |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(counts):
        c = counts[key]
        rows.append(
            f"| {key} | {c['tp'] + c['fn']} | {c['tp']} | {c['fp']} | {c['fn']} | "
            f"{ratio(c['tp'], c['tp'] + c['fp'])} | {ratio(c['tp'], c['tp'] + c['fn'])} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cfgfix", default="cfgfix", help="the cfgfix executable to measure")
    parser.add_argument("--manifest", type=Path, default=HERE / "manifest.jsonl")
    parser.add_argument("--mirror", type=Path, default=Path(DEFAULT_MIRROR), help="folder of git snapshots (owner+name/repo)")
    parser.add_argument("--cache", type=Path, default=Path(DEFAULT_CACHE), help="where projects are materialised")
    parser.add_argument("--tolerance", type=int, default=2, help="lines between a label and a finding that still match")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per project")
    parser.add_argument("--section", help="write the tables into results.md under this heading (replacing it)")
    parser.add_argument("--results", type=Path, help="results file for --section (default: results.md beside the manifest)")
    parser.add_argument("--details", action="store_true", help="print every FP and FN")
    parser.add_argument("--only", help="only records whose repo contains this text")
    args = parser.parse_args()
    if args.results is None:
        args.results = args.manifest.resolve().parent / "results.md"
    if os.sep in args.cfgfix:  # cfgfix runs in each project's root: a relative path would break
        args.cfgfix = str(Path(args.cfgfix).resolve())

    records = load_manifest(args.manifest)
    if args.only:
        records = [r for r in records if args.only in r["repo"]]
    by_project: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for record in records:
        by_project[(record["repo"], record["commit"])].append(record)

    per_code: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unscored: collections.Counter = collections.Counter()
    unscored_list: list[tuple[str, str, str]] = []  # the version-gated findings not scored, for --details
    fps, fns, errors = [], [], []
    total_time = 0.0
    for (repo, commit), files in sorted(by_project.items()):
        try:
            root = materialise(repo, commit, args.mirror, args.cache)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            errors.append(f"{repo}@{commit[:12]}: {exc}")
            for record in files:  # a project that cannot be read counts as all missed
                for label in record["labels"]:
                    per_code[label["code"]]["fn"] += 1
            continue
        findings, error, elapsed = run_cfgfix(args.cfgfix, root, [r["path"] for r in files], args.timeout)
        total_time += elapsed
        if error:
            errors.append(f"{repo}@{commit[:12]}: {error}")
        by_file = collections.defaultdict(list)
        for f in findings:
            by_file[Path(f["filename"]).as_posix()].append(f)
        for record in files:
            skip = set(record.get("unscored", []))
            got = [f for f in by_file.get(record["path"], []) if f["code"] not in skip]
            for f in by_file.get(record["path"], []):
                if f["code"] in skip:
                    unscored[f["code"]] += 1
                    unscored_list.append((f["code"], f"{repo}/{record['path']}:{position(f.get('cell'), f['location']['row'])}",
                                          f["message"]))
            labels = [l for l in record["labels"] if l["code"] not in skip]
            pairs, missed, extra = match(labels, got, args.tolerance)
            for label, _ in pairs:
                per_code[label["code"]]["tp"] += 1
            for label in missed:
                per_code[label["code"]]["fn"] += 1
                fns.append((label["code"], f"{repo}/{record['path']}:{position(label.get('cell'), label['line'])}", label["reason"]))
            for f in extra:
                per_code[f["code"]]["fp"] += 1
                fps.append((f["code"], f"{repo}/{record['path']}:{position(f.get('cell'), f['location']['row'])}", f["message"]))
            for label in labels:
                per_code[label["code"]]["labels"] += 0  # keep codes with labels in the table

    families: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for code, c in per_code.items():
        families[code[:4] + "xx"].update(c)
        families["all"].update(c)
    n_repos = len({r["repo"] for r in records})
    n_labels = sum(len(r["labels"]) for r in records)
    head = [
        f"{len(records)} files from {n_repos} repositories, {n_labels} labels; "
        f"line tolerance ±{args.tolerance}; cfgfix: `{args.cfgfix}`; "
        f"cfgfix time {total_time:.1f}s over {len(by_project)} projects.",
    ]
    if unscored:
        head.append(
            "Findings of version-gated codes in projects that do not pin the package, not scored: "
            + ", ".join(f"{k} {v}" for k, v in sorted(unscored.items())) + "."
        )
    out = head + [""] + table(per_code, "code") + [""] + table(families, "family")
    if errors:
        out += ["", "Errors:"] + [f"- {e}" for e in errors]
    print("\n".join(out))
    if args.details:
        print("\nFalse positives:")
        for code, where, message in sorted(fps):
            print(f"  FP {code} {where}  {message[:160]}")
        print("\nFalse negatives:")
        for code, where, reason in sorted(fns):
            print(f"  FN {code} {where}  {reason[:160]}")
        if unscored_list:
            print("\nNot scored (version-gated codes in projects that do not pin the package):")
            for code, where, message in sorted(unscored_list):
                print(f"  NS {code} {where}  {message[:160]}")
    if args.section:
        write_section(args.results, args.section, out, fps, fns)
    return 0


def write_section(results: Path, heading: str, body: list[str], fps, fns) -> None:
    text = results.read_text(encoding="utf-8") if results.exists() else "# cfgfix precision and recall on labelled real code\n"
    marker = f"## {heading}\n"
    detail = ["", "<details><summary>False positives and false negatives</summary>", ""]
    detail += [f"- FP {c} `{w}`: {m[:200]}" for c, w, m in sorted(fps)]
    detail += [f"- FN {c} `{w}`: {r[:200]}" for c, w, r in sorted(fns)]
    detail += ["", "</details>"]
    section = marker + "\n" + "\n".join(body + detail) + "\n"
    if marker in text:
        start = text.index(marker)
        nxt = text.find("\n## ", start + len(marker))
        text = text[:start] + section + (text[nxt + 1:] if nxt != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
