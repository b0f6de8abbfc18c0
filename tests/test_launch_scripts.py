"""CFX308 beyond the embedded examples: wrappers, pipelines, inline scripts, heredocs, and
which scripts count as launch scripts."""

import pytest
from conftest import lint_project, write_project

LAUNCH = "torchrun --nproc_per_node 2 train.py\n"


def flagged(tmp_path, name, text):
    write_project(tmp_path, {name: text})
    _, _, result = lint_project(tmp_path)
    return [f.span.line for f in result.findings if f.code == "CFX308"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("timeout 10 pkill -f python", True),
        ("env FOO=1 nohup killall python3.11 &", True),
        ("sudo -u trainer pkill -KILL python", True),
        ("pkill -u \"$USER\" -9 python", True),
        ("pkill --signal 9 -f '^python'", True),
        ("kill -9 `pgrep python`", True),
        ("kill -9 $(ps aux | grep '[p]ython' | awk '{print $2}')", True),
        ("nvidia-smi -r", True),
        ("sudo systemctl reboot", True),
        ("fuser -k -9 /dev/nvidia0 /dev/nvidia1", True),
        ("bash -c 'pkill -f python'", True),
        ("command -v pkill >/dev/null", False),
        ("pkill -F /tmp/train.pid", False),
        ("pkill -f python_server_that_is_not_python", False),
        ("killall tensorboard", False),
        ("kill -9 $(lsof -t -i :6006)", False),
        ("fuser -v /dev/nvidia0", False),
        ("docker exec trainer pkill -9 -f python", False),
        ("ssh node2 'pkill -9 -f python'", True),  # every Python process on node2 (issue 22)
        ("ssh -p 2222 -i key node2 \"nvidia-smi --gpu-reset\"", True),
        ("ssh node2 'python train.py'", False),
        ("nvidia-smi --query-compute-apps=pid --format=csv | grep -c pid", False),
    ],
)
def test_commands(tmp_path, line, expected):
    assert bool(flagged(tmp_path, "start.sh", f"#!/bin/bash\n{line}\n{LAUNCH}")) is expected


def test_pipeline_over_continuation_lines(tmp_path):
    text = (
        "#!/bin/bash\n"
        "nvidia-smi --query-compute-apps=pid --format=csv,noheader \\\n"
        "  | xargs -r kill -9\n" + LAUNCH
    )
    assert flagged(tmp_path, "start.sh", text) == [3]


def test_heredoc_body_is_not_a_command(tmp_path):
    text = "#!/bin/bash\ncat > cleanup.sh <<'EOF'\npkill -9 -f python\nEOF\n" + LAUNCH
    assert flagged(tmp_path, "start.sh", text) == []


def test_heredoc_script_that_the_launcher_runs_is_read(tmp_path):
    text = "#!/bin/bash\ncat > cleanup.sh <<'EOF'\npkill -9 -f python\nEOF\nbash cleanup.sh\n" + LAUNCH
    assert flagged(tmp_path, "start.sh", text) == [3]


@pytest.mark.parametrize(
    "name", ["pretrain.sh", "restart_job.sh", "run-8gpu.sh", "launch.bash", "prune.sh", "utils.sh",
             "chexinstruct_gemma3_multinode_z3.sh"],
)
def test_the_content_decides_not_the_name(tmp_path, name):
    """heldout3 (cosbidev/Deep-Sick): SLURM scripts not named like launches start training;
    a script named like one may start nothing."""
    assert flagged(tmp_path / "alone", name, "#!/bin/bash\npkill -9 -f python\n") == []
    assert flagged(tmp_path / "launch", name, "#!/bin/bash\npkill -9 -f python\n" + LAUNCH) == [2]


RESET = "#!/bin/bash\nnvidia-smi --gpu-reset || true\n"


@pytest.mark.parametrize(
    "line",
    [
        "srun bash -c 'python train.py --bf16'",
        "srun --ntasks-per-node=4 -p gpu bash -lc 'cd /work && python train.py'",
        "timeout 10800 srun bash -c '  # 3 hours\n  export RANK=$SLURM_PROCID\n  python train.py --out '\"$OUT\"' --lr 2e-4\n'",
        "bash -c \"torchrun --nproc_per_node 4 train.py --out $OUT\"",
        "sh -c 'accelerate launch --num_processes 2 train.py'",
        "nohup bash -c 'deepspeed --num_gpus 2 train.py' > log.txt 2>&1 &",
        "mpirun -np 4 bash -c 'python -m torch.distributed.run --nproc_per_node 1 train.py'",
        "srun bash -c 'srun python train.py'",
        "bash -c 'echo \"out = '$OUT'\"; python train.py'",
    ],
)
def test_training_inside_an_inline_script_makes_a_launch_script(tmp_path, line):
    assert flagged(tmp_path, "job_a100.sh", RESET + line + "\n") == [2]


@pytest.mark.parametrize(
    "line",
    [
        "srun bash -c 'echo python train.py'",  # only echoed
        "# srun bash -c 'python train.py'",  # a comment
        "echo \"srun bash -c 'python train.py'\"",  # the whole command is echo text
        "printf '%s\\n' \"bash -c 'torchrun train.py'\"",
        "bash -c 'echo '\"'\"'python train.py'\"'\"''",  # quoting this reader does not follow
        "bash train_helpers.sh",  # a file, not an inline script
        "ssh node2 'python train.py'",  # runs elsewhere
        "srun bash -c \"$TRAIN_CMD\"",  # the script is a variable
    ],
)
def test_inline_near_misses_start_no_training(tmp_path, line):
    assert flagged(tmp_path, "train_job.sh", RESET + line + "\n") == []


