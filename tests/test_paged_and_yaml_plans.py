"""Issue 13, item 6's remaining parts: bitsandbytes' paged optimizers (read from a project,
sized, and a rung of `fix --fit`), and a plan written into the YAML a
`TrainingArguments(**cfg["training"])` script spreads (comments, quoting and order kept)."""

import os

from click.testing import CliRunner
from conftest import write_project
from test_training_setup import _setups

from cfgfix.commands import cli
from cfgfix.memory.estimator import estimate
from cfgfix.memory.gpus import find_gpu
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.training.fit import plan

SCRIPT = (
    "import torch\nimport yaml\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
    "cfg = yaml.safe_load(open('configs/train.yaml'))\n"
    "model = AutoModelForCausalLM.from_pretrained(cfg['model']['name'], torch_dtype=torch.bfloat16)\n"
    "Trainer(model=model, args=TrainingArguments(**cfg['training'])).train()\n"
)
YAML = (
    "# Qwen2.5-1.5B full fine-tune on one 10 GB card\n"
    "model:\n"
    "  name: Qwen/Qwen2.5-1.5B\n"
    "  max_seq_length: 1024   # tokens\n"
    "training:\n"
    "  output_dir: 'out'\n"
    "  per_device_train_batch_size: 1\n"
    "  gradient_accumulation_steps: 16\n"
    "  gradient_checkpointing: true\n"
    "  report_to: \"none\"   # no tracker\n"
)


def test_paged_states_page_out_and_leave_one_parameter_resident():
    shape = shape_from_catalog("Qwen/Qwen2.5-3B")
    plain = estimate(MemorySetup(weights="bf16", optimizer="adamw-8bit", seq_len=1024), shape)
    paged = estimate(MemorySetup(weights="bf16", optimizer="paged-adamw-8bit", seq_len=1024), shape)
    assert plain.component("optimizer_states").size == 2 * shape.params
    assert paged.component("optimizer_states").size == 2 * shape.largest_module_params  # the embedding's states
    assert [c.size for c in paged.cpu if c.name == "optimizer_states"] == [2 * shape.params]
    assert any("paged optimizer" in note for note in paged.assumptions)
    assert paged.peak < plain.peak
    paged32 = estimate(MemorySetup(weights="bf16", optimizer="paged-adamw", seq_len=1024), shape)
    assert [c.size for c in paged32.cpu] == [8 * shape.params]  # PagedAdamW32bit: fp32 states


def test_paged_optimizer_is_a_rung_after_the_8bit_one():
    shape = shape_from_catalog("Qwen/Qwen2.5-1.5B")
    setup = MemorySetup(weights="bf16", micro_batch=4, seq_len=1024, gradient_accumulation=4)
    result = plan(setup, shape, find_gpu("RTX 3080"))
    keys = [r.key for r in result.rungs]
    assert result.fits and keys[-2:] == ["8bit", "paged"]  # the paged one only on top of 8-bit states
    assert result.rungs[-1].settings == {"optimizer": "paged-adamw-8bit"}
    # never under DeepSpeed, which owns the optimizer's placement
    ds = plan(MemorySetup(weights="bf16", zero_stage=2, num_gpus=2, deepspeed_half="bf16", seq_len=1024), shape,
              find_gpu("RTX 3080"))
    assert "paged" not in [r.key for r in ds.rungs]


def test_paged_optimizer_read_from_the_project(tmp_path):
    write_project(tmp_path, {
        "train.py": SCRIPT, "configs/train.yaml": YAML.replace("  gradient_checkpointing: true\n",
                                                               "  gradient_checkpointing: true\n  optim: paged_adamw_32bit\n"),
        "run.sh": "python train.py\n",
    })
    setup = _setups(tmp_path)[0]
    assert setup.get("optimizer") == "paged-adamw"


def test_the_plan_is_written_into_the_spread_yaml(tmp_path):
    # the sequence length stated (the script never reads `model.max_seq_length`): with it open,
    # the plan is made for an unbounded length and the answer stays conditional
    write_project(tmp_path, {"train.py": SCRIPT, "configs/train.yaml": YAML,
                             "run.sh": "python train.py --max_seq_length 1024\n", "cfgfix.toml": 'gpu = "RTX 3080"\n'})
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(cli, ["fix", "--fit"])
    finally:
        os.chdir(cwd)
    assert "written: configs/train.yaml" in result.output, result.output
    text = (tmp_path / "configs" / "train.yaml").read_text()
    # the optimizer added at the end of `training:`; every comment, quote style and the key
    # order kept (8-bit AdamW alone is 9.4 GiB, over the band's top on the 10 GB card)
    assert text == YAML + "  optim: paged_adamw_8bit\n", text
    assert "+ 8-bit AdamW" in result.output and "+ paged 8-bit AdamW" in result.output
    setup = _setups(tmp_path)[0]
    assert setup.get("optimizer") == "paged-adamw-8bit"
