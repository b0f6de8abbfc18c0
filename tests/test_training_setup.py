"""The resolved training setup of each launch (`cfgfix explain`): values from flags, training
configs at any depth, Python config modules, the script, accelerate and DeepSpeed configs,
each with the file and line it came from, and "unknown" where nothing says."""

import json

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from conftest import REPO, lint_project, setting_value, training_setups_of, write_project


_setups = training_setups_of


def _by_script(setups, script):
    return next(s for s in setups if s.launch.script == script)


_value = setting_value


def _where(setup, setting):
    value = setup.values[setting]
    return (value.span.path, value.span.line) if value.span else value.origin


HF_SCRIPT = (
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('org/model')\n"
    "Trainer(model=model, args=args).train()\n"
)


def test_the_mm_story_resolves_zero_off_because_of_the_misspelt_block():
    setup = _setups(REPO / "fixtures/mm-8b-47gb/project")[0]
    assert setup.files["deepspeed"].name == "zero3.json"
    assert _value(setup, "zero_stage") == 0  # `zero_optimisation` is ignored by DeepSpeed
    assert _value(setup, "micro_batch") == 4 and _where(setup, "micro_batch") == ("scripts/finetune.sh", 14)
    assert _value(setup, "grad_accum") == 4
    assert _value(setup, "world_size") == 8
    assert _value(setup, "effective_batch") == 128
    assert _value(setup, "seq_len") == 4096
    assert _value(setup, "gradient_checkpointing") is False
    assert _value(setup, "precision") == "deepspeed-fp16"
    assert _value(setup, "optimizer") == "adamw"  # the Trainer's default
    assert _value(setup, "lora_rank") is None  # unknown: nothing says


def test_the_qwen_story_reads_the_python_config_module():
    setup = _setups(REPO / "fixtures/qwen7b-lora/project")[0]
    assert setup.files["config module"].name == "config.py"
    assert _value(setup, "model") == "Qwen/Qwen2.5-7B-Instruct"
    assert _where(setup, "micro_batch") == ("config.py", 15)
    assert (_value(setup, "micro_batch"), _value(setup, "grad_accum"), _value(setup, "world_size")) == (2, 8, 2)
    assert _value(setup, "lora_rank") == 16
    assert _value(setup, "weights") == "bf16"
    assert _value(setup, "seq_len") == 2048


def test_the_sdxl_story_expands_exported_variables_and_links_both_configs():
    setup = _setups(REPO / "fixtures/sdxl-zero2-offload/project")[0]
    assert _value(setup, "model") == "stabilityai/stable-diffusion-xl-base-1.0"
    assert {"accelerate", "deepspeed"} <= set(setup.files)
    assert _value(setup, "precision") == "deepspeed-bf16"
    assert (_value(setup, "zero_stage"), _value(setup, "offload_optimizer")) == (2, True)
    assert _value(setup, "resolution") == 1024
    assert _value(setup, "gradient_checkpointing") is True


def test_training_config_keys_at_any_depth_and_ambiguity_is_unknown(tmp_path):
    write_project(tmp_path, {
        "run.sh": "torchrun --nproc_per_node 2 train.py --config cfg/train.yaml\n",
        "train.py": "print('train')\n",
        "cfg/train.yaml": (
            "training:\n  per_device_train_batch_size: 4\n  gradient_accumulation_steps: 8\n"
            "  bf16: true\nmodel:\n  model_name_or_path: org/m\n"
            "data:\n  train:\n    max_seq_length: 1024\n  eval:\n    max_seq_length: 2048\n"
        ),
    })
    setup = _setups(tmp_path)[0]
    assert _value(setup, "micro_batch") == 4 and _where(setup, "micro_batch") == ("cfg/train.yaml", 2)
    assert _value(setup, "effective_batch") == 4 * 8 * 2
    assert _value(setup, "model") == "org/m"
    assert _value(setup, "seq_len") is None  # two different values at the same depth
    assert _value(setup, "precision") == "amp-bf16"


