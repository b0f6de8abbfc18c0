#!/usr/bin/env python3
"""cfgfix speed benchmark: cfgfix against ruff, TorchFix and Fixit on real ML code.

A script, not a test. It

1. builds a corpus from code nobody here wrote: the installed source trees of
   transformers, diffusers, peft, trl and accelerate (``pip install --no-deps
   --target``), outside the repository;
2. builds a bench virtualenv with ruff, TorchFix and Fixit, and installs cfgfix
   from the repository (editable); a tool that fails to install is recorded and
   left out;
3. times every tool on the same files in the same run (wall time and the CPU
   time of the child processes: user + sys from ``getrusage(RUSAGE_CHILDREN)``),
   and writes ``results.json`` and ``results.md`` beside this script.

TorchFix and Fixit are ~1000x slower than ruff, so they run on a fixed, seeded
random subset of the corpus files (``--subset-size``); ruff and cfgfix run on
that subset too, so the subset ratios are measured on identical files. Their
full-corpus figures are *extrapolated by lines* and marked as such.

Usage::

    python bench/run.py [--corpus DIR] [--skip-setup]

Only the standard library is needed to run this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_DEFAULT = HERE.parent
BENCH_DIR_DEFAULT = Path("/tmp/cfgfix-bench")

# The corpus. Pinned so that figures taken on different days compare; if a pin
# cannot be installed the script falls back to the newest release and records it.
CORPUS_PACKAGES = {
    "transformers": "5.23.0",
    "diffusers": "0.42.1",
    "peft": "0.21.2",
    "trl": "1.16.0",
    "accelerate": "1.15.0",
}
TOOLS = ["ruff", "torchfix", "fixit"]

# Targets from issue 2 ("Speed").
TARGET_COLD_VS_RUFF = 2.0  # cfgfix cold wall <= 2x ruff --select ALL cold wall
TARGET_WARM_VS_RUFF = 1.0  # cfgfix warm wall <= ruff warm wall
TARGET_VS_TORCHFIX = 50.0  # TorchFix wall / cfgfix wall >= 50
TARGET_PRECOMMIT_S = 0.300  # 5 changed files
TARGET_VERSION_S = 0.100  # cfgfix --version

RUFF_CHECK = ["check", "--select", "ALL", "--exit-zero"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


# --------------------------------------------------------------------------- setup


def run_quiet(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def pip_output_tail(proc: subprocess.CompletedProcess) -> str:
    # The local package indexes here print one "is ignored" warning per missing
    # project; drop that noise from what we record.
    lines = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "is ignored: it is neither a file nor a directory" not in line
    ]
    return tail("\n".join(lines))


def venv_bin(venv: Path, name: str) -> Path:
    return venv / "bin" / name


def ensure_venv(venv: Path, setup: dict) -> None:
    if not venv_bin(venv, "python").exists():
        log(f"creating venv {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        proc = run_quiet([sys.executable, "-m", "venv", str(venv)])
        if proc.returncode != 0:
            raise SystemExit(f"cannot create venv {venv}:\n{tail(proc.stderr)}")
    setup.setdefault("venv", str(venv))


def install_tools(venv: Path, setup: dict) -> None:
    pip = str(venv_bin(venv, "pip"))
    status = setup.setdefault("tools_install", {})
    for tool in TOOLS:
        log(f"pip install {tool}")
        proc = run_quiet([pip, "install", "--disable-pip-version-check", "-q", tool])
        if proc.returncode == 0:
            status[tool] = "ok"
        else:
            status[tool] = f"install failed (rc={proc.returncode}): {pip_output_tail(proc)}"
            log(status[tool])


def install_cfgfix(venv: Path, repo: Path, setup: dict) -> None:
    pip = str(venv_bin(venv, "pip"))
    log(f"pip install -e {repo}")
    proc = run_quiet([pip, "install", "--disable-pip-version-check", "-q", "-e", str(repo)])
    if proc.returncode == 0:
        setup["cfgfix_install"] = "ok"
        # bytecode up front, as a regular install has it (the timed runs must not compile)
        run_quiet([str(venv_bin(venv, "python")), "-m", "compileall", "-q", str(repo / "cfgfix")])
    else:
        setup["cfgfix_install"] = f"install failed (rc={proc.returncode}): {pip_output_tail(proc)}"
        log(setup["cfgfix_install"].splitlines()[0])


def corpus_present(corpus: Path) -> bool:
    return all((corpus / name).is_dir() for name in CORPUS_PACKAGES)


def build_corpus(corpus: Path, venv: Path, setup: dict) -> None:
    pip = str(venv_bin(venv, "pip"))
    if corpus.exists():
        shutil.rmtree(corpus)
    corpus.mkdir(parents=True)
    base = [pip, "install", "--disable-pip-version-check", "-q", "--no-deps", "--no-compile",
            "--target", str(corpus)]
    pinned = [f"{name}=={ver}" for name, ver in CORPUS_PACKAGES.items()]
    log(f"pip install --no-deps --target {corpus} {' '.join(pinned)}")
    proc = run_quiet(base + pinned)
    setup["corpus_pins"] = "pinned"
    if proc.returncode != 0:
        log("pinned corpus install failed; falling back to the newest releases")
        setup["corpus_pins"] = f"pins failed ({pip_output_tail(proc)[:300]}); newest releases used"
        shutil.rmtree(corpus)
        corpus.mkdir(parents=True)
        proc = run_quiet(base + list(CORPUS_PACKAGES))
        if proc.returncode != 0:
            raise SystemExit(f"corpus install failed:\n{pip_output_tail(proc)}")
    # Keep only the package trees: console-script wrappers and byte code are not source.
    shutil.rmtree(corpus / "bin", ignore_errors=True)
    for cache in list(corpus.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


# ------------------------------------------------------------------------ corpus


def count_lines(path: Path) -> int:
    data = path.read_bytes()
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def scan_py(root: Path) -> list[tuple[str, int]]:
    """Sorted (relative path, line count) for every .py file under root."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        out.append((path.relative_to(root).as_posix(), count_lines(path)))
    return out


