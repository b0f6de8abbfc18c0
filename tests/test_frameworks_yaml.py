"""LLaMA-Factory and axolotl launches resolved as each tool runs them, per release
(cfgfix/training/frameworks/llamafactory.py, axolotl.py): the defaults a YAML leaves out, the
load dtype, the process count the tool derives, the launch shapes each tool has had, a fit
plan written into the tool's own keys, and no "fp32 training" finding where it trains 16-bit."""

import json

from click.testing import CliRunner
from conftest import lint_project, training_setups_of, write_project

from cfgfix.commands import cli
from cfgfix.training.frameworks.yaml_tools import pick_release
from cfgfix.training.resolve import training_setups

LF_LORA = ("### model\nmodel_name_or_path: meta-llama/Llama-3.1-8B\n\n### method\nstage: sft\nfinetuning_type: lora\n"
           "template: llama3\n\n### train\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 4\nbf16: true\n")


_setups = training_setups_of


def _one(root, files):
    write_project(root, files)
    setups = _setups(root)
    assert len(setups) == 1, [s.launch for s in setups]
    return setups[0]


def _value(setup, setting):
    value = setup.values.get(setting)
    return value.value if value is not None else None


def _codes(root):
    _, _, result = lint_project(root)
    return {f.code for f in result.findings}


# -- LLaMA-Factory: defaults ---------------------------------------------------------------

def test_llamafactory_lora_without_a_rank_trains_rank_8_with_checkpointing_on(tmp_path):
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train cfg/lora.yaml\n", "cfg/lora.yaml": LF_LORA})
    assert setup.framework.tool == "llamafactory" and setup.framework.release == "0.9.5"
    assert _value(setup, "lora_rank") == 8 and "lora_rank=8" in setup.values["lora_rank"].origin
    assert _value(setup, "gradient_checkpointing") is True
    assert _value(setup, "seq_len") == 2048  # cutoff_len's default from 0.9.1
    assert (_value(setup, "weights"), _value(setup, "precision")) == ("bf16", "amp-bf16")
    assert setup.to_dict(str)["framework"]["finetuning_type"] == "lora"


def test_llamafactory_finetuning_type_defaults_to_lora(tmp_path):
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n",
                            "a.yaml": LF_LORA.replace("finetuning_type: lora\n", "")})
    assert _value(setup, "lora_rank") == 8


def test_llamafactory_disable_gradient_checkpointing_turns_it_off(tmp_path):
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n",
                            "a.yaml": LF_LORA + "disable_gradient_checkpointing: true\n"})
    assert _value(setup, "gradient_checkpointing") is False


def test_llamafactory_full_fine_tune_has_no_lora_and_fp32_trainable_weights(tmp_path):
    """A stray lora_rank does not make a full fine-tune LoRA; model/adapter.py casts the
    trainable parameters to fp32 (bf16 autocast on top)."""
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n",
                            "a.yaml": LF_LORA.replace("lora", "full") + "lora_rank: 64\n"})
    assert _value(setup, "lora_rank") is None
    assert (_value(setup, "weights"), _value(setup, "precision")) == ("fp32", "amp-bf16")


def test_llamafactory_pure_bf16_trains_16_bit_weights(tmp_path):
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n",
                            "a.yaml": LF_LORA.replace("lora", "full").replace("bf16: true", "pure_bf16: true")})
    assert (_value(setup, "weights"), _value(setup, "precision")) == ("bf16", "bf16")


def test_llamafactory_release_pin_selects_the_older_defaults(tmp_path):
    """cutoff_len defaulted to 1024 up to 0.9.0; the pin picks it."""
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n", "requirements.txt": "llamafactory==0.8.3\n",
                            "a.yaml": LF_LORA})
    assert setup.framework.release == "0.8.3" and _value(setup, "seq_len") == 1024
    assert "llamafactory==0.8.3" in setup.framework.release_origin


def test_pick_release_takes_the_newest_read_release_the_specifier_admits():
    releases = ("0.8.3", "0.9.0", "0.9.5")
    assert pick_release(releases, "==0.9.6.dev0") == "0.9.5"
    assert pick_release(releases, ">=0.8,<0.9") == "0.8.3"
    assert pick_release(releases, "==0.7.0") is None
    assert pick_release(releases, "not a specifier") is None