def test_flags_beat_the_training_config_and_deepspeed_beats_flags(tmp_path):
    write_project(tmp_path, {
        "scripts/run.sh": ("deepspeed --num_gpus 4 train.py --config train.yaml --deepspeed ds.json "
                           "--per_device_train_batch_size=2 --gradient_accumulation_steps 3\n"),
        "train.py": "print('train')\n",
        "train.yaml": "per_device_train_batch_size: 16\ngradient_accumulation_steps: 1\nlearning_rate: 1.0e-4\n",
        "ds.json": '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": "auto",'
                   ' "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}\n',
    })
    setup = _setups(tmp_path)[0]
    assert setup.script is not None and setup.script.name == "train.py"  # found above scripts/
    assert _value(setup, "micro_batch") == 1 and _where(setup, "micro_batch") == ("ds.json", 1)
    assert _value(setup, "grad_accum") == 3 and _where(setup, "grad_accum") == ("scripts/run.sh", 1)
    assert (_value(setup, "zero_stage"), _value(setup, "offload_param")) == (3, True)


@pytest.mark.parametrize("zero, optimizer, params", [
    ('{"stage": 3}', False, False),  # no offload blocks: DeepSpeed's default None, no offload
    ('{"stage": 3, "offload_optimizer": {"pin_memory": true}}', False, False),  # block without device: "none"
    ('{"stage": 3, "offload_optimizer": {"device": "cpu"}}', True, False),
    ('{"stage": 2, "cpu_offload": true}', True, False),  # the deprecated boolean
    ('{"stage": 3, "offload_param": {"device": "auto"}}', False, None),  # "auto": not DeepSpeed's to say
])
def test_absent_offload_blocks_are_deepspeeds_default(tmp_path, zero, optimizer, params):
    write_project(tmp_path, {
        "run.sh": "deepspeed --num_gpus 2 train.py --deepspeed configs/ds.json\n",
        "train.py": "print('train')\n",
        "configs/ds.json": '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": %s}\n' % zero,
    })
    setup = _setups(tmp_path)[0]
    assert (_value(setup, "offload_optimizer"), _value(setup, "offload_param")) == (optimizer, params)


def test_no_zero_block_offloads_nothing(tmp_path):
    write_project(tmp_path, {"run.sh": "deepspeed train.py --deepspeed ds.json\n", "train.py": "print(1)\n",
                             "ds.json": '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}\n'})
    setup = _setups(tmp_path)[0]
    assert (_value(setup, "zero_stage"), _value(setup, "offload_optimizer")) == (0, False)


def test_training_arguments_in_the_script_link_the_deepspeed_config(tmp_path):
    write_project(tmp_path, {
        "run.sh": "torchrun --nproc_per_node 8 train.py\n",
        "train.py": (
            "import torch\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
            "model = AutoModelForCausalLM.from_pretrained('org/m', torch_dtype=torch.bfloat16)\n"
            "model.gradient_checkpointing_enable()\n"
            "args = TrainingArguments(output_dir='o', per_device_train_batch_size=2, bf16=True,\n"
            "                         deepspeed='configs/ds.json', optim='adamw_bnb_8bit')\n"
            "Trainer(model=model, args=args).train()\n"
        ),
        "configs/ds.json": '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}\n',
    })
    setup = _setups(tmp_path)[0]
    assert setup.files["deepspeed"].name == "ds.json"
    assert _value(setup, "zero_stage") == 2
    assert _value(setup, "micro_batch") == 2 and _where(setup, "micro_batch") == ("train.py", 6)
    assert _value(setup, "optimizer") == "adamw-8bit"
    assert _value(setup, "weights") == "bf16"
    assert _value(setup, "gradient_checkpointing") is True
    assert _value(setup, "model") == "org/m"


