"""`cfgfix verify` reports coverage of the change: the statements a fix (or a revision) edited,
and whether they ran during the measured steps. A fix whose lines did not run never "holds":
an evaluation-only fix that two steps never reach, a CUDA-guarded line on a CPU run. Also:
gradient norms compared like losses, long series summarised, launches whose effects escape
the copies refused, and a launch that started no training said plainly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.verify import coverage
from cfgfix.verify.guard import uncontained_command
from cfgfix.verify.report import compare_series, to_text
from cfgfix.verify.runner import RunResult, blank_report, run_launch
from cfgfix.verify.verdict import describe, judge

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "verify"
PYTHON = sys.executable


def _git(folder: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull)
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, env=env, text=True).stdout


def _verify(folder: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key in ("GITHUB_EVENT_NAME", "GITHUB_EVENT_PATH"):
                mp.delenv(key, raising=False)
            for key, value in (env or {}).items():
                mp.setenv(key, value)
            result = CliRunner().invoke(cli, ["verify", "--output-format", "json", *args])
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, (json.loads(result.stdout) if result.stdout.strip() else {}), result.stderr


def _check(doc: dict, name: str) -> dict:
    return next(c for c in doc["verdict"]["checks"] if c["name"] == name)


def _units(doc: dict) -> list[dict]:
    return [u for u in doc["coverage"]["units"] if u["counts"]]


# -- which lines changed, and what must run ---------------------------------------------------------
BEFORE = '''import torch


def evaluate(model, data):
    model.eval()
    for batch in data:
        model(batch)  # forward only
    model.train()


def train(model, data, optimizer, step):
    loss = model(data).sum()
    loss.backward()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if step % 100 == 0:
        print("checkpoint")
    optimizer.step()
'''


def test_reindented_lines_are_not_changes_and_a_def_header_needs_its_body_to_run():
    after = BEFORE.replace('''    for batch in data:
        model(batch)  # forward only''', '''    with torch.no_grad():
        for batch in data:
            model(batch)  # forward only''')
    changed, replaced, deleted = coverage.changed_lines(BEFORE, after)
    assert changed == {6} and not replaced and not deleted  # only the `with` line: the loop is re-indented
    (unit,) = coverage._units(after, "train.py", changed, "after", counts=True)
    assert unit.probe == [6] and unit.function == "evaluate"
    decorated = BEFORE.replace("def evaluate(", "@torch.no_grad()\ndef evaluate(")
    changed, _, _ = coverage.changed_lines(BEFORE, decorated)
    (unit,) = coverage._units(decorated, "train.py", changed, "after", counts=True)
    # the decorator runs at import; the change is exercised only when evaluate() is called
    assert unit.lines == [4] and unit.probe == [6, 7, 8, 9]


def test_guards_are_named_and_comments_are_no_change():
    after = BEFORE.replace("torch.cuda.synchronize()", "torch.cuda.empty_cache()").replace(
        'print("checkpoint")', 'print("saving")').replace("# forward only", "# no grads needed")
    changed, _, _ = coverage.changed_lines(BEFORE, after)
    units = coverage._units(after, "train.py", changed, "after", counts=True)
    by_line = {u.lines[0]: u for u in units}
    assert set(by_line) == {15, 17}  # line 7 changed only its comment
    assert by_line[15].cuda_guard == 14 and by_line[17].every_n == 16
    assert "GPU" in coverage.hint(by_line[15], 2, on_cpu=True)
    assert "--steps" in coverage.hint(by_line[17], 2, on_cpu=True)
    comment_only = "# a new comment\n" + BEFORE
    changed, _, _ = coverage.changed_lines(BEFORE, comment_only)
    assert coverage._units(comment_only, "train.py", changed, "after", counts=True) == []


def test_a_deletion_must_have_run_in_the_original(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "train.py").write_text(BEFORE)
    (tmp_path / "b" / "train.py").write_text(BEFORE.replace("    if torch.cuda.is_available():\n        torch.cuda.synchronize()\n", ""))
    (tmp_path / "a" / "config.yaml").write_text("lr: 1\n")
    (tmp_path / "b" / "config.yaml").write_text("lr: 2\n")
    change = coverage.build([("train.py", "train.py"), ("config.yaml", "config.yaml")], tmp_path / "a", tmp_path / "b")
    assert [(u.side, u.lines, u.counts) for u in change.units] == [("before", [14], True), ("before", [15], True)]
    assert [f.path for f in change.other] == ["config.yaml"]
    spec = change.spec(tmp_path / "a", "before")
    assert spec["files"] == {str(tmp_path / "a" / "train.py"): [[14], [15]]}
    assert spec["reads"] == [str(tmp_path / "a" / "config.yaml")]


# -- the harness records the lines, on this Python and with sys.monitoring -------------------------
SCRIPT = '''import threading


def used(x):
    if x > 100:
        return "big"
    return "small"


def unused():
    return 1


def in_a_thread():
    value = 2
    return value


used(1)
thread = threading.Thread(target=in_a_thread)
thread.start()
thread.join()
open("config.yaml").read()
'''


def _pythons():
    """This Python, and one with sys.monitoring (3.12+) when the machine has one."""
    found = [PYTHON]
    if sys.version_info >= (3, 12):
        return found
    candidates = [shutil.which(f"python3.{minor}") for minor in (12, 13, 14)]
    candidates += [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3"))]
    for path in filter(None, candidates):
        probe = subprocess.run([path, "-c", "import sys; print(hasattr(sys, 'monitoring'))"],
                               capture_output=True, text=True, check=False)
        if probe.stdout.strip() == "True":
            return [*found, path]
    return found


@pytest.mark.parametrize("python", _pythons())
def test_the_harness_records_only_changed_lines_that_ran(tmp_path, python):
    (tmp_path / "prog.py").write_text(SCRIPT)
    (tmp_path / "config.yaml").write_text("a: 1\n")
    (tmp_path / "other.yaml").write_text("b: 1\n")
    prog = str((tmp_path / "prog.py").resolve())
    spec = {"files": {prog: [[5], [6], [7], [11], [15, 16]]},
            "reads": [str(tmp_path / "config.yaml"), str(tmp_path / "other.yaml")]}
    result = run_launch([python, "prog.py"], tmp_path, steps=2, timeout=60, cover=spec)
    assert result.returncode == 0, result.output_tail
    # x > 100 ran, its `return "big"` did not; unused() never ran; the thread's function did
    # (line 15 proves it: line 16 is not watched any more)
    assert result.covered == {prog: [5, 7, 15]}
    assert result.reads == [str((tmp_path / "config.yaml").resolve())]
    assert [s["role"] for s in result.started] == ["worker"]


# -- whole runs: an evaluation-only fix and a CUDA-guarded change on the CPU never "hold" ------------
@pytest.fixture(scope="module")
def eval_only(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("eval-only") / "plain-loop"
    shutil.copytree(FIXTURES / "plain-loop", folder)
    return _verify(folder, "--fix-unsafe", "--", PYTHON, "train.py", "--eval-steps", "100")


def test_an_evaluation_only_fix_that_two_steps_never_reach_is_not_exercised(eval_only):
    code, doc, _ = eval_only
    assert code == 3 and doc["verdict"]["state"] == "not exercised" and doc["verdict"]["holds"] is False
    assert {c["name"]: c["holds"] for c in doc["verdict"]["checks"]} == {
        "completed steps": True, "finite losses and parameters": True, "losses match": True,
        "gradient norms match": True, "peak memory": True, "changed lines ran": False}
    units = {u["code"]: u for u in _units(doc)}
    with_line = units["with torch.no_grad():"]  # CFX303 inside evaluate(), every 100 steps
    assert with_line["ran"] is False and with_line["function"] == "evaluate"
    assert "evaluate() did not run in 2 steps" in with_line["hint"]
    guarded = units["torch.cuda.empty_cache()"]  # CFX301 removes it; the CPU run never called it
    assert guarded["side"] == "before" and guarded["ran"] is False and "GPU" in guarded["hint"]
    assert units["if torch.cuda.is_available():"]["ran"] is True  # the test itself runs on a CPU


def test_the_text_report_lists_the_lines_with_hints(eval_only):
    _code, doc, _ = eval_only
    from cfgfix.verify.verdict import Check, Verdict

    verdict = Verdict(True, [Check(c["name"], c["holds"], c["detail"]) for c in doc["verdict"]["checks"]])
    runs = []
    for key in ("before", "after"):
        run = doc["runs"][key]
        runs.append(RunResult(run["label"], run["command"], ".", returncode=run["returncode"], processes=run["processes"]))
    text = to_text(doc, *runs, verdict)
    assert "NOT RUN train.py:46  with torch.no_grad():" in text
    assert "evaluate() did not run in 2 steps" in text
    assert "verdict: NOT EXERCISED" in text and "(exit 3)" in text
    assert "MISS changed lines ran" in text


def _cuda_guarded_repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    text = (FIXTURES / "early-exit" / "train.py").read_text()
    old = "        optimizer.step()\n"
    assert old in text
    base = text.replace(old, old + "        if torch.cuda.is_available():\n            torch.cuda.synchronize()\n")
    (folder / "train.py").write_text(base)
    _git(folder, "init", "-q")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-qm", "base")
    (folder / "train.py").write_text(base.replace("            torch.cuda.synchronize()\n", "            torch.cuda.empty_cache()\n"))
    _git(folder, "commit", "-qam", "head")
    return folder


def test_a_cuda_guarded_change_on_the_cpu_is_not_exercised(tmp_path):
    pytest.importorskip("torch")
    folder = _cuda_guarded_repo(tmp_path)
    code, doc, _ = _verify(folder, "--device", "cpu", "--before", "HEAD~1", "--after", "HEAD", "--", PYTHON, "train.py", "--target", "0")
    assert code == 3 and doc["verdict"]["state"] == "not exercised"
    (unit,) = _units(doc)
    assert unit["code"] == "torch.cuda.empty_cache()" and unit["ran"] is False and unit["cuda_guard"] == 25
    assert "this run was on the CPU: verify on a GPU" in unit["hint"]
    assert _check(doc, "losses match")["holds"] and _check(doc, "gradient norms match")["holds"]


def test_a_change_that_runs_holds(tmp_path):
    pytest.importorskip("torch")
    folder = _cuda_guarded_repo(tmp_path)
    text = (folder / "train.py").read_text()
    (folder / "train.py").write_text(text.replace("        loss.backward()\n", "        loss.backward(retain_graph=False)\n"))
    _git(folder, "commit", "-qam", "runs")
    code, doc, _ = _verify(folder, "--before", "HEAD~1", "--after", "HEAD", "--", PYTHON, "train.py", "--target", "0")
    assert code == 0 and doc["verdict"]["state"] == "holds", doc["verdict"]
    (unit,) = _units(doc)
    assert unit["code"] == "loss.backward(retain_graph=False)" and unit["ran"] is True
    assert _check(doc, "changed lines ran")["detail"] == "1 of 1 changed statement ran"


# -- gradient norms and long series ------------------------------------------------------------------
def _result(losses, norms, peak=100) -> RunResult:
    p = blank_report(1) | {"status": "completed", "steps": len(norms), "losses": losses, "grad_norms": norms,
                           "losses_finite": True, "params_finite": True, "seeded": True,
                           "memory": {"cpu_live_peak_bytes": peak}}
    return RunResult("x", [], ".", processes=[p])


def test_gradient_norms_are_compared_like_losses_and_worded_honestly():
    same_losses = judge(_result([1.0, 0.9], [6.1495, 5.0]), _result([1.0, 0.9], [6.0864, 5.0]), 2, safe_only=True)
    losses, norms = (c for c in same_losses.checks if c.name in ("losses match", "gradient norms match"))
    assert losses.holds and "the gradient norms are not" in losses.detail
    assert norms.holds is False and "6.0864 against 6.1495" in norms.detail
    assert same_losses.exit_code == 1
    unsafe = judge(_result([1.0, 0.9], [6.1495, 5.0]), _result([1.0, 0.9], [6.0864, 5.0]), 2, safe_only=False)
    norms = next(c for c in unsafe.checks if c.name == "gradient norms match")
    assert norms.holds and norms.detail.startswith("differ, within 2% relative (largest difference 1.026%")
    far = judge(_result([1.0], [6.0]), _result([1.0], [7.0]), 1, safe_only=False)
    assert far.exit_code == 1


def test_long_series_are_summarised_in_the_text_and_whole_in_json():
    before = [2.0 + i / 100 for i in range(40)]
    after = list(before)
    after[7] += 0.001
    assert compare_series(before, after) == "1 of 40 differ, max 0.001 (0.05%)"
    assert compare_series(before, before) == "identical"
    run_b, run_a = _result(before, [1.0] * 40), _result(after, [1.0] * 40)
    context = {"command": ["python", "train.py"], "steps": 40, "before_ref": "a", "after_ref": "b", "fixes": None}
    verdict = judge(run_b, run_a, 40, safe_only=False)
    text = to_text(context, run_b, run_a, verdict)
    row = next(line for line in text.splitlines() if line.strip().startswith("losses "))
    assert "40 values: first 2.0000, last 2.3900" in row and "1 of 40 differ" in row and len(row) < 160
    assert max(len(line) for line in text.splitlines() if "values" in line) < 160


# -- launches -----------------------------------------------------------------------------------------
def test_launches_whose_effects_escape_the_copies_are_refused(tmp_path):
    (tmp_path / "run_full_sdxl.sh").write_text(
        '#!/bin/bash\nexport OUT="/home/u/sdxl-out"\ncd "$(dirname "$0")"\n'
        "accelerate launch train_sdxl.py \\\n  --output_dir=$OUT --resolution 1024 2>&1 | tee logs/run.txt\n")
    (tmp_path / "abs_cd.sh").write_text("#!/bin/bash\ncd /home/u/project\npython train.py\n")
    (tmp_path / "fine.sh").write_text('#!/bin/bash\ncd "$(dirname "$0")"\nmkdir -p out\npython train.py --data /data/x --output_dir out > log.txt 2>/dev/null\n')
    assert "run_full_sdxl.sh:4 writes to /home/u/sdxl-out" in uncontained_command(["bash", "run_full_sdxl.sh"], tmp_path)
    assert "abs_cd.sh:2 changes to a folder outside the copy (`cd /home/u/project`)" in uncontained_command(["bash", "abs_cd.sh"], tmp_path)
    assert uncontained_command(["bash", "fine.sh"], tmp_path) is None
    assert "writes to ../runs" in uncontained_command(["bash", "-c", "mkdir -p ../runs && python train.py"], tmp_path)
    assert "writes to ~/log" in uncontained_command(["python", "train.py", "--logging_dir", "~/log"], tmp_path)
    assert uncontained_command(["python", "train.py", "--output_dir", "out"], tmp_path) is None


def test_verify_refuses_an_uncontained_launch_with_exit_2(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "train.sh").write_text("#!/bin/bash\ncd /srv/training && python train.py\n")
    code, _, err = _verify(tmp_path, "--", "bash", "train.sh")
    assert code == 2 and "verify refuses to run this: train.sh:2 changes to a folder outside the copy" in err


def test_without_a_command_it_says_which_launch_it_picked_and_why(tmp_path):
    from cfgfix.verify.command import project_launch

    (tmp_path / "train.py").write_text("import torch\nloss = model(x).sum()\nloss.backward()\noptimizer.step()\n")
    (tmp_path / "train.sh").write_text("#!/bin/bash\npython train.py --steps 10\n")
    command, why = project_launch(tmp_path)
    assert command == ["bash", "train.sh"]
    assert why.startswith("the only launch script here that starts a training script (train.py")


def test_a_launch_that_starts_no_python_says_so(tmp_path):
    result = run_launch(["bash", "-c", "echo preparing; exit 0"], tmp_path, steps=2, timeout=30)
    assert result.status == "no report" and result.started == []
    message = describe(result)
    assert "exit code 0" in message and "without starting a Python process that cfgfix could see" in message
    assert judge(result, None, 2, safe_only=True).exit_code == 2


def test_a_launch_whose_python_never_trains_says_so(tmp_path):
    (tmp_path / "run_full_sdxl.sh").write_text(f'#!/bin/bash\n"{PYTHON}" -c "print(\'checking the dataset\')"\n')
    result = run_launch(["bash", "run_full_sdxl.sh"], tmp_path, steps=2, timeout=60)
    assert [s["role"] for s in result.started] == ["worker"]
    assert result.status == "exited early"
    assert "(it never imported torch: the launch did not start training)" in describe(result)
    assert judge(result, None, 2, safe_only=True).exit_code == 2


@pytest.mark.parametrize("python", _pythons())
def test_tracing_stops_once_every_changed_statement_ran(tmp_path, python):
    (tmp_path / "prog.py").write_text(
        "import sys\n\n\ndef f():\n    return 1\n\n\nf()\n"
        "monitoring = getattr(sys, 'monitoring', None)\n"
        "tools = [monitoring.get_tool(i) for i in range(6)] if monitoring else []\n"
        "print(sys.gettrace() is None and 'cfgfix-verify' not in tools)\n")
    prog = str((tmp_path / "prog.py").resolve())
    result = run_launch([python, "prog.py"], tmp_path, steps=2, timeout=60, cover={"files": {prog: [[5]]}, "reads": []})
    assert result.covered == {prog: [5]}
    assert result.output_tail.strip() == "True"
