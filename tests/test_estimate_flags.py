"""Issue 21, items 1 and 7: `cfgfix estimate --model/--params` is the same answer as a launch
of a project (training/memory_answer.py through training/estimate_flags.py): the same peak,
range, open inputs and verdict for the same setup; the flags that state a run (LoRA targets,
DPO, a DeepSpeed JSON, the torch release); exit codes 0 fits / 1 not surely / 2 bad input."""

import itertools
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import lint_project, write_project

from cfgfix.commands import cli
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.records import replace
from cfgfix.training.estimate_flags import FlagError, RunFlags, flags_answer, flags_input

MODELS = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-2-7b-hf", "openai-community/gpt2", "mistralai/Mistral-7B-v0.1")
# (how the script loads, the Trainer's flag, the pin): fp32 weights + autocast, pure bf16, fp32
DTYPES = (("", " --bf16 True", "transformers==4.46.3\n"), (", torch_dtype=torch.bfloat16", "", ""),
          ("", "", "transformers==4.46.3\n"))
SEQS = (None, 512)
GPUS = ("RTX 4090", "A100 80GB")


def _project(root: Path, model: str, dtype, batch: int, checkpointing: bool, lora: bool, seq, gpu: str) -> None:
    load, flag, pin = dtype
    peft = "model = get_peft_model(model, LoraConfig(r=16))\n" if lora else ""
    write_project(root, {
        "train.py": (
            "from dataclasses import dataclass\n\nimport torch\nfrom peft import LoraConfig, get_peft_model\n"
            "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n\n"
            "@dataclass\nclass DataArguments:\n    max_seq_length: int = 0\n\n\n"
            "args, data_args = HfArgumentParser((TrainingArguments, DataArguments)).parse_args_into_dataclasses()\n"
            f"model = AutoModelForCausalLM.from_pretrained('{model}'{load})\n{peft}"
            "Trainer(model=model, args=args).train()\n"),
        "run.sh": (f"python train.py --output_dir out --per_device_train_batch_size {batch}{flag}"
                   + (" --gradient_checkpointing True" if checkpointing else "")
                   + (f" --max_seq_length {seq}" if seq else "") + "\n"),
        "cfgfix.toml": f'gpu = "{gpu}"\n',
        "requirements.txt": pin,
    })


def _project_answer(root: Path):
    from cfgfix.training.memory_answer import answers

    engine, _, _ = lint_project(root)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        found = answers(engine.project)
    finally:
        os.chdir(cwd)
    assert len(found) == 1
    return found[0]


def _flags_of(setup) -> RunFlags:
    """The flags that state a project's resolved `MemorySetup`; every field the flags cannot
    state must be at its flag's default (asserted), so equal answers mean one computation."""
    if setup.deepspeed_half:
        precision = f"ds-{setup.deepspeed_half}"
    elif setup.autocast:
        assert setup.weights == "fp32", setup
        precision = f"amp-{setup.autocast}"
    else:
        precision = setup.weights
    assert not setup.frozen and not setup.frozen_params and not setup.extras, setup
    offload = "optimizer+params" if setup.offload_params else "optimizer" if setup.offload_optimizer else "none"
    return RunFlags(
        model=setup.model, gpu=setup.gpu, num_gpus=setup.num_gpus, precision=precision, optimizer=setup.optimizer,
        zero=setup.zero_stage, fsdp=setup.fsdp, offload=offload, batch=setup.micro_batch, seq=setup.seq_len,
        target_seq=setup.target_len, resolution=setup.resolution, lora_rank=setup.lora_rank,
        lora_targets=",".join(setup.lora_targets) if setup.lora_targets else None, quantize=setup.quantization,
        checkpointing=setup.checkpointing, device=setup.device, attention=setup.attention,
        optimizer_impl=setup.optimizer_impl, head=setup.head, grad_accum=setup.gradient_accumulation,
        torch_version=setup.torch_version, transformers_version=setup.transformers_version,
        variable_length=setup.variable_length)


