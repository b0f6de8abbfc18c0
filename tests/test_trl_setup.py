"""TRL trainers resolved as TRL runs them: the model a trainer is given by name, and the
`TrainingArguments` defaults its config classes override, per trl release (pin, installed
copy, else the current release), read from the released wheels (training/frameworks/trl.py)."""


import pytest

from cfgfix.analysis.versions import VersionInfo
from cfgfix.training.frameworks import trl
from cfgfix.training.memory_setup import memory_input
from conftest import setting_value, training_setups_of, write_project


def _setup(root, script="train.py"):
    return next(s for s in training_setups_of(root) if s.launch.script == script)


_value = setting_value


SFT = (
    "from datasets import load_dataset\n"
    "from trl import SFTConfig, SFTTrainer\n\n"
    "dataset = load_dataset('trl-lib/Capybara', split='train')\n"
    "args = SFTConfig(output_dir='out', per_device_train_batch_size=2, gradient_accumulation_steps=8{extra})\n"
    "trainer = SFTTrainer(model='Qwen/Qwen2.5-7B', args=args, train_dataset=dataset)\n"
    "trainer.train()\n"
)


def _project(tmp_path, script, pins="trl==1.16.0\ntransformers==4.57.1\n", launch="python train.py\n"):
    write_project(tmp_path, {"train.py": script, "run.sh": launch, "requirements.txt": pins})
    return tmp_path


def test_sft_trainer_with_a_model_id_and_sftconfig_defaults(tmp_path):
    setup = _setup(_project(tmp_path, SFT.format(extra="")))
    assert _value(setup, "model") == "Qwen/Qwen2.5-7B"
    assert _value(setup, "gradient_checkpointing") is True
    assert _value(setup, "mixed_precision") == "bf16"
    assert _value(setup, "seq_len") == 1024
    assert _value(setup, "weights") == "fp32"  # create_model_from_path's float32 default
    assert _value(setup, "precision") == "amp-bf16"
    assert (_value(setup, "micro_batch"), _value(setup, "grad_accum"), _value(setup, "world_size")) == (2, 8, 1)
    assert "trl==1.16.0" in setup.values["gradient_checkpointing"].origin
    built = memory_input(setup)
    assert built.shape is not None and built.setup.checkpointing and built.setup.seq_len == 1024


def test_what_the_config_states_beats_its_defaults(tmp_path):
    extra = ", fp16=True, gradient_checkpointing=False, max_length=4096, model_init_kwargs={'dtype': 'bfloat16'}"
    setup = _setup(_project(tmp_path, SFT.format(extra=extra)))
    assert _value(setup, "mixed_precision") == "fp16"  # bf16 defaults to True only when fp16 is not set
    assert _value(setup, "gradient_checkpointing") is False
    assert _value(setup, "seq_len") == 4096
    assert _value(setup, "weights") == "bf16"


def test_an_old_trl_keeps_training_arguments_defaults(tmp_path):
    # trl 0.18.2: no bf16 or gradient checkpointing override yet; transformers 4.x loads float32
    setup = _setup(_project(tmp_path, SFT.format(extra=""), pins="trl==0.18.2\ntransformers==4.52.3\n"))
    assert _value(setup, "gradient_checkpointing") is False
    assert _value(setup, "mixed_precision") == "no"
    assert _value(setup, "precision") == "fp32"
    assert _value(setup, "seq_len") == 1024


def test_a_range_across_a_change_leaves_that_default_unknown(tmp_path):
    setup = _setup(_project(tmp_path, SFT.format(extra=""), pins="trl>=0.19.1,<0.24\n"))
    assert _value(setup, "gradient_checkpointing") is None  # True only from 0.22
    assert _value(setup, "mixed_precision") == "bf16"  # every release from 0.19


def test_no_pin_assumes_the_current_release_and_says_so(tmp_path, monkeypatch):
    from cfgfix.analysis import versions

    monkeypatch.setattr(versions, "_installed", lambda name: VersionInfo(name))
    setup = _setup(_project(tmp_path, SFT.format(extra=""), pins="datasets\n"))
    assert _value(setup, "gradient_checkpointing") is True
    assert "assumed" in setup.values["gradient_checkpointing"].origin