# -- LLaMA-Factory: processes ---------------------------------------------------------------

def test_llamafactory_cli_process_count_follows_its_environment(tmp_path):
    cases = {
        "CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train a.yaml\n": 2,
        "CUDA_VISIBLE_DEVICES=0 llamafactory-cli train a.yaml\n": 1,
        "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 NNODES=2 llamafactory-cli train a.yaml\n": 8,
        "export CUDA_VISIBLE_DEVICES=0,1,2\nllamafactory-cli train a.yaml\n": 3,
        "env FORCE_TORCHRUN=1 CUDA_VISIBLE_DEVICES=0 llamafactory-cli train a.yaml\n": 1,
        "lmf train a.yaml\n": None,
        "FORCE_TORCHRUN=1 llamafactory-cli train a.yaml\n": None,
        "USE_RAY=1 llamafactory-cli train a.yaml\n": None,
    }
    for i, (line, world) in enumerate(cases.items()):
        root = tmp_path / str(i)
        setup = _one(root, {"run.sh": line, "a.yaml": LF_LORA})
        assert _value(setup, "world_size") == world, line
        if world is None:  # unknown, and explain says why rather than assuming one process
            assert setup.values["world_size"].origin


def test_llamafactory_cli_before_0_8_runs_one_process(tmp_path):
    setup = _one(tmp_path, {"run.sh": "CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train a.yaml\n",
                            "requirements.txt": "llamafactory==0.7.1\n", "a.yaml": LF_LORA})
    assert _value(setup, "world_size") == 1


def test_settings_gpus_fill_an_unknown_tool_process_count(tmp_path):
    setup = _one(tmp_path, {"run.sh": "llamafactory-cli train a.yaml\n", "a.yaml": LF_LORA,
                            "cfgfix.toml": 'gpu = "A100 80GB"\ngpus = 4\n'})
    assert _value(setup, "world_size") == 4


# -- LLaMA-Factory: launch shapes -------------------------------------------------------------

def test_llamafactory_dotlist_overrides_beat_the_yaml_from_0_9_3(tmp_path):
    line = "llamafactory-cli train a.yaml cutoff_len=8192 per_device_train_batch_size=1\n"
    setup = _one(tmp_path / "new", {"run.sh": line, "a.yaml": LF_LORA})
    assert (_value(setup, "seq_len"), _value(setup, "micro_batch")) == (8192, 1)
    old = _one(tmp_path / "old", {"run.sh": line, "a.yaml": LF_LORA, "requirements.txt": "llamafactory==0.9.2\n"})
    assert (_value(old, "seq_len"), _value(old, "micro_batch")) == (2048, 2)  # 0.9.2 reads no key=value words (read_args)


def test_llamafactory_flags_form_reads_its_own_flags(tmp_path):
    setup = _one(tmp_path, {"run.sh": ("CUDA_VISIBLE_DEVICES=3 llamafactory-cli train --stage sft --model_name_or_path "
                                       "meta-llama/Llama-3.1-8B --finetuning_type lora --cutoff_len 4096 "
                                       "--per_device_train_batch_size 4 --fp16 True\n")})
    assert (_value(setup, "lora_rank"), _value(setup, "seq_len"), _value(setup, "world_size")) == (8, 4096, 1)
    assert _value(setup, "mixed_precision") == "fp16"


def test_llamafactory_script_launches_are_recognised_by_their_yaml_or_name(tmp_path):
    setup = _one(tmp_path / "torchrun", {"run.sh": "torchrun --nproc_per_node 2 src/train.py examples/a.yaml\n",
                                         "examples/a.yaml": LF_LORA})
    assert setup.framework is not None and _value(setup, "world_size") == 2 and _value(setup, "lora_rank") == 8
    setup = _one(tmp_path / "bash", {"run.sh": ("CUDA_VISIBLE_DEVICES=0 python src/train_bash.py --stage sft --do_train "
                                                "--model_name_or_path meta-llama/Llama-2-7b-hf --fp16\n")})
    assert setup.framework.release == "0.6.3" and _value(setup, "gradient_checkpointing") is True
    assert (_value(setup, "weights"), _value(setup, "seq_len")) == ("fp16", 1024)
    for shape in ("accelerate launch --num_processes 2 src/train.py a.yaml\n",
                  "deepspeed --num_gpus 2 src/train.py a.yaml\n"):
        setup = _one(tmp_path / shape.split()[0], {"run.sh": shape, "a.yaml": LF_LORA})
        assert setup.framework is not None and _value(setup, "world_size") == 2, shape