CASES = [c for i, c in enumerate(itertools.product(MODELS, DTYPES, (1, 8), (True, False), (False, True), SEQS, GPUS))
         if i % 7 == 0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].split('/')[-1]}-b{c[2]}-gc{int(c[3])}-lora{int(c[4])}-"
                                                      f"seq{c[5]}-{c[6].replace(' ', '')}-{c[1][1].strip()[2:6] or c[1][0][-8:]}")
def test_flags_give_the_project_s_answer_for_the_same_setup(case, tmp_path):
    model, dtype, batch, checkpointing, lora, seq, gpu = case
    _project(tmp_path, model, dtype, batch, checkpointing, lora, seq, gpu)
    project = _project_answer(tmp_path)
    assert project.estimated and project.verdict is not None, project.problem
    assert project.inputs.setup.micro_batch == batch and project.inputs.setup.checkpointing is checkpointing
    assert project.inputs.setup.seq_len == seq and (project.inputs.setup.lora_rank is not None) is lora
    flags, _ = flags_answer(_flags_of(project.inputs.setup))
    assert flags.inputs.setup == project.inputs.setup
    assert (flags.high.peak, flags.range, flags.verdict, flags.condition, flags.text) == (
        project.high.peak, project.range, project.verdict, project.condition, project.text)
    assert [(o.setting, o.low, o.high, o.bounded) for o in flags.open] == [
        (o.setting, o.low, o.high, o.bounded) for o in project.open]


def test_the_grid_covers_open_and_stated_lengths_lora_and_every_verdict(tmp_path):
    """The cases above are not all alike: open and stated sequence lengths, LoRA runs, and
    more than one verdict among them (checked on the flags side, which is cheap)."""
    verdicts, opened, lora = set(), set(), set()
    for model, dtype, batch, checkpointing, with_lora, seq, gpu in CASES:
        precision = "amp-bf16" if "--bf16" in dtype[1] else "bf16" if "bfloat16" in dtype[0] else "fp32"
        found, _ = flags_answer(RunFlags(model=model, gpu=gpu, precision=precision, batch=batch, seq=seq,
                                         checkpointing=checkpointing, lora_rank=16 if with_lora else None))
        verdicts.add(found.verdict)
        opened.add(bool(found.open))
        lora.add(with_lora)
    assert verdicts >= {"fits", "conditional"} and opened == {True, False} and lora == {True, False}, verdicts


def test_estimate_prints_the_project_s_entry_for_the_flags():
    """JSON: the project mode's entry for one launch ("assumed", "estimate", "answer");
    text: the same lines (open inputs, the least-memory end), then the breakdown."""
    runner = CliRunner()
    out = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--precision", "bf16", "--batch", "4",
                              "--gpu", "RTX 4090", "--output-format", "json"])
    data = json.loads(out.output)
    assert set(data) == {"assumed", "estimate", "answer"}
    assert data["answer"]["verdict"] == "conditional" and data["answer"]["condition"].startswith("the sequence length is ≤")
    assert data["answer"]["open"][0]["assumption"].startswith("sequence length not given (--seq)")
    assert data["estimate"]["peak_bytes"] == data["answer"]["peak_bytes"]
    assert out.exit_code == 1  # conditional: not surely fits
    text = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--precision", "bf16", "--batch", "4",
                               "--gpu", "RTX 4090"])
    assert text.exit_code == 1
    assert "   open: sequence length not given (--seq)" in text.output
    assert "Verdict: fits RTX 4090 only if the sequence length is ≤ " in text.output