@pytest.mark.parametrize("trainer, config, seq", [
    ("DPOTrainer", "DPOConfig", 1024), ("KTOTrainer", "KTOConfig", 1024), ("RewardTrainer", "RewardConfig", 1024),
    ("GRPOTrainer", "GRPOConfig", None),  # from 0.26 prompts are not truncated by default: unknown
])
def test_each_trainer_without_args_builds_its_config_with_defaults(tmp_path, trainer, config, seq):
    script = (f"from trl import {trainer}\n"
              f"trainer = {trainer}(model='Qwen/Qwen2.5-0.5B-Instruct', train_dataset=ds)\n"
              "trainer.train()\n")
    setup = _setup(_project(tmp_path, script))
    assert _value(setup, "model") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert _value(setup, "gradient_checkpointing") is True
    assert (_value(setup, "micro_batch"), _value(setup, "grad_accum")) == (8, 1)  # TrainingArguments'
    assert _value(setup, "mixed_precision") == "bf16"
    assert _value(setup, "seq_len") == seq


def test_grpo_sequence_is_prompt_plus_completion(tmp_path):
    script = ("from trl import GRPOConfig, GRPOTrainer\n"
              "args = GRPOConfig(output_dir='o', max_prompt_length=1024)\n"
              "GRPOTrainer(model='Qwen/Qwen2.5-1.5B-Instruct', args=args, reward_funcs=[f]).train()\n")
    assert _value(_setup(_project(tmp_path, script)), "seq_len") == 1024 + 512  # 1.10+: completion 512
    assert _value(_setup(_project(tmp_path, script, pins="trl==0.19.1\n")), "seq_len") == 1024 + 256


def test_a_project_subclass_of_a_trl_config_parsed_by_trlparser(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/configs.py": "import trl\n\nclass GRPOConfig(trl.GRPOConfig):\n    pass\n",
        "train.py": ("from trl import GRPOTrainer, ModelConfig, TrlParser\n"
                     "from pkg.configs import GRPOConfig\n\n"
                     "parser = TrlParser((GRPOConfig, ModelConfig))\n"
                     "training_args, model_args = parser.parse_args_and_config()\n"
                     "GRPOTrainer(model=model_args.model_name_or_path, args=training_args).train()\n"),
        "cfg.yaml": ("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nper_device_train_batch_size: 16\n"
                     "gradient_accumulation_steps: 4\nmax_prompt_length: 1024\nmax_completion_length: 2048\n"),
        "run.sh": "accelerate launch --num_processes 7 train.py --config cfg.yaml\n",
        "requirements.txt": "trl==0.18.0\n",
    }
    write_project(tmp_path, files)
    setup = _setup(tmp_path)
    assert _value(setup, "seq_len") == 3072
    assert _value(setup, "mixed_precision") == "no"  # 0.18: no bf16 default yet
    assert _value(setup, "gradient_checkpointing") is False
    assert (_value(setup, "micro_batch"), _value(setup, "grad_accum"), _value(setup, "world_size")) == (16, 4, 7)


def test_a_projects_own_sftconfig_and_trainer_are_not_trls(tmp_path):
    script = ("from dataclasses import dataclass\n"
              "from transformers import TrainingArguments, Trainer\n\n"
              "@dataclass\nclass SFTConfig(TrainingArguments):\n    lora_rank: int = 16\n\n"
              "class SFTTrainer(Trainer):\n    pass\n\n"
              "args = SFTConfig(output_dir='o', per_device_train_batch_size=2)\n"
              "SFTTrainer(model='Qwen/Qwen2.5-7B', args=args).train()\n")
    setup = _setup(_project(tmp_path, script))
    assert _value(setup, "gradient_checkpointing") is None
    assert _value(setup, "seq_len") is None
    assert _value(setup, "model") is None  # a Trainer subclass does not load a name


