"""`cfgfix fix --fit`, `cfgfix estimate PATH` and the ladder behind CFX701/CFX702: the
cheapest changes first, the effective batch kept, minimal edits written only when the
launch's setup, resolved again from the edited files, holds the planned values."""

import json
import shutil

from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.memory.gpus import find_gpu
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import resolve_shape
from cfgfix.training.fit import plan
from conftest import REPO, write_project

HF_TRAIN = (
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
    "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B')\n"
    "Trainer(model=model, args=args).train()\n"
)
HF_LAUNCH = (
    "#!/bin/bash\ntorchrun --nproc_per_node 4 train.py \\\n    --output_dir out \\\n"
    "    --per_device_train_batch_size 4 \\\n    --gradient_accumulation_steps 2 \\\n    --bf16 True \\\n"
    "    --max_seq_length 2048 \\\n    --gradient_checkpointing True\n"
)


def _run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _story(tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(REPO / "fixtures" / name / "project", dest)
    return dest


# -- the ladder ------------------------------------------------------------------------------
def test_plan_stops_at_the_first_rung_that_fits_and_keeps_the_effective_batch():
    shape = resolve_shape("Qwen/Qwen2.5-7B")
    setup = MemorySetup(params=shape.params, weights="fp32", autocast="bf16", num_gpus=4, micro_batch=8,
                        gradient_accumulation=2, seq_len=2048, checkpointing=False)
    result = plan(setup, shape, find_gpu("A100 80GB"))
    assert result.fits
    assert result.rungs[0].name == "gradient checkpointing"  # mixed precision is already on
    final = result.rungs[-1].setup
    assert final.micro_batch * final.gradient_accumulation == 16
    assert result.after.high <= find_gpu("A100 80GB").usable_bytes
    # a prefix: one rung less does not fit
    if len(result.rungs) > 1:
        assert result.rungs[-2].estimate.high > find_gpu("A100 80GB").usable_bytes


def test_rungs_that_do_not_lower_the_peak_are_left_out():
    shape = resolve_shape("google/flan-t5-xl")
    # bf16 weights + AdamW at micro batch 1: the optimizer step is the peak, not activations
    setup = MemorySetup(params=shape.params, weights="bf16", micro_batch=4, gradient_accumulation=8,
                        seq_len=64, checkpointing=True)
    result = plan(setup, shape, find_gpu("RTX 4090"))
    assert not any(r.name.startswith("micro batch") for r in result.rungs)


def test_with_several_gpus_zero2_comes_before_the_8bit_optimizer():
    shape = resolve_shape("Qwen/Qwen2.5-7B")
    setup = MemorySetup(params=shape.params, weights="bf16", num_gpus=8, micro_batch=1, seq_len=1024,
                        checkpointing=True)
    names = [r.name for r in plan(setup, shape, find_gpu("RTX A6000")).rungs]
    assert "DeepSpeed ZeRO-2" in names and "8-bit AdamW" not in names


# -- fix --fit on the stories -----------------------------------------------------------------
def test_fit_writes_one_line_into_the_flan_t5_training_config(tmp_path, monkeypatch):
    folder = _story(tmp_path, "flan-t5-xl-trainer")
    monkeypatch.chdir(folder)
    config = (folder / "configs/flan_t5_xl.yaml").read_text()
    code, out = _run("fix", "--fit", "--diff")
    assert code == 1 and "+gradient_checkpointing: true" in out
    assert (folder / "configs/flan_t5_xl.yaml").read_text() == config  # --diff writes nothing
    code, out = _run("fix", "--fit")
    assert code == 0, out
    assert "gradient checkpointing" in out and "written: configs/flan_t5_xl.yaml" in out
    assert (folder / "configs/flan_t5_xl.yaml").read_text() == config.replace(
        "gradient_checkpointing: false", "gradient_checkpointing: true")
    code, out = _run("check", "--no-cache", "--select", "CFX7", ".")
    assert code == 0, out


def test_fit_on_the_mm_story_waits_for_the_ordinary_fixes_then_matches_the_authors_fix(tmp_path, monkeypatch):
    folder = _story(tmp_path, "mm-8b-47gb")
    monkeypatch.chdir(folder)
    launch = (folder / "scripts/finetune.sh").read_text()
    code, out = _run("fix", "--fit")
    assert code == 1 and "misspells zero_optimization (CFX507)" in out
    assert (folder / "scripts/finetune.sh").read_text() == launch  # half a plan is never written
    _run("fix", "--no-cache")  # CFX507 renames the block: ZeRO-3 is on
    code, out = _run("fix", "--fit")
    assert code == 0, out
    fixed = (REPO / "fixtures/mm-8b-47gb/fixed/scripts/finetune.sh").read_text()
    for flag in ("--per_device_train_batch_size 2", "--gradient_accumulation_steps 8", "--gradient_checkpointing True"):
        assert flag in fixed and flag in (folder / "scripts/finetune.sh").read_text()


def test_fit_creates_a_deepspeed_config_for_an_hf_trainer_launch(tmp_path, monkeypatch):
    write_project(tmp_path, {"train.py": HF_TRAIN, "run.sh": HF_LAUNCH, "cfgfix.toml": 'gpu = "A100 80GB"\n'})
    monkeypatch.chdir(tmp_path)
    code, out = _run("fix", "--fit")
    assert code == 0, out
    created = json.loads((tmp_path / "ds_zero2.json").read_text())
    assert created["zero_optimization"]["stage"] == 2
    assert created["train_micro_batch_size_per_gpu"] == "auto" and created["bf16"]["enabled"] == "auto"
    launch = (tmp_path / "run.sh").read_text()
    assert launch.endswith("--gradient_checkpointing True --deepspeed ds_zero2.json\n")
    code, out = _run("explain", "--output-format", "json")
    settings = json.loads(out)[0]["settings"]
    assert settings["zero_stage"]["value"] == 2
    assert settings["effective_batch"]["value"] == 32  # 4 x 2 x 4 before, kept
    assert _run("check", "--no-cache", "--select", "CFX7,CFX5", ".")[0] == 0
    code, out = _run("fix", "--fit")  # again: nothing to do, nothing overwritten
    assert code == 0 and "nothing to change" in out


def test_fit_on_a_plain_script_is_advice_only(tmp_path, monkeypatch):
    write_project(tmp_path, {
        "train.py": ("import torch\nfrom transformers import AutoModelForCausalLM\n\n"
                     "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', torch_dtype=torch.bfloat16)\n"
                     "optimizer = torch.optim.AdamW(model.parameters())\n"
                     "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n"),
        "run.sh": "torchrun --nproc_per_node 2 train.py --max_seq_length 512 --gradient_checkpointing\n",
        "cfgfix.toml": 'gpu = "RTX 4090"\n',
    })
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()}
    code, out = _run("fix", "--fit")
    assert code == 1 and "advice only" in out
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()} == before


