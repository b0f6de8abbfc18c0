"""Launch precedence as the tools apply it (issue 22, item 3): accelerate's launch options over
its --config_file YAML (`_validate_launch_command`, accelerate 1.15.0), the environment where a
launcher reads it (CUDA_VISIBLE_DEVICES, PET_NPROC_PER_NODE), variables expanded around
`srun bash -c`, and shell arithmetic."""

import os

import pytest
from conftest import lint_project, setting_value, training_setups_of, write_project

from cfgfix.documents.launches import arithmetic, find_launches, visible_devices
from cfgfix.documents.shell import parse_shell
from cfgfix.documents.text import SourceText
from cfgfix.training.memory_setup import memory_input
from cfgfix.training.resolve import training_setups

HF_SCRIPT = (
    "import torch\n"
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', torch_dtype=torch.bfloat16)\n"
    "Trainer(model=model, args=args).train()\n"
)
ACCELERATE_SCRIPT = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from transformers import AutoModelForCausalLM\n\n"
    "accelerator = Accelerator()\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B')\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
    "for batch in range(3):\n"
    "    loss = model(batch).loss\n"
    "    accelerator.backward(loss)\n"
    "    optimizer.step()\n"
)
MULTI_GPU_FP16 = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: fp16\nnum_processes: 2\n"
DEEPSPEED_YAML = (
    "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: fp16\nnum_processes: 2\n"
    "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 2\n  offload_optimizer_device: none\n"
)
DS_AUTO = ('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",'
           ' "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}\n')


def _setups(tmp_path, files):
    write_project(tmp_path, files)
    return training_setups_of(tmp_path)


def _one(tmp_path, files):
    setups = _setups(tmp_path, files)
    assert len(setups) == 1, setups
    return setups[0]


_value = setting_value


def _origin(setup, setting):
    return setup.values[setting].origin


# -- accelerate's options over its YAML ---------------------------------------------------------


@pytest.mark.parametrize("spelling", ["--mixed_precision bf16", "--mixed_precision=bf16", "--mixed-precision bf16",
                                      "--mixed_precision 'bf16'"])
def test_mixed_precision_flag_beats_the_yaml(tmp_path, spelling):
    setup = _one(tmp_path, {
        "acc.yaml": MULTI_GPU_FP16, "train.py": ACCELERATE_SCRIPT,
        "run.sh": f"accelerate launch --config_file acc.yaml {spelling} train.py\n",
    })
    assert _value(setup, "mixed_precision") == "bf16"
    assert "run.sh" in _origin(setup, "mixed_precision")
    assert _value(setup, "world_size") == 2  # the YAML still gives what no flag says


def test_without_the_flag_the_yaml_decides(tmp_path):
    setup = _one(tmp_path, {
        "acc.yaml": MULTI_GPU_FP16, "train.py": ACCELERATE_SCRIPT,
        "run.sh": "accelerate launch --config_file acc.yaml train.py\n",
    })
    assert _value(setup, "mixed_precision") == "fp16" and "acc.yaml" in _origin(setup, "mixed_precision")


def test_the_issue_launch_deepspeed_bf16_with_fp32_master_weights(tmp_path):
    """`--mixed_precision bf16 --use_deepspeed --deepspeed_config_file ds.json` over a fp16
    MULTI_GPU YAML: DeepSpeed's bf16 engine (16-bit weights with an fp32 master copy), not
    the YAML's fp16 and not "pure bf16" from the bf16 load."""
    setup = _one(tmp_path, {
        "acc.yaml": MULTI_GPU_FP16, "ds.json": DS_AUTO, "train.py": HF_SCRIPT,
        "run.sh": ("accelerate launch --config_file acc.yaml --mixed_precision bf16 --use_deepspeed \\\n"
                   "  --deepspeed_config_file ds.json --num_processes 8 train.py --per_device_train_batch_size 4\n"),
    })
    assert setup.files["deepspeed"].name == "ds.json"
    assert _value(setup, "precision") == "deepspeed-bf16"
    assert "--mixed_precision bf16 in run.sh" in _origin(setup, "precision")
    assert "fp32 master copy" in _origin(setup, "precision")
    assert (_value(setup, "world_size"), _value(setup, "zero_stage")) == (8, 3)
    memory = memory_input(setup).setup
    assert (memory.weights, memory.autocast, memory.deepspeed_half) == ("bf16", None, "bf16")