def corpus_versions(corpus: Path) -> dict[str, str]:
    versions = {}
    for dist in corpus.glob("*.dist-info"):
        m = re.match(r"(.+?)-([^-]+)\.dist-info$", dist.name)
        if m:
            versions[m.group(1).lower()] = m.group(2)
    return versions


def make_subset(corpus: Path, files: list[tuple[str, int]], size: int, seed: int,
                dest: Path) -> list[tuple[str, int]]:
    """Copy a seeded random sample of the corpus .py files to dest (same relative paths)."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(files, min(size, len(files))))
    if dest.exists():
        shutil.rmtree(dest)
    for rel, _ in chosen:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(corpus / rel, target)
    return chosen


def pick_precommit_files(corpus: Path, files: list[tuple[str, int]], seed: int,
                         n: int = 5) -> list[tuple[str, int]]:
    """n seeded files that mention torch: changes in an ML repo, which cfgfix must really read."""
    rng = random.Random(seed + 1)
    pool = [f for f in files if 50 <= f[1] <= 2000]
    rng.shuffle(pool)
    chosen = []
    for rel, lines in pool:
        if b"torch" in (corpus / rel).read_bytes():
            chosen.append((rel, lines))
            if len(chosen) == n:
                break
    return sorted(chosen)


# ----------------------------------------------------------------------- timing


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cpu_seconds() -> float | None:
    """CPU seconds spent by everything on the machine so far (from /proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    vals = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait
    busy = sum(vals[:3]) + sum(vals[5:8])
    return busy / CLK_TCK


def wait_for_quiet(max_wait: float, threshold: float = 0.15, window: float = 1.0) -> float | None:
    """Wait (up to max_wait s) until the machine's CPU use over `window` falls below threshold.

    Returns the busy fraction last seen (of all cores), or None where /proc/stat is missing.
    """
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait
    while True:
        a = busy_cpu_seconds()
        if a is None:
            return None
        time.sleep(window)
        frac = (busy_cpu_seconds() - a) / (window * cores)
        if frac < threshold or time.monotonic() >= deadline:
            return frac


class Runner:
    def __init__(self, venv: Path, scratch: Path, wait_idle: float = 0.0, retries: int = 0):
        self.wait_idle = wait_idle
        self.retries = retries
        self.max_foreign = 0.0
        self.venv = venv
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["VIRTUAL_ENV"] = str(venv)
        self.env["NO_COLOR"] = "1"
        self.env.pop("PYTHONPATH", None)
        # Users' installs carry bytecode (pip compiles it; an editable checkout writes it on the
        # first import). A shell that sets PYTHONDONTWRITEBYTECODE would make every timed run
        # compile cfgfix from source (~120 ms of a pre-commit run), so it is dropped here.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def once(self, cmd: list[str], cwd: Path) -> dict:
        """Run cmd once; stdout goes to a scratch file (tools must write their report)."""
        out_path = self.scratch / "stdout.txt"
        err_path = self.scratch / "stderr.txt"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            busy0 = busy_cpu_seconds()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=cwd, env=self.env, stdout=out, stderr=err,
                                  stdin=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            busy1 = busy_cpu_seconds()
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        # CPU that other processes on the machine used meanwhile, as a share of all cores:
        # a benchmark on a shared machine is only as good as this number is small.
        foreign = None
        if busy0 is not None and busy1 is not None and wall > 0.05:
            foreign = max(0.0, (busy1 - busy0) - cpu) / (wall * (os.cpu_count() or 1))
        return {
            "foreign": foreign,
            "wall": wall,
            "cpu": cpu,
            "rc": proc.returncode,
            "stdout_bytes": out_path.stat().st_size,
            "stdout_path": out_path,
            "stderr": err_path.read_text(errors="replace"),
        }

    def measure(self, name: str, cmd: list[str], cwd: Path, reps: int, ok_rcs=(0,),
                files: int | None = None, lines: int | None = None, note: str = "",
                keep_stdout: bool = False) -> dict:
        log(f"{name}: {' '.join(map(str, cmd))}  (x{reps}, cwd={cwd})")
        walls, cpus, runs, foreign = [], [], [], []
        quiet_before = wait_for_quiet(self.wait_idle) if self.wait_idle > 0 else None
        if quiet_before is not None and quiet_before >= 0.15:
            log(f"  machine still busy ({quiet_before:.0%} of all cores) after waiting "
                f"{self.wait_idle:.0f}s; measuring anyway")
        retries, discarded = self.retries, []
        while len(walls) < reps:
            r = self.once([str(c) for c in cmd], cwd)
            # A run during which other processes took a large share of the machine is
            # discarded and repeated (when short enough to repeat), after waiting for quiet.
            if (r["foreign"] is not None and r["foreign"] >= 0.15 and retries > 0
                    and r["wall"] < 30 and r["rc"] in ok_rcs):
                retries -= 1
                discarded.append({"wall": r["wall"], "cpu": r["cpu"], "other_load": r["foreign"]})
                log(f"  discarded: wall {r['wall']:.3f}s, other load {r['foreign']:.0%}; retrying")
                if self.wait_idle > 0:
                    wait_for_quiet(self.wait_idle)
                continue
            if r["foreign"] is not None:
                foreign.append(r["foreign"])
            runs.append(r)
            failed = r["rc"] not in ok_rcs or "Traceback (most recent call last)" in r["stderr"]
            if failed:
                log(f"  FAILED rc={r['rc']}: {tail(r['stderr'], 400)}")
                return {
                    "name": name, "cmd": [str(c) for c in cmd], "cwd": str(cwd),
                    "status": "failed", "rc": r["rc"], "stderr_tail": tail(r["stderr"]),
                    "files": files, "lines": lines, "note": note,
                }
            walls.append(r["wall"])
            cpus.append(r["cpu"])
            fg = "" if r["foreign"] is None else f" other-load {r['foreign']:.0%}"
            log(f"  wall {r['wall']:.3f}s cpu {r['cpu']:.3f}s rc={r['rc']}{fg}")
        last = runs[-1]
        other = max(foreign) if foreign else None
        if other is not None:
            self.max_foreign = max(self.max_foreign, other)
        res = {
            "name": name, "cmd": [str(c) for c in cmd], "cwd": str(cwd), "status": "ok",
            "reps": reps, "rc": last["rc"],
            "wall_min": min(walls), "wall_median": statistics.median(walls), "walls": walls,
            "cpu_min": min(cpus), "cpu_median": statistics.median(cpus), "cpus": cpus,
            "files": files, "lines": lines, "note": note,
            "other_load_max": other, "busy_before": quiet_before, "discarded": discarded,
            "stdout_bytes": last["stdout_bytes"], "stderr_tail": tail(last["stderr"], 600),
        }
        if files and lines:
            res["files_per_s"] = files / res["wall_min"]
            res["lines_per_s"] = lines / res["wall_min"]
            res["lines_per_cpu_s"] = lines / res["cpu_min"] if res["cpu_min"] > 0 else None
        if keep_stdout:
            res["_stdout"] = last["stdout_path"].read_text(errors="replace")
        return res


def extrapolate(sub: dict, full_files: int, full_lines: int) -> dict | None:
    """Full-corpus estimate from a subset measurement, scaled by lines."""
    if not sub or sub.get("status") != "ok" or not sub.get("lines"):
        return None
    k = full_lines / sub["lines"]
    return {
        "name": sub["name"].replace("(subset)", "(full corpus, extrapolated)"),
        "status": "extrapolated", "files": full_files, "lines": full_lines,
        "wall_min": sub["wall_min"] * k, "wall_median": sub["wall_median"] * k,
        "cpu_min": sub["cpu_min"] * k, "cpu_median": sub["cpu_median"] * k,
        "files_per_s": full_files / (sub["wall_min"] * k),
        "lines_per_s": sub["lines_per_s"], "lines_per_cpu_s": sub["lines_per_cpu_s"],
        "note": f"extrapolated by lines from the {sub['files']}-file subset (x{k:.1f})",
    }


# ----------------------------------------------------------------------- main


def tool_version(cmd: list[str], env: dict) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None if isinstance(exc, OSError) else "timeout"
    if proc.returncode != 0:
        return None
    return (proc.stdout.strip() or proc.stderr.strip()).splitlines()[0] if (proc.stdout or proc.stderr) else ""


def machine_info() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "memory": mem, "os": platform.platform(),
            "python": platform.python_version()}