@pytest.mark.parametrize(
    "lines, expected",
    [
        ("srun bash <<'EOF'\npython train.py\nEOF", [2]),
        ("cat <<'EOF' | srun -N 2 bash -s\ntorchrun --nproc_per_node 4 train.py\nEOF", [2]),
        ("nohup bash <<EOF > log 2>&1\naccelerate launch train.py\nEOF", [2]),
        ("srun python - <<'EOF'\nimport os\nprint('python train.py')\nEOF", []),  # a Python program, not shell
        ("srun bash -c 'cat' <<'EOF'\npython train.py\nEOF", []),  # the shell runs its -c string, not stdin
    ],
)
def test_heredocs_read_by_a_shell_behind_a_wrapper(tmp_path, lines, expected):
    assert flagged(tmp_path, "job.sh", RESET + lines + "\n") == expected


def test_a_heredoc_that_srun_runs_counts_copies():
    from cfgfix.documents.launches import find_launches
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText

    doc = parse_shell(SourceText("job.sh", "srun bash <<'EOF'\npython train.py\nEOF\nbash <<'EOF'\npython eval.py\nEOF\n"))
    train, evaluate = find_launches(doc)
    assert (train.script.text, train.world_size) == ("train.py", None)
    assert (evaluate.script.text, evaluate.world_size) == ("eval.py", 1)


def test_a_readme_block_is_not_a_launch_script(tmp_path):
    readme = "# Train\n\n```bash\nnvidia-smi --gpu-reset\nsrun bash -c 'python train.py'\ntorchrun train.py\n```\n"
    assert flagged(tmp_path, "README.md", readme) == []


def test_inline_words_keep_their_positions_and_srun_counts_copies():
    from cfgfix.documents.launches import find_launches
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText

    text = ("OUT=./o\ntimeout 1h srun -N 2 bash -c '\n  python train.py --out '\"$OUT\"' --x 1\n'\n"
            "bash -c 'python eval.py'\n")
    doc = parse_shell(SourceText("job.sh", text))
    train, evaluate = find_launches(doc)
    assert train.script.text == "train.py" and train.script.span.line == 3
    assert text[train.script.span.start:train.script.span.end] == "train.py"
    out = train.script_args[1]
    assert out.text == "$OUT" and out.raw == "'\"$OUT\"'"
    assert train.world_size is None  # one copy per srun task: not known from the file
    assert evaluate.world_size == 1  # a plain shell runs it once


def test_makefile_needs_a_launch(tmp_path):
    assert flagged(tmp_path, "Makefile", "clean:\n\tpkill -f python\n") == []
    assert flagged(tmp_path, "Makefile", "clean:\n\tpkill -f python\ntrain:\n\tpython train.py\n") == [2]


# -- what a launch script runs elsewhere (issue 22) ---------------------------------------------
def _helper_project(tmp_path, launch, helpers):
    write_project(tmp_path, {"run.sh": launch, **helpers})
    _, _, result = lint_project(tmp_path)
    return [(f.path, f.span.line, [r.span.path for r in f.related]) for f in result.findings if f.code == "CFX308"]


@pytest.mark.parametrize("call", ["bash kill_all.sh", "sh ./kill_all.sh", "source kill_all.sh", ". kill_all.sh",
                                  "./kill_all.sh", "sudo bash kill_all.sh || true", "bash -e kill_all.sh"])
def test_a_helper_script_the_launch_runs_is_read(tmp_path, call):
    found = _helper_project(tmp_path, f"#!/bin/bash\n{call}\n{LAUNCH}", {"kill_all.sh": "#!/bin/bash\npkill -f python\n"})
    assert found == [("run.sh", 2, ["kill_all.sh"])], found


def test_helpers_are_followed_three_deep_once_each_and_from_their_own_folder(tmp_path):
    found = _helper_project(
        tmp_path, "#!/bin/bash\nbash tools/a.sh\nbash tools/a.sh\n" + LAUNCH,
        {"tools/a.sh": "bash b.sh\n", "tools/b.sh": "source ./c.sh\n", "tools/c.sh": "killall python3\n"})
    assert found == [("run.sh", 2, ["tools/c.sh"])], found


def test_a_cycle_of_helpers_ends(tmp_path):
    found = _helper_project(tmp_path, "#!/bin/bash\nbash a.sh\n" + LAUNCH,
                            {"a.sh": "bash b.sh\n", "b.sh": "bash a.sh\npkill -9 -f python\n"})
    assert found == [("run.sh", 2, ["b.sh"])], found


def test_a_helper_outside_the_project_is_not_read(tmp_path):
    outside = tmp_path / "outside.sh"
    outside.write_text("pkill -9 -f python\n")
    project = tmp_path / "project"
    found = _helper_project(project, f"#!/bin/bash\nbash ../outside.sh\nbash {outside}\n" + LAUNCH, {})
    assert found == []


def test_a_helper_of_a_script_that_starts_no_training_is_not_flagged(tmp_path):
    found = _helper_project(tmp_path, "#!/bin/bash\nbash kill_all.sh\necho done\n", {"kill_all.sh": "pkill -f python\n"})
    assert found == []


def test_a_changed_helper_is_seen_by_a_cached_run(tmp_path):
    from conftest import lint_project as lint

    write_project(tmp_path, {"run.sh": "#!/bin/bash\nbash stop.sh\n" + LAUNCH, "stop.sh": "kill $(cat train.pid)\n"})
    _, _, first = lint(tmp_path, use_cache=True)
    assert not [f for f in first.findings if f.code == "CFX308"]
    (tmp_path / "stop.sh").write_text("pkill -9 -f python\n")
    _, _, second = lint(tmp_path, use_cache=True)
    assert [f.span.line for f in second.findings if f.code == "CFX308"] == [2]