def test_use_deepspeed_alone_builds_accelerates_inline_config(tmp_path):
    """No YAML, no JSON: `--use_deepspeed --zero_stage 3 --offload_optimizer_device cpu
    --gradient_accumulation_steps 4 --mixed_precision bf16` is the whole DeepSpeed setup."""
    setup = _one(tmp_path, {
        "train.py": ACCELERATE_SCRIPT,
        "run.sh": ("accelerate launch --use_deepspeed --zero_stage 3 --offload_optimizer_device cpu "
                   "--gradient_accumulation_steps 4 --mixed_precision bf16 --num_processes 4 train.py\n"),
    })
    assert (_value(setup, "zero_stage"), _value(setup, "offload_optimizer"), _value(setup, "grad_accum")) == (3, True, 4)
    assert _value(setup, "precision") == "deepspeed-bf16"
    assert _value(setup, "world_size") == 4


def test_deepspeed_flags_beat_the_yamls_deepspeed_config(tmp_path):
    setup = _one(tmp_path, {
        "acc.yaml": DEEPSPEED_YAML, "train.py": ACCELERATE_SCRIPT,
        "launch/run.sh": ("accelerate launch --config_file acc.yaml --zero_stage=3 --gradient_accumulation_steps 8 "
                          "--offload_optimizer_device cpu --offload_param_device nvme train.py\n"),
    })
    assert _value(setup, "zero_stage") == 3 and "launch/run.sh" in _origin(setup, "zero_stage")
    assert _value(setup, "grad_accum") == 8
    assert (_value(setup, "offload_optimizer"), _value(setup, "offload_param")) == (True, True)
    assert _value(setup, "precision") == "deepspeed-fp16"  # the YAML's mixed_precision: no flag says otherwise


def test_use_deepspeed_over_a_multi_gpu_yaml(tmp_path):
    setup = _one(tmp_path, {
        "acc.yaml": MULTI_GPU_FP16 + "deepspeed_config:\n  zero_stage: 1\n", "train.py": ACCELERATE_SCRIPT,
        "run.sh": "accelerate launch --config_file acc.yaml --use_deepspeed --zero_stage 2 train.py\n",
    })
    assert _value(setup, "zero_stage") == 2
    assert _value(setup, "precision") == "deepspeed-fp16"


def test_multi_gpu_over_a_deepspeed_yaml_is_no_deepspeed_run(tmp_path):
    """`--multi_gpu` replaces the YAML's `distributed_type: DEEPSPEED`: accelerate reads neither
    its deepspeed_config block nor a --deepspeed_config_file."""
    setup = _one(tmp_path, {
        "acc.yaml": DEEPSPEED_YAML, "ds.json": DS_AUTO, "train.py": ACCELERATE_SCRIPT,
        "run.sh": "accelerate launch --config_file acc.yaml --multi_gpu --deepspeed_config_file ds.json train.py\n",
    })
    assert "deepspeed" not in setup.files
    assert _value(setup, "zero_stage") is None and _value(setup, "grad_accum") is None
    assert _value(setup, "precision") == "amp-fp16"


def test_fsdp_flags_over_the_yaml(tmp_path):
    yaml = ("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\n"
            "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")
    setup = _one(tmp_path, {
        "acc.yaml": yaml, "train.py": ACCELERATE_SCRIPT,
        "run.sh": "accelerate launch --config_file acc.yaml --fsdp_sharding_strategy SHARD_GRAD_OP train.py\n",
    })
    assert _value(setup, "fsdp") == "grad-op"
    setup = _one(tmp_path / "b", {
        "acc.yaml": MULTI_GPU_FP16, "train.py": ACCELERATE_SCRIPT,
        "run.sh": "accelerate launch --config_file acc.yaml --use_fsdp --fsdp_sharding_strategy FULL_SHARD train.py\n",
    })
    assert _value(setup, "fsdp") == "full"


def test_flags_through_variables_and_python_m(tmp_path):
    setup = _one(tmp_path, {
        "acc.yaml": MULTI_GPU_FP16, "train.py": ACCELERATE_SCRIPT,
        "run.sh": ('MP=bf16\nNP=$((2 * 4))\n'
                   'python -m accelerate.commands.launch --config_file acc.yaml --mixed_precision "$MP" '
                   '--num_processes $NP train.py\n'),
    })
    assert _value(setup, "mixed_precision") == "bf16"
    assert _value(setup, "world_size") == 8