def test_a_plain_hf_yaml_under_src_train_py_is_not_llamafactory(tmp_path):
    """Near miss: an HfArgumentParser YAML with no LLaMA-Factory key."""
    setup = _one(tmp_path, {"run.sh": "torchrun --nproc_per_node 2 src/train.py a.yaml\n",
                            "a.yaml": "per_device_train_batch_size: 2\nlearning_rate: 1.0e-5\nbf16: true\n"})
    assert setup.framework is None and _value(setup, "gradient_checkpointing") is None


def test_llamafactory_yaml_deepspeed_key_is_the_runs_deepspeed_config(tmp_path):
    setup = _one(tmp_path, {"run.sh": "FORCE_TORCHRUN=1 llamafactory-cli train a.yaml\n",
                            "a.yaml": LF_LORA.replace("lora", "full") + "deepspeed: ds/z3.json\n",
                            "ds/z3.json": '{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}}\n'})
    assert (_value(setup, "zero_stage"), _value(setup, "precision")) == (3, "deepspeed-bf16")
    assert _value(setup, "weights") == "bf16"


# -- axolotl ---------------------------------------------------------------------------------

AX_QLORA = ("base_model: meta-llama/Llama-3.1-8B\nload_in_4bit: true\nadapter: qlora\nlora_r: 32\nsequence_len: 4096\n"
            "micro_batch_size: 2\ngradient_accumulation_steps: 4\nbf16: auto\ngradient_checkpointing: true\n")


def test_axolotl_bf16_auto_with_4bit_trains_16_bit_weights_on_a_4_bit_base(tmp_path):
    setup = _one(tmp_path, {"train.sh": "axolotl train cfg.yml\n", "cfg.yml": AX_QLORA})
    assert setup.framework.tool == "axolotl"
    assert (_value(setup, "weights"), _value(setup, "mixed_precision"), _value(setup, "precision")) == ("bf16", "bf16", "amp-bf16")
    assert (_value(setup, "quantization"), _value(setup, "lora_rank")) == ("4bit", 32)
    assert (_value(setup, "micro_batch"), _value(setup, "seq_len")) == (2, 4096)


def test_axolotl_bf16_auto_follows_the_target_gpu(tmp_path):
    setup = _one(tmp_path, {"train.sh": "axolotl train cfg.yml\n", "cfg.yml": AX_QLORA,
                            "cfgfix.toml": 'gpu = "V100 32GB"\n'})
    assert (_value(setup, "weights"), _value(setup, "mixed_precision")) == ("fp16", "fp16")


def test_axolotl_defaults_and_keys_without_an_adapter(tmp_path):
    """No adapter: a full fine-tune, whatever lora_r says; defaults micro batch 1, sequence 512,
    no checkpointing; bf16: true loads and trains bf16 weights."""
    setup = _one(tmp_path, {"train.sh": "accelerate launch -m axolotl.cli.train cfg.yml\n",
                            "cfg.yml": "base_model: meta-llama/Llama-3.2-1B\nlora_r: 8\nbf16: true\nnum_epochs: 1\n"})
    assert _value(setup, "lora_rank") is None
    assert (_value(setup, "micro_batch"), _value(setup, "grad_accum"), _value(setup, "seq_len")) == (1, 1, 512)
    assert _value(setup, "gradient_checkpointing") is False
    assert (_value(setup, "weights"), _value(setup, "precision")) == ("bf16", "bf16")


def test_axolotl_fp16_and_fp32(tmp_path):
    fp16 = _one(tmp_path / "a", {"t.sh": "python -m axolotl.cli.train c.yml\n",
                                 "c.yml": AX_QLORA.replace("bf16: auto", "bf16: false\nfp16: true")})
    assert (_value(fp16, "weights"), _value(fp16, "precision"), _value(fp16, "world_size")) == ("fp16", "amp-fp16", 1)
    fp32 = _one(tmp_path / "b", {"t.sh": "python -m axolotl.cli.train c.yml\n",
                                 "c.yml": "base_model: meta-llama/Llama-3.2-1B\nbf16: false\nmicro_batch_size: 2\n"})
    assert (_value(fp32, "weights"), _value(fp32, "precision")) == ("fp32", "fp32")


