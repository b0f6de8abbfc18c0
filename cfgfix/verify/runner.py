"""Run one launch command with the harness injected, under a timeout, and collect what
its processes report.

The harness folder (a copy of harness/sitecustomize.py and of cfgfix/memory/live_bytes.py,
so the user's Python needs no cfgfix) goes first on PYTHONPATH; every Python process of the
launch inherits it. On timeout every process of the launch gets SIGUSR1 (the harness dumps
its threads' stacks), then SIGKILL. torchrun starts its workers in sessions of their own,
so the processes are found through /proc (parent links), not only the process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from cfgfix.records import dataclass, field

HARNESS = Path(__file__).with_name("harness") / "sitecustomize.py"
LIVE_BYTES = Path(__file__).resolve().parents[1] / "memory" / "live_bytes.py"
POLL_S = 0.2
STACK_WAIT_S = 2.0  # the most time given to the harness to write its stacks after SIGUSR1
STACK_SETTLE_S = 0.1  # a stack file unchanged this long (and ending a line) is complete


@dataclass
class RunResult:
    label: str
    command: list[str]
    cwd: str
    returncode: int | None = None
    timed_out: bool = False
    launch_error: str | None = None  # the command could not start at all
    wall_s: float = 0.0
    processes: list[dict] = field(default_factory=list)
    output_tail: str = ""
    notes: list[str] = field(default_factory=list)
    started: list[dict] = field(default_factory=list)  # every Python process the harness saw start
    covered: dict[str, list[int]] = field(default_factory=dict)  # real path -> changed lines that ran
    reads: list[str] = field(default_factory=list)  # changed non-Python files a process opened

    @property
    def status(self) -> str:
        """completed when every process completed its steps; else the first problem."""
        if self.launch_error:
            return "could not start"
        if not self.processes:
            return "timed out" if self.timed_out else "no report"
        for wanted in ("timed out", "crashed", "died", "terminated", "exited early"):
            if any(p["status"] == wanted for p in self.processes):
                return wanted
        return "completed"

    def to_dict(self) -> dict:
        return {
            "label": self.label, "command": self.command, "status": self.status,
            "returncode": self.returncode, "timed_out": self.timed_out,
            "launch_error": self.launch_error, "wall_s": round(self.wall_s, 3),
            "processes": self.processes, "output_tail": self.output_tail, "notes": self.notes,
            "started": self.started, "covered": self.covered, "reads": self.reads,
        }


def harness_folder(into: Path) -> Path:
    """A folder holding the files every launched process imports at start-up."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(HARNESS, into / "sitecustomize.py")
    if LIVE_BYTES.exists():  # the CPU counter; the harness notes its absence
        shutil.copy(LIVE_BYTES, into / "_cfgfix_live_bytes.py")  # a name no user module has
    return into


def run_launch(command: list[str], cwd: Path, steps: int, timeout: float, device: str = "auto",
               label: str = "run", progress=None, cover: dict | None = None) -> RunResult:
    """Run `command` in `cwd` until it ends, stops at `steps` optimizer steps, or times out.
    `cover`: the changed lines to record (coverage.Change.spec)."""
    result = RunResult(label, list(command), str(cwd))
    with tempfile.TemporaryDirectory(prefix="cfgfix-verify-") as tmp:
        tmp_path = Path(tmp)
        harness = harness_folder(tmp_path / "harness")
        reports = tmp_path / "reports"
        reports.mkdir()
        log_path = tmp_path / "output.log"
        env = launch_env(os.environ, harness, reports, steps, device)
        if cover and (cover.get("files") or cover.get("reads") or cover.get("steady")):
            spec = tmp_path / "cover.json"
            spec.write_text(json.dumps(cover))
            env["CFGFIX_VERIFY_COVER"] = str(spec)
        started = time.monotonic()
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                result.launch_error = f"{command[0]}: {exc.strerror or exc}"
                return result
            try:
                result.returncode = _wait(proc, reports, started, timeout, label, steps, progress)
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (cfgfix.interrupts.Interrupted)
                _stop(proc, reports, quick=True)
                proc.wait()
                raise
            if result.returncode is None:
                result.timed_out = True
                _stop(proc, reports)
                result.returncode = proc.wait()
            _reap_descendants(proc.pid)
        result.wall_s = time.monotonic() - started
        result.processes = collect_reports(reports, result.timed_out)
        result.started = collect_started(reports)
        result.covered, result.reads = collect_coverage(reports)
        result.output_tail = _tail(log_path)
    return result


def collect_started(reports: Path) -> list[dict]:
    """The Python processes that started under the harness: pid, role, argv."""
    started = []
    for path in sorted(reports.glob("seen-*.json")):
        try:
            started.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(started, key=lambda s: s.get("pid", 0))


def collect_coverage(reports: Path) -> tuple[dict[str, list[int]], list[str]]:
    """The changed lines that ran (real path -> lines) and the changed non-Python files that
    were opened, over every process of the launch."""
    covered: dict[str, set[int]] = {}
    reads: set[str] = set()
    for path in reports.glob("cover-*.txt"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for row in text.splitlines():
            where, _, what = row.rpartition("\t")
            if where == "read":
                reads.add(what)
            elif where and what.isdigit():
                covered.setdefault(where, set()).add(int(what))
    return {p: sorted(lines) for p, lines in sorted(covered.items())}, sorted(reads)


def launch_env(base, harness: Path, reports: Path, steps: int, device: str) -> dict:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(harness), base.get("PYTHONPATH", "")) if p)
    env["CFGFIX_VERIFY_DIR"] = str(reports)
    env["CFGFIX_VERIFY_STEPS"] = str(steps)
    env["CFGFIX_VERIFY_PARENT"] = str(os.getpid())  # the launch dies with verify (harness)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the script's own `cuda if available else cpu` picks the CPU
    return env