def test_the_script_flag_still_beats_accelerates_option_for_the_hf_trainer(tmp_path):
    """TrainingArguments' own `--fp16` sets ACCELERATE_MIXED_PRECISION over the launcher's."""
    setup = _one(tmp_path, {
        "train.py": HF_SCRIPT,
        "run.sh": "accelerate launch --mixed_precision bf16 --num_processes 2 train.py --fp16\n",
    })
    assert _value(setup, "mixed_precision") == "fp16"


def test_flag_values_survive_the_cache(tmp_path):
    files = {"acc.yaml": MULTI_GPU_FP16, "train.py": ACCELERATE_SCRIPT,
             "run.sh": "accelerate launch --config_file acc.yaml --mixed_precision bf16 train.py\n"}
    write_project(tmp_path, files)
    lint_project(tmp_path, use_cache=True)
    engine, _, _ = lint_project(tmp_path, use_cache=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        (setup,) = training_setups(engine.project)
    finally:
        os.chdir(cwd)
    assert _value(setup, "mixed_precision") == "bf16"


# -- the environment, srun bash -c, arithmetic ----------------------------------------------


def _launches(text: str):
    return find_launches(parse_shell(SourceText.from_bytes("run.sh", text.encode())))


def _world(text: str):
    found = _launches(text)
    assert len(found) == 1, found
    return found[0].world_size


@pytest.mark.parametrize("script, world", [
    ("export CUDA_VISIBLE_DEVICES=0,1,2\ntorchrun --nproc_per_node=gpu x.py\n", 3),
    ("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node gpu --nnodes 2 x.py\n", 4),
    ("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node auto x.py\n", 2),
    ("env CUDA_VISIBLE_DEVICES=4,5,6,7 torchrun --nproc_per_node=gpu x.py\n", 4),
    ("torchrun --nproc_per_node=gpu x.py\n", None),  # every GPU of a machine we do not know
    ("CUDA_VISIBLE_DEVICES=$GPUS torchrun --nproc_per_node=gpu x.py\n", None),
    ("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 4 x.py\n", 4),  # the flag decides
    ("PET_NPROC_PER_NODE=4 torchrun x.py\n", 4),  # torchrun's option default from the environment
    ("export CUDA_VISIBLE_DEVICES=0,1\naccelerate launch x.py\n", 2),
    ("export CUDA_VISIBLE_DEVICES=0,1\naccelerate launch --multi_gpu x.py\n", 2),
    ("CUDA_VISIBLE_DEVICES=0,1 accelerate launch --config_file a.yaml x.py\n", None),  # the YAML decides
    ("CUDA_VISIBLE_DEVICES=0,1 accelerate launch --num_processes 1 x.py\n", 1),
    ("CUDA_VISIBLE_DEVICES=0,1 accelerate launch --cpu x.py\n", None),
    ("CUDA_VISIBLE_DEVICES=2,3,5 deepspeed x.py --deepspeed ds.json\n", 3),
    ("CUDA_VISIBLE_DEVICES=2,3,5 deepspeed --num_gpus 2 x.py\n", 2),
    ("CUDA_VISIBLE_DEVICES=2,3,5 deepspeed --include localhost:0 x.py\n", 1),
    ("(export CUDA_VISIBLE_DEVICES=0,1)\ntorchrun --nproc_per_node=gpu x.py\n", None),  # a subshell's export
    # WORLD_SIZE is what launchers set for their children, read by none of them as a count
    ("WORLD_SIZE=8 python x.py\n", 1),
    ("export WORLD_SIZE=8\ntorchrun --nproc_per_node=gpu x.py\n", None),
])
def test_visible_devices_where_the_launcher_reads_them(script, world):
    assert _world(script) == world


@pytest.mark.parametrize("text, count", [
    ("0,1,2,3", 4), ("0", 1), ("GPU-5e3a,GPU-77b1", 2), ("MIG-1", 1), ('"0,1"', 2),
    ("", None), ("-1", None), ("$GPUS", None), ("0,,1", None), (None, None),
])
def test_visible_devices(text, count):
    assert visible_devices(text) == count


@pytest.mark.parametrize("expression, value", [
    ("128/4/1", 32), (" NUM_GPUS * 2 ", 8), ("$NUM_GPUS*$NODES", 8), ("${NUM_GPUS} + 1", 5),
    ("(1+2)*3", 9), ("7/2", 3), ("-7/2", -3), ("7%3", 1), ("2**3", 8), ("10 - 2 - 3", 5),
    ("1/0", None), ("UNKNOWN * 2", None), ("1 << 2", None), ("N=3", None), ("1 +", None), ("(1", None),
    ("2**1000", None),
])
def test_arithmetic(expression, value):
    assert arithmetic(expression, {"NUM_GPUS": 4, "NODES": 2}.get) == value


@pytest.mark.parametrize("script, world", [
    ("torchrun --nproc_per_node $((128/4/16)) x.py\n", 2),
    ("NUM_GPUS=2\ntorchrun --nproc_per_node $(( NUM_GPUS * 2 )) x.py\n", 4),
    ("NUM_GPUS=2\nNODES=2\ntorchrun --nproc_per_node=$((NUM_GPUS)) --nnodes $((NODES)) x.py\n", 4),
    ("G=4\nN=1\nWORLD=$((G * N))\naccelerate launch --num_processes $WORLD x.py\n", 4),
    ("torchrun --nproc_per_node $((GPUS * 2)) x.py\n", None),  # GPUS from the environment
    ("G=2\nif [ -n \"$BIG\" ]; then G=8; fi\ntorchrun --nproc_per_node $((G)) x.py\n", None),
])
def test_shell_arithmetic(script, world):
    assert _world(script) == world


@pytest.mark.parametrize("script, world", [
    # the variable exported outside, the inline script single-quoted: the inner shell reads it
    ("export GPUS_PER_NODE=4\nsrun bash -c 'torchrun --nproc_per_node ${GPUS_PER_NODE} --nnodes 1 x.py'\n", 4),
    (("export GPUS_PER_NODE=4\nsrun --ntasks-per-node=1 bash -c '\n  accelerate launch --num_processes "
     "$((GPUS_PER_NODE * 2)) --num_machines 2 x.py\n'\n"), 8),
    # the launcher in variables the outer shell expands (`srun bash -c "$LAUNCHER $CMD"`)
    (('export GPUS_PER_NODE=8\nexport LAUNCHER="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes 2"\n'
     'export CMD="x.py --bf16"\nsrun --jobid $SLURM_JOBID bash -c "$LAUNCHER $CMD"\n'), 16),
    (('GPUS=4\nLAUNCHER="torchrun --nproc_per_node $GPUS --nnodes $SLURM_NNODES"\n'
     'srun bash -c "$LAUNCHER x.py"\n'), None),  # the node count comes from Slurm
])
def test_srun_bash_c(script, world):
    assert _world(script) == world


def test_launcher_in_a_variable_outside_srun():
    found = _launches('LAUNCHER="accelerate launch --num_processes 4"\n$LAUNCHER train.py --lr 1\n')
    assert len(found) == 1 and found[0].launcher == "accelerate" and found[0].world_size == 4
    assert found[0].script.text == "train.py"
    assert _launches('"$RUNNER" train.py\n') == []  # a variable that holds nothing we know


# -- the accelerate rules read the same options ------------------------------------------------

DS_FILE_YAML = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                "  deepspeed_config_file: ds.json\n  zero_stage: 2\nmixed_precision: bf16\nnum_processes: 2\n")
DS_BF16 = '{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}\n'


