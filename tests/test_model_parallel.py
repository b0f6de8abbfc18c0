"""Model-parallel sizes as divisors of the data-parallel size (CFX502, CFX603), and the
training DataLoader's batch_size as the micro batch of a script with its own loop."""

from click.testing import CliRunner

from cfgfix.analysis.model_parallel import from_sources
from cfgfix.commands import cli
from conftest import write_project


def _args(text):
    return [(token, None) for token in text.split()]


def test_sizes_from_flags():
    mp = from_sources(_args("--tensor-model-parallel-size 2 --pipeline_model_parallel_size=4 --sequence-parallel"))
    assert (mp.divisor, mp.megatron) == (8, True)
    assert from_sources(_args("--tp_size 2")).divisor == 2 and not from_sources(_args("--tp_size 2")).megatron
    assert from_sources(_args("--lr 1e-4 --bf16")).divisor == 1


def test_sizes_it_cannot_read_are_unknown():
    assert from_sources(_args("--tensor-model-parallel-size $TP")).divisor is None
    assert from_sources(_args("--expert-model-parallel-size 4")).divisor is None
    assert from_sources(_args("--vllm_tensor_parallel_size 2")).divisor is None
    assert from_sources(_args("--tp_size 2 --tensor_parallel_size 4")).divisor is None  # two answers
    # a size of 1 divides nothing, whatever it sizes
    assert from_sources(_args("--vllm_tensor_parallel_size 1 --expert-model-parallel-size 1")).divisor == 1


def test_sizes_from_a_training_config(tmp_path):
    from cfgfix.documents.config import parse_config
    from cfgfix.documents.text import SourceText

    doc = parse_config(SourceText("t.yaml", "trainer:\n  strategy:\n    tensor_parallel_size: 8\n"), "yaml")
    mp = from_sources((), doc, "t.yaml")
    assert mp.divisor == 8 and mp.related and "t.yaml" in mp.related[0].message


_SCRIPT = '''import argparse
import yaml
import torch
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--config")
args = parser.parse_args()
cfg = yaml.safe_load(open(args.config))
tcfg = cfg["training"]
train_loader = DataLoader(train_set, batch_size=tcfg["batch_size_per_gpu"], shuffle=True)
val_loader = DataLoader(val_set, batch_size=1)
for batch in train_loader:
    model(batch).loss.backward()
'''


def _explain(tmp_path, files):
    write_project(tmp_path, files)
    result = CliRunner().invoke(cli, ["explain", str(tmp_path)], catch_exceptions=False)
    line = next(line for line in result.output.splitlines() if "micro batch per GPU" in line)
    return line.split("micro batch per GPU", 1)[1].split()[0], line


def test_dataloader_batch_size_from_the_scripts_config_is_the_micro_batch(tmp_path):
    value, line = _explain(tmp_path, {
        "train.py": _SCRIPT, "cfg.yaml": "training:\n  batch_size_per_gpu: 4\n",
        "train.sh": "accelerate launch --num_processes 2 train.py --config cfg.yaml\n"})
    assert value == "4" and "training.batch_size_per_gpu in" in line


def test_dataloader_near_misses(tmp_path):
    files = {"cfg.yaml": "training:\n  batch_size_per_gpu: 4\n",
             "train.sh": "accelerate launch --num_processes 2 train.py --config cfg.yaml\n"}
    # two loaders and neither says train: which one trains is not known
    two = _SCRIPT.replace("train_loader = DataLoader(train_set", "a = DataLoader(ds_a").replace(
        "val_loader = DataLoader(val_set", "b = DataLoader(ds_b").replace("in train_loader", "in a")
    assert _explain(tmp_path / "a", {**files, "train.py": two})[0] == "unknown"
    # built under a condition: unknown
    cond = _SCRIPT.replace("train_loader = DataLoader(", "train_loader = None\nif args.config:\n    train_loader = DataLoader(")
    assert _explain(tmp_path / "b", {**files, "train.py": cond})[0] == "unknown"
    # the HF Trainer's batch is per_device_train_batch_size, not a DataLoader of the script
    hf = ("from transformers import Trainer, TrainingArguments\n" + _SCRIPT +
          "args = TrainingArguments('out', per_device_train_batch_size=2)\nTrainer(model=m, args=args).train()\n")
    assert _explain(tmp_path / "c", {**files, "train.py": hf})[0] == "2"
