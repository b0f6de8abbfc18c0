"""DeepSpeed configs bound in code count as the launch's config (issue 22, item 4):
`TrainingArguments(deepspeed=...)` (a literal, a name, an argparse or argument-dataclass
default the launch may replace), `deepspeed.initialize(config=...)` / `config_params=`,
`DeepSpeedPlugin(hf_ds_config=...)`, for the rules that need a launch link (CFX502, CFX505,
CFX506) and for the resolved setup (`explain`, CFX511, the estimate)."""

import ast
import os

import pytest
from conftest import lint_project, write_project

from cfgfix.analysis.training_script import bound_configs
from cfgfix.training.resolve import training_setups

DS_BATCH = ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,\n'
            ' "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": false}}\n')
DS_AUTO_STAGE = '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": "auto"}}\n'
HF_TRAIN = (
    "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
    "args = TrainingArguments(output_dir='out', per_device_train_batch_size=4, gradient_accumulation_steps=4,\n"
    "                         deepspeed={ds})\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
    "trainer = Trainer(model=model, args=args)\n"
    "trainer.train()\n"
    "trainer.save_model()\n"
)
BARE = (
    "import deepspeed{alias}\n\n"
    "engine, *_ = {name}.initialize(model=model, model_parameters=model.parameters(), {keyword}={ds})\n"
    "engine.train_batch()\n"
)


def _codes(tmp_path, files, select="CFX502,CFX505,CFX506"):
    write_project(tmp_path, files)
    _, _, results = lint_project(tmp_path, select=select.split(","))
    return sorted((f.code, f.path, f.span.line) for f in results.findings)


@pytest.mark.parametrize("ds, launch", [
    ('"ds.json"', "torchrun --nproc_per_node 2 train.py\n"),
    ("DS_CONFIG", "torchrun --nproc_per_node 2 train.py\n"),  # a module constant (defined below)
    ('"./configs/../ds.json"', "torchrun --nproc_per_node=2 train.py\n"),
    ('"ds.json"', "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=gpu train.py\n"),
])
def test_training_arguments_deepspeed_links_the_config(tmp_path, ds, launch):
    script = HF_TRAIN.format(ds=ds)
    if ds == "DS_CONFIG":
        script = "DS_CONFIG = 'ds.json'\n" + script
    codes = _codes(tmp_path, {"ds.json": DS_BATCH, "train.py": script, "run.sh": launch, "configs/keep.txt": ""})
    # 64 != 4 x 4 x 2 = 32 (CFX502); gather false with trainer.save_model (CFX506)
    assert [c for c, _, _ in codes] == ["CFX502", "CFX506"], codes


def test_a_plain_python_launch_is_one_process(tmp_path):
    codes = _codes(tmp_path, {"ds.json": DS_BATCH.replace('"train_batch_size": 64', '"train_batch_size": 16'),
                              "train.py": HF_TRAIN.format(ds='"ds.json"'), "run.sh": "python train.py\n"})
    assert [c for c, _, _ in codes] == ["CFX506"]  # 16 = 4 x 4 x 1: the batch arithmetic holds


def test_no_launch_no_link(tmp_path):
    """Nothing says how the script runs (the world size, the working folder): no use."""
    assert _codes(tmp_path, {"ds.json": DS_BATCH, "train.py": HF_TRAIN.format(ds='"ds.json"')}) == []


@pytest.mark.parametrize("alias, name, keyword", [
    ("", "deepspeed", "config"), (" as ds", "ds", "config"), ("", "deepspeed", "config_params"),
])
def test_deepspeed_initialize_config(tmp_path, alias, name, keyword):
    script = BARE.format(alias=alias, name=name, keyword=keyword, ds='"configs/ds.json"')
    codes = _codes(tmp_path, {"configs/ds.json": DS_AUTO_STAGE, "src/train.py": script,
                              "scripts/run.sh": "cd ..\npython src/train.py\n"})
    assert codes == [("CFX505", "configs/ds.json", 1)]


def test_a_config_next_to_the_script(tmp_path):
    """`config="ds.json"` found beside the script when the launch's folder has none."""
    script = BARE.format(alias="", name="deepspeed", keyword="config", ds='"ds.json"')
    codes = _codes(tmp_path, {"src/ds.json": DS_AUTO_STAGE, "src/train.py": script, "run.sh": "python src/train.py\n"})
    assert codes == [("CFX505", "src/ds.json", 1)]


def test_argparse_default_and_the_flag_that_replaces_it(tmp_path):
    script = (
        "import argparse\nimport deepspeed\n\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--ds-config', type=str, default='default.json')\n"
        "args = parser.parse_args()\n"
        "engine, *_ = deepspeed.initialize(model=model, config=args.ds_config)\n"
    )
    files = {"default.json": DS_AUTO_STAGE, "other.json": DS_AUTO_STAGE, "train.py": script}
    codes = _codes(tmp_path, {**files, "run.sh": "deepspeed --num_gpus 2 train.py\n"})
    assert codes == [("CFX505", "default.json", 1)]
    codes = _codes(tmp_path / "b", {**files, "run.sh": "deepspeed --num_gpus 2 train.py --ds-config other.json\n"})
    assert codes == [("CFX505", "other.json", 1)]


