"""No process left behind, and the exit code a signal gives (issue 24).

A pooled `check` (over POOL_MIN_FILES Python files) is killed while its workers lint; no
process it started may be left, and a caller reading its stdout must see end-of-file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cfgfix.engine import POOL_MIN_FILES

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TRAINER = '''import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
model = model.to(torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters())
for step, batch in enumerate(loader):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        torch.cuda.empty_cache()
'''


def _env() -> dict:
    env = dict(os.environ)
    # no empty entry: "" on PYTHONPATH is the current folder, which the -m test must not get
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _big_project(root: Path, files: int) -> None:
    for i in range(files):
        folder = root / f"pkg{i // 50}"
        folder.mkdir(exist_ok=True)
        # distinct texts, so nothing is shared between files
        (folder / f"train_{i}.py").write_text(TRAINER + f"\nSEED = {i}\n" * (1 + i % 7), encoding="utf-8")


def _children(pid: int) -> set[int]:
    """Every live process whose parent is `pid` (read from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start_pooled_check(root: Path, *extra: str) -> tuple[subprocess.Popen, set[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cfgfix", "check", "--no-cache", *extra, "."],
        cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        workers = _children(proc.pid)
        if len(workers) >= 2:
            time.sleep(0.3)  # the workers have taken jobs
            return proc, workers | _children(proc.pid)
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the pool never started (exit {proc.poll()}): {proc.stderr.read()[-500:]!r}")


def _wait_gone(pids: set[int], seconds: float = 10) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pids):
            return set()
        time.sleep(0.05)
    return _alive(pids)


@pytest.fixture(scope="module")
def big_project(tmp_path_factory):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the pool needs two CPUs")
    root = tmp_path_factory.mktemp("pooled")
    _big_project(root, POOL_MIN_FILES + 100)
    return root


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_no_worker_outlives_a_killed_check(big_project, signum):
    proc, workers = _start_pooled_check(big_project)
    proc.send_signal(signum)
    # a caller waiting for end-of-file on the pipes returns: no worker holds them
    out, err = proc.communicate(timeout=20)
    left = _wait_gone(workers)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {sorted(left)} outlived the check ({signal.Signals(signum).name})"
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
    assert proc.returncode == expected, err.decode(errors="replace")[-800:]
    assert b"Traceback" not in err, err.decode(errors="replace")[-1500:]
    if signum != signal.SIGKILL:
        assert f"stopped by {signal.Signals(signum).name}".encode() in err


def test_workers_do_not_write_to_the_callers_streams(big_project):
    """Ctrl-C at a terminal reaches the whole foreground group; the workers are not in it and
    print nothing (no KeyboardInterrupt traceback per worker)."""
    proc, workers = _start_pooled_check(big_project)
    for pid in workers:
        assert os.getpgid(pid) != os.getpgid(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert not _wait_gone(workers)
    assert err.count(b"stopped by SIGINT") == 1 and b"Traceback" not in err


def test_a_pooled_check_that_finishes_leaves_no_worker(big_project):
    proc, workers = _start_pooled_check(big_project)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err.decode(errors="replace")[-800:]  # the copies hold findings
    assert b"CFX101" in out or b"CFX301" in out
    assert not _wait_gone(workers)


def test_sigterm_during_a_small_check_exits_143(tmp_path):
    """Without a pool too: the code a shell gives a process SIGTERM killed, not 1."""
    (tmp_path / "train.py").write_text(TRAINER, encoding="utf-8")
    script = (
        "import os, signal, sys\n"
        "import cfgfix.checking as checking\n"
        "real = checking.check\n"
        "def check(**kw):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(**kw)\n"
        "checking.check = check\n"
        "sys.argv = ['cfgfix', 'check', '--no-cache', '.']\n"
        "from cfgfix.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(), capture_output=True, timeout=60)
    assert proc.returncode == 143, proc.stderr.decode(errors="replace")
    assert b"stopped by SIGTERM" in proc.stderr


@pytest.mark.parametrize("command", [["explain", "."], ["fix", "--diff", "."]])
def test_sigint_in_a_click_command_exits_130(tmp_path, command):
    """click turns Ctrl-C into "Aborted!" and exit 1; cfgfix exits 130, as ruff does."""
    (tmp_path / "train.py").write_text(TRAINER, encoding="utf-8")
    script = (
        "import os, signal, sys\n"
        "import cfgfix.engine as engine\n"
        "real = engine.Engine.run\n"
        "def run(self, *a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(self, *a, **k)\n"
        "engine.Engine.run = run\n"
        f"sys.argv = ['cfgfix', *{command!r}]\n"
        "from cfgfix.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(), capture_output=True, timeout=60)
    assert proc.returncode == 130, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr


def test_python_dash_m_ignores_the_projects_own_modules(tmp_path):
    """`python -m cfgfix` inside a project must not import that project's typing.py or click.py."""
    for name in ("typing", "click", "yaml", "pathspec"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('PWNED: the project module ran')\n")
    (tmp_path / "train.py").write_text(TRAINER, encoding="utf-8")
    for command in (["check", "--no-cache", "."], ["explain", "."], ["check", "--no-cache", "--diff", "."]):
        proc = subprocess.run([sys.executable, "-m", "cfgfix", *command], cwd=tmp_path, env=_env(),
                              capture_output=True, timeout=120)
        assert b"PWNED" not in proc.stdout + proc.stderr, command
        assert proc.returncode in (0, 1), (command, proc.stderr.decode(errors="replace")[-800:])


def test_a_link_out_of_the_project_is_reported_without_its_lines(tmp_path):
    """`.env -> ../secret.txt`: the findings say where the link goes; no line of the target
    reaches the output, in any format."""
    project = tmp_path / "project"
    project.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("API_KEY=sk-live-0123456789abcdef\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:Ture\n")
    (project / ".env").symlink_to(secret)
    (project / "inside.env").write_text("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:Ture\n")
    for fmt in ("text", "json", "sarif", "github", "concise"):
        proc = subprocess.run([sys.executable, "-m", "cfgfix", "check", "--no-cache", "--output-format", fmt, "."],
                              cwd=project, env=_env(), capture_output=True, timeout=120)
        if fmt == "concise" and proc.returncode == 2:
            continue  # an older CLI without the concise format
        out = proc.stdout.decode()
        assert proc.returncode == 1, (fmt, proc.stderr.decode())
        assert "sk-live" not in out and "API_KEY" not in out, (fmt, out)
        assert "links to" in out and "outside the project" in out, (fmt, out)
    # a file inside the project keeps its code frame
    proc = subprocess.run([sys.executable, "-m", "cfgfix", "check", "--no-cache", "inside.env"],
                          cwd=project, env=_env(), capture_output=True, timeout=120)
    assert b"expandable_segments:Ture" in proc.stdout
