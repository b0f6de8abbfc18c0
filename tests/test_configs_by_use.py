"""A JSON a launch passes as its DeepSpeed config is one, whatever it holds: the per-file
DeepSpeed rules read it even when its content alone is not recognisable as DeepSpeed's
(`{"train_batch_size": 16, "train_batch_size": 32}` says nothing DeepSpeed-only) and holds
none of their byte triggers (`{"amp": {...}}`) (issue 25)."""

from __future__ import annotations

import pytest

from tests.conftest import lint_project, write_project

TRAIN = '''import deepspeed
engine, *_ = deepspeed.initialize(model=model, config="ds.json")
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
'''
LAUNCHES = {
    "deepspeed": "#!/bin/bash\ndeepspeed --num_gpus 2 train.py --deepspeed ds.json\n",
    "torchrun": "#!/bin/bash\ntorchrun --nproc_per_node 2 train.py --deepspeed ds.json\n",
    "accelerate": "#!/bin/bash\naccelerate launch --use_deepspeed --deepspeed_config_file ds.json train.py\n",
    "deepspeed_config": "#!/bin/bash\ndeepspeed train.py --deepspeed_config=ds.json\n",
}


def _codes(tmp_path, files):
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path)
    return sorted((f.path, f.span.line, f.code) for f in result.findings)


@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_a_launched_json_with_a_duplicate_key_is_reported(tmp_path, launch):
    found = _codes(tmp_path, {"train.py": TRAIN, "run.sh": LAUNCHES[launch],
                              "ds.json": '{\n  "train_batch_size": 16,\n  "train_batch_size": 32\n}\n'})
    assert ("ds.json", 3, "CFX510") in found, found


@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_a_launched_json_without_trigger_words_is_read(tmp_path, launch):
    found = _codes(tmp_path, {"train.py": TRAIN, "run.sh": LAUNCHES[launch],
                              "requirements.txt": "deepspeed==0.19.8\n",
                              "ds.json": '{\n  "amp": {"enabled": false}\n}\n'})
    assert ("ds.json", 2, "CFX509") in found, found


def test_the_same_json_unlaunched_is_not_a_deepspeed_config(tmp_path):
    """Nothing says it is DeepSpeed's: a data or training-argument file keeps its silence."""
    found = _codes(tmp_path, {"train.py": TRAIN, "ds.json": '{"train_batch_size": 16, "train_batch_size": 32}\n',
                              "other.json": '{"amp": {"enabled": false}}\n'})
    assert not [f for f in found if f[0].endswith(".json")], found


def test_a_json_recognised_by_content_is_reported_once(tmp_path):
    found = _codes(tmp_path, {"train.py": TRAIN, "run.sh": LAUNCHES["deepspeed"],
                              "ds.json": '{\n  "train_micro_batch_size_per_gpu": 4,\n'
                                         '  "train_micro_batch_size_per_gpu": 8\n}\n'})
    assert [f for f in found if f[2] == "CFX510"] == [("ds.json", 3, "CFX510")], found