def test_deepspeed_plugin_through_accelerate(tmp_path):
    script = (
        "from accelerate import Accelerator\nfrom accelerate.utils import DeepSpeedPlugin\n\n"
        "plugin = DeepSpeedPlugin(hf_ds_config='ds.json')\n"
        "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
        "model = accelerator.prepare(model)\n"
        "state = accelerator.get_state_dict(model)\n"
    )
    codes = _codes(tmp_path, {"ds.json": DS_BATCH, "train.py": script,
                              "run.sh": "accelerate launch --num_processes 2 train.py\n"})
    assert [c for c, _, _ in codes] == ["CFX502", "CFX506"]


@pytest.mark.parametrize("ds", ["None", "cfg.get('deepspeed')", "'missing.json'", "{'train_batch_size': 8}",
                                "f'{ROOT}/ds.json'"])
def test_near_misses_bind_nothing(tmp_path, ds):
    codes = _codes(tmp_path, {"ds.json": DS_BATCH, "train.py": HF_TRAIN.format(ds=ds),
                              "run.sh": "torchrun --nproc_per_node 2 train.py\n"})
    assert codes == []


def test_the_launch_flag_still_names_the_config(tmp_path):
    """`--deepspeed ds.json` on the command line (HfArgumentParser) keeps working, and a code
    default of the same file is not a second use."""
    script = ("from transformers import HfArgumentParser, Trainer, TrainingArguments\n\n"
              "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
              "Trainer(model=model, args=args).save_model()\n")
    codes = _codes(tmp_path, {"ds.json": DS_BATCH, "train.py": script,
                              "run.sh": "torchrun --nproc_per_node 2 train.py --deepspeed ds.json "
                                        "--per_device_train_batch_size 4 --gradient_accumulation_steps 4\n"})
    assert [c for c, _, _ in codes] == ["CFX502", "CFX506"]


def test_the_setup_reads_a_config_bound_by_initialize(tmp_path):
    script = BARE.format(alias="", name="deepspeed", keyword="config", ds='"ds.json"')
    write_project(tmp_path, {"ds.json": DS_BATCH, "train.py": script, "run.sh": "deepspeed --num_gpus 2 train.py\n"})
    engine, _, _ = lint_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        (setup,) = training_setups(engine.project)
    finally:
        os.chdir(cwd)
    assert setup.files["deepspeed"].name == "ds.json"
    assert setup.values["zero_stage"].value == 3
    assert setup.values["micro_batch"].value == 4


@pytest.mark.parametrize("code, expected", [
    ("from transformers import TrainingArguments\nTrainingArguments(deepspeed='ds.json')",
     [("TrainingArguments(deepspeed=...)", "ds.json", None)]),
    ("import transformers\ntransformers.Seq2SeqTrainingArguments('o', deepspeed='z.json')",
     [("transformers.Seq2SeqTrainingArguments(deepspeed=...)", "z.json", None)]),
    (("from trl import SFTConfig\nfrom dataclasses import dataclass, field\n@dataclass\nclass A:\n"
     "    ds: str = field(default='ds.json')\nSFTConfig(deepspeed=a.ds)"),
     [("SFTConfig(deepspeed=...)", "ds.json", "--ds")]),
    ("from accelerate.utils import DeepSpeedPlugin\nDeepSpeedPlugin('ds.json')",
     [("DeepSpeedPlugin(hf_ds_config=...)", "ds.json", None)]),
    ("from transformers.integrations import HfDeepSpeedConfig\nHfDeepSpeedConfig('ds.json')",
     [("HfDeepSpeedConfig(config_file_or_dict=...)", "ds.json", None)]),
    (("import argparse\np = argparse.ArgumentParser()\np.add_argument('--deepspeed_config', default=None)\n"
     "import deepspeed\ndeepspeed.initialize(config=p.parse_args().deepspeed_config)"),
     [("deepspeed.initialize(config=...)", None, "--deepspeed_config")]),
    ("from mylib import TrainingArguments\nTrainingArguments(deepspeed='ds.json')", []),  # not transformers'
    ("from transformers import TrainingArguments\nDS = 'a.json'\nDS = 'b.json'\nTrainingArguments(deepspeed=DS)", []),
])
def test_bound_configs_spellings(code, expected):
    found = [(b.call, b.path, b.flag) for b in bound_configs(ast.parse(code))]
    assert found == expected


@pytest.mark.parametrize("call", [
    "TrainingArguments(output_dir='o', per_device_train_batch_size=2, bf16=True, deepspeed=DS)",
    "TrainingArguments(output_dir='o', per_device_train_batch_size=2, bf16=True,\n    deepspeed={inline})",
])
def test_a_dict_literal_is_the_setups_deepspeed_config(tmp_path, call):
    inline = ('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},'
              ' "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}')
    script = ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
              f"DS = {inline}\n"
              f"args = {call.replace('{inline}', inline)}\n"
              "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
              "Trainer(model=model, args=args).train()\n")
    write_project(tmp_path, {"train.py": script, "run.sh": "torchrun --nproc_per_node 2 train.py\n"})
    engine, _, _ = lint_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        (setup,) = training_setups(engine.project)
    finally:
        os.chdir(cwd)
    assert "deepspeed" not in setup.files  # no file
    assert (setup.values["zero_stage"].value, setup.values["offload_optimizer"].value) == (3, True)
    # the values point at the dict: the name's binding (line 2) or the keyword's value (line 4)
    assert setup.values["zero_stage"].span.path == "train.py"
    assert setup.values["zero_stage"].span.line == (2 if "deepspeed=DS" in call else 4)
    assert setup.values["precision"].value == "deepspeed-bf16"
    assert setup.values["micro_batch"].value == 2
