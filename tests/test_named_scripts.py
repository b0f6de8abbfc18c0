"""A shell script named on the command line (`cfgfix check OPTIMIZE_MEMORY.sh`, the files a
pre-commit hook passes) is checked by the shell rules whether or not it launches training
(issue 22, item 5); the same script found by walking a folder keeps the launch-script test
(a `cleanup.sh` kept as a tool is not a launch script)."""

import json

import pytest
from click.testing import CliRunner
from conftest import write_project

from cfgfix.commands import cli
from cfgfix.settings import load_settings
from cfgfix.workspace import discover

OPTIMIZE = "#!/bin/bash\n# free GPU memory before training\npkill -9 -f python\nnvidia-smi --gpu-reset\n"


def _findings(*args):
    result = CliRunner().invoke(cli, ["check", "--output-format", "json", *args], catch_exceptions=False)
    return sorted((f["filename"], f["location"]["row"], f["code"]) for f in json.loads(result.output))


@pytest.mark.parametrize("name", ["OPTIMIZE_MEMORY.sh", "scripts/free_gpu.bash", "tools/optimize"])
def test_a_named_script_is_checked_launched_or_not(in_tmp, name):
    write_project(in_tmp, {name: OPTIMIZE})
    assert _findings("--no-cache", name) == [(name, 3, "CFX308"), (name, 4, "CFX308")]


def test_the_same_script_found_by_walking_is_not(in_tmp):
    write_project(in_tmp, {"OPTIMIZE_MEMORY.sh": OPTIMIZE, "tools/optimize": OPTIMIZE})
    assert _findings("--no-cache") == []
    assert _findings("--no-cache", "tools") == []  # a folder named is walked: its files are not named


def test_named_beside_a_folder_that_holds_it(in_tmp):
    write_project(in_tmp, {"OPTIMIZE_MEMORY.sh": OPTIMIZE})
    expected = [("OPTIMIZE_MEMORY.sh", 3, "CFX308"), ("OPTIMIZE_MEMORY.sh", 4, "CFX308")]
    assert _findings("--no-cache", ".", "OPTIMIZE_MEMORY.sh") == expected
    assert _findings("--no-cache", "OPTIMIZE_MEMORY.sh", ".") == expected


def test_the_cache_keeps_named_and_walked_results_apart(in_tmp):
    write_project(in_tmp, {"OPTIMIZE_MEMORY.sh": OPTIMIZE})
    assert _findings() == []
    assert len(_findings("OPTIMIZE_MEMORY.sh")) == 2
    assert _findings() == []
    assert len(_findings("OPTIMIZE_MEMORY.sh")) == 2


def test_a_named_script_reports_the_helper_it_runs(in_tmp):
    write_project(in_tmp, {"clean.sh": "#!/bin/bash\nfree_all() {\n  bash kill_all.sh\n}\nfree_all\n",
                           "kill_all.sh": "pkill -f python\n"})
    assert _findings("--no-cache", "clean.sh") == [("clean.sh", 3, "CFX308")]


def test_named_makefile_and_harmless_scripts(in_tmp):
    write_project(in_tmp, {"Makefile": "clean:\n\tpkill -9 -f python\n",
                           "setup.sh": "#!/bin/bash\npip install -r requirements.txt\nkill %1\n"})
    assert _findings("--no-cache", "Makefile", "setup.sh") == [("Makefile", 2, "CFX308")]


def test_discovery_marks_only_named_files(in_tmp):
    write_project(in_tmp, {"a.sh": OPTIMIZE, "sub/b.sh": OPTIMIZE})
    files, _ = discover([in_tmp / "a.sh", in_tmp / "sub"], load_settings(in_tmp))
    assert {(f.display.rsplit("/", 1)[-1], f.named) for f in files} == {("a.sh", True), ("b.sh", False)}
