"""Hostile and odd input (issue 14): each case a fuzzer found gets its regression test. None
may give a traceback, an internal error (a bug) or a hang; bad input is a CFX901, a warning
or a clear error, and the run goes on."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from conftest import REPO, write_project

BIG = "9" * 5000  # past Python's 4,300-digit conversion limit
LONG = "a" * 300  # past the 255-byte file name limit
TRAIN = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.to(device)\n"
)


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def assert_no_bug(code, out):
    assert code in (0, 1), out
    assert "internal error" not in out and "Traceback" not in out, out


# -- names over 255 bytes ---------------------------------------------------------------------
def test_a_launch_naming_files_over_255_bytes(in_tmp):
    write_project(in_tmp, {
        "run.sh": (f"accelerate launch --config_file {LONG}.yaml train.py --deepspeed {LONG}.json --config {LONG}.yaml\n"
                   f"deepspeed {LONG}.py --deepspeed_config {LONG}.json\n"
                   f"torchrun --nproc_per_node 2 train.py --model_name_or_path /{LONG}/{LONG}\n"),
        "train.py": ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     f"import config_{LONG}\n"
                     f"model = AutoModelForCausalLM.from_pretrained('./{LONG}')\n"
                     "Trainer(model=model, args=TrainingArguments('o')).train()\n"),
        "cfgfix.toml": 'gpu = "RTX 4070"\n',
    })
    for command in (("check", "--no-cache"), ("fix", "--unsafe-fixes", "--no-cache"), ("explain",)):
        assert_no_bug(*run(*command))
    code, out = run("estimate")
    assert code == 2 and "not estimated" in out and "Traceback" not in out and "internal error" not in out
    code, out = run("fix", "--fit")
    assert "Traceback" not in out and "internal error" not in out


# -- integers Python cannot convert -------------------------------------------------------------
def test_huge_integers_everywhere_are_ordinary_input(in_tmp):
    write_project(in_tmp, {
        "ds.json": f'{{"train_micro_batch_size_per_gpu": {BIG}, "zero_optimization": {{"stage": 2}}, "fp16": {{"enabled": true}}}}\n',
        "acc.yaml": (f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: {BIG}\n"
                     "mixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"),
        "train.py": ("import torch\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
                     "Trainer(model=model, args=TrainingArguments('o', bf16=True)).train()\n"),
        "run.sh": (f"export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{BIG}\n"
                   f"accelerate launch --config_file acc.yaml --num_processes {BIG} train.py "
                   f"--per_device_train_batch_size {BIG} --gradient_accumulation_steps {BIG}\n"),
        "requirements.txt": f"torch==2.{BIG}\ntransformers>=4.{BIG}\naccelerate<{BIG}\n",
        "environment.yml": f"name: x\ndependencies:\n  - python=3.{BIG}\n  - pip:\n    - torch=={BIG}\n",
        "sub/pyproject.toml": f"[project]\nname = 'x'\ndependencies = ['torch==1.{BIG}']\n",
        "sub/train.py": TRAIN,
        "sub/ds.json": '{"zero_optimization": {"stage": 2}, // c\n "x": ' + "[" * 1000 + "]" * 1000 + "}\n",
    })
    for command in (("check", "--no-cache"), ("check",), ("check",), ("fix", "--unsafe-fixes", "--no-cache"),
                    ("explain",), ("estimate",)):
        code, out = run(*command)
        assert_no_bug(code, out)
    code, out = run("check", "--no-cache")
    assert "ds.json:1:36: CFX901 invalid JSON: a number with more than 4,300 digits" in out


def test_a_deeply_nested_environment_file_with_huge_numbers_is_no_pins(in_tmp):
    nested = "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 300)) + "  " * 300 + f"v: {BIG}\n"
    write_project(in_tmp, {"environment.yml": nested + f"dependencies:\n  - torch={BIG}\n", "train.py": TRAIN,
                           "pyproject.toml": "[project]\nname = 'x'\nx = " + "[" * 3000 + "]" * 3000 + "\n"})
    (in_tmp / "pyproject.toml").unlink()  # a broken pyproject is a settings error; pins are read lazily
    assert_no_bug(*run("check"))
    assert_no_bug(*run("check"))  # the cached path asks for the pins again (engine._file_key)


# -- FIFOs, devices, files that vanish ----------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_never_block(in_tmp):
    write_project(in_tmp, {"train.py": TRAIN})
    os.mkfifo(in_tmp / "named.py")
    os.mkfifo(in_tmp / "noext")
    os.mkfifo(in_tmp / "requirements.txt")
    os.mkfifo(in_tmp / ".gitignore")
    started = time.monotonic()
    code, out = run("check", "named.py", "noext")
    assert code == 0 and "named.py: not a regular file; skipped" in out
    code, out = run("check")  # FIFOs in the tree, as ignore and pin files
    assert code == 1 and "CFX103" in out
    (in_tmp / ".cfgfix_cache").mkdir(exist_ok=True)
    for results in (in_tmp / ".cfgfix_cache").glob("results-*.json"):
        results.unlink()
        os.mkfifo(results)
    code, out = run("check")
    assert code == 1 and "CFX103" in out
    assert time.monotonic() - started < 30


def test_dev_zero_named_or_linked_is_not_read(in_tmp):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    write_project(in_tmp, {"train.py": TRAIN})
    (in_tmp / "zero.py").symlink_to("/dev/zero")
    code, out = run("check", "--no-cache", "/dev/zero", "zero.py")
    assert code == 0 and "not a regular file" in out
    assert_no_bug(*run("check", "--no-cache"))


def test_a_file_deleted_while_fix_runs(in_tmp, monkeypatch):
    from cfgfix.engine import Engine

    write_project(in_tmp, {"train.py": TRAIN, "other.py": TRAIN})
    original = Engine.run

    def run_then_delete(self, files):
        result = original(self, files)
        (in_tmp / "train.py").unlink()
        return result

    monkeypatch.setattr(Engine, "run", run_then_delete)
    code, out = run("fix", "--no-cache")
    assert code == 2 and "cannot read train.py" in out and "Traceback" not in out
    assert "model.to(device)" not in (in_tmp / "other.py").read_text()  # the run went on


# -- the cache ----------------------------------------------------------------------------------
def _results(root: Path) -> Path:
    (found,) = (root / ".cfgfix_cache").glob("results-*.json")
    return found


def test_a_cache_file_of_the_wrong_shape_is_a_miss(in_tmp):
    from cfgfix.cache import _MAGIC, content_hash

    write_project(in_tmp, {"train.py": TRAIN})
    code, first = run("check")
    path = _results(in_tmp)
    for entries in ({"train.py": ["x", {"findings": 5}]}, [1, 2], {"train.py": [1]}, "x",
                    {"train.py": None}):
        body = json.dumps(entries).encode()
        path.write_bytes(_MAGIC + content_hash(body).encode() + b"\n" + body)  # a valid checksum
        assert run("check") == (code, first)
    key = next(iter(json.loads(path.read_bytes().partition(b"\n")[2])))
    shaped = {key: [json.loads(path.read_bytes().partition(b"\n")[2])[key][0],
                    {"findings": [{"code": 1}], "conditional": [], "launches": [{"x": 1}], "errors": []}]}
    body = json.dumps(shaped).encode()
    path.write_bytes(_MAGIC + content_hash(body).encode() + b"\n" + body)
    assert run("check") == (code, first)
    path.write_bytes(b"{not json")
    assert run("check") == (code, first)


def test_changed_digits_in_the_cache_are_never_served(in_tmp):
    write_project(in_tmp, {"train.py": TRAIN})
    code, first = run("check")
    path = _results(in_tmp)
    raw = path.read_bytes()
    assert b'"line":4' in raw
    path.write_bytes(raw.replace(b'"line":4', b'"line":3'))  # a changed digit, checksum stale
    assert run("check") == (code, first)


def test_a_symlinked_cache_folder_is_not_used(in_tmp, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    write_project(in_tmp, {"train.py": TRAIN})
    (in_tmp / ".cfgfix_cache").symlink_to(outside, target_is_directory=True)
    code, out = run("check")
    assert code == 1 and "CFX103" in out
    assert list(outside.iterdir()) == []  # nothing written outside the project


def test_stale_temporary_files_are_cleaned_and_new_ones_never_left(in_tmp, monkeypatch):
    import cfgfix.fixing as fixing

    write_project(in_tmp, {"train.py": TRAIN})
    old = time.time() - 3600
    stale = in_tmp / ".train.py.ab12cd34.cfgfix"
    fresh = in_tmp / ".train.py.zz12cd34.cfgfix"  # a concurrent run's: kept
    other = in_tmp / ".train.py.notours"
    for path in (stale, fresh, other):
        path.write_text("x")
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    (in_tmp / ".cfgfix_cache").mkdir()
    cache_tmp = in_tmp / ".cfgfix_cache" / ".tmp-abc123"
    cache_tmp.write_text("x")
    os.utime(cache_tmp, (old, old))
    code, out = run("fix")
    assert code == 0, out
    assert not stale.exists() and fresh.exists() and other.exists() and not cache_tmp.exists()

    # interrupted mid-write (Ctrl-C, or SIGTERM which `fix` turns into SystemExit): no leftover
    write_project(in_tmp, {"train.py": TRAIN})
    fresh.unlink()

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(fixing.os, "fsync", interrupted)
    result = CliRunner().invoke(cli, ["fix", "--no-cache"])
    assert result.exit_code != 0  # click turns Ctrl-C into "Aborted!"
    assert sorted(p.name for p in in_tmp.iterdir() if p.name.endswith(".cfgfix")) == []
    assert (in_tmp / "train.py").read_text() == TRAIN


def test_a_cache_that_cannot_be_written_leaves_no_temporary_file(in_tmp, monkeypatch):
    import cfgfix.cache as cache

    write_project(in_tmp, {"train.py": TRAIN})

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.os, "replace", full)
    code, out = run("check")
    assert code == 1 and "CFX103" in out
    assert [p.name for p in (in_tmp / ".cfgfix_cache").iterdir()] == [".gitignore"]


# -- line endings and size ----------------------------------------------------------------------
def _findings(folder: Path):
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code, out = run("check", "--no-cache", "--output-format", "json")
    finally:
        os.chdir(cwd)
    return [(f["code"], f["filename"].rsplit("/", 1)[-1], f["location"]["row"], f["location"]["column"])
            for f in json.loads(out)]


def _convert(folder: Path, newline: bytes) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".json", ".md", ".txt"):
            path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", newline))


def test_cr_only_line_endings_give_the_same_findings_and_fixes_as_lf(tmp_path):
    lf = tmp_path / "lf"
    shutil.copytree(REPO / "fixtures" / "flan-t5-xl-trainer" / "project", lf)
    cr = tmp_path / "cr"
    shutil.copytree(lf, cr)
    _convert(cr, b"\r")
    expected = _findings(lf)
    assert len(expected) >= 8
    assert _findings(cr) == expected
    for folder in (lf, cr):
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            run("fix", "--unsafe-fixes", "--no-cache")
        finally:
            os.chdir(cwd)
    for name in ("train.py", "pseudo_label.py"):
        fixed_cr = (cr / name).read_bytes()
        assert b"\n" not in fixed_cr  # written back with the file's own line endings
        assert fixed_cr.replace(b"\r", b"\n") == (lf / name).read_bytes()


def test_a_huge_python_file_is_bounded(in_tmp):
    body = TRAIN + "x = torch.zeros(3).cuda()\n" * 60000  # ~1.6 MB
    write_project(in_tmp, {"big.py": body, "train.py": TRAIN})
    started = time.monotonic()
    code, out = run("check", "--no-cache")
    assert time.monotonic() - started < 20
    assert "big.py:1:1: CFX901 big.py is larger than 1 MB" in out and "train.py:4:1: CFX103" in out


def test_a_dockerfile_exec_form_nested_too_deep(in_tmp):
    write_project(in_tmp, {"Dockerfile": "FROM x\nCMD " + "[" * 100000 + "\n", "train.py": TRAIN})
    assert_no_bug(*run("check", "--no-cache"))


def test_fix_re_checks_only_what_the_fixed_file_touches(tmp_path, monkeypatch):
    """`fix` on a tree of N projects: after each edit the project stage judges the launches
    that link the edited file, not the whole tree, so the work per fixed file stays the same
    as the tree grows (it grew with the tree before: 4 -> 32 projects, 2.9 s -> 127 s)."""
    from cfgfix.training import resolve

    calls = []
    original = resolve._Resolver.resolve

    def counting(self):
        calls.append(self.launch_file)
        return original(self)

    monkeypatch.setattr(resolve._Resolver, "resolve", counting)
    counts = {}
    for copies in (1, 4):
        tree = tmp_path / f"tree{copies}"
        for i in range(copies):
            shutil.copytree(REPO / "fixtures" / "flan-t5-xl-trainer" / "project", tree / f"p{i}")
        (tree / "cfgfix.toml").write_text('gpu = "RTX 4090"\n')
        monkeypatch.chdir(tree)
        calls.clear()
        code, out = run("fix", "--unsafe-fixes", "--no-cache")
        assert "fixed" in out
        counts[copies] = len(calls)
    assert counts[4] <= 4 * counts[1] + 4, counts  # linear; quadratic would be ~16x


def test_python_nested_past_the_interpreters_limits_never_reaches_libcst(in_tmp):
    """5,000 nested brackets: `ast` refuses them (no Python accepts more than 200), and
    libcst's native parser, tried for newer syntax, crashed the whole process with SIGSEGV
    (found by tests/fuzz/harness.py, seed 6)."""
    deep = "(" * 5000 + "1" + ")" * 5000
    write_project(in_tmp, {"train.py": TRAIN + f"x = {deep}\n",
                           "other.py": "x = = 1\n" + TRAIN + f"y = {deep}\n",
                           "run.sh": "python train.py\npython other.py\n"})
    code, out = run("check", "--no-cache")
    assert code == 1 and "train.py:5:" in out and "CFX901" in out and "Traceback" not in out


# -- line endings in a followed module (fuzz seed 14) ------------------------------------------
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_a_followed_module_with_any_line_ending_reads_the_same(in_tmp, newline):
    """`ast` ends a line at CR, CRLF or LF; the model analysis maps a followed module's
    text to those line numbers (a CR-only `build.py` was an IndexError in CFX204)."""
    build = newline.join([
        "import torch",
        "from transformers import AutoModelForCausalLM",
        "def build_model(name):",
        "    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)",
        "    return model",
        "",
    ])
    write_project(in_tmp, {
        "models/__init__.py": "",
        "train.py": "import torch\nfrom models.build import build_model\nmodel = build_model('m')\nmodel = model.to(torch.bfloat16)\n",
    })
    (in_tmp / "models" / "build.py").write_bytes(build.encode())
    code, out = run("check", "--no-cache", "--output-format", "json", ".")
    assert_no_bug(code, out)
    assert [(f["code"], f["filename"], f["location"]["row"]) for f in json.loads(out)] == [("CFX101", "train.py", 4)]


# -- found by the independent fuzzer (issue 24) -------------------------------------------------
def _cli(args, cwd, encoding="utf-8"):
    """The real entry point in a child process, with a strict stdout encoding as CI images set."""
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": encoding, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", "from cfgfix.cli import main; main()", *args], cwd=cwd, env=env, check=False,
                          capture_output=True)


def test_fix_on_a_notebook_with_cells_that_are_not_objects(in_tmp):
    """`cells` holding a number, a string, null and a list next to a fixable code cell: check
    reads the code cell, and fix fixes it and keeps the odd entries as they are."""
    code = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": TRAIN.splitlines(keepends=True)}
    cells = [7, code, "x", None, [1], {"cell_type": "code"}, {"source": 3}]
    (in_tmp / "nb.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    checked = _cli(["check", "--no-cache", "nb.ipynb"], in_tmp)
    assert checked.returncode == 1 and b"CFX103" in checked.stdout, checked
    for args in (["fix", "--diff", "nb.ipynb"], ["fix", "nb.ipynb"]):
        done = _cli(args, in_tmp)
        assert b"Traceback" not in done.stderr + done.stdout and done.returncode in (0, 1), done
    fixed = json.loads((in_tmp / "nb.ipynb").read_text())
    assert fixed["cells"][0] == 7 and fixed["cells"][2:] == cells[2:]
    assert "model.to(device)\n" not in fixed["cells"][1]["source"]
    assert _cli(["check", "--no-cache", "nb.ipynb"], in_tmp).returncode == 0


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_file_name_that_is_not_utf8_prints_in_every_format(in_tmp, encoding):
    name = os.fsdecode(b"tr\xe9in-\xff.py")
    (in_tmp / name).write_text(TRAIN)
    for fmt in ("text", "concise", "json", "sarif", "github"):
        done = _cli(["check", "--no-cache", "--output-format", fmt], in_tmp, encoding)
        assert done.returncode == 1 and not done.stderr, (fmt, done)
        out = done.stdout.decode("utf-8")  # click writes UTF-8 where the stream says ASCII
        if fmt == "json":
            assert {item["filename"] for item in json.loads(out)} == {name}  # json.loads gives the name back
        elif fmt == "sarif":
            location = json.loads(out)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
            assert location["artifactLocation"]["uri"] == "tr%E9in-%FF.py"
        else:  # click rewrites an ASCII stream's characters it cannot write as "?"
            assert ("tr?in-?.py" if encoding == "ascii" else "tr\\xe9in-\\xff.py") in out
    diff = _cli(["fix", "--diff"], in_tmp, encoding)
    assert b"+++ b/tr" in diff.stdout and b"Traceback" not in diff.stderr, diff
    fixed = _cli(["fix"], in_tmp, encoding)
    assert fixed.returncode == 0 and b"Traceback" not in fixed.stderr, fixed
    assert "model.to(device)" not in (in_tmp / name).read_text()


# -- hostile sizes (issue 24) ------------------------------------------------------------------
def test_each_launch_sees_the_variables_set_before_it_and_no_later_ones():
    """A launch's environment is a point in the script's variable history (not a copy of
    every variable per launch, which made a script that sets a variable before each of its
    6,400 launches take 67 s and 1.2 GB)."""
    from cfgfix.documents.launches import find_launches
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText

    lines = []
    for i in range(300):
        lines.append(f"export V{i}={i}\nCUDA_VISIBLE_DEVICES={i % 4} torchrun --nproc_per_node 2 train.py --out $V{i}\n")
    lines.append("( SUB=1 )\nif x; then MAYBE=1; fi\nV0=last torchrun --nproc_per_node 2 train.py\n")
    found = find_launches(parse_shell(SourceText("run.sh", "".join(lines)), "sh"))
    assert len(found) == 301
    for i, launch in enumerate(found[:300]):
        assert launch.env[f"V{i}"] == str(i) and f"V{i + 1}" not in launch.env
        assert launch.env["CUDA_VISIBLE_DEVICES"] == str(i % 4) and len(launch.env) == i + 2
    last = found[-1].env
    assert last["V0"] == "last" and last["V299"] == "299" and "SUB" not in last and "MAYBE" not in last
    assert dict(last) == {**{f"V{i}": str(i) for i in range(300)}, "V0": "last"}


def test_launch_arguments_survive_the_cache_shape():
    from cfgfix.project import LaunchFacts

    write_args = "torchrun --nproc_per_node 2 train.py --lr 1e-5 \\\n  'a b' --deepspeed ds.json ü\n"
    from cfgfix.documents.launches import find_launches
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText

    launch = find_launches(parse_shell(SourceText("run.sh", write_args), "sh"))[0]
    facts = LaunchFacts.from_launch(launch)
    stored = json.loads(json.dumps(facts.to_dict()))
    assert isinstance(stored["arg_spans"], str)
    assert LaunchFacts.from_dict(stored) == facts
    assert [t for t, _ in facts.args] == ["--lr", "1e-5", "a b", "--deepspeed", "ds.json", "ü"]
    assert facts.args[2][1].line == 2


def test_fix_parses_a_large_linked_config_once(in_tmp, monkeypatch):
    """`fix` re-checks a launch after each round: its megabyte configs are parsed once, not
    once per round (a 6.4 MB YAML made `fix --diff` 5x slower than `check`)."""
    from cfgfix.documents import config

    big = "learning_rate: 1e-5\nbf16: true\n" + "".join(f"block_{i}:\n  a: {i}\n  s: '{'x' * 90}'\n" for i in range(3000))
    write_project(in_tmp, {
        "train.py": TRAIN + "model.half()\nTrainer(model=model, args=TrainingArguments('out', fp16=True)).train()\n",
        "run.sh": "accelerate launch --config_file acc.yaml train.py --config train.yaml\n",
        "acc.yaml": "distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n",
        "train.yaml": big,
    })
    parsed = []
    real = config._parse
    monkeypatch.setattr(config, "_parse", lambda source, fmt, *rest: parsed.append(source.path) or real(source, fmt, *rest))
    config._REMEMBERED.clear()
    code, out = run("fix", "--diff", "--no-cache")
    assert_no_bug(code, out)
    assert "-model.to(device)" in out
    assert parsed.count("train.yaml") == 1, parsed


def test_a_yaml_past_the_node_limit_is_refused_before_it_is_composed(monkeypatch):
    import yaml

    from cfgfix.documents import config
    from cfgfix.documents.text import SourceText

    text = "".join(f"k{i}: {i}\n" for i in range(config.MAX_NODES))
    monkeypatch.setattr(yaml, "compose_all", lambda *a, **k: pytest.fail("composed"))
    config._REMEMBERED.clear()
    with pytest.raises(config.ConfigError, match="more than 200000 nodes"):
        config.parse_config(SourceText("big.yaml", text), "yaml")


def test_many_fixes_that_each_fail_to_parse_are_tried_quickly(in_tmp):
    """Found by the fuzzer: 200 CFX405 typos in an accelerate config that cannot be loaded
    (a 4,302-digit number) — each fix is tried alone and each try loads the YAML; with the
    pure-Python loader that was 35 s for 16 KB."""
    body = "mixed_precison: bf16\nnum_processes: 4\n" * 200
    write_project(in_tmp, {"accelerate.yaml": f"compute_environment: LOCAL_MACHINE\nnum_machines: {BIG[:4302]}\n{body}"})
    started = time.monotonic()
    code, out = run("fix", "--diff", "--no-cache")
    assert_no_bug(code, out)
    assert time.monotonic() - started < 15


def test_a_launch_script_over_1_mb_is_skipped_with_a_warning(in_tmp):
    """A launch line of 400,000 arguments (6 MB) took 27 s to check and over 2 min to fix
    (each round reads the fixed script again): launch scripts are read up to 1 MB, as Python."""
    args = " ".join(f"--a{i} {i}" for i in range(120_000))
    write_project(in_tmp, {"run.sh": f"torchrun --nproc_per_node 2 train.py --mixed_precision fp16 {args}\n", "train.py": TRAIN})
    started = time.monotonic()
    code, out = run("check", "--no-cache")
    assert_no_bug(code, out)
    assert "run.sh:1:1: CFX901 run.sh is larger than 1 MB (1.8 MB): not read as a launch script" in out, out[-500:]
    code, out = run("fix", "--diff", "--no-cache")
    assert_no_bug(code, out)
    assert "+++ b/train.py" in out and "run.sh" not in out
    assert time.monotonic() - started < 20


def test_a_launch_script_naming_a_path_over_255_bytes_it_runs_or_cds_into(in_tmp):
    """Fuzz-found (issue 24): `bash x...x.sh` and `cd x...x` with a name over 255 bytes made
    Path.is_file / Path.is_dir raise (ENAMETOOLONG) in CFX308 and CFX310."""
    write_project(in_tmp, {
        "run.sh": f"bash {LONG}.sh\ncd {LONG} && python {LONG}.py\ncd {LONG}\ntorchrun --nproc_per_node 2 train.py --config {LONG}.json\n",
        "train.py": TRAIN,
    })
    for command in (("check", "--no-cache"), ("fix", "--diff", "--no-cache")):
        assert_no_bug(*run(*command))


@pytest.mark.parametrize("bend", [
    lambda text: text.replace('"num_attention_heads": 16', '"num_attention_heads": ' + "7" * 120),  # overflowed a float
    lambda text: text.replace('"hidden_size": 1024', '"hidden_size": 1e400'),  # inf
    lambda text: text.replace('"intermediate_size": 4096', '"intermediate_size": NaN'),
    lambda text: text[:text.index('"hidden_size": 1024')] + '"hidden_size":' + "[" * 1200,  # past json's depth, cut there
])
def test_a_vision_towers_config_that_cannot_size_a_model(in_tmp, bend):
    """Fuzz-found (json kind): a local model part's config.json with a 120-digit head count
    (OverflowError in the estimator, CFX701/702) or nested past the JSON decoder's depth
    (RecursionError in CFX501/511/601) is a model that cannot be sized, not an internal error."""
    shutil.copytree(REPO / "fixtures" / "mm-encoder-8b" / "project", in_tmp, dirs_exist_ok=True)
    config = in_tmp / "models" / "vision_tower" / "config.json"
    text = config.read_text()
    assert bend(text) != text
    config.write_text(bend(text))
    assert_no_bug(*run("check", "--no-cache"))


def test_an_option_value_that_looks_like_an_option(in_tmp):
    """Fuzz-found (shell kind, 1 of 32,107 inputs): `--gradient_accumulation_steps --1e400`
    raised IndexError reading the launch."""
    write_project(in_tmp, {"train.sh": "accelerate launch train.py --gradient_accumulation_steps --1e400\n"
                                       "torchrun --nproc_per_node 2 train.py --gradient_accumulation_steps=4 --x --gradient_accumulation_steps --a=b\n",
                           "train.py": TRAIN})
    code, out = run("check", "--no-cache")
    assert_no_bug(code, out)


def test_a_training_config_value_that_only_looks_numeric(in_tmp):
    """fuzz (yaml kind, seed 28): `gradient_checkpointing: --0` passed str.isdigit after
    stripping dashes and made int() raise in the project stage (CFX501); `²` likewise."""
    from cfgfix.training.values import normalise

    assert normalise("gradient_checkpointing", "--0") == "--0"
    assert normalise("micro_batch", "²") == "²"
    assert normalise("micro_batch", "-4") == -4 and normalise("micro_batch", "+8") == 8
    write_project(in_tmp, {
        "train.yaml": "per_device_train_batch_size: 8\ngradient_checkpointing: --0\n",
        "run.sh": "python train.py --config train.yaml\n",
        "train.py": "import yaml\ncfg = yaml.safe_load(open('train.yaml'))\n",
    })
    for command in (("check", "--no-cache"), ("explain",)):
        assert_no_bug(*run(*command))
