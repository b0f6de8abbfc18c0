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
        ("ssh node2 'pkill -9 -f python'", False),
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
    "name, expected",
    [
        ("pretrain.sh", True),
        ("restart_job.sh", True),
        ("run-8gpu.sh", True),
        ("launch.bash", True),
        ("prune.sh", False),
        ("utils.sh", False),
    ],
)
def test_launch_script_names(tmp_path, name, expected):
    assert bool(flagged(tmp_path, name, "#!/bin/bash\npkill -9 -f python\n")) is expected


def test_makefile_needs_a_launch(tmp_path):
    assert flagged(tmp_path, "Makefile", "clean:\n\tpkill -f python\n") == []
    assert flagged(tmp_path, "Makefile", "clean:\n\tpkill -f python\ntrain:\n\tpython train.py\n") == [2]