def _wait(proc, reports: Path, started: float, timeout: float, label: str, steps: int, progress):
    """The exit code, or None on timeout."""
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if progress is not None:
            progress.update(label, _latest_step(reports), steps, time.monotonic() - started)
        if time.monotonic() - started > timeout:
            return None
        time.sleep(POLL_S)


def _latest_step(reports: Path) -> int:
    best = 0
    for path in reports.glob("proc-*.json"):
        try:
            best = max(best, json.loads(path.read_text())["steps"])
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now
    return best


def _stop(proc, reports: Path, quick: bool = False) -> None:
    """Dump the stacks of the launch's Python processes (unless `quick`: an interrupted
    verify has no report to write), then kill them all: the process group the launch leads
    (start_new_session) and every descendant that left it."""
    pids = [proc.pid, *_descendants(proc.pid)]
    if not quick:
        _signal_all(pids, signal.SIGUSR1)
        deadline = time.monotonic() + STACK_WAIT_S
        previous = None
        while time.monotonic() < deadline:
            current = _stack_states(reports, pids)
            if _stacks_written(previous, current):
                break
            previous = current
            time.sleep(STACK_SETTLE_S)
    _kill_group(proc.pid)
    _signal_all([proc.pid, *_descendants(proc.pid)], signal.SIGKILL)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _stack_states(reports: Path, pids: list[int]) -> dict[str, tuple[int, bool]]:
    """(size, ends with a newline) of each stack file the launch's processes opened (the
    harness opens one per Python process at start-up, empty until SIGUSR1)."""
    states = {}
    for pid in pids:
        try:
            with open(reports / f"stack-{pid}.txt", "rb") as f:
                size = f.seek(0, os.SEEK_END)
                last = b""
                if size:
                    f.seek(size - 1)
                    last = f.read(1)
        except OSError:
            continue
        states[str(pid)] = (size, last == b"\n")
    return states


def _stacks_written(previous: dict | None, current: dict) -> bool:
    """Every stack dumped in full: each file non-empty, ending a line, and the same as one
    poll ago. faulthandler writes a dump in many small writes; a loaded machine can pause the
    process between them, and a file read (or a process killed) at the first byte held a
    truncated stack."""
    return (bool(current) and current == previous
            and all(size > 0 and whole_line for size, whole_line in current.values()))


def _signal_all(pids: list[int], sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap_descendants(pid: int) -> None:
    """Nothing of the launch may outlive verify (a worker whose launcher died)."""
    _kill_group(pid)
    _signal_all(_descendants(pid), signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """Every live descendant of `root`, from /proc parent links (Linux); [] elsewhere."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])  # after "(comm) state ppid"
        children.setdefault(parent, []).append(int(name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def collect_reports(reports: Path, timed_out: bool) -> list[dict]:
    """The workers' reports, ranks in order; a report left 'running' belongs to a process
    that was killed (timed out, with its stack) or died without a word (a signal, OOM)."""
    processes = []
    for path in sorted(reports.glob("proc-*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        stack = reports / f"stack-{report['pid']}.txt"
        if report["status"] == "running":
            report["status"] = "timed out" if timed_out else "died"
            if stack.exists() and stack.stat().st_size:
                report["stack"] = stack.read_text(errors="replace")[-8000:]
        report["status"] = report["status"].replace("_", " ")
        processes.append(report)
    # A process that never ran a forward, a step or into an error is a helper (a tool the
    # script ran in a subprocess), unless it is all there is.
    workers = [p for p in processes if p["forwards"] or p["steps"] or p["error"] or p["status"] != "exited early"]
    processes = workers or processes
    processes.sort(key=lambda p: (p["rank"] if p["rank"] is not None else -1, p["pid"]))
    if timed_out and not processes:
        processes = _unreported_stacks(reports)
    return processes


def _unreported_stacks(reports: Path) -> list[dict]:
    """A hang before the harness wrote anything (before the first step): its stacks."""
    found = []
    for stack in sorted(reports.glob("stack-*.txt")):
        text = stack.read_text(errors="replace")
        if text:
            pid = int(stack.stem.split("-")[1])
            found.append(blank_report(pid) | {"status": "timed out", "stack": text[-8000:]})
    return found


def _tail(path: Path, limit: int = 4000) -> str:
    data = path.read_bytes()
    return data[-limit:].decode(errors="replace")


def blank_report(pid: int) -> dict:
    """The fields of a harness report, for a process that wrote none."""
    return {
        "pid": pid, "rank": None, "local_rank": None, "world_size": None, "argv": [], "status": "no report",
        "target_steps": None, "steps": 0, "forwards": 0, "error": None, "signal": None, "torch_imported": False,
        "seeded": False, "device": None, "first_step_s": None, "later_step_mean_s": None, "step_times_s": [],
        "losses": [], "step_losses": [], "losses_finite": None, "grad_norms": [], "grad_norm_source": None,
        "params_finite": None, "state_bytes": None, "memory": {}, "notes": [],
    }