def test_axolotl_fsdp_and_bundled_deepspeed_configs(tmp_path):
    fsdp = _one(tmp_path / "a", {"t.sh": "axolotl train c.yml\n",
                                 "c.yml": AX_QLORA + "fsdp:\n  - full_shard\n  - auto_wrap\nfsdp_config:\n  fsdp_offload_params: true\n"})
    assert _value(fsdp, "fsdp") == "full"
    v2 = _one(tmp_path / "b", {"t.sh": "axolotl train c.yml\n",
                               "c.yml": AX_QLORA + "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: false\n"})
    assert _value(v2, "fsdp") == "grad-op"
    ds = _one(tmp_path / "c", {"t.sh": "axolotl train c.yml\n",
                               "c.yml": AX_QLORA + "deepspeed: deepspeed_configs/zero3_bf16_cpuoffload_params.json\n"})
    assert (_value(ds, "zero_stage"), _value(ds, "offload_param")) == (3, True)


def test_axolotl_command_line_overrides_and_processes(tmp_path):
    setup = _one(tmp_path, {"t.sh": "CUDA_VISIBLE_DEVICES=0,1 axolotl train c.yml --micro_batch_size 1\n", "c.yml": AX_QLORA})
    assert (_value(setup, "micro_batch"), _value(setup, "world_size"), _value(setup, "effective_batch")) == (1, 2, 8)
    setup = _one(tmp_path / "p", {"t.sh": "axolotl train c.yml --launcher python\n", "c.yml": AX_QLORA})
    assert _value(setup, "world_size") == 1


def test_axolotl_preprocess_trains_nothing(tmp_path):
    setup = _one(tmp_path, {"t.sh": "python -m axolotl.cli.preprocess c.yml\n", "c.yml": AX_QLORA})
    assert setup.trains is False and setup.framework is None


# -- fp32 findings ------------------------------------------------------------------------------

def test_no_fp32_training_finding_where_llamafactory_trains_a_16_bit_base(tmp_path):
    """LoRA with bf16 and fp16 off: the base loads in the compute dtype (16-bit), not fp32."""
    write_project(tmp_path / "lora", {"run.sh": "CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train a.yaml\n",
                                      "a.yaml": LF_LORA.replace("bf16: true", "bf16: false\nfp16: false")})
    assert "CFX601" not in _codes(tmp_path / "lora")
    write_project(tmp_path / "full", {"run.sh": "CUDA_VISIBLE_DEVICES=0,1 llamafactory-cli train a.yaml\n",
                                      "a.yaml": LF_LORA.replace("lora", "full").replace("bf16: true", "bf16: false\nfp16: false")})
    assert "CFX601" in _codes(tmp_path / "full")  # a full fine-tune is cast to fp32: really fp32


def test_no_cfx401_where_axolotl_decides_the_precision(tmp_path):
    accelerate = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'no'\n"
                  "num_processes: 2\n")
    write_project(tmp_path, {"t.sh": "accelerate launch --config_file acc.yaml -m axolotl.cli.train c.yml\n",
                             "acc.yaml": accelerate, "c.yml": AX_QLORA})
    assert "CFX401" not in _codes(tmp_path)


# -- fix --fit ---------------------------------------------------------------------------------

def _run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_fit_writes_llamafactory_keys_and_keeps_the_rest_of_the_yaml(tmp_path, monkeypatch):
    yaml = ("### model\nmodel_name_or_path: meta-llama/Llama-3.1-8B   # base\n\n### method\nstage: sft\n"
            "finetuning_type: full\ndisable_gradient_checkpointing: true\n\n### train\nper_device_train_batch_size: 8\n"
            "gradient_accumulation_steps: 2\ncutoff_len: 4096\nbf16: true\n")
    write_project(tmp_path, {"run.sh": "CUDA_VISIBLE_DEVICES=0,1,2,3 llamafactory-cli train examples/full.yaml\n",
                             "examples/full.yaml": yaml, "cfgfix.toml": 'gpu = "A100 80GB"\n'})
    monkeypatch.chdir(tmp_path)
    code, out = _run("fix", "--fit")
    assert code == 0, out
    text = (tmp_path / "examples/full.yaml").read_text()
    assert "disable_gradient_checkpointing: false\n" in text and "deepspeed: examples/ds_zero2.json" in text
    assert text.startswith("### model\nmodel_name_or_path: meta-llama/Llama-3.1-8B   # base\n\n### method\n")
    assert json.loads((tmp_path / "examples/ds_zero2.json").read_text())["zero_optimization"]["stage"] == 2
    assert "FORCE_TORCHRUN=1" in out
    code, out = _run("explain", "--output-format", "json")
    settings = json.loads(out)[0]["settings"]
    assert settings["zero_stage"]["value"] == 2 and settings["gradient_checkpointing"]["value"] is True
    code, out = _run("fix", "--fit")
    assert code == 0 and "nothing to change" in out


