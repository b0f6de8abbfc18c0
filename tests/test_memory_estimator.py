"""The memory model without torch: GPU and model catalogs, DeepSpeed's formulas, the four
user stories' headline numbers, and the `cfgfix estimate` command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.memory.estimator import GIB, estimate, verdict
from cfgfix.memory.gpus import find_gpu
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import catalog_entry, params_only, shape_from_catalog


@pytest.mark.parametrize("name,expected", [
    ("RTX 4090", "RTX 4090"), ("rtx4090", "RTX 4090"), ("4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("A100-80GB", "A100 80GB"), ("a100 80gb", "A100 80GB"), ("A100", "A100 40GB"), ("RTX A6000", "RTX A6000"),
    ("A6000 Ada", "RTX 6000 Ada"), ("h200", "H200"), ("T4", "Tesla T4"),
])
def test_gpu_aliases(name, expected):
    assert find_gpu(name).name == expected


def test_gpu_unknown_and_usable_memory():
    assert find_gpu("RTX 9999") is None
    assert find_gpu("RTX 4090").usable_bytes == int(23.65 * GIB)
    assert find_gpu("RTX 5090").usable_bytes == int(31.36 * GIB)


def test_catalog_counts_agree_with_the_model_cards():
    for model_id in ("Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "google/flan-t5-xl", "mistralai/Mistral-7B-v0.1"):
        entry, shape = catalog_entry(model_id), shape_from_catalog(model_id)
        assert abs(shape.params / entry["card_params"] - 1) < 0.01, model_id
    assert shape_from_catalog("stabilityai/stable-diffusion-xl-base-1.0").params == 2_567_463_684  # facts C15b
    assert shape_from_catalog("sd15").params == 859_520_964
    assert shape_from_catalog("qwen2.5-7b-instruct").family == "qwen2"


def test_zero2_offload_matches_deepspeeds_estimator():
    # facts C14 [EXP]: 2.6B params, 1 GPU, ZeRO-2 with optimizer offload: GPU 4.84 GiB, CPU 58.1 GiB
    setup = MemorySetup(deepspeed_half="bf16", zero_stage=2, offload_optimizer=True, num_gpus=1)
    result = estimate(setup, params_only(2_600_000_000))
    assert round(result.model_states / GIB, 2) == 4.84
    assert round(result.cpu_bytes / GIB, 1) == 58.1
    no_offload = estimate(setup.with_(offload_optimizer=False), params_only(2_600_000_000))
    assert round(no_offload.model_states / GIB, 1) == 48.4  # 2Psi + 18Psi/G


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_zero3_matches_deepspeeds_formula(gpus):
    shape = shape_from_catalog("meta-llama/Llama-3.1-8B")
    psi, largest = shape.params, shape.largest_module_params
    result = estimate(MemorySetup(deepspeed_half="bf16", zero_stage=3, num_gpus=gpus), shape)
    gathered = 4 * largest  # DeepSpeed's 4L, reported under temporaries
    assert result.model_states + gathered == pytest.approx(4 * largest + 18 * psi / gpus, rel=1e-6)


def test_amp_keeps_fp32_model_states():
    # HF anatomy (C14): AMP + AdamW = 4 weights + 4 grads + 8 Adam, plus 2 B of 16-bit copies
    psi = 1_000_000_000
    result = estimate(MemorySetup(autocast="bf16"), params_only(psi))
    assert result.model_states == 16 * psi


def _fits(setup, model, gpu):
    result = estimate(setup, shape_from_catalog(model))
    target = find_gpu(gpu)
    return verdict(result, target.usable_bytes, target.name), result


def test_story_sdxl():
    sdxl = "stabilityai/stable-diffusion-xl-base-1.0"
    amp, result = _fits(MemorySetup(autocast="fp16", checkpointing=True, micro_batch=2, resolution=1024, num_gpus=4), sdxl, "RTX 4090")
    assert not amp.fits and amp.certain
    assert result.model_states > 24e9  # checkpointing cannot shrink model states (C15b)
    zero2, _ = _fits(MemorySetup(deepspeed_half="bf16", zero_stage=2, offload_optimizer=True, checkpointing=True,
                                 micro_batch=2, resolution=1024, num_gpus=4), sdxl, "RTX 4090")
    assert zero2.fits


def test_story_flan_t5_xl():
    setup = MemorySetup(weights="bf16", micro_batch=8, seq_len=512, target_len=128)
    result_verdict, result = _fits(setup, "google/flan-t5-xl", "RTX 5090")
    assert not result_verdict.fits
    # the optimizer states are the largest model state: twice the weights ("bf16 halves everything" forgets them)
    states = {c.name: c.size for c in result.components}
    assert states["optimizer_states"] == 2 * states["weights"] > states["gradients"]
    fixed, _ = _fits(setup.with_(micro_batch=4, checkpointing=True, gradient_accumulation=8), "google/flan-t5-xl", "RTX 5090")
    assert fixed.fits


def test_story_mm_8b():
    model = "llava-hf/llama3-llava-next-8b-hf"
    ddp, _ = _fits(MemorySetup(autocast="bf16", micro_batch=4, seq_len=4096, num_gpus=8), model, "RTX A6000")
    assert not ddp.fits and ddp.certain
    zero3, result = _fits(MemorySetup(deepspeed_half="bf16", zero_stage=3, micro_batch=2, seq_len=4096, num_gpus=8,
                                      checkpointing=True, gradient_accumulation=8), model, "RTX A6000")
    assert zero3.fits and result.peak < 47.4 * GIB


def test_story_qwen_lora_margin():
    result_verdict, result = _fits(MemorySetup(weights="bf16", lora_rank=16, micro_batch=2, seq_len=2048, checkpointing=True,
                                               num_gpus=2, gradient_accumulation=8), "Qwen/Qwen2.5-7B-Instruct", "A100 40GB")
    assert result_verdict.fits and result_verdict.margin > 5 * GIB
    assert result.trainable_params == 40_370_176  # r=16 on all 7 projections of 28 layers


def test_qlora_counts_quantized_base():
    shape = shape_from_catalog("Qwen/Qwen2.5-7B")
    q4 = estimate(MemorySetup(weights="bf16", lora_rank=16, quantization="4bit"), shape)
    bf16 = estimate(MemorySetup(weights="bf16", lora_rank=16), shape)
    quantized = shape.block_linear_params
    adapters = q4.trainable_params
    # NF4: 0.5 B + an fp32 absmax per 64 weights; the rest up-cast to fp32 by PEFT (C14)
    assert q4.component("weights").size == int(quantized * (0.5 + 4 / 64)) + (shape.params - quantized) * 4 + adapters * 4
    assert q4.component("weights").size < bf16.component("weights").size
    assert any("up-casts" in a for a in q4.assumptions)


def test_cli_estimate_text_and_json():
    runner = CliRunner()
    out = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-7B", "--precision", "bf16", "--lora-rank", "16",
                              "--batch", "2", "--seq", "2048", "--checkpointing", "--gpu", "A100 40GB"])
    assert out.exit_code == 0, out.output
    assert "Verdict: fits A100 40GB" in out.output and "| GPU 39.39 GiB" in out.output
    out = runner.invoke(cli, ["estimate", "--params", "2.6e9", "--precision", "ds-bf16", "--zero", "2",
                              "--offload", "optimizer", "--output-format", "json"])
    data = json.loads(out.output)
    # the same entry as a launch of a project: the breakdown ("estimate") and the answer
    assert round(data["estimate"]["cpu_bytes"] / GIB, 1) == 58.1
    assert data["answer"]["verdict"] is None and data["answer"]["open"][0]["setting"] == "seq_len"
    missing = runner.invoke(cli, ["estimate", "some/project"])  # project mode: tests/test_fit.py
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    assert runner.invoke(cli, ["estimate", "--model", "no/such-model"]).exit_code == 2


def test_import_cfgfix_commands_does_not_import_the_memory_model():
    code = "import sys, cfgfix.commands; print(any(m.startswith(('torch', 'cfgfix.memory')) for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# -- impossible inputs and plain-word sources (issue 13, item 7) ---------------------------------

@pytest.mark.parametrize("flags, expected", [
    (["--batch", "0"], "'--batch': 0 is not in the range 1<=x<=1000000"),
    (["--num-gpus", "0"], "'--num-gpus': 0 is not in the range 1<=x<=1000000"),
    (["--seq", "-5"], "'--seq': -5 is not in the range 1<=x<=100000000"),
    (["--grad-accum", "0"], "'--grad-accum'"),
    (["--lora-rank", "0"], "'--lora-rank'"),
    (["--offload", "optimizer"], "without ZeRO nothing is offloaded"),
    (["--offload", "optimizer+params", "--zero", "2"], "works only under ZeRO-3"),
    (["--fsdp", "full", "--zero", "3", "--num-gpus", "8"], "a run uses one of them, not both"),
    (["--quantize", "4bit"], "give a LoRA rank"),
])
def test_estimate_refuses_impossible_inputs(flags, expected):
    result = CliRunner().invoke(cli, ["estimate", "--model", "meta-llama/Llama-2-7b-hf", *flags])
    assert result.exit_code == 2
    assert expected in result.output
    assert "GiB" not in result.output  # nothing estimated


def test_estimator_refuses_impossible_values():
    with pytest.raises(ValueError, match="the micro batch must be a whole number of at least 1, not 0"):
        estimate(MemorySetup(micro_batch=0), shape_from_catalog("meta-llama/Llama-2-7b-hf"))
    with pytest.raises(ValueError, match="the sequence length must be at least 1, not -5"):
        estimate(MemorySetup(seq_len=-5, num_gpus=2), shape_from_catalog("meta-llama/Llama-2-7b-hf"))


def test_a_conflicting_project_setup_is_estimated_as_it_runs_and_says_why():
    shape = shape_from_catalog("meta-llama/Llama-2-7b-hf")
    result = estimate(MemorySetup(weights="bf16", deepspeed_half="bf16", zero_stage=2, offload_params=True,
                                  num_gpus=2), shape)
    plain = estimate(MemorySetup(weights="bf16", deepspeed_half="bf16", zero_stage=2, num_gpus=2), shape)
    assert result.peak == plain.peak
    assert any("works only under ZeRO-3" in note for note in result.assumptions)


@pytest.mark.parametrize("flags", [
    ["--precision", "amp-bf16"], ["--precision", "bf16", "--lora-rank", "16", "--quantize", "4bit"],
    ["--precision", "ds-bf16", "--zero", "3", "--num-gpus", "8", "--offload", "optimizer+params"],
    ["--precision", "ds-bf16", "--zero", "2", "--num-gpus", "4", "--offload", "optimizer"],
    ["--precision", "fp16"],
])
def test_estimate_output_cites_sources_in_words_not_fact_codes(flags):
    import re

    result = CliRunner().invoke(cli, ["estimate", "--model", "meta-llama/Llama-2-7b-hf", "--gpu", "A100-80GB", *flags])
    assert result.exit_code in (0, 1), result.output  # 1: does not fit
    codes = re.findall(r"(?<![\w.-])[A-F]\d{1,2}[a-z]?(?![\w.])", result.output)
    assert not [c for c in codes if c not in ("A100",)], result.output


def test_estimate_exit_codes_and_sanity():
    """issue 21: 0 fits (the band's top too), 1 does not fit, 2 bad input; nan/inf and
    absurd sizes are errors; a sequence past the model's positions and bf16 on a GPU
    without it are warnings; columns stay aligned at any magnitude."""
    runner = CliRunner()
    fits = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--precision", "bf16", "--seq", "512",
                               "--gpu", "H100 80GB"])
    assert fits.exit_code == 0 and "Verdict: fits" in fits.output, fits.output
    over = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-72B", "--seq", "32768", "--batch", "64",
                               "--gpu", "A100 80GB"])
    assert over.exit_code == 1 and "does not fit" in over.output
    rows = [line for line in over.output.splitlines() if line.startswith(("weights ", "activations ", "peak per GPU"))]
    ends = {len(line.split("GiB")[0]) for line in rows[:2]}
    assert len(ends) == 1, rows  # the size column ends at the same place for 270 GiB and 1.4M GiB
    assert all("GiB  " in line for line in rows[:2]), rows  # never "GiB1437221.25"
    no_gpu = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-7B"])
    assert no_gpu.exit_code == 0  # nothing to judge against
    for flags in (["--params", "nan"], ["--params", "inf"], ["--params", "1e20"], ["--seq", "1000000000000"],
                  ["--batch", "99999999999"]):
        bad = runner.invoke(cli, ["estimate", "--model", "Qwen/Qwen2.5-7B", *flags] if flags[0] != "--params"
                            else ["estimate", *flags])
        assert bad.exit_code == 2 and "Traceback" not in bad.output, (flags, bad.output)
    warned = runner.invoke(cli, ["estimate", "--model", "openai-community/gpt2", "--seq", "4096", "--precision",
                                 "amp-bf16", "--gpu", "V100"])
    assert "beyond the model's 1,024 positions" in warned.output and "no bf16 support" in warned.output
