"""The warm run's stat-keyed cache (issue 15): an unchanged file is neither read nor hashed,
and any change the stat signature can see (content, size, a rewrite, a followed module)
is linted again. Findings are always those of a cold run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import cfgfix.cache as cache
import cfgfix.engine as engine
from cfgfix.commands import cli
from conftest import write_project

TRAIN = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.to(device)\n"
)
QUIET = "import os\nprint(os.getcwd())\n"
SUPPRESSED = TRAIN.replace("model.to(device)\n", "model.to(device)  # cfgfix: ignore[CFX103]\n")


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def reads(monkeypatch):
    """The files the engine reads, by name (the stat-keyed path must read none of the
    unchanged ones); signatures are trusted at once (no racy window in a test)."""
    monkeypatch.setattr(cache, "RACY_SECONDS", 0)
    seen: list[str] = []
    real = engine.read_file

    def counting(path, *args, **kwargs):
        seen.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine, "read_file", counting)
    return seen


def _entries(root: Path) -> dict:
    (found,) = (root / ".cfgfix_cache").glob("results-*.json")
    return json.loads(found.read_bytes().partition(b"\n")[2])


def test_a_warm_run_reads_only_the_files_it_must_show_or_check(in_tmp, reads):
    write_project(in_tmp, {"train.py": TRAIN, "quiet.py": QUIET, "kept.py": SUPPRESSED})
    cold = run("check", "--no-cache")
    assert run("check") == cold  # fills the cache
    assert all(len(entry) == 3 for entry in _entries(in_tmp).values())
    reads.clear()
    assert run("check") == cold
    # train.py has a finding to show, kept.py a directive to apply; quiet.py is not read
    assert sorted(reads) == ["kept.py", "train.py"]


def test_a_change_with_the_same_size_and_mtime_is_seen(in_tmp, reads):
    write_project(in_tmp, {"train.py": TRAIN})
    before = run("check")
    assert before[0] == 1 and "CFX103" in before[1]
    path = in_tmp / "train.py"
    info = os.stat(path)
    path.write_text(TRAIN.replace("model.to(device)", "model.eval(    )"), encoding="utf-8")
    assert os.stat(path).st_size == info.st_size
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))  # the ctime still moves
    assert run("check") == run("check", "--no-cache")
    assert run("check")[0] == 0


def test_a_file_replaced_by_another_of_the_same_stamp_is_seen(in_tmp, reads):
    write_project(in_tmp, {"train.py": TRAIN})
    run("check")
    path = in_tmp / "train.py"
    info = os.stat(path)
    other = in_tmp / "other.tmp"
    other.write_text(TRAIN.replace("model.to(device)", "model.eval(    )"), encoding="utf-8")
    os.utime(other, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(other, path)  # a new inode, as editors and `git checkout` write
    assert run("check")[0] == 0


def test_a_touched_file_is_hashed_once_then_trusted_again(in_tmp, reads):
    write_project(in_tmp, {"quiet.py": QUIET})
    run("check")
    os.utime(in_tmp / "quiet.py")  # a new mtime, the same bytes
    reads.clear()
    assert run("check")[0] == 0
    assert reads == ["quiet.py"]  # hashed: the same content, the entry takes the new stamp
    reads.clear()
    assert run("check")[0] == 0
    assert reads == []


def test_a_just_written_file_is_never_trusted_by_its_stamp(in_tmp):
    # Within RACY_SECONDS of a change a second write could keep the stamp: hash instead.
    write_project(in_tmp, {"quiet.py": QUIET})
    run("check")
    assert [len(entry) for entry in _entries(in_tmp).values()] == [2]


def test_a_changed_followed_module_is_seen_without_touching_the_script(in_tmp, reads):
    write_project(in_tmp, {
        "models/__init__.py": "",
        "models/build.py": ("import torch\nfrom transformers import AutoModelForCausalLM\n"
                            "def build_model(name):\n"
                            "    return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)\n"),
        "train.py": ("import torch\nfrom models.build import build_model\n"
                     "model = build_model('m')\nmodel = model.to(torch.bfloat16)\n"),
    })
    first = run("check")
    assert "CFX101" in first[1]
    (in_tmp / "models/build.py").write_text(
        "from transformers import AutoModelForCausalLM\n"
        "def build_model(name):\n"
        "    return AutoModelForCausalLM.from_pretrained(name)\n", encoding="utf-8")
    assert run("check") == run("check", "--no-cache")
    assert "CFX101" not in run("check")[1]


def test_a_cache_entry_with_a_bad_stamp_is_a_miss(in_tmp, reads):
    from cfgfix.cache import _MAGIC, content_hash

    write_project(in_tmp, {"train.py": TRAIN})
    first = run("check")
    path = next((in_tmp / ".cfgfix_cache").glob("results-*.json"))
    entries = _entries(in_tmp)
    for meta in ({"stat": [1, 2], "directive": False}, {"stat": "x"}, [1], None):
        broken = {key: [value[0], value[1], meta] for key, value in entries.items()}
        body = json.dumps(broken).encode()
        path.write_bytes(_MAGIC + content_hash(body).encode() + b"\n" + body)
        assert run("check") == first