def ratio(a: dict | None, b: dict | None, key: str = "wall_min") -> float | None:
    if not a or not b or a.get("status") not in ("ok", "extrapolated") \
            or b.get("status") not in ("ok", "extrapolated"):
        return None
    return a[key] / b[key] if b[key] else None


def count_cfgfix_findings(stdout: str) -> dict:
    try:
        data = json.loads(stdout) if stdout.strip() else []
    except json.JSONDecodeError:
        return {"findings": None, "note": "stdout is not JSON"}
    if not isinstance(data, list):
        return {"findings": None, "note": "JSON is not a list"}
    by_code: dict[str, int] = {}
    for item in data:
        code = item.get("code", "?") if isinstance(item, dict) else "?"
        by_code[code] = by_code.get(code, 0) + 1
    return {"findings": len(data), "by_code": dict(sorted(by_code.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", type=Path, default=BENCH_DIR_DEFAULT,
                    help="scratch folder outside the repo (default %(default)s)")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="corpus folder (default BENCH_DIR/corpus); built there unless --skip-setup")
    ap.add_argument("--venv", type=Path, default=None, help="bench venv (default BENCH_DIR/venv)")
    ap.add_argument("--repo", type=Path, default=REPO_DEFAULT,
                    help="cfgfix checkout to install editable (default %(default)s)")
    ap.add_argument("--skip-setup", action="store_true",
                    help="use the existing venv and corpus as they are (cfgfix is still "
                         "installed if the venv lacks it)")
    ap.add_argument("--setup-only", action="store_true", help="build venv and corpus, then stop")
    ap.add_argument("--rebuild-corpus", action="store_true", help="reinstall the corpus even if present")
    ap.add_argument("--subset-size", type=int, default=300,
                    help="files in the seeded subset for TorchFix and Fixit (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="subset seed (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each cold run (default %(default)s)")
    ap.add_argument("--warm-reps", type=int, default=3, help="repetitions of each warm run (default %(default)s)")
    ap.add_argument("--skip-torchfix", action="store_true")
    ap.add_argument("--skip-fixit", action="store_true")
    ap.add_argument("--skip-floors", action="store_true",
                    help="skip the ast.parse floor and the ruff default-output run")
    ap.add_argument("--wait-idle", type=float, default=20.0,
                    help="before each measurement wait up to this many seconds for other "
                         "processes' CPU use to fall below 15%% (default %(default)s; 0: don't)")
    ap.add_argument("--retries", type=int, default=4,
                    help="per row: repeat up to this many runs (under 30 s each) during which other "
                         "processes used 15%% or more of the machine (default %(default)s)")
    ap.add_argument("--out-dir", type=Path, default=HERE,
                    help="where results.json and results.md go (default: this script's folder)")
    args = ap.parse_args(argv)

    bench = args.bench_dir.resolve()
    corpus = (args.corpus or bench / "corpus").resolve()
    venv = (args.venv or bench / "venv").resolve()
    repo = args.repo.resolve()
    scratch = bench / "scratch"
    setup: dict = {}

    # ---- setup
    if args.skip_setup:
        if not venv_bin(venv, "python").exists():
            raise SystemExit(f"--skip-setup: no venv at {venv}; run without --skip-setup once")
        if not corpus_present(corpus) and not any(corpus.rglob("*.py")):
            raise SystemExit(f"--skip-setup: no corpus at {corpus}")
        setup["mode"] = "skip-setup"
        if not venv_bin(venv, "cfgfix").exists():
            install_cfgfix(venv, repo, setup)
    else:
        setup["mode"] = "full"
        ensure_venv(venv, setup)
        install_tools(venv, setup)
        empty = not corpus.exists() or not any(corpus.iterdir())
        if empty or (args.rebuild_corpus and corpus_present(corpus)):
            build_corpus(corpus, venv, setup)
        elif corpus_present(corpus):
            setup["corpus_pins"] = "existing corpus reused"
        else:
            # A folder the user named that is not ours: measure it as it is, never delete it.
            setup["corpus_pins"] = "custom corpus folder, used as it is"
        install_cfgfix(venv, repo, setup)
    if args.setup_only:
        log("setup done")
        print(json.dumps(setup, indent=2))
        return 0

    runner = Runner(venv, scratch, args.wait_idle, args.retries)
    env = runner.env
    py = venv_bin(venv, "python")

    # ---- corpus facts
    files = scan_py(corpus)
    n_files = len(files)
    n_lines = sum(n for _, n in files)
    if not n_files:
        raise SystemExit(f"no .py files under {corpus}")
    log(f"corpus: {n_files} .py files, {n_lines} lines")
    subset_dir = bench / f"subset-s{args.seed}-n{args.subset_size}"
    subset = make_subset(corpus, files, args.subset_size, args.seed, subset_dir)
    s_files, s_lines = len(subset), sum(n for _, n in subset)
    s_torch = sum(1 for rel, _ in subset if b"torch" in (corpus / rel).read_bytes())
    log(f"subset: {s_files} files, {s_lines} lines -> {subset_dir}")
    pc_files = pick_precommit_files(corpus, files, args.seed)
    pc_lines = sum(n for _, n in pc_files)

    # ---- tool availability and versions
    versions = {
        "ruff": tool_version([str(venv_bin(venv, "ruff")), "--version"], env),
        "torchfix": tool_version([str(venv_bin(venv, "torchfix")), "--version"], env),
        "fixit": tool_version([str(venv_bin(venv, "fixit")), "--version"], env),
        "libcst": tool_version([str(py), "-c", "import importlib.metadata as m; print(m.version('libcst'))"], env),
        "cfgfix": None,
    }
    cfgfix_bin = venv_bin(venv, "cfgfix")
    cfgfix_reason = ""
    if cfgfix_bin.exists():
        proc = subprocess.run([str(cfgfix_bin), "--version"], capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            versions["cfgfix"] = (proc.stdout.strip() or proc.stderr.strip() or "?").splitlines()[0]
        else:
            cfgfix_reason = f"`cfgfix --version` failed (rc={proc.returncode}): {tail(proc.stderr, 300)}"
    else:
        cfgfix_reason = setup.get("cfgfix_install") or "no cfgfix executable in the bench venv"
    git = run_quiet(["git", "-C", str(repo), "describe", "--always", "--dirty"])
    versions["cfgfix_commit"] = git.stdout.strip() if git.returncode == 0 else None
    have = {t: versions[t] is not None for t in ("ruff", "torchfix", "fixit", "cfgfix")}
    log(f"versions: {versions}")

    R: dict[str, dict] = {}  # measurements by key
    ruff = venv_bin(venv, "ruff")
    ruff_cache = bench / "ruff_cache"
    cfgfix_cold = [cfgfix_bin, "check", ".", "--no-cache", "--output-format", "json", "--quiet"]
    cfgfix_warm = [cfgfix_bin, "check", "."]

    # ---- start-up
    if have["cfgfix"]:
        R["cfgfix_version"] = runner.measure("cfgfix --version", [cfgfix_bin, "--version"], bench, 10)
    R["python_pass"] = runner.measure("python -c pass (floor)", [py, "-c", "pass"], bench, 10)
    if have["ruff"]:
        R["ruff_version"] = runner.measure("ruff --version", [ruff, "--version"], bench, 10)

    # ---- full corpus
    if have["ruff"]:
        R["ruff_cold"] = runner.measure(
            "ruff check --select ALL --no-cache (cold, json)",
            [ruff, *RUFF_CHECK, "--no-cache", "--output-format", "json", "."],
            corpus, args.reps, files=n_files, lines=n_lines,
            note="json output like the cfgfix run")
        shutil.rmtree(ruff_cache, ignore_errors=True)
        R["ruff_fill"] = runner.measure(
            "ruff check --select ALL (cache fill)",
            [ruff, *RUFF_CHECK, "--cache-dir", ruff_cache, "--output-format", "json", "."],
            corpus, 1, files=n_files, lines=n_lines)
        R["ruff_warm"] = runner.measure(
            "ruff check --select ALL (warm, json)",
            [ruff, *RUFF_CHECK, "--cache-dir", ruff_cache, "--output-format", "json", "."],
            corpus, args.warm_reps, files=n_files, lines=n_lines)
        stats = subprocess.run([str(ruff), *RUFF_CHECK, "--no-cache", "--statistics",
                                "--output-format", "json", "."],
                               cwd=corpus, env=env, capture_output=True, text=True)
        try:
            R["ruff_cold"]["findings"] = sum(s["count"] for s in json.loads(stats.stdout))
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
        # ruff (since 0.12.9) caches only files without diagnostics, and --select ALL
        # flags nearly every file, so its warm run above re-lints nearly everything.
        # With the default rules (which these projects pass) the cache really is hit.
        R["ruff_default_cold"] = runner.measure(
            "ruff check, default rules --no-cache (cold)",
            [ruff, "check", "--exit-zero", "--no-cache", "--output-format", "json", "."],
            corpus, args.reps, files=n_files, lines=n_lines)
        shutil.rmtree(ruff_cache, ignore_errors=True)
        runner.measure("ruff check, default rules (cache fill)",
                       [ruff, "check", "--exit-zero", "--cache-dir", ruff_cache,
                        "--output-format", "json", "."], corpus, 1)
        R["ruff_default_warm"] = runner.measure(
            "ruff check, default rules (warm)",
            [ruff, "check", "--exit-zero", "--cache-dir", ruff_cache, "--output-format", "json", "."],
            corpus, args.warm_reps, files=n_files, lines=n_lines,
            note="ruff caches files without diagnostics: a real cache hit")
        shutil.rmtree(ruff_cache, ignore_errors=True)
        if not args.skip_floors:
            R["ruff_cold_full_text"] = runner.measure(
                "ruff check --select ALL --no-cache (cold, default text output)",
                [ruff, *RUFF_CHECK, "--no-cache", "."], corpus, 1, files=n_files, lines=n_lines,
                note="default `full` text output with code frames: formatting the findings costs")
    if not args.skip_floors:
        floor = ("import ast,sys,pathlib\n"
                 "for p in sorted(pathlib.Path(sys.argv[1]).rglob('*.py')):\n"
                 "    ast.parse(p.read_bytes(), str(p))\n")
        R["ast_floor"] = runner.measure("ast.parse loop, 1 process (floor)", [py, "-c", floor, "."],
                                        corpus, 1, files=n_files, lines=n_lines)

    cfgfix_ok = (0, 1)  # 0 clean, 1 findings; 2 = usage/internal error
    if have["cfgfix"]:
        cache = corpus / ".cfgfix_cache"
        shutil.rmtree(cache, ignore_errors=True)
        R["cfgfix_cold"] = runner.measure(
            "cfgfix check --no-cache (cold, json)", cfgfix_cold, corpus, args.reps, ok_rcs=cfgfix_ok,
            files=n_files, lines=n_lines, keep_stdout=True)
        if R["cfgfix_cold"]["status"] == "ok":
            R["cfgfix_cold"].update(count_cfgfix_findings(R["cfgfix_cold"].pop("_stdout")))
        shutil.rmtree(cache, ignore_errors=True)
        R["cfgfix_fill"] = runner.measure(
            "cfgfix check (first run, fills .cfgfix_cache)", cfgfix_warm, corpus, 1,
            ok_rcs=cfgfix_ok, files=n_files, lines=n_lines)
        R["cfgfix_warm"] = runner.measure(
            "cfgfix check (warm)", cfgfix_warm, corpus, args.warm_reps, ok_rcs=cfgfix_ok,
            files=n_files, lines=n_lines, note="text output, as a user runs it")
        R["cfgfix_fill"]["cache_created"] = cache.is_dir()
        shutil.rmtree(cache, ignore_errors=True)

    # ---- subset: every tool on the same files
    if have["ruff"]:
        R["ruff_subset"] = runner.measure(
            "ruff check --select ALL --no-cache (subset)",
            [ruff, *RUFF_CHECK, "--no-cache", "--output-format", "json", "."],
            subset_dir, args.reps, files=s_files, lines=s_lines)
    if have["cfgfix"]:
        R["cfgfix_subset"] = runner.measure(
            "cfgfix check --no-cache (subset)", cfgfix_cold, subset_dir, args.reps,
            ok_rcs=cfgfix_ok, files=s_files, lines=s_lines)
        shutil.rmtree(subset_dir / ".cfgfix_cache", ignore_errors=True)
    if have["torchfix"] and not args.skip_torchfix:
        R["torchfix_subset"] = runner.measure(
            "torchfix (subset)", [venv_bin(venv, "torchfix"), "."], subset_dir, 1, ok_rcs=(0, 1),
            files=s_files, lines=s_lines,
            note=f"default rules, -j = cores; TorchFix itself skips files without 'torch' "
                 f"({s_torch}/{s_files} of the subset have it)")
        R["torchfix_full_est"] = extrapolate(R["torchfix_subset"], n_files, n_lines)
    if have["fixit"] and not args.skip_fixit:
        R["fixit_subset"] = runner.measure(
            "fixit lint (subset)", [venv_bin(venv, "fixit"), "lint", "."], subset_dir, 1,
            ok_rcs=(0, 1), files=s_files, lines=s_lines, note="built-in default rules")
        R["fixit_full_est"] = extrapolate(R["fixit_subset"], n_files, n_lines)

    # ---- pre-commit-like: 5 changed files
    pc_args = [rel for rel, _ in pc_files]
    if have["cfgfix"]:
        R["cfgfix_precommit"] = runner.measure(
            "cfgfix check, 5 files (pre-commit)", [cfgfix_bin, "check", "--no-cache", *pc_args],
            corpus, 5, ok_rcs=cfgfix_ok, files=len(pc_files), lines=pc_lines,
            note="--no-cache: changed files miss the cache")
    if have["ruff"]:
        R["ruff_precommit"] = runner.measure(
            "ruff check --select ALL, 5 files", [ruff, *RUFF_CHECK, "--no-cache", *pc_args],
            corpus, 5, files=len(pc_files), lines=pc_lines)

    R = {k: v for k, v in R.items() if v is not None}

    # ---- ratios and targets
    def g(key):
        return R.get(key)

    ratios = []

    def add_ratio(label, num, den, target=None, direction=None, basis="measured"):
        val = ratio(g(num), g(den))
        passed = None
        if val is not None and target is not None:
            passed = val <= target if direction == "le" else val >= target
        ratios.append({"label": label, "num": num, "den": den, "value": val, "target": target,
                       "direction": direction, "pass": passed, "basis": basis})

    add_ratio("cfgfix cold wall / ruff cold wall (full corpus)", "cfgfix_cold", "ruff_cold",
              TARGET_COLD_VS_RUFF, "le")
    add_ratio("cfgfix warm wall / ruff warm wall (full corpus)", "cfgfix_warm", "ruff_warm",
              TARGET_WARM_VS_RUFF, "le")
    add_ratio("cfgfix warm wall / ruff default-rules warm wall (stricter: ruff's cache hits)",
              "cfgfix_warm", "ruff_default_warm")
    add_ratio("cfgfix cold wall / ruff cold wall (subset)", "cfgfix_subset", "ruff_subset")
    add_ratio("TorchFix wall / cfgfix cold wall (subset, same files)", "torchfix_subset",
              "cfgfix_subset", TARGET_VS_TORCHFIX, "ge")
    add_ratio("TorchFix wall / cfgfix cold wall (full corpus, TorchFix extrapolated)",
              "torchfix_full_est", "cfgfix_cold", TARGET_VS_TORCHFIX, "ge", basis="extrapolated")
    add_ratio("Fixit wall / cfgfix cold wall (subset, same files)", "fixit_subset", "cfgfix_subset")
    add_ratio("Fixit wall / cfgfix cold wall (full corpus, Fixit extrapolated)", "fixit_full_est",
              "cfgfix_cold", basis="extrapolated")
    add_ratio("TorchFix wall / ruff cold wall (subset, same files)", "torchfix_subset", "ruff_subset")
    add_ratio("Fixit wall / ruff cold wall (subset, same files)", "fixit_subset", "ruff_subset")
    add_ratio("TorchFix CPU / ruff cold CPU (subset, same files)", "torchfix_subset", "ruff_subset")
    ratios[-1]["value"] = ratio(g("torchfix_subset"), g("ruff_subset"), "cpu_min")
    add_ratio("ruff warm wall / ruff cold wall", "ruff_warm", "ruff_cold")
    add_ratio("cfgfix warm wall / cfgfix cold wall", "cfgfix_warm", "cfgfix_cold")

    absolute = []
    for key, label, target in (("cfgfix_precommit", "cfgfix pre-commit run, 5 files (min wall)",
                                TARGET_PRECOMMIT_S),
                               ("cfgfix_version", "cfgfix --version (min wall)", TARGET_VERSION_S)):
        m = g(key)
        val = m["wall_min"] if m and m.get("status") == "ok" else None
        absolute.append({"label": label, "key": key, "value_s": val, "target_s": target,
                         "pass": (val <= target) if val is not None else None})

    results = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine_info(),
        "paths": {"bench": str(bench), "corpus": str(corpus), "venv": str(venv),
                  "repo": str(repo), "subset": str(subset_dir)},
        "setup": setup,
        "versions": versions,
        "cfgfix_available": have["cfgfix"],
        "cfgfix_unavailable_reason": None if have["cfgfix"] else cfgfix_reason,
        "corpus": {"packages": corpus_versions(corpus), "py_files": n_files, "lines": n_lines},
        "subset": {"seed": args.seed, "size": s_files, "lines": s_lines,
                   "files_mentioning_torch": s_torch, "files": [rel for rel, _ in subset]},
        "precommit_files": [{"path": rel, "lines": n} for rel, n in pc_files],
        "other_load_max": runner.max_foreign,
        "measurements": R,
        "ratios": ratios,
        "absolute_targets": absolute,
    }
    md = render_markdown(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (args.out_dir / "results.md").write_text(md)
    print(md)
    log(f"wrote {args.out_dir / 'results.json'} and {args.out_dir / 'results.md'}")
    return 0


# ----------------------------------------------------------------------- report


def fmt_s(v):
    return "–" if v is None else (f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s")


def fmt_n(v):
    if v is None:
        return "–"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}"


def short_version(text):
    if not text:
        return "not available"
    m = re.search(r"\d+(?:\.\d+)+\S*", text)
    return m.group(0) if m else text


def fmt_load(v):
    if v is None:
        return ""
    return f"**{v:.0%}**" if v >= 0.10 else f"{v:.0%}"


def render_markdown(res: dict) -> str:
    m, c = res["machine"], res["corpus"]
    v = res["versions"]
    pk = ", ".join(f"{k} {ver}" for k, ver in sorted(c["packages"].items()))
    out = [
        "# cfgfix benchmark results",
        "",
        f"- Generated {res['generated']} on {m['cores']} cores ({m['cpu']}), {m['memory']} RAM, "
        f"Python {m['python']}.",
        f"- Corpus: {pk}: **{c['py_files']} .py files, {c['lines']:,} lines** ({res['paths']['corpus']}).",
        f"- Subset for TorchFix and Fixit: {res['subset']['size']} files, {res['subset']['lines']:,} "
        f"lines, seed {res['subset']['seed']} ({res['subset']['files_mentioning_torch']} mention "
        f"`torch`); ruff and cfgfix are timed on the same subset too.",
        "- Tools: " + ", ".join(f"{k} {short_version(v[k])}" for k in
                                ("ruff", "torchfix", "fixit", "libcst", "cfgfix"))
        + (f" (checkout {v['cfgfix_commit']})" if v.get("cfgfix_commit") else "") + ".",
    ]
    if (res.get("other_load_max") or 0) >= 0.10:
        out.append(f"- **Warning: the machine was shared.** Other processes used up to "
                   f"{res['other_load_max']:.0%} of all cores during some runs (bold in the "
                   f"'other load' column); wall times there are inflated. Re-run on a quiet machine.")
    if not res["cfgfix_available"]:
        out.append(f"- **cfgfix: not available** — {res['cfgfix_unavailable_reason']}")
    out += [
        "- Wall = elapsed; CPU = user+sys of the child processes. files/s and lines/s use the "
        "min wall; lines/CPU-s uses the min CPU.",
        "",
        "- other load = the largest share of all cores that *other* processes used during one "
        "run of that row (from /proc/stat): a timing with a high other load is not to be trusted.",
        "",
        "| run | files | lines | wall min | wall median | CPU min | files/s | lines/s | lines/CPU-s | runs | other load | note |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for meas in res["measurements"].values():
        name = meas["name"]
        if meas["status"] == "failed":
            out.append(f"| {name} | {meas.get('files') or ''} | {meas.get('lines') or ''} | "
                       f"FAILED rc={meas['rc']} | | | | | | | | "
                       f"{tail(meas['stderr_tail'], 160).replace('|', '/').replace(chr(10), ' ')} |")
            continue
        est = meas["status"] == "extrapolated"
        note = meas.get("note", "")
        if "findings" in meas and meas["findings"] is not None:
            note = (note + "; " if note else "") + f"{meas['findings']:,} findings"
        runs = "est." if est else str(meas.get("reps", ""))
        out.append(
            f"| {'*' if est else ''}{name}{'*' if est else ''} | {meas.get('files') or ''} | "
            f"{fmt_n(meas.get('lines')) if meas.get('lines') else ''} | {fmt_s(meas['wall_min'])} | "
            f"{fmt_s(meas['wall_median'])} | {fmt_s(meas['cpu_min'])} | "
            f"{fmt_n(meas.get('files_per_s'))} | {fmt_n(meas.get('lines_per_s'))} | "
            f"{fmt_n(meas.get('lines_per_cpu_s'))} | {runs} | {fmt_load(meas.get('other_load_max'))} | {note} |")
        if meas.get("discarded"):
            out[-1] = out[-1][:-2] + f" ({len(meas['discarded'])} busy runs discarded) |"
    out += ["", "Rows in *italics* are extrapolated by lines from the subset, not measured.", "",
            "## Ratios (min wall unless stated)", "",
            "| ratio | value | target | met |", "| --- | ---: | ---: | :---: |"]
    for r in res["ratios"]:
        val = "–" if r["value"] is None else f"{r['value']:.2f}×"
        tgt = "" if r["target"] is None else ("≤ " if r["direction"] == "le" else "≥ ") + f"{r['target']:g}×"
        met = "" if r["pass"] is None else ("yes" if r["pass"] else "**no**")
        out.append(f"| {r['label']} | {val} | {tgt} | {met} |")
    out += ["", "## Absolute targets", "", "| what | value | target | met |", "| --- | ---: | ---: | :---: |"]
    for a in res["absolute_targets"]:
        met = "" if a["pass"] is None else ("yes" if a["pass"] else "**no**")
        out.append(f"| {a['label']} | {fmt_s(a['value_s'])} | < {fmt_s(a['target_s'])} | {met} |")
    pcs = ", ".join(f"`{p['path']}` ({p['lines']})" for p in res["precommit_files"])
    out += ["", f"Pre-commit files (lines): {pcs}.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