def test_peft_config_without_r_trains_peft_default_rank(tmp_path):
    script = ("from peft import LoraConfig\nfrom trl import SFTTrainer\n"
              "SFTTrainer(model='Qwen/Qwen2.5-7B', train_dataset=ds, peft_config=LoraConfig(task_type='CAUSAL_LM')).train()\n")
    assert _value(_setup(_project(tmp_path, script)), "lora_rank") == 8
    spread = script.replace("LoraConfig(task_type='CAUSAL_LM')", "LoraConfig(**lora_kwargs)")
    assert _value(_setup(_project(tmp_path, spread)), "lora_rank") is None


def test_value_for_reads_only_what_every_admitted_release_agrees_on():
    rows = trl.GRADIENT_CHECKPOINTING["*"]
    assert trl.value_for(rows, VersionInfo("trl", "==0.21.0")) == (True, False)
    assert trl.value_for(rows, VersionInfo("trl", "==0.22.0")) == (True, True)
    assert trl.value_for(rows, VersionInfo("trl", ">=0.21")) == (False, None)
    assert trl.value_for(rows, VersionInfo("trl", "==0.7.11")) == (False, None)  # older than any wheel read
    assert trl.value_for(rows, VersionInfo("trl", "")) == (False, None)


def _cli_setups(tmp_path, launch, extra=None):
    write_project(tmp_path, {"run.sh": launch, "requirements.txt": "trl==1.16.0\n", **(extra or {})})
    return training_setups_of(tmp_path)


def test_the_trl_cli_runs_its_own_script_with_the_command_config(tmp_path):
    launch = ("trl sft --model_name_or_path Qwen/Qwen2.5-0.5B \\\n    --dataset_name trl-lib/Capybara --config cfg.yaml\n"
              "trl dpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dtype bfloat16 --output_dir o\n")
    setups = _cli_setups(tmp_path, launch, {"cfg.yaml": "gradient_checkpointing: false\nper_device_train_batch_size: 2\n"
                                                       "learning_rate: 1.0e-5\n"})
    sft, dpo = sorted(setups, key=lambda s: s.launch.span.line)
    assert sft.launch.module == "trl.scripts.sft"
    assert _value(sft, "model") == "Qwen/Qwen2.5-0.5B"
    assert _value(sft, "gradient_checkpointing") is False  # the config's, over SFTConfig's True
    assert (_value(sft, "micro_batch"), _value(sft, "grad_accum")) == (2, 1)
    assert _value(sft, "seq_len") == 1024 and _value(sft, "precision") == "amp-bf16"
    assert _value(dpo, "weights") == "bf16"  # ModelConfig --dtype
    assert _value(dpo, "seq_len") == 1024 and _value(dpo, "micro_batch") == 8


def test_trl_commands_that_do_not_train_are_not_launches(tmp_path):
    setups = _cli_setups(tmp_path, "trl env\ntrl vllm-serve --model Qwen/Qwen2.5-0.5B\nctrl sft --x 1\n")
    assert setups == []


@pytest.mark.parametrize("pins, name, impl", [
    ("transformers==4.31.0\ntorch==2.1.0\n", "adamw_hf", None),
    ("transformers==4.45.2\ntorch==2.9.0\n", "adamw_torch", None),
    ("transformers==4.57.1\ntorch==2.9.0\n", "adamw_torch_fused", "fused"),
    ("transformers==4.57.1\ntorch==2.4.0\n", "adamw_torch", None),
])
def test_the_hf_trainers_default_optimizer_per_release(tmp_path, pins, name, impl):
    script = ("from transformers import Trainer, TrainingArguments\n"
              "from transformers import AutoModelForCausalLM\n"
              "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
              "Trainer(model=model, args=TrainingArguments(output_dir='o')).train()\n")
    setup = _setup(_project(tmp_path, script, pins=pins))
    assert _value(setup, "optimizer") == "adamw"
    assert name in setup.values["optimizer"].origin
    assert _value(setup, "optimizer_impl") == impl
    assert _value(setup, "micro_batch") == 8  # one complete literal TrainingArguments: its defaults hold
