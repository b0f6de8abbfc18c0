"""`cfgfix verify`: real runs of the tiny training scripts in fixtures/verify/ (CPU), and
the pieces around them. Runs are shared between assertions through module-scoped fixtures;
the scripts stop after 2 optimizer steps."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.verify import guard, runner, workspace
from cfgfix.verify.command import Options, launch_command, run
from cfgfix.verify.progress import Progress
from cfgfix.verify.runner import RunResult, blank_report, harness_folder, run_launch
from cfgfix.verify.verdict import judge

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "verify"
PYTHON = sys.executable
BIN = Path(sys.executable).parent


def _copy(tmp_factory, name: str) -> Path:
    dest = tmp_factory.mktemp(name) / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def _verify(folder: Path, *args: str) -> tuple[int, dict]:
    """`cfgfix verify --output-format json ARGS` in `folder`, through the click command."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with pytest.MonkeyPatch.context() as mp:  # a CI pull-request event must not refuse these
            mp.delenv("GITHUB_EVENT_NAME", raising=False)
            mp.delenv("GITHUB_EVENT_PATH", raising=False)
            result = CliRunner().invoke(cli, ["verify", "--output-format", "json", *args])
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.stdout)


def _proc(doc: dict, run: str, index: int = 0) -> dict:
    return doc["runs"][run]["processes"][index]


def _check(doc: dict, name: str) -> dict:
    return next(c for c in doc["verdict"]["checks"] if c["name"] == name)