def test_fit_without_a_target_gpu_says_how_to_set_one(tmp_path, monkeypatch):
    write_project(tmp_path, {"train.py": HF_TRAIN, "run.sh": HF_LAUNCH})
    monkeypatch.chdir(tmp_path)
    code, out = _run("fix", "--fit")
    # the user asked for a plan that cannot be made: a CI step must not pass green
    assert code == 2 and "no target GPU" in out and "no launch could be estimated" in out
    code, out = _run("fix", "--fit", "--gpu", "Mystery 9000")
    assert code == 2 and "unknown GPU 'Mystery 9000'" in out and "--list-gpus" in out


# -- estimate, project mode -------------------------------------------------------------------
def test_estimate_reads_each_launch_of_the_project(tmp_path, monkeypatch):
    folder = _story(tmp_path, "mm-8b-47gb")
    monkeypatch.chdir(folder)
    code, out = _run("estimate")
    assert code in (0, 1)  # 1: a launch that does not surely fit its GPU
    assert out.startswith("== scripts/finetune.sh:6: deepspeed train.py")
    assert "Verdict: does not fit RTX A6000" in out
    code, out = _run("estimate", "--output-format", "json", "--gpu", "H200")
    data = json.loads(out)
    assert data[0]["launch"]["path"] == "scripts/finetune.sh"
    assert data[0]["estimate"]["gpu"]["name"] == "H200"