@pytest.mark.parametrize("flags, code, said", [
    (["--model", "Qwen/Qwen2.5-0.5B", "--precision", "bf16", "--seq", "512", "--gpu", "H100 80GB"], 0, "Verdict: fits"),
    (["--model", "Qwen/Qwen2.5-0.5B", "--seq", "512"], 0, "Model:"),  # no GPU: nothing to judge
    (["--model", "meta-llama/Llama-2-7b-hf", "--seq", "4096", "--batch", "16", "--gpu", "RTX 4090"], 1, "does not fit"),
    (["--model", "meta-llama/Llama-2-7b-hf", "--gpu", "RTX 4090", "--precision", "bf16", "--lora-rank", "8"], 1,
     "only if the sequence length is ≤"),
    (["--model", "no/such-model", "--seq", "512"], 2, "no/such-model"),
    (["--model", "Qwen/Qwen2.5-0.5B", "--lora-rank", "8", "--lora-targets", "q,nope"], 2, "'nope' names no Linear"),
    (["--model", "Qwen/Qwen2.5-0.5B", "--lora-targets", "q,v"], 2, "give --lora-rank too"),
    (["--params", "7e9", "--lora-rank", "8", "--lora-targets", "q_proj"], 2, "--params gives no layers"),
    (["--model", "Qwen/Qwen2.5-0.5B", "--no-reference"], 2, "give --task dpo"),
    (["--model", "Qwen/Qwen2.5-0.5B", "--torch-version", "two"], 2, "is not a release number"),
])
def test_estimate_exit_codes(flags, code, said):
    result = CliRunner().invoke(cli, ["estimate", *flags])
    assert result.exit_code == code, result.output
    assert said in result.output and "Traceback" not in result.output


# -- --lora-targets -----------------------------------------------------------------------------

