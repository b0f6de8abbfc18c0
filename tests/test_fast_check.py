"""`cfgfix check` with its common options runs without click (cli.py parses them); it must
print and exit exactly as the click command line does, and anything else goes to click."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cfgfix.cli import _check_options

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "flan-t5-xl-trainer" / "project"

FAST = textwrap.dedent("""
    import sys
    from cfgfix.cli import main
    try:
        main(sys.argv[1:])
    finally:
        sys.stderr.write("click loaded: %s\\n" % ("click" in sys.modules))
""")
CLICK = textwrap.dedent("""
    import sys
    from cfgfix.commands import cli
    try:
        cli.main(args=sys.argv[1:], prog_name="cfgfix")
    finally:
        sys.stderr.write("click loaded: %s\\n" % ("click" in sys.modules))
""")


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout, whatever cfgfix the interpreter has installed
    env = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--no-cache"],
        ["check", "--no-cache", "--output-format", "json"],
        ["check", "--no-cache", "--output-format=sarif", "-q"],
        ["check", "--no-cache", "--output-format", "concise"],
        ["check", "--no-cache", "--output-format=concise", "-q"],
        ["check", "--no-cache", "--statistics", "."],
        ["check", "--no-cache", "--select", "CFX1", "--ignore=CFX103", "."],
        ["check", "--no-cache", "--extend-select", "CFX902", "--", "."],
        ["check", "--no-cache", "no-such-file.py"],
        ["check", "--no-cache", "--select", "CFX999"],
    ],
)
def test_the_fast_path_prints_what_click_prints(args):
    fast = _run(FAST, args, FIXTURE)
    slow = _run(CLICK, args, FIXTURE)
    assert fast.stderr.endswith("click loaded: False\n"), fast.stderr
    assert slow.stderr.endswith("click loaded: True\n")
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout)
    assert fast.stderr.replace("False", "True") == slow.stderr


def test_a_folder_with_nothing_to_check(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    fast = _run(FAST, ["check", "--no-cache"], tmp_path)
    slow = _run(CLICK, ["check", "--no-cache"], tmp_path)
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout) == (0, "No files checked.\n")


@pytest.mark.parametrize(
    "args",
    [
        ["--fix"], ["--diff"], ["--unsafe-fixes"], ["--simulate"], ["--config", ""], ["-h"], ["--help"],
        ["--output-format", "yaml"], ["--select"], ["--select", "--no-cache"], ["-qq"], [""], ["--no-cache=1"],
    ],
)
def test_what_the_fast_path_leaves_to_click(args):
    assert _check_options(args) is None


def test_options_as_click_reads_them():
    options = _check_options(["a.py", "--select=CFX1,CFX2", "-q", "--select", "CFX3", "--", "--weird.py"])
    assert options["select"] == "CFX3"  # the last one wins, as in click
    assert options["quiet"] is True and options["no_cache"] is False
    assert options["paths"] == (Path("a.py"), Path("--weird.py"))
    assert _check_options(["--select="])["select"] == ""
    options = _check_options(["--config", "x.toml", "--isolated", "--gpu=RTX 4090"])
    assert (options["config_file"], options["isolated"], options["gpu"]) == (Path("x.toml"), True, "RTX 4090")


@pytest.mark.parametrize("args", [["check", "--no-cache", "--output-format", "json"], ["check", "--no-cache", "no-such-file.py"]])
def test_the_entry_point_ends_without_teardown_and_loses_nothing(args):
    """`python -m cfgfix check` ends with os._exit once the report is out (cli.py): the
    same bytes and exit status as the click command line, through a pipe."""
    entry = subprocess.run([sys.executable, "-m", "cfgfix", *args], capture_output=True, text=True, cwd=FIXTURE,
                           env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1"})
    slow = _run(CLICK, args, FIXTURE)
    assert (entry.returncode, entry.stdout) == (slow.returncode, slow.stdout)
    assert entry.stderr + "click loaded: True\n" == slow.stderr


def test_the_entry_point_writes_its_cache_before_it_ends(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda().half().half()\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    first = subprocess.run([sys.executable, "-m", "cfgfix", "check", "train.py"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    cached = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "train.py"]
    assert cached, "the run left no cache"
    again = subprocess.run([sys.executable, "-m", "cfgfix", "check", "train.py"], capture_output=True, text=True,
                           cwd=tmp_path, env=env)
    assert (again.returncode, again.stdout) == (first.returncode, first.stdout)


def test_the_entry_point_exits_quietly_into_a_closed_pipe():
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    writer = subprocess.run([sys.executable, "-m", "cfgfix", "check", "--no-cache", "--output-format", "json"],
                            stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=FIXTURE,
                            env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1"})
    reader.stdin.close()
    reader.wait()
    assert "Traceback" not in writer.stderr
    assert writer.returncode in (0, 1)


@pytest.mark.parametrize("exiting", [False, True])
def test_the_collector_is_back_on_unless_the_process_is_ending(exiting, monkeypatch):
    """A few files are checked with the cyclic collector paused; a caller that goes on in
    the same process gets it back, the CLI's own process (which ends at once) does not pay
    for a pass over everything the run made."""
    import gc

    from cfgfix.checking import check

    monkeypatch.chdir(FIXTURE)
    assert gc.isenabled()
    try:
        with pytest.raises(SystemExit):
            check(paths=(Path("train.py"),), select=None, ignore=None, extend_select=None, output_format="json",
                  config_file=None, no_cache=True, quiet=True, statistics=False, exiting=exiting)
        assert gc.isenabled() is not exiting
    finally:
        gc.enable()