def test_defaults_only_when_the_script_parses_the_flags(tmp_path):
    write_project(tmp_path, {
        "a.sh": "torchrun --nproc_per_node 2 hf.py --output_dir out\n",
        "b.sh": "torchrun --nproc_per_node 2 plain.py --output_dir out\n",
        "hf.py": HF_SCRIPT,
        "plain.py": "import argparse\nparser = argparse.ArgumentParser()\n",
    })
    setups = _setups(tmp_path)
    hf, plain = _by_script(setups, "hf.py"), _by_script(setups, "plain.py")
    assert (_value(hf, "micro_batch"), _value(hf, "grad_accum"), _value(hf, "effective_batch")) == (8, 1, 16)
    assert "default" in hf.values["micro_batch"].origin
    assert _value(hf, "precision") == "fp32"
    assert _value(plain, "micro_batch") is None and _value(plain, "effective_batch") is None


def test_unresolved_variables_stay_unknown(tmp_path):
    write_project(tmp_path, {
        "run.sh": "torchrun --nproc_per_node 2 train.py --per_device_train_batch_size $BS --model_name_or_path $M\n",
        "train.py": "print('x')\n",
    })
    setup = _setups(tmp_path)[0]
    assert _value(setup, "micro_batch") is None and _value(setup, "model") is None


def test_explain_prints_every_setting_with_its_origin(tmp_path, monkeypatch):
    write_project(tmp_path, {
        "run.sh": "torchrun --nproc_per_node 2 train.py --config train.yaml\n",
        "train.py": "print('x')\n",
        "train.yaml": "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nbf16: true\n",
        "pyproject.toml": '[tool.cfgfix]\ngpu = "RTX 4090"\n',
    })
    monkeypatch.chdir(tmp_path)
    text = CliRunner().invoke(cli, ["explain"]).output
    assert "run.sh:1: torchrun train.py" in text
    assert "training config: train.yaml" in text
    assert "micro batch per GPU" in text and "per_device_train_batch_size in train.yaml (line 1)" in text
    assert "effective batch" in text and "4 × 2 × 2" in text
    assert "RTX 4090" in text
    assert "ZeRO stage" in text and "unknown" in text
    result = CliRunner().invoke(cli, ["explain", "--output-format", "json", "--gpu", "A100 80GB"])
    data = json.loads(result.output)
    assert data[0]["settings"]["micro_batch"]["value"] == 4
    assert data[0]["settings"]["micro_batch"]["span"]["line"] == 1
    assert data[0]["settings"]["gpu"]["value"] == "A100 80GB"
    assert data[0]["settings"]["zero_stage"] is None


def test_explain_with_paths_shows_only_their_launches(tmp_path, monkeypatch):
    write_project(tmp_path, {
        "a/run.sh": "python train.py\n", "a/train.py": "print(1)\n",
        "b/run.sh": "python train.py\n", "b/train.py": "print(1)\n",
    })
    monkeypatch.chdir(tmp_path)
    text = CliRunner().invoke(cli, ["explain", "a"]).output
    assert "a/run.sh" in text and "b/run.sh" not in text


SUBCLASS_SCRIPT = (
    "from dataclasses import dataclass, field\n\nimport transformers\n\n\n"
    "@dataclass\nclass ModelArguments:\n    model_name_or_path: str = field(default='facebook/opt-125m')\n\n\n"
    "@dataclass\nclass TrainingArguments(transformers.TrainingArguments):\n"
    "    per_device_train_batch_size: int = field(default=4)\n    model_max_length: int = 1024\n"
    "    lora_r: int = 64\n\n\n"
    "def train():\n    parser = transformers.HfArgumentParser((ModelArguments, TrainingArguments))\n"
    "    model_args, args = parser.parse_args_into_dataclasses()\n"
    "    transformers.Trainer(model=model, args=args).train()\n"
)