def test_lora_targets_change_trainable_parameters_states_and_activations():
    shape = shape_from_catalog("meta-llama/Llama-2-7b-hf")
    base = {"model": "meta-llama/Llama-2-7b-hf", "precision": "bf16", "lora_rank": 16, "seq": 2048, "batch": 4, "gpu": "A100 80GB"}
    every, _ = flags_answer(RunFlags(**base))
    qv, _ = flags_answer(RunFlags(**base, lora_targets="q,v"))
    spelled, _ = flags_answer(RunFlags(**base, lora_targets="q_proj, v_proj"))
    assert qv.inputs.setup.lora_targets == ("q_proj", "v_proj") == spelled.inputs.setup.lora_targets
    assert qv.high.trainable_params == shape.lora_params(16, ("q_proj", "v_proj")) == 32 * 16 * 2 * (4096 + 4096)
    assert qv.high.trainable_params < every.high.trainable_params
    assert qv.high.component("optimizer_states").size < every.high.component("optimizer_states").size
    # peft's fp32 input copies follow the adapted Linears: fewer targets, fewer activations
    assert qv.high.component("activations").size < every.high.component("activations").size
    everything, _ = flags_answer(RunFlags(**base, lora_targets="all-linear"))
    named, _ = flags_answer(RunFlags(**base, lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"))
    assert everything.high.peak == every.high.peak == named.high.peak


def test_lora_targets_match_module_names_as_peft_does():
    from cfgfix.memory.lora_targets import resolve_targets

    gpt2 = shape_from_catalog("openai-community/gpt2")
    assert resolve_targets("c_proj", gpt2)[0] == ("attn.c_proj", "mlp.c_proj")  # PEFT: a suffix of the module path
    assert resolve_targets("attn.c_proj", gpt2)[0] == ("attn.c_proj",)
    bert = shape_from_catalog("google-bert/bert-base-uncased")
    assert resolve_targets("query,value", bert)[0] == ("query", "value")
    assert resolve_targets("q,v", bert)[0] == ("query", "value")
    llama = shape_from_catalog("meta-llama/Llama-2-7b-hf")
    assert resolve_targets("self_attn.q_proj,v_proj", llama)[0] == ("q_proj", "v_proj")
    assert resolve_targets("all", llama)[0] is None


# -- --task dpo ---------------------------------------------------------------------------------

def test_dpo_doubles_the_batch_and_holds_a_reference_model_as_trl_prepares_it():
    base = {"model": "mistralai/Mistral-7B-v0.1", "precision": "ds-bf16", "seq": 1024, "checkpointing": True,
                "gpu": "A100 80GB", "num_gpus": 8}
    sft, _, _ = flags_input(RunFlags(**base, zero=2))
    dpo, _, _ = flags_input(RunFlags(**base, zero=2, task="dpo"))
    params = shape_from_catalog("mistralai/Mistral-7B-v0.1").params
    assert (dpo.setup.micro_batch, dpo.setup.sequences_per_sample) == (sft.setup.micro_batch, 2) == (1, 2)
    assert dpo.setup.frozen == (("DPO reference model", params, 2),)  # ZeRO-2: a whole bf16 copy per GPU
    zero3, _, _ = flags_input(RunFlags(**base, zero=3, task="dpo"))
    assert zero3.setup.frozen == (("DPO reference model", -(-params // 8), 2),)  # ZeRO-3 shards it
    lora, _, _ = flags_input(RunFlags(**{**base, "precision": "bf16"}, lora_rank=16, task="dpo"))
    assert lora.setup.frozen == () and any("adapters disabled" in a for a in lora.assumptions)
    none, _, _ = flags_input(RunFlags(**base, zero=2, task="dpo", no_reference=True))
    assert none.setup.frozen == ()
    with_ref, _ = flags_answer(RunFlags(**base, zero=2, task="dpo"))
    without, _ = flags_answer(RunFlags(**base, zero=2, task="dpo", no_reference=True))
    assert with_ref.high.peak - without.high.peak >= params * 2 * 0.99


# -- --deepspeed-config and --torch-version -----------------------------------------------------

def test_deepspeed_config_is_read_by_the_project_mode_s_readers(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True,
                              "reduce_bucket_size": 5e8, "stage3_max_live_parameters": 1e9,
                              "stage3_prefetch_bucket_size": "auto"}}))
    inputs, _, _ = flags_input(RunFlags(model="meta-llama/Llama-2-7b-hf", precision="amp-bf16", num_gpus=4,
                                        deepspeed_config=config, given=frozenset({"precision"})))
    setup = inputs.setup
    assert (setup.zero_stage, setup.offload_optimizer, setup.offload_params, setup.deepspeed_half, setup.micro_batch) == (
        3, True, False, "bf16", 2)
    assert setup.extras == {"reduce_bucket_size": 5e8, "overlap_comm": True, "prefetch_bucket_size": "auto",
                            "max_live_parameters": 1e9}
    assert any(a.startswith(f"from {config}: zero 3") for a in inputs.assumptions)
    with pytest.raises(FlagError, match="--zero 2 but .* states 3"):
        flags_input(RunFlags(model="meta-llama/Llama-2-7b-hf", zero=2, num_gpus=4, deepspeed_config=config,
                             given=frozenset({"zero"})))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(cli, ["estimate", "--model", "gpt2", "--deepspeed-config", str(bad)])
    assert result.exit_code == 2 and "is not a JSON object" in result.output


def test_torch_version_sets_the_optimizer_defaults_of_that_release():
    base = {"model": "openai-community/gpt2", "seq": 512, "batch": 4, "gpu": "T4"}
    old, _ = flags_answer(RunFlags(**base, torch_version="1.13.1+cu117"))
    new, _ = flags_answer(RunFlags(**base, torch_version="2.4.1"))
    assert old.inputs.setup.cuda_version == "11.7"
    assert any("before 2.0" in a for a in old.high.assumptions)
    assert not any("before 2.0" in a for a in new.high.assumptions)


def test_a_diffusion_transformer_s_open_input_is_its_resolution_not_a_length():
    """FLUX's tokens come from the image (latent patches + 512 text tokens): with --resolution
    nothing is open; without it the resolution is, never a sequence length."""
    stated, _ = flags_answer(RunFlags(model="black-forest-labs/FLUX.1-dev", precision="bf16", lora_rank=16,
                                      resolution=512, gpu="A100 80GB"))
    assert stated.open == () and stated.verdict == "fits", stated.text
    unstated, _ = flags_answer(RunFlags(model="black-forest-labs/FLUX.1-dev", precision="bf16", lora_rank=16,
                                        gpu="A100 80GB"))
    assert [o.setting for o in unstated.open] == ["resolution"]
    assert unstated.open[0].words.startswith("image resolution not given (--resolution)")


# -- a project's LoRA targets: the same answer as --lora-targets ----------------------------------

LORA_TRAIN = (
    "import torch\nfrom peft import LoraConfig, get_peft_model\n"
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-2-7b-hf', torch_dtype=torch.bfloat16)\n"
    "model = get_peft_model(model, LoraConfig({config}))\n"
    "Trainer(model=model, args=args).train()\n"
)


@pytest.mark.parametrize("config, targets", [
    ("r=16, target_modules=['q_proj', 'v_proj']", "q_proj,v_proj"),
    ("r=16, target_modules=['self_attn.q_proj', 'k_proj', 'v_proj', 'o_proj']", "q,k,v,o"),
    ("r=16, target_modules='all-linear'", "all-linear"),
    # peft 0.13.2: no target_modules on a llama model type -> its default q_proj, v_proj
    ("r=16", "q_proj,v_proj"),
])
def test_a_project_s_lora_targets_give_the_flags_answer(tmp_path, config, targets):
    write_project(tmp_path, {
        "train.py": LORA_TRAIN.format(config=config),
        "run.sh": "python train.py --output_dir out --per_device_train_batch_size 2 --max_seq_length 2048\n",
        "cfgfix.toml": 'gpu = "A100 40GB"\n'})
    project = _project_answer(tmp_path)
    flags, _ = flags_answer(_flags_of(project.inputs.setup))
    stated, _ = flags_answer(RunFlags(model="meta-llama/Llama-2-7b-hf", precision="bf16", lora_rank=16, batch=2, seq=2048,
                                      gpu="A100 40GB", lora_targets=targets,
                                      optimizer_impl=project.inputs.setup.optimizer_impl,
                                      transformers_version=project.inputs.setup.transformers_version))
    assert project.inputs.setup.lora_targets == stated.inputs.setup.lora_targets
    assert project.high.peak == flags.high.peak == stated.high.peak
    assert project.text == stated.text
    if config == "r=16":
        assert any("q_proj, v_proj" in a for a in project.inputs.assumptions)


def test_llamafactory_and_axolotl_targets_are_read_from_their_yaml(tmp_path):
    write_project(tmp_path, {
        "README.md": "```bash\nllamafactory-cli train lf/sft.yaml\n```\n",
        "lf/sft.yaml": ("model_name_or_path: meta-llama/Llama-2-7b-hf\nfinetuning_type: lora\nlora_rank: 8\n"
                        "lora_target: q_proj,v_proj\ncutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\n"),
        "train.sh": "axolotl train ax/lora.yml\n",
        "ax/lora.yml": ("base_model: meta-llama/Llama-2-7b-hf\nadapter: lora\nlora_r: 32\nsequence_len: 1024\n"
                        "micro_batch_size: 1\nlora_target_modules:\n  - q_proj\n  - k_proj\n"),
    })
    from cfgfix.training.memory_answer import answers

    engine, _, _ = lint_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        found = {a.training.launch.launcher: a.inputs.setup.lora_targets for a in answers(engine.project)}
    finally:
        os.chdir(cwd)
    assert found["llamafactory-cli"] == ("q_proj", "v_proj")
    assert ("q_proj", "k_proj") in found.values()


# -- a project's DPO run: the same answer as --task dpo -------------------------------------------

DPO_TRAIN = (
    "import torch\nfrom transformers import AutoModelForCausalLM\nfrom trl import DPOConfig, DPOTrainer\n\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-1.5B', torch_dtype=torch.bfloat16)\n"
    "args = DPOConfig(output_dir='out', per_device_train_batch_size=4, max_length=1024, bf16=False,"
    " gradient_checkpointing=True{extra})\n"
    "DPOTrainer(model=model, args=args, train_dataset=None).train()\n"
)


@pytest.mark.parametrize("extra, no_reference", [("", False), (", precompute_ref_log_probs=True", True)])
def test_a_project_s_dpo_trainer_gives_the_task_dpo_answer(tmp_path, extra, no_reference):
    write_project(tmp_path, {"train.py": DPO_TRAIN.format(extra=extra), "run.sh": "python train.py\n",
                             "cfgfix.toml": 'gpu = "RTX 4090"\n', "requirements.txt": "trl==0.12.0\n"})
    project = _project_answer(tmp_path)
    setup = project.inputs.setup
    assert project.training.task == "dpo" and setup.sequences_per_sample == 2 and setup.micro_batch == 4
    assert bool(setup.frozen) is not no_reference
    stated = replace(_flags_of(setup.with_(frozen=(), sequences_per_sample=1)), task="dpo", no_reference=no_reference)
    flags, _ = flags_answer(stated)
    assert flags.inputs.setup == setup
    assert (flags.high.peak, flags.range, flags.verdict, flags.text) == (
        project.high.peak, project.range, project.verdict, project.text)


@pytest.mark.parametrize("extra, reference", [("finetuning_type: full\n", True), ("finetuning_type: lora\nlora_rank: 8\n", False),
                                              ("finetuning_type: full\npref_loss: simpo\n", False)])
def test_a_llamafactory_dpo_stage_holds_the_reference_llamafactory_builds(tmp_path, extra, reference):
    write_project(tmp_path, {
        "README.md": "```bash\nllamafactory-cli train dpo.yaml\n```\n",
        "dpo.yaml": ("model_name_or_path: Qwen/Qwen2.5-1.5B\nstage: dpo\n" + extra
                     + "cutoff_len: 1024\nper_device_train_batch_size: 2\nbf16: true\n"),
        "cfgfix.toml": 'gpu = "A100 80GB"\n'})
    setup = _project_answer(tmp_path).inputs.setup
    assert (setup.sequences_per_sample, setup.micro_batch) == (2, 2)
    assert bool(setup.frozen) is reference


@pytest.mark.parametrize("keyword", ["group_by_length=True", "group_by_length=False", ""])
def test_group_by_length_makes_the_batches_variable_length_in_project_and_flags(tmp_path, keyword):
    """HF TrainingArguments(group_by_length=True) pads each batch to its own longest sample, so
    the shapes change from step to step: the band's top carries the caching allocator's reported
    margin (memory/estimator.py VARIABLE_LENGTH_RESERVED); `--variable-length` states the same."""
    extra = f", {keyword}" if keyword else ""
    write_project(tmp_path, {
        "train.py": ("import torch\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-2-7b-hf', torch_dtype=torch.bfloat16)\n"
                     f"args = TrainingArguments(output_dir='o', per_device_train_batch_size=2, max_seq_length=1024{extra})\n"
                     "Trainer(model=model, args=args).train()\n"),
        "run.sh": "python train.py\n",
        "cfgfix.toml": 'gpu = "H100 80GB"\n'})
    project = _project_answer(tmp_path)
    varying = keyword == "group_by_length=True"
    assert project.inputs.setup.variable_length is (True if varying else None)
    flags, _ = flags_answer(_flags_of(project.inputs.setup))
    assert (flags.high.peak, flags.range, flags.verdict) == (project.high.peak, project.range, project.verdict)
    fixed, _ = flags_answer(replace(_flags_of(project.inputs.setup), variable_length=None))
    assert flags.high.peak == fixed.high.peak
    if varying:
        assert flags.range[1] > fixed.range[1] * 1.3
        assert any("batches vary in shape" in a for a in flags.high.assumptions)
    else:
        assert flags.range == fixed.range


def test_variable_length_flag_on_the_command_line():
    base = ["estimate", "--model", "meta-llama/Llama-2-7b-hf", "--precision", "bf16", "--seq", "1024", "--batch", "2",
            "--gpu", "H100 80GB", "--output-format", "json"]
    plain = CliRunner().invoke(cli, base)
    varying = CliRunner().invoke(cli, [*base, "--variable-length"])
    top = [json.loads(r.output)["answer"]["range_bytes"][1] for r in (plain, varying)]
    assert plain.exit_code == 0 and varying.exit_code == 1  # fits at the top / only at the estimate
    assert top[1] > 1.3 * top[0]
