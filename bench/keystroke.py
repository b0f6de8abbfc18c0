"""The runs a developer feels: a pre-commit run on a few changed files, `cfgfix --version`,
and a warm whole-tree run, each next to ruff on the same files, measured in one interleaved
run (issue 15).

Every round runs every command once, in the same order, so load from other processes on
a shared machine falls on all of them alike; tables give the min and median over rounds.
CPU is user+sys of the one child (os.wait4), wall is perf_counter around it.

    python bench/keystroke.py                       # start-up and 5-file rows, 15 rounds
    python bench/keystroke.py --tree --tree-rounds 3  # and the whole-tree rows
    python bench/keystroke.py --baseline DIR        # and the same cfgfix rows for another
                                                    # checkout (DIR holds its cfgfix/ package)
    python bench/keystroke.py --hook-env            # and the rows of the environment the
                                                    # pre-commit hook runs in (see below)

The bench venv holds cfgfix as an editable install next to ruff, TorchFix and Fixit: its
interpreter starts slower than the one pre-commit gives the hook (an editable finder and
more `.pth` files run at every start). `--hook-env` lets pre-commit itself install this
checkout's HEAD commit as a hook (`repo:` this repository, `rev:` HEAD, its own
PRE_COMMIT_HOME under the bench dir) and adds the same rows for the `cfgfix` and `python`
of the environment it built: what a developer's commit runs.

It uses the bench venv and corpus that `bench/run.py` builds (`bash bench/setup.sh`).
Results go to bench/keystroke.json and into bench/results.md (its "Keystroke" section).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = Path("/tmp/cfgfix-bench")
# Five training files of a real trainer library (the "5 trl trainer files").
TRAINING_FILES = [
    "trl/trainer/dpo_trainer.py",
    "trl/trainer/grpo_trainer.py",
    "trl/trainer/kto_trainer.py",
    "trl/trainer/reward_trainer.py",
    "trl/trainer/sft_trainer.py",
]
RUFF_ALL = ["check", "--select", "ALL", "--exit-zero"]
SECTION = "## Keystroke: pre-commit, start-up and warm runs (bench/keystroke.py)"


def run_once(cmd: list[str], cwd: Path, env: dict, out: Path) -> tuple[float, float, int]:
    with open(out, "wb") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sink, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
    if "Traceback (most recent call last)" in stderr:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-dir", type=Path, default=BENCH)
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the small rows (default %(default)s)")
    ap.add_argument("--tree", action="store_true", help="also the whole-tree rows (cold and warm)")
    ap.add_argument("--tree-rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="a folder holding another checkout's cfgfix/ package")
    ap.add_argument("--label", default="this checkout", help="what the cfgfix rows measure")
    ap.add_argument("--baseline-label", default="baseline")
    ap.add_argument("--hook-env", action="store_true",
                    help="also the rows of the environment pre-commit builds for this checkout's HEAD")
    ap.add_argument("--out", type=Path, default=HERE / "keystroke.json")
    ap.add_argument("--no-results-md", action="store_true", help="do not rewrite bench/results.md's section")
    args = ap.parse_args(argv)

    bench = args.bench_dir.resolve()
    corpus, venv = bench / "corpus", bench / "venv"
    py, cfgfix, ruff = venv / "bin" / "python", venv / "bin" / "cfgfix", venv / "bin" / "ruff"
    for need in (py, cfgfix, ruff, corpus):
        if not need.exists():
            raise SystemExit(f"missing {need}: run `bash bench/setup.sh` first")
    scratch = bench / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), NO_COLOR="1")
    # (label, cfgfix, python, env) for each cfgfix measured
    variants = [(args.label, cfgfix, py, env)]
    if args.baseline:
        variants.append((args.baseline_label, cfgfix, py, {**env, "PYTHONPATH": str(args.baseline.resolve())}))
    if args.hook_env:
        hook_bin = pre_commit_env(bench, venv)
        hook_env = {**env, "PATH": f"{hook_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                    "VIRTUAL_ENV": str(hook_bin.parent)}
        variants.append((f"pre-commit env, {_head()[:7]}", hook_bin / "cfgfix", hook_bin / "python", hook_env))
    files = [f for f in TRAINING_FILES if (corpus / f).is_file()]
    lines = sum(len((corpus / f).read_bytes().splitlines()) for f in files)
    ruff_cache = scratch / "keystroke_ruff_cache"

    small: list[tuple[str, list[str], dict]] = [("python -c pass", [str(py), "-c", "pass"], env)]
    for label, exe, python, venv_env in variants:
        if python != py:
            small.append((f"python -c pass [{label}]", [str(python), "-c", "pass"], venv_env))
        small.append((f"cfgfix --version [{label}]", [str(exe), "--version"], venv_env))
    small.append(("ruff --version", [str(ruff), "--version"], env))
    for label, exe, _, venv_env in variants:
        small.append((f"cfgfix check --no-cache, 5 files (cold) [{label}]",
                      [str(exe), "check", "--no-cache", *files], venv_env))
        small.append((f"cfgfix check, 5 files (cached) [{label}]", [str(exe), "check", *files], venv_env))
    small.append(("ruff check --select ALL --no-cache, 5 files (cold)", [str(ruff), *RUFF_ALL, "--no-cache", *files], env))
    small.append(("ruff check --select ALL, 5 files (cached)",
                  [str(ruff), *RUFF_ALL, "--cache-dir", str(ruff_cache), *files], env))

    tree: list[tuple[str, list[str], dict]] = []
    if args.tree:
        for label, exe, _, venv_env in variants:
            tree.append((f"cfgfix check --no-cache, whole tree (cold) [{label}]",
                         [str(exe), "check", ".", "--no-cache", "--output-format", "json", "--quiet"], venv_env))
            tree.append((f"cfgfix check, whole tree (warm) [{label}]", [str(exe), "check", "."], venv_env))
        tree.append(("ruff check --select ALL --no-cache, whole tree (cold)",
                     [str(ruff), *RUFF_ALL, "--no-cache", "--output-format", "json", "."], env))
        tree.append(("ruff check --select ALL, whole tree (warm)",
                     [str(ruff), *RUFF_ALL, "--cache-dir", str(ruff_cache), "--output-format", "json", "."], env))

    # Fill the caches once (cfgfix's and ruff's), so "cached" and "warm" rows hit them.
    for name, cmd, cmd_env in small + tree:
        if "cached" in name or "warm" in name:
            run_once(cmd, corpus, cmd_env, scratch / "fill.txt")
    results: dict[str, dict] = {}

    def measure(rows, rounds):
        for _ in range(rounds):
            for name, cmd, cmd_env in rows:
                wall, cpu, rc = run_once(cmd, corpus, cmd_env, scratch / "out.txt")
                entry = results.setdefault(name, {"cmd": cmd, "walls": [], "cpus": [], "rcs": set()})
                entry["walls"].append(wall)
                entry["cpus"].append(cpu)
                entry["rcs"].add(rc)
            print(".", end="", flush=True, file=sys.stderr)

    measure(small, args.rounds)
    if tree:
        measure(tree, args.tree_rounds)
    print(file=sys.stderr)
    rows = []
    for name, entry in results.items():
        rows.append({
            "name": name, "cmd": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(entry["cmd"])),
            "rounds": len(entry["walls"]), "rc": sorted(entry["rcs"]),
            "wall_min": min(entry["walls"]), "wall_median": statistics.median(entry["walls"]),
            "cpu_min": min(entry["cpus"]), "cpu_median": statistics.median(entry["cpus"]),
        })
    by = {r["name"]: r for r in rows}

    def ratio(a, b, key="cpu_min"):
        return by[a][key] / by[b][key] if a in by and b in by and by[b][key] else None

    checks = []
    for label, _, python, _ in variants:
        start = by.get(f"python -c pass [{label}]") if python != py else by["python -c pass"]
        for kind in ("cold", "cached"):
            row = by.get(f"cfgfix check{' --no-cache' if kind == 'cold' else ''}, 5 files ({kind}) [{label}]")
            if row:
                checks.append((f"5 training files, {kind}, CPU min [{label}]", f"{row['cpu_min'] * 1000:.0f} ms", "< 150 ms",
                               row["cpu_min"] < 0.150))
        version = by.get(f"cfgfix --version [{label}]")
        if version:
            diff = version["cpu_min"] - start["cpu_min"]
            checks.append((f"cfgfix --version minus python -c pass, CPU min [{label}]", f"{diff * 1000:+.1f} ms",
                           "≤ 5 ms", diff <= 0.005))
            wdiff = version["wall_min"] - start["wall_min"]
            checks.append((f"cfgfix --version minus python -c pass, wall min [{label}]", f"{wdiff * 1000:+.1f} ms",
                           "≤ 5 ms", wdiff <= 0.005))
        warm = ratio(f"cfgfix check, whole tree (warm) [{label}]", "ruff check --select ALL, whole tree (warm)")
        if warm is not None:
            checks.append((f"warm whole tree / ruff --select ALL warm, CPU min [{label}]", f"{warm:.3f}×", "≤ 0.05×",
                           warm <= 0.05))
            wall = ratio(f"cfgfix check, whole tree (warm) [{label}]", "ruff check --select ALL, whole tree (warm)",
                         "wall_min")
            checks.append((f"warm whole tree / ruff --select ALL warm, wall min [{label}]", f"{wall:.3f}×", "", None))
        cold = ratio(f"cfgfix check --no-cache, whole tree (cold) [{label}]",
                     "ruff check --select ALL --no-cache, whole tree (cold)")
        if cold is not None:
            checks.append((f"cold whole tree / ruff --select ALL cold, CPU min [{label}]", f"{cold:.3f}×", "", None))
            wall = ratio(f"cfgfix check --no-cache, whole tree (cold) [{label}]",
                         "ruff check --select ALL --no-cache, whole tree (cold)", "wall_min")
            checks.append((f"cold whole tree / ruff --select ALL cold, wall min [{label}]", f"{wall:.3f}×", "", None))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    commit = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    if args.hook_env and commit.endswith("-dirty"):
        print("note: the pre-commit env rows measure HEAD, without the uncommitted changes", file=sys.stderr)
    meta = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cores": os.cpu_count(), "python": platform.python_version(),
        "checkout": commit, "baseline": str(args.baseline) if args.baseline else None, "files": files, "lines": lines,
        "load_after": load,
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "checks": checks}, indent=2, default=list) + "\n")
    md = render(meta, rows, checks, args)
    print(md)
    if not args.no_results_md:
        path = HERE / "results.md"
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        head = text.split(SECTION)[0].rstrip("\n")
        path.write_text((head + "\n\n" if head else "") + md, encoding="utf-8")
    return 0


def _head() -> str:
    return subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def pre_commit_env(bench: Path, venv: Path) -> Path:
    """The bin folder of the environment pre-commit builds for this checkout's HEAD as a
    hook repository: pre-commit clones the commit and `pip install`s it (not editable), as
    for a user's `.pre-commit-config.yaml`. Built once per commit (pre-commit reuses it)."""
    import sqlite3

    pre_commit = venv / "bin" / "pre-commit"
    if not pre_commit.exists():
        subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", "pre-commit"],
                       check=True)
    home, project = bench / "pre-commit-home", bench / "scratch" / "hook-project"
    project.mkdir(parents=True, exist_ok=True)
    repo, rev = str(HERE.parent), _head()
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {repo}\n  rev: {rev}\n  hooks:\n  - id: cfgfix\n", encoding="utf-8")
    if not (project / ".git").exists():
        subprocess.run(["git", "init", "-q", str(project)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PRE_COMMIT_HOME"] = str(home)
    proc = subprocess.run([str(pre_commit), "install-hooks"], cwd=project, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"pre-commit install-hooks failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with sqlite3.connect(home / "db.db") as db:
        row = db.execute("SELECT path FROM repos WHERE repo = ? AND ref = ?", (repo, rev)).fetchone()
    found = sorted(Path(row[0]).glob("py_env-*/bin/cfgfix")) if row else []
    if not found:
        raise SystemExit(f"pre-commit built no cfgfix for {repo}@{rev} under {home}")
    return found[-1].parent


def render(meta, rows, checks, args) -> str:
    out = [SECTION, ""]
    out.append(f"- Generated {meta['generated']} on {meta['cores']} cores, Python {meta['python']}, checkout "
               f"{meta['checkout']}" + (f"; baseline rows: the cfgfix package in `{meta['baseline']}`" if meta["baseline"] else "")
               + f"; load average after the run {meta['load_after']:.1f}." if meta["load_after"] is not None else ".")
    out.append(f"- 5 files: {', '.join(f'`{f}`' for f in meta['files'])} ({meta['lines']:,} lines), "
               f"run from the corpus root. Interleaved: each round runs every row once; "
               f"{args.rounds} rounds for the small rows"
               + (f", {args.tree_rounds} for the whole-tree rows." if args.tree else "."))
    out.append("- CPU = user+sys of the one process (os.wait4); wall = elapsed. Caches (cfgfix's `.cfgfix_cache`, "
               "ruff's `--cache-dir`) are filled once before the rounds.")
    out += ["", "| run | rounds | wall min | wall median | CPU min | CPU median |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['name']} | {r['rounds']} | {_ms(r['wall_min'])} | {_ms(r['wall_median'])} | "
                   f"{_ms(r['cpu_min'])} | {_ms(r['cpu_median'])} |")
    out += ["", "| check | value | target | met |", "| --- | ---: | ---: | :---: |"]
    for name, value, target, met in checks:
        out.append(f"| {name} | {value} | {target} | {'' if met is None else ('yes' if met else 'no')} |")
    return "\n".join(out) + "\n"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