def test_the_scripts_own_argument_defaults_count_and_an_imported_trainer_is_followed(tmp_path):
    """LLaVA's shape: `deepspeed pkg/train/train_mem.py` calls `train()` from
    `pkg/train/train.py`, whose TrainingArguments subclass changes the defaults."""
    write_project(tmp_path, {
        "pkg/__init__.py": "", "pkg/train/__init__.py": "",
        "pkg/train/train.py": SUBCLASS_SCRIPT,
        "pkg/train/train_mem.py": "from pkg.train.train import train\n\nif __name__ == '__main__':\n    train()\n",
        "scripts/run.sh": "deepspeed pkg/train/train_mem.py --deepspeed scripts/ds.json --output_dir o "
                          "--model_name_or_path $MODEL --bf16 True\n",
        "scripts/ds.json": '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": "auto"},'
                           ' "zero_optimization": {"stage": 3}}\n',
    })
    setup = _setups(tmp_path)[0]
    assert setup.trainer and setup.trains and setup.parses_training_arguments
    assert _value(setup, "seq_len") == 1024 and "default of TrainingArguments" in setup.values["seq_len"].origin
    assert _value(setup, "model") is None  # passed as an unresolved $MODEL: not the dataclass default
    assert _value(setup, "lora_rank") is None  # a default lora_r says nothing about LoRA being on
    assert _value(setup, "precision") == "deepspeed-bf16"
    _, _, result = lint_project(tmp_path)
    assert not [f for f in result.findings if f.code == "CFX511"]  # micro batch 4 is the subclass default


def test_llamafactory_and_axolotl_launches_read_their_yaml(tmp_path):
    """`llamafactory-cli train cfg.yaml` (in a README) and `axolotl train` / `accelerate launch
    -m axolotl.cli.train` (in a script): the YAML is the whole setup, an HF Trainer runs it."""
    write_project(tmp_path, {
        "README.md": "```bash\nFORCE_TORCHRUN=1 llamafactory-cli train lf/sft.yaml\n```\n",
        "lf/sft.yaml": ("model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nfinetuning_type: lora\nlora_rank: 8\n"
                        "quantization_bit: 4\ndeepspeed: lf/ds_z3.json\ncutoff_len: 2048\n"
                        "per_device_train_batch_size: 1\ngradient_accumulation_steps: 2\nbf16: true\n"),
        "lf/ds_z3.json": '{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}, '
                         '"zero_optimization": {"stage": 3}}\n',
        "train.sh": ("accelerate launch -m axolotl.cli.train ax/lora.yml\n"
                     "axolotl train ax/lora.yml\n"),
        # axolotl refuses load_in_8bit without an adapter (validate_adapter, 0.6.0 and 0.19.0)
        "ax/lora.yml": ("base_model: NousResearch/Meta-Llama-3-8B\nadapter: lora\nload_in_8bit: true\nlora_r: 32\nsequence_len: 4096\n"
                        "micro_batch_size: 2\ngradient_accumulation_steps: 4\noptimizer: adamw_bnb_8bit\n"),
    })
    setups = _setups(tmp_path)
    factory = next(s for s in setups if s.launch.launcher == "llamafactory-cli")
    assert factory.trainer and factory.files["training config"].name == "sft.yaml"
    assert factory.files["deepspeed"].name == "ds_z3.json"
    assert (_value(factory, "lora_rank"), _value(factory, "quantization"), _value(factory, "seq_len")) == (8, "4bit", 2048)
    assert _value(factory, "precision") == "deepspeed-bf16" and _value(factory, "zero_stage") == 3
    axolotl = [s for s in setups if s.launch.module == "axolotl.cli.train"]
    assert len(axolotl) == 2
    for setup in axolotl:
        assert _value(setup, "model") == "NousResearch/Meta-Llama-3-8B"
        assert (_value(setup, "micro_batch"), _value(setup, "grad_accum"), _value(setup, "seq_len")) == (2, 4, 4096)
        assert (_value(setup, "optimizer"), _value(setup, "quantization"), _value(setup, "lora_rank")) == ("adamw-8bit", "8bit", 32)