def test_fit_writes_axolotl_keys_and_one_deepspeed_config(tmp_path, monkeypatch):
    yaml = ("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 16\nsequence_len: 8192\nmicro_batch_size: 8\n"
            "gradient_accumulation_steps: 1\nbf16: auto\n")
    write_project(tmp_path, {"train.sh": "axolotl train lora.yml\n", "lora.yml": yaml, "cfgfix.toml": 'gpu = "RTX 4090"\n'})
    monkeypatch.chdir(tmp_path)
    code, out = _run("fix", "--fit")
    assert code == 0, out
    text = (tmp_path / "lora.yml").read_text()
    assert "gradient_checkpointing: true\n" in text and "micro_batch_size: 1\n" in text
    assert "per_device_train_batch_size" not in text and text.count("deepspeed:") <= 1
    assert len(list(tmp_path.glob("ds_zero*.json"))) <= 1


def test_the_tools_yaml_deepspeed_key_is_the_launchs_deepspeed_config_for_the_rules(tmp_path):
    """CFX502 checks the batch arithmetic of the JSON the axolotl YAML names against the
    launch's 4 processes; the same JSON that no launch names is not checked against any."""
    ds = '{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}\n'
    launch = "accelerate launch --num_processes 4 -m axolotl.cli.train c.yml\n"
    write_project(tmp_path / "named", {"t.sh": launch, "zero2.json": ds,
                                       "c.yml": "base_model: meta-llama/Llama-3.2-1B\ndeepspeed: zero2.json\n"})
    assert "CFX502" in _codes(tmp_path / "named")
    write_project(tmp_path / "unnamed", {"t.sh": launch, "zero2.json": ds, "c.yml": "base_model: meta-llama/Llama-3.2-1B\n"})
    assert "CFX502" not in _codes(tmp_path / "unnamed")


def test_writer_quantizes_in_each_tools_own_keys(tmp_path, monkeypatch):
    """A 4-bit base is LLaMA-Factory's quantization_bit (LoRA runs only) and axolotl's
    load_in_4bit with adapter qlora: the edits add exactly those keys."""
    from cfgfix.training.write_setup import SetupWriter

    lf = tmp_path / "lf"
    write_project(lf, {"run.sh": "llamafactory-cli train a.yaml\n", "a.yaml": LF_LORA})
    engine, _, _ = lint_project(lf)
    setup = training_setups(engine.project)[0]
    change = SetupWriter(engine.project, setup).set("quantization", "4bit")
    assert [e.content for e in change.edits] == ["\nquantization_bit: 4"]
    full = tmp_path / "full"
    write_project(full, {"run.sh": "llamafactory-cli train a.yaml\n", "a.yaml": LF_LORA.replace("lora", "full")})
    engine, _, _ = lint_project(full)
    writer = SetupWriter(engine.project, training_setups(engine.project)[0])
    assert writer.set("quantization", "4bit") is None and "LoRA" in writer.reason
    ax = tmp_path / "ax"
    write_project(ax, {"t.sh": "axolotl train c.yml\n", "c.yml": "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 8\n"})
    monkeypatch.chdir(ax)  # the replaced value's span names the file as shown from here
    engine, _, _ = lint_project(ax)
    change = SetupWriter(engine.project, training_setups(engine.project)[0]).set("quantization", "4bit")
    edits = {(e.start, e.end): e.content for e in change.edits}
    assert sorted(edits.values()) == ["\nload_in_4bit: true", "qlora"]