def test_a_fine_tune_is_sized_by_its_base_model_named_in_its_id():
    from cfgfix.memory.shapes import ShapeError

    assert resolve_shape("lmsys/vicuna-13b-v1.5").params == resolve_shape("meta-llama/Llama-2-13b-hf").params
    guessed = resolve_shape("HuggingFaceH4/zephyr-7b-beta")
    assert guessed.params == resolve_shape("mistralai/Mistral-7B-v0.1").params
    assert "guessed from the name" in " ".join(guessed.notes)
    assert resolve_shape("./checkpoints/llama-7b-hf").params == resolve_shape("meta-llama/Llama-2-7b-hf").params
    for unclear in ("x/llama-7b-13b-merge", "org/my-model"):
        try:
            resolve_shape(unclear)
        except ShapeError:
            continue
        raise AssertionError(f"{unclear} should stay unknown")
    # never read as another model's shape: Qwen-1 has its own entry, a size without a family is a bare count
    assert "Qwen-7B config.json" in resolve_shape("Qwen/Qwen-7B").source
    assert resolve_shape("mistral-22b").family == "params"


def test_check_simulate_measures_the_full_size_step(tmp_path, monkeypatch):
    """`cfgfix check --simulate`: CFX701 decides on the FakeTensor simulator's band and says
    what it measured (a 0.5B model at batch 8 x 1024: seconds on the CPU)."""
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    write_project(tmp_path, {
        "train.py": HF_TRAIN.replace("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-0.5B"),
        "run.sh": "python train.py --output_dir o --per_device_train_batch_size 8 --max_seq_length 1024\n",
        "cfgfix.toml": 'gpu = "T4"\n',
    })
    monkeypatch.chdir(tmp_path)
    code, out = _run("check", "--no-cache", "--simulate", "--select", "CFX7", ".")
    assert code == 1 and "CFX701" in out
    assert "a simulated step (FakeTensor, --simulate) peaks at" in out


def test_two_launches_sharing_a_file_are_fixed_one_run_at_a_time(tmp_path, monkeypatch):
    """Both launches' plans edit run.sh: the second one's offsets are stale once the first
    is written, so it waits for the next run instead of corrupting the file."""
    launch = HF_LAUNCH.replace("#!/bin/bash\n", "")
    write_project(tmp_path, {"train.py": HF_TRAIN, "run.sh": "#!/bin/bash\n" + launch + launch,
                             "cfgfix.toml": 'gpu = "A100 80GB"\n'})
    monkeypatch.chdir(tmp_path)
    code, out = _run("fix", "--fit")
    assert "written: " in out and "changed for a launch above" in out and code == 1
    code, out = _run("fix", "--fit")
    assert code == 0, out
    assert (tmp_path / "run.sh").read_text().count("--deepspeed ds_zero2.json") == 2