# -- the plain loop: safe fixes, then unsafe ones --------------------------------------------
@pytest.fixture(scope="module")
def plain_safe(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return _verify(_copy(tmp_path_factory, "plain-loop"), "--", PYTHON, "train.py")


@pytest.fixture(scope="module")
def plain_unsafe(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return _verify(_copy(tmp_path_factory, "plain-loop"), "--fix-unsafe", "--", PYTHON, "train.py")


def test_plain_loop_stops_at_n_steps_and_reports_every_measure(plain_safe):
    _code, doc = plain_safe
    for which in ("before", "after"):
        p = _proc(doc, which)
        assert p["status"] == "completed" and p["steps"] == 2 and len(p["step_losses"]) == 2
        assert p["first_step_s"] > 0 and p["later_step_mean_s"] > 0
        assert len(p["losses"]) == 2 and p["losses_finite"] is True and p["params_finite"] is True
        assert len(p["grad_norms"]) == 2 and p["grad_norm_source"] == "clip_grad_norm_"
        assert all(g > 0 for g in p["grad_norms"])
        # 0.28M parameters in fp32; AdamW keeps two moments each, plus its step counters
        params = p["state_bytes"]["params"]
        assert p["state_bytes"]["grads"] == params
        assert 2 * params <= p["state_bytes"]["optimizer"] <= 2 * params + 1024
        assert p["memory"]["cpu_live_peak_bytes"] > params + p["state_bytes"]["optimizer"]
        assert p["memory"]["rss_peak_bytes"] > p["memory"]["cpu_live_peak_bytes"]
        assert p["seeded"] is True and p["device"] == "cpu"


def _missed(doc: dict) -> list[str]:
    return [u["code"] for u in doc["coverage"]["units"] if u["counts"] and u["ran"] is False]


def test_safe_fixes_keep_losses_identical_and_detach_lowers_the_peak(plain_safe):
    code, doc = plain_safe
    assert {(f["code"], f["safe"]) for f in doc["fixes"]} == {("CFX301", True), ("CFX302", True)}
    before, after = _proc(doc, "before"), _proc(doc, "after")
    assert after["losses"] == before["losses"] and after["grad_norms"] == before["grad_norms"]
    assert _check(doc, "losses match")["detail"].startswith("identical (safe fixes only")
    assert _check(doc, "gradient norms match")["detail"].startswith("identical (safe fixes only")
    # the evaluation kept every batch's graph through `losses.append(outputs.loss)`
    assert after["memory"]["cpu_live_peak_bytes"] < before["memory"]["cpu_live_peak_bytes"]
    assert _check(doc, "peak memory")["holds"] is True
    # every check holds, but CFX301 removed a `torch.cuda.empty_cache()` under
    # `if torch.cuda.is_available()` that a CPU run never calls: not exercised, not "holds"
    assert _missed(doc) == ["torch.cuda.empty_cache()"]
    assert code == 3 and doc["verdict"]["state"] == "not exercised" and doc["verdict"]["holds"] is False


def test_unsafe_no_grad_fix_lowers_the_cpu_peak_further(plain_safe, plain_unsafe):
    code, doc = plain_unsafe
    assert code == 3 and _missed(doc) == ["torch.cuda.empty_cache()"]  # the no_grad line ran (eval every step)
    assert ("CFX303", False) in {(f["code"], f["safe"]) for f in doc["fixes"]}
    before, after = _proc(doc, "before"), _proc(doc, "after")
    assert after["losses"] == before["losses"]
    assert after["memory"]["cpu_live_peak_bytes"] < _proc(plain_safe[1], "after")["memory"]["cpu_live_peak_bytes"]
    assert "saves" in _check(doc, "peak memory")["detail"]


# -- HF Trainer: a "safe" fix that verify catches changing the numbers ---------------------
def test_hf_trainer_redundant_cast_fix_changes_buffers_and_verify_shows_it(tmp_path_factory):
    """CFX101's `.to(torch.bfloat16)` after a bf16 load copies no weight, but Llama keeps its
    rotary `inv_freq` buffers in float32 and the cast converts them; that is why CFX101's fix
    is unsafe. Safe fixes only: nothing to verify. With --fix-unsafe: the patched copy's
    buffers are 64 B (fp32) against 32 B (bf16), the seeded losses move in the 5th digit
    (inside the unsafe tolerance), and the peak grows by exactly those 32 B, so the
    "peak not higher" check fails."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    folder = _copy(tmp_path_factory, "hf-trainer")
    code, doc = _verify(folder, "--", PYTHON, "train.py")
    assert code == 0 and doc["fixes"] == []
    code, doc = _verify(folder, "--fix-unsafe", "--", PYTHON, "train.py")
    assert [f["code"] for f in doc["fixes"]] == ["CFX101"]
    before, after = _proc(doc, "before"), _proc(doc, "after")
    assert before["status"] == after["status"] == "completed" and before["steps"] == after["steps"] == 2
    assert before["state_bytes"]["params"] == after["state_bytes"]["params"]  # bf16 weights either way
    grown = after["state_bytes"]["buffers"] - before["state_bytes"]["buffers"]
    assert after["state_bytes"]["buffers"] == 2 * before["state_bytes"]["buffers"]
    assert after["losses"] != before["losses"]
    assert after["losses"] == pytest.approx(before["losses"], rel=1e-4)
    assert _check(doc, "losses match")["holds"]
    assert after["memory"]["cpu_live_peak_bytes"] - before["memory"]["cpu_live_peak_bytes"] == grown
    assert not _check(doc, "peak memory")["holds"] and code == 1


# -- launchers: accelerate (gradient accumulation) and torchrun (2 gloo ranks) --------------
def test_accelerate_launch_counts_optimizer_steps_not_micro_batches(tmp_path_factory):
    pytest.importorskip("accelerate")
    folder = _copy(tmp_path_factory, "accelerate-accum")
    command = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "1", "train.py"]
    result = run_launch(command, folder, steps=2, timeout=120)
    assert result.status == "completed", result.output_tail
    (p,) = result.processes  # the launcher parent writes nothing
    assert p["steps"] == 2 and len(p["losses"]) == 4  # two micro-batches per optimizer step
    assert [len(s) for s in p["step_losses"]] == [2, 2]


def test_torchrun_two_ranks_each_report(tmp_path_factory):
    pytest.importorskip("torch")
    folder = _copy(tmp_path_factory, "torchrun-ddp")
    command = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "train.py"]
    result = run_launch(command, folder, steps=2, timeout=120)
    assert result.status == "completed", result.output_tail
    assert [p["rank"] for p in result.processes] == [0, 1]
    r0, r1 = result.processes
    assert r0["steps"] == r1["steps"] == 2
    assert r0["losses"] != r1["losses"]  # each rank sees its own shard
    assert r0["grad_norms"] == r1["grad_norms"]  # ... and the all-reduced gradients


# -- runs that cannot be verified --------------------------------------------------------------
def test_a_hang_times_out_with_the_stuck_stack(tmp_path_factory, monkeypatch):
    pytest.importorskip("torch")
    folder = _copy(tmp_path_factory, "hang")
    # `--timeout` counts from the launch, interpreter start and `import torch` included: on
    # a loaded machine the import alone can outlast a short timeout, and the stack then shows
    # the import, not the hang. The test counts the timeout from the moment the script is
    # stuck instead: its rendezvous file exists once it is inside init_process_group (the
    # verify run works in a copy, found through the process's cwd).
    real_wait = runner._wait

    def wait_from_the_hang(proc, reports, started, timeout, *rest):
        rendezvous = Path(f"/proc/{proc.pid}/cwd/rendezvous")
        give_up = time.monotonic() + 300
        while proc.poll() is None and not rendezvous.exists() and time.monotonic() < give_up:
            time.sleep(0.05)
        return real_wait(proc, reports, time.monotonic(), timeout, *rest)

    monkeypatch.setattr(runner, "_wait", wait_from_the_hang)
    code, doc = _verify_fixless(folder, "--timeout", "2")
    assert code == 2
    p = _proc(doc, "before")
    assert p["status"] == "timed out" and p["steps"] == 0
    assert "init_process_group" in p["stack"] and "train.py" in p["stack"]
    assert doc["runs"]["after"] is None  # nothing to compare with: the patched copy is not run
    assert "timed out" in doc["verdict"]["reason"]


def test_stacks_are_read_only_once_dumped_in_full(tmp_path):
    """faulthandler writes a dump in many small writes: a stack file is complete only when it
    ends a line and has stopped growing (a truncated stack was read under load)."""
    stack = tmp_path / "stack-7.txt"
    stack.write_text("")
    states = [runner._stack_states(tmp_path, [7, 8])]  # 8: no Python harness, no file
    for text in ("Current thread 0x1 (most recent call first):\n  File \"x.py\", line 3 in ",
                 "Current thread 0x1 (most recent call first):\n  File \"x.py\", line 3 in f\n",
                 "Current thread 0x1 (most recent call first):\n  File \"x.py\", line 3 in f\n"):
        stack.write_text(text)
        states.append(runner._stack_states(tmp_path, [7, 8]))
    assert list(states[-1]) == ["7"]
    written = [runner._stacks_written(before, after) for before, after in zip([None, *states], states)]
    # empty; a line cut off; a whole line, but grown since the last poll; unchanged: complete
    assert written == [False, False, False, True]
    assert not runner._stacks_written(None, {})  # no Python process of the launch


def _verify_fixless(folder: Path, *args: str):
    """Scripts with nothing to fix are compared with themselves through git revisions."""
    _git_init(folder)
    return _verify(folder, *args, "--before", "HEAD", "--after", "HEAD", "--", PYTHON, "train.py")


def test_a_script_that_ends_early(tmp_path_factory):
    pytest.importorskip("torch")
    code, doc = _verify_fixless(_copy(tmp_path_factory, "early-exit"))
    assert code == 2
    p = _proc(doc, "before")
    assert p["status"] == "exited early" and p["steps"] == 1 and p["grad_norm_source"] == "computed before step"
    assert "exited early after 1 step" in doc["verdict"]["reason"]


# -- a "fix" that breaks training, as two git revisions ------------------------------------
def _git(folder: Path, *args: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, env=env)


def _git_init(folder: Path) -> None:
    _git(folder, "init", "-q")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", "original")


def _broken_revision(tmp_path_factory, name: str, old: str, new: str) -> Path:
    folder = _copy(tmp_path_factory, "early-exit")
    _git_init(folder)
    script = folder / "train.py"
    text = script.read_text()
    assert old in text
    script.write_text(text.replace(old, new))
    _git(folder, "commit", "-q", "-am", name)
    (folder / "data").mkdir()
    (folder / "data" / "untracked.txt").write_text("kept in both copies")
    return folder


@pytest.mark.parametrize("name, new, failing", [
    ("inf loss", "loss = nn.functional.mse_loss(model(inputs), targets) * float('inf')", "finite losses and parameters"),
    ("crash", "loss = nn.functional.mse_loss(model(inputs.half()), targets)", "completed steps"),
])
def test_a_fix_that_breaks_training_fails_the_verdict(tmp_path_factory, name, new, failing):
    pytest.importorskip("torch")
    folder = _broken_revision(tmp_path_factory, name, "loss = nn.functional.mse_loss(model(inputs), targets)", new)
    code, doc = _verify(folder, "--before", "HEAD~1", "--after", "HEAD", "--", PYTHON, "train.py", "--target", "0")
    assert code == 1, doc["verdict"]
    assert doc["runs"]["before"]["status"] == "completed"
    assert _check(doc, failing)["holds"] is False
    if name == "crash":
        assert _proc(doc, "after")["error"]["type"] == "RuntimeError"
    else:
        assert _proc(doc, "after")["losses_finite"] is False


# -- refusing to run -----------------------------------------------------------------------------
def _event(tmp_path, head: str, base: str, fork: bool) -> dict:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"pull_request": {"head": {"repo": {"full_name": head, "fork": fork}},
                                                 "base": {"repo": {"full_name": base}}}}))
    return {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(path)}


def test_untrusted_events_are_refused(tmp_path):
    assert "pull_request_target" in guard.untrusted_event({"GITHUB_EVENT_NAME": "pull_request_target"})
    assert "fork" in guard.untrusted_event(_event(tmp_path, "evil/x", "org/x", fork=True))
    assert "another repository" in guard.untrusted_event(_event(tmp_path, "evil/x", "org/x", fork=False))
    assert guard.untrusted_event(_event(tmp_path, "org/x", "org/x", fork=False)) is None
    assert guard.untrusted_event({"GITHUB_EVENT_NAME": "push"}) is None
    assert guard.untrusted_event({}) is None


def test_verify_exits_2_on_a_fork_pull_request(tmp_path, monkeypatch, capsys):
    for key, value in _event(tmp_path, "evil/x", "org/x", fork=True).items():
        monkeypatch.setenv(key, value)
    assert run(Options(command=[PYTHON, "train.py"], folder=tmp_path)) == 2
    assert "refuses" in capsys.readouterr().err


def test_without_torch_it_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    monkeypatch.setattr(guard.importlib.util, "find_spec", lambda name: None)
    assert run(Options(command=[PYTHON, "train.py"], folder=tmp_path)) == 2
    assert "pip install 'cfgfix[verify]'" in capsys.readouterr().err


# -- pieces ------------------------------------------------------------------------------------
def test_workspace_copy_leaves_out_tool_folders_and_large_data(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(workspace, "MAX_FOLDER_BYTES", 3000)
    src = tmp_path / "src"
    for rel, size in {"train.py": 10, ".git/HEAD": 10, "__pycache__/x.pyc": 10, "big.bin": 2000,
                      "data/a.bin": 900, "data/b.bin": 900, "data/c.bin": 900, "data/d.bin": 900,
                      "configs/ds.json": 10, "env/pyvenv.cfg": 10}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"x" * size)
    copy = workspace.copy_workspace(src, tmp_path / "dst")
    kept = sorted(p.relative_to(copy.root).as_posix() for p in copy.root.rglob("*") if p.is_file())
    assert kept == ["configs/ds.json", "train.py"]
    assert copy.left_out == ["big.bin (0 MiB)", "data/ (0 MiB)", "env/ (a virtual environment)"]


def test_launch_command_forms():
    assert launch_command(["train.py", "--x"]) == [sys.executable, "train.py", "--x"]
    assert launch_command(["torchrun --nproc_per_node 2 train.py"]) == ["torchrun", "--nproc_per_node", "2", "train.py"]
    assert launch_command(["run.sh"]) == ["bash", "run.sh"]


def test_harness_chains_to_the_sitecustomize_it_shadows(tmp_path):
    harness = harness_folder(tmp_path / "harness")
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.CHAINED = True\n")
    env = dict(os.environ, PYTHONPATH=f"{harness}{os.pathsep}{other}")
    done = subprocess.run([sys.executable, "-c", "import builtins; print(getattr(builtins, 'CHAINED', False))"],
                          env=env, capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "True", done.stderr


def test_a_command_that_is_not_python_cannot_be_verified(tmp_path):
    result = run_launch(["true"], tmp_path, steps=2, timeout=10)
    assert result.status == "no report" and result.returncode == 0
    assert judge(result, None, 2, safe_only=True).exit_code == 2


def _result(losses, peak, seeded=True, status="completed") -> RunResult:
    p = blank_report(1) | {"status": status, "steps": 2, "losses": losses, "losses_finite": True,
                           "params_finite": True, "seeded": seeded, "memory": {"cpu_live_peak_bytes": peak}}
    return RunResult("x", [], ".", processes=[p])


def test_verdict_tolerances():
    same = judge(_result([1.0, 0.9], 100), _result([1.0, 0.9], 100), 2, safe_only=True)
    assert same.exit_code == 0
    # a safe fix must not move a seeded loss at all; an unsafe one may, within the tolerance
    assert judge(_result([1.0, 0.9], 100), _result([1.0, 0.9001], 100), 2, safe_only=True).exit_code == 1
    assert judge(_result([1.0, 0.9], 100), _result([1.0, 0.9001], 100), 2, safe_only=False).exit_code == 0
    assert judge(_result([1.0, 0.9], 100), _result([1.0, 0.95], 100), 2, safe_only=False).exit_code == 1
    grew = judge(_result([1.0], 100), _result([1.0], 101), 2, safe_only=True)
    assert grew.exit_code == 1 and "grows by" in grew.checks[-1].detail
    unseeded = judge(_result([1.0], 100, seeded=False), _result([2.0], 90, seeded=False), 2, safe_only=True)
    assert unseeded.exit_code == 0 and unseeded.checks[2].holds is None


class _Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_plain_lines_off_a_terminal_and_a_spinner_on_one():
    plain = _Stream(tty=False)
    progress = Progress(plain)
    for step in (0, 0, 1, 2):
        progress.update("original", step, 2, 1.0)
    assert plain.text.count("\n") == 3 and "\r" not in plain.text
    tty = _Stream(tty=True)
    Progress(tty).update("original", 1, 2, 1.0)
    assert tty.text.startswith("\r") and "step 1/2" in tty.text and "\n" not in tty.text


def test_a_launch_that_kills_every_python_process_is_refused(tmp_path):
    """`pkill -9 -f python` in the launch script (or the command) would kill cfgfix itself and
    every other job of the user, copy or not: verify refuses before copying anything."""
    from cfgfix.verify.guard import destructive_command

    (tmp_path / "start.sh").write_text("#!/bin/bash\npkill -9 -f python\nsleep 5\ntorchrun --nproc_per_node 2 train.py\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash\ntorchrun --nproc_per_node 2 train.py\n")
    assert "start.sh:2" in destructive_command(["bash", "start.sh"], tmp_path)
    assert destructive_command(["bash", "-c", "pkill -9 -f python; python train.py"], tmp_path)
    assert destructive_command(["bash", "run.sh"], tmp_path) is None
    assert destructive_command(["python", "train.py", "--steps", "2"], tmp_path) is None


def test_without_a_command_verify_picks_the_projects_one_launch_script(tmp_path):
    from cfgfix.verify.command import project_launch

    (tmp_path / "train.py").write_text("import torch\nloss = model(x).sum()\nloss.backward()\n")
    (tmp_path / "setup.sh").write_text("pip install -r requirements.txt\n")
    assert project_launch(tmp_path)[0] is None  # no launch script yet
    (tmp_path / "train.sh").write_text("#!/bin/bash\npython train.py --steps 10\n")
    assert project_launch(tmp_path) == (["bash", "train.sh"], "the only launch script here that starts a training script (train.py, which runs a training step)")
    (tmp_path / "other.sh").write_text("#!/bin/bash\ntorchrun --nproc_per_node 2 train.py\n")
    command, problem = project_launch(tmp_path)
    assert command is None and "other.sh, train.sh" in problem