def _findings(tmp_path, launch, select=("CFX402", "CFX403")):
    write_project(tmp_path, {"acc.yaml": DS_FILE_YAML, "ds.json": DS_BF16, "run.sh": launch,
                             "train.py": "from accelerate import Accelerator\nacc = Accelerator()\n"})
    _, _, result = lint_project(tmp_path, select=list(select))
    return sorted((f.code, f.span.line, f.severity.name) for f in result.findings)


@pytest.mark.parametrize("flag", ["--multi_gpu", "--use_fsdp", "--cpu"])
def test_cfx403_silent_when_the_command_line_runs_no_deepspeed(tmp_path, flag):
    assert _findings(tmp_path, f"accelerate launch --config_file acc.yaml {flag} train.py\n") == []


def test_cfx403_latent_only_for_accelerates_own_mixed_precision(tmp_path):
    latent = _findings(tmp_path, "accelerate launch --config_file acc.yaml --mixed_precision=bf16 train.py\n")
    assert ("CFX403", 6, "WARNING") in latent
    # the script's own `--mixed_precision` (after train.py) is not accelerate's: rejected at launch
    rejected = _findings(tmp_path / "b", "accelerate launch --config_file acc.yaml train.py --mixed_precision fp16\n")
    assert ("CFX403", 6, "ERROR") in rejected