def test_fit_never_writes_outside_the_project(tmp_path, monkeypatch):
    """A launch naming its DeepSpeed JSON as `../ds.json`, by an absolute path, or through a
    link out of the tree: the plan is printed, nothing is written anywhere (issue 14)."""
    outside = tmp_path / "shared"
    outside.mkdir()
    ds = '{"zero_optimization": {"stage": 1}, "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"}\n'
    launch = ("#!/bin/bash\ntorchrun --nproc_per_node 4 train.py --output_dir out --deepspeed {} "
              "--per_device_train_batch_size 4 --bf16 True --max_seq_length 2048 --gradient_checkpointing True\n")
    for name, written in (("rel", "../shared/ds.json"), ("abs", str(outside / "ds.json")), ("link", "ds.json")):
        project = tmp_path / name
        write_project(project, {"train.py": HF_TRAIN, "run.sh": launch.format(written), "cfgfix.toml": 'gpu = "A100 40GB"\n'})
        (outside / "ds.json").write_text(ds)
        if name == "link":
            (project / "ds.json").symlink_to(outside / "ds.json")
        monkeypatch.chdir(project)
        code, out = _run("fix", "--fit")
        assert code == 2, out
        assert "is outside the project" in out and "zero_optimization.stage 2" in out  # the plan, as advice
        assert (outside / "ds.json").read_text() == ds
        assert (project / "run.sh").read_text() == launch.format(written)  # half a plan is never written


def test_a_lora_plan_a_practitioner_would_take():
    """Issue 13, item 6: Qwen2.5-7B LoRA with an fp32 base on one RTX 4090. Parameter offload
    moves the frozen base to the CPU too; every kept rung is needed (the plan without any one
    of them does not fit) and each lowers the peak; the 8-bit optimizer is on the ladder."""
    from cfgfix.memory.gpus import find_gpu
    from cfgfix.memory.setup import MemorySetup
    from cfgfix.memory.shapes import shape_from_catalog
    from cfgfix.training import fit

    shape, gpu = shape_from_catalog("Qwen/Qwen2.5-7B"), find_gpu("RTX 4090")
    setup = MemorySetup(weights="fp32", lora_rank=16, micro_batch=2, seq_len=2048, gradient_accumulation=8)
    result = fit.plan(setup, shape, gpu)
    assert result.fits
    keys = [r.key for r in result.rungs]
    assert keys == ["checkpointing", "offload_params"]
    offloaded = next(c for c in result.after.cpu if c.name == "parameters")
    assert offloaded.size >= shape.params * 4  # the frozen fp32 base, not only the adapters
    assert result.after.component("weights").size == 0
    peaks = [result.before.peak] + [r.estimate.peak for r in result.rungs]
    assert all(b < a for a, b in zip(peaks, peaks[1:]))
    for left_out in range(len(keys)):
        after, _ = fit._replay(setup, [k for i, k in enumerate(keys) if i != left_out], gpu, True)
        assert not fit.fits(fit.estimate(after, shape), gpu.usable_bytes)
    assert "8-bit AdamW" in [name for name, *_ in fit.ladder(setup, gpu)]


def test_a_plan_never_adds_training_keys_to_a_deepspeed_json(tmp_path, monkeypatch):
    """DeepSpeed ignores a top-level `gradient_checkpointing` or `optim` (CFX507): when the file
    a launch reads its training settings from is its DeepSpeed JSON, the setting goes to a
    flag the HF Trainer reads, or stays advice (issue 14)."""
    from cfgfix.training.resolve import training_setups
    from cfgfix.training.write_setup import SetupWriter
    from conftest import lint_project

    write_project(tmp_path, {
        "train.py": HF_TRAIN,
        "run.sh": HF_LAUNCH.replace("    --gradient_checkpointing True\n", "    --deepspeed ds.json\n"),
        "ds.json": '{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}\n',
    })
    monkeypatch.chdir(tmp_path)
    engine, _, _ = lint_project(tmp_path)
    (setup,) = training_setups(engine.project)
    setup.files["training config"] = setup.files["deepspeed"]  # read as both, as a `--config ds.json` would
    for setting, value in (("gradient_checkpointing", True), ("optimizer", "adamw-8bit")):
        change = SetupWriter(engine.project, setup).set(setting, value)
        assert change is not None and change.edits  # a flag the HF Trainer reads
        assert all(e.path == "run.sh" for e in change.edits), change.where
    setup.parses_training_arguments = False  # no flag to append: advice, with the reason
    writer = SetupWriter(engine.project, setup)
    assert writer.set("gradient_checkpointing", True) is None
    assert "is a DeepSpeed config" in writer.reason
