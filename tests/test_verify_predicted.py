"""`cfgfix verify`'s predicted column: the launch's memory answer (training/memory_answer.py)
next to what the harness measured: parameters, gradients, optimizer states, and the peak on
the run's device; nothing without a target GPU or for a command that names no launch."""

import shutil
from pathlib import Path

from conftest import write_project

from cfgfix.training.fit import gib
from cfgfix.verify.predicted import predicted
from cfgfix.verify.report import _table

REPO = Path(__file__).resolve().parents[1]


def _flan(tmp_path):
    root = tmp_path / "flan"
    shutil.copytree(REPO / "fixtures" / "flan-t5-xl-trainer" / "project", root,
                    ignore=shutil.ignore_patterns(".cfgfix_cache"))
    return root


def test_the_launch_script_or_its_training_script_gets_the_answer(tmp_path):
    root = _flan(tmp_path)
    by_script = predicted(root, ["bash", "run.sh"], "cuda")
    by_python = predicted(root, ["python", "train.py", "--config", "configs/flan_t5_xl.yaml"], "cuda")
    assert by_script == by_python and by_script["gpu"] == "RTX 5090"
    assert by_script["text"].startswith("does not fit RTX 5090")
    assert gib(by_script["peak"]) == "59.6 GiB"  # the peak estimate, check and fix --fit show
    # the model states do not depend on the device; the peak does (no CUDA context on a CPU)
    on_cpu = predicted(root, ["bash", "run.sh"], "cpu")
    assert {k: on_cpu[k] for k in ("parameters", "gradients", "optimizer")} == {
        k: by_script[k] for k in ("parameters", "gradients", "optimizer")}
    assert on_cpu["peak_device"] == "cpu" and on_cpu["peak"] != by_script["peak"]


def test_no_prediction_without_a_gpu_or_a_named_launch(tmp_path):
    root = _flan(tmp_path)
    assert predicted(root, ["python", "other.py"], "cuda") is None
    (root / "cfgfix.toml").unlink()
    write_project(root, {"cfgfix.toml": "# no gpu\n"})
    assert predicted(root, ["bash", "run.sh"], "cuda") is None


def test_the_table_shows_the_predicted_figures_beside_the_measured_ones():
    measured = {"status": "completed", "steps": 2, "target_steps": 2, "state_bytes": {
        "params": 5 * 2**30, "grads": 5 * 2**30, "optimizer": 10 * 2**30, "buffers": 0},
        "memory": {"cpu_live_peak_bytes": 30 * 2**30}}
    guess = {"parameters": 5 * 2**30, "gradients": 5 * 2**30, "optimizer": 10 * 2**30, "peak": 40 * 2**30,
             "peak_device": "cpu", "gpu": "RTX 5090", "text": "does not fit"}
    rows = {line.split("  ")[1].strip(): line for line in _table(("original", "patched"), measured, measured, None,
                                                                  None, guess)[1:]}
    assert "10240.00 MiB predicted" in rows["optimizer state"]
    assert "40960.00 MiB predicted (cpu)" in rows["peak (CPU live tensor bytes)"]
    plain = _table(("original", "patched"), measured, measured, None, None)
    assert not any("predicted" in line for line in plain)
