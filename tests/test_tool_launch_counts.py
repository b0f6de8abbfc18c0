"""The process count a training tool's own command starts, on the launch itself
(`LaunchFacts.world_size`), so the rules that read a launch's count see it: `llamafactory-cli
train` (torchrun from FORCE_TORCHRUN / NPROC_PER_NODE / NNODES / CUDA_VISIBLE_DEVICES,
analysis/tool_processes.py) and `trl <command>` (accelerate launch: `--num_processes`,
`--config_file` / `--accelerate_config`, else every visible GPU)."""

import pytest

from conftest import lint_project, setting_value, training_setups_of, write_project

LF = ("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\ntemplate: llama3\n"
      "per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\nbf16: true\n")


def _launches(root):
    engine, _, _ = lint_project(root)
    return [launch for launch, _ in engine.project.launches]


@pytest.mark.parametrize("command, world", [
    ("CUDA_VISIBLE_DEVICES=0,1,2,3 llamafactory-cli train cfg.yaml", 4),  # torchrun on every visible GPU
    ("CUDA_VISIBLE_DEVICES=0 llamafactory-cli train cfg.yaml", 1),
    ("FORCE_TORCHRUN=1 NPROC_PER_NODE=8 NNODES=2 llamafactory-cli train cfg.yaml", 16),
    ("export CUDA_VISIBLE_DEVICES=0,1\nFORCE_TORCHRUN=1 lmf train cfg.yaml", 2),  # exported before, the shortcut
    ("FORCE_TORCHRUN=1 llamafactory-cli train cfg.yaml", None),  # every GPU of a machine we do not see
    ("NPROC_PER_NODE=$N FORCE_TORCHRUN=1 llamafactory-cli train cfg.yaml", None),
    ("CUDA_VISIBLE_DEVICES=0,1 USE_RAY=1 llamafactory-cli train cfg.yaml", None),  # Ray's processes
    # a prefix assignment's value is expanded when the command runs, exported or not
    ("GPUS=5,6,7\nCUDA_VISIBLE_DEVICES=$GPUS llamafactory-cli train cfg.yaml", 3),
    ('GPUS=5,6\nCUDA_VISIBLE_DEVICES="${GPUS}" llamafactory-cli train cfg.yaml', 2),
    # near misses: a value from a command, a default the environment may replace, an unset name
    ("GPUS=$(nvidia-smi -L | wc -l)\nCUDA_VISIBLE_DEVICES=$GPUS llamafactory-cli train cfg.yaml", None),
    ("CUDA_VISIBLE_DEVICES=${GPUS:-0,1} llamafactory-cli train cfg.yaml", None),
    ("CUDA_VISIBLE_DEVICES=$GPUS llamafactory-cli train cfg.yaml", None),
])
def test_llamafactory_cli_count_on_the_launch(tmp_path, command, world):
    write_project(tmp_path, {"run.sh": command + "\n", "cfg.yaml": LF})
    (launch,) = _launches(tmp_path)
    assert launch.world_size == world
    setup = training_setups_of(tmp_path)[0]
    assert setting_value(setup, "world_size") == world
    if world is not None:
        assert "llamafactory-cli train" in setup.values["world_size"].origin  # the tool's own account


def test_a_release_before_0_8_starts_one_process(tmp_path):
    write_project(tmp_path, {"run.sh": "CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train cfg.yaml\n", "cfg.yaml": LF,
                             "requirements.txt": "llamafactory==0.7.1\n"})
    (launch,) = _launches(tmp_path)
    assert launch.world_size == 1


def test_the_tools_count_reaches_the_deepspeed_batch_rule(tmp_path):
    # 2 x 4 x 4 processes = 32, not the JSON's 16: DeepSpeed refuses (CFX502 needs the count)
    write_project(tmp_path, {
        "run.sh": "CUDA_VISIBLE_DEVICES=0,1,2,3 llamafactory-cli train cfg.yaml\n",
        "cfg.yaml": LF + "deepspeed: ds.json\n",
        "ds.json": '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}\n',
    })
    engine, _, result = lint_project(tmp_path)
    uses = [use for path, found in engine.project.deepspeed_uses().items() for use in found]
    assert [use.world_size for use in uses] == [4]
    assert "CFX502" in {f.code for f in result.findings}


@pytest.mark.parametrize("command, world", [
    ("trl sft --model_name_or_path Qwen/Qwen2.5-0.5B --num_processes 4 --dataset_name d", 4),
    ("trl dpo --model_name_or_path m --num_processes=2 --num_machines 1", 2),
    ("CUDA_VISIBLE_DEVICES=0,1,2 trl sft --model_name_or_path m", 3),  # accelerate: every visible GPU
    ("trl grpo --model_name_or_path m --accelerate_config zero3", 8),  # the config trl ships: 8 processes
    ("trl sft --model_name_or_path m --config_file acc.yaml", 2),  # the YAML's num_processes
    ("trl sft --model_name_or_path m --num_processes $NGPU", None),
    ("trl sft --model_name_or_path m", None),  # every GPU of a machine we do not see
])
def test_trl_cli_count_on_the_launch(tmp_path, command, world):
    write_project(tmp_path, {"run.sh": command + "\n",
                             "acc.yaml": "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n"})
    setup = training_setups_of(tmp_path)[0]
    assert setting_value(setup, "world_size") == world
    assert setup.values.get("micro_batch") is None or setting_value(setup, "micro_batch") == 8


def test_trl_cli_gradient_accumulation_stays_the_scripts(tmp_path):
    """`--gradient_accumulation_steps` is TrainingArguments' (trl's parser takes it), not accelerate's."""
    write_project(tmp_path, {"run.sh": "trl sft --model_name_or_path m --num_processes 2 --gradient_accumulation_steps 4\n"})
    (launch,) = _launches(tmp_path)
    assert launch.option("gradient_accumulation_steps") is None
    setup = training_setups_of(tmp_path)[0]
    assert setting_value(setup, "grad_accum") == 4
    assert setting_value(setup, "effective_batch") == 8 * 4 * 2
