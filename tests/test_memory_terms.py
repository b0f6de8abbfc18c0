"""Estimator terms of issue 21 item 5: FSDP shards a (Q)LoRA run's frozen base, its mixed
precision makes no whole-model copy, CPU parameter offload, and the DeepSpeed JSON's buckets,
overlap_comm and ZeRO-3 live / persistent parameters read into the setup."""

import json

import pytest

from cfgfix.memory.estimator import GIB, estimate
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.records import replace
from cfgfix.training.memory_setup import deepspeed_extras

LLAMA_70B = shape_from_catalog("meta-llama/Llama-3.1-70B")
LLAMA_8B = shape_from_catalog("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize("quantization", [None, "4bit"])
@pytest.mark.parametrize("sharding", ["full", "grad-op"])
def test_fsdp_shards_the_frozen_base_of_a_lora_run(sharding, quantization):
    one = MemorySetup(weights="bf16", lora_rank=16, quantization=quantization, micro_batch=1, seq_len=2048,
                      checkpointing=True)
    single = estimate(one, LLAMA_70B)
    sharded = estimate(replace(one, fsdp=sharding, num_gpus=8), LLAMA_70B)
    weights = sharded.component("weights").size
    assert weights == pytest.approx(single.component("weights").size / 8, rel=0.01)
    assert "frozen base too" in sharded.component("weights").formula


def test_fsdp_lora_70b_on_8_h100_fits_where_the_unsharded_base_did_not():
    # the report behind issue 21: 76 GiB measured for a 70B LoRA run on 8 x H100 (was 434 GiB here)
    setup = MemorySetup(weights="bf16", lora_rank=16, fsdp="full", num_gpus=8, micro_batch=1, seq_len=2048,
                        checkpointing=True)
    result = estimate(setup, LLAMA_70B)
    assert result.peak < 80 * GIB


def test_fsdp_mixed_precision_makes_no_whole_model_copy():
    base = MemorySetup(weights="fp32", autocast="bf16", micro_batch=2, seq_len=1024, num_gpus=8)
    ddp = estimate(base, LLAMA_8B)
    fsdp = estimate(replace(base, fsdp="full"), LLAMA_8B)
    assert "autocast 16-bit weight copies" in ddp.component("temporaries").formula
    assert "autocast" not in fsdp.component("temporaries").formula
    assert "gathered FSDP units" in fsdp.component("temporaries").formula
    # FSDP's param_dtype computes in bf16 throughout: a 16-bit residual stream, fewer activation bytes
    assert fsdp.component("activations").size < ddp.component("activations").size
    # the gathered units: two layers and the root (embeddings, head), in bf16
    layer = max(b.params for b in LLAMA_8B.blocks)
    gathered = (2 * layer + LLAMA_8B.embedding_params + LLAMA_8B.head_params) * 2
    assert f"{gathered / GIB:.3g} GiB" in fsdp.component("temporaries").formula


def test_fsdp_cpu_offload_is_modelled():
    setup = MemorySetup(weights="fp32", autocast="bf16", fsdp="full", num_gpus=8, offload_optimizer=True,
                        offload_params=True, micro_batch=1, seq_len=2048, checkpointing=True)
    assert setup.conflicts() == []
    result = estimate(setup, LLAMA_70B)
    for name in ("weights", "gradients", "optimizer_states"):
        assert result.component(name).size == 0
    cpu = {c.name: c.size for c in result.cpu}
    assert cpu["parameters"] == pytest.approx(LLAMA_70B.params * 4, rel=0.01)
    assert cpu["optimizer_states"] == pytest.approx(LLAMA_70B.params * 8, rel=0.01)
    assert result.peak < 30 * GIB
    # FSDP has no optimizer-only offload
    assert any("FSDP offloads the optimizer only with the parameters" in c
               for c in replace(setup, offload_params=False).conflicts())


def test_cli_fsdp_offload_exits_by_the_verdict_not_2():
    from click.testing import CliRunner

    from cfgfix.commands import cli

    out = CliRunner().invoke(cli, ["estimate", "--model", "meta-llama/Llama-3.1-70B", "--fsdp", "full", "--num-gpus", "8",
                                   "--precision", "amp-bf16", "--offload", "optimizer+params", "--seq", "2048",
                                   "--checkpointing", "--gpu", "H100"])
    assert out.exit_code == 0, out.output
    assert "FSDP CPUOffload" in out.output


def _write(tmp_path, zero: dict):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": zero}))
    return path


def test_deepspeed_json_buckets_read_under_either_spelling(tmp_path):
    path = _write(tmp_path, {"stage": 3, "reduce_bucket_size": 1e7, "stage3_prefetch_bucket_size": "auto",
                             "max_live_parameters": 3e7, "overlap_comm": False, "stage3_param_persistence_threshold": 1e4,
                             "allgather_bucket_size": True})
    extras = deepspeed_extras(path)
    assert extras == {"reduce_bucket_size": 1e7, "prefetch_bucket_size": "auto", "max_live_parameters": 3e7,
                      "overlap_comm": False, "param_persistence_threshold": 1e4}
    assert deepspeed_extras(tmp_path / "missing.json") == {}
    assert deepspeed_extras(None) == {}


def test_stated_buckets_change_the_estimate_and_silence_the_unknown_note():
    base = MemorySetup(deepspeed_half="bf16", weights="bf16", zero_stage=2, num_gpus=8, micro_batch=1, seq_len=1024)
    default = estimate(base, LLAMA_8B)
    stated = estimate(replace(base, extras={"reduce_bucket_size": 2e8, "allgather_bucket_size": 2e8, "overlap_comm": True}),
                      LLAMA_8B)
    assert any("bucket sizes not stated" in a for a in default.assumptions)
    assert not any("bucket sizes not stated" in a for a in stated.assumptions)
    # (2e8 + 2e8) x 2 B x 4.5 with overlap_comm against (5e8 + 5e8) x 2 B without
    assert stated.peak - default.peak == int(4e8 * 2 * 4.5) - int(1e9 * 2)


def test_zero3_live_parameters_cap_the_prefetch_and_auto_follows_the_hidden_size():
    base = MemorySetup(deepspeed_half="bf16", weights="bf16", zero_stage=3, num_gpus=8, micro_batch=1, seq_len=1024)
    capped = estimate(replace(base, extras={"reduce_bucket_size": 1e8, "prefetch_bucket_size": 5e8,
                                            "max_live_parameters": 1e8}), LLAMA_8B)
    assert "prefetched parameters 1e+08" in capped.component("temporaries").formula
    auto = estimate(replace(base, extras={"reduce_bucket_size": "auto", "prefetch_bucket_size": "auto"}), LLAMA_8B)
    h = LLAMA_8B.hidden
    assert f"prefetched parameters {0.9 * h * h:.3g}" in auto.component("temporaries").formula
    assert any("as the HF Trainer fills it" in a for a in auto.assumptions)


def test_a_projects_deepspeed_json_reaches_the_estimate(tmp_path):
    from conftest import write_project
    from test_training_setup import _setups

    from cfgfix.training.memory_setup import memory_input

    write_project(tmp_path, {
        "train.py": ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-8B')\n"
                     "args = TrainingArguments(output_dir='out', per_device_train_batch_size=1, bf16=True,"
                     " deepspeed='ds_z3.json')\n"
                     "Trainer(model=model, args=args).train()\n"),
        "ds_z3.json": json.dumps({"bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto",
                                  "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto",
                                                        "stage3_prefetch_bucket_size": 2e7,
                                                        "stage3_max_live_parameters": 1e9}}),
        "run.sh": "deepspeed --num_gpus 8 train.py\n",
    })
    setup = _setups(tmp_path)[0]
    inputs = memory_input(setup)
    assert inputs.setup.extras == {"reduce_bucket_size": "auto", "prefetch_bucket_size": 2e7, "overlap_comm": True,
                                   "max_live_parameters": 1e9}
    result = estimate(inputs.setup, inputs.shape)
    assert any(a.startswith("from the DeepSpeed config: reduce_bucket_size auto") for a in result.assumptions)


def test_torch_before_2_keeps_gradients_through_the_forward_and_loops_the_optimizer():
    base = MemorySetup(weights="bf16", micro_batch=4, seq_len=2048)
    new = estimate(base, LLAMA_8B)
    old = estimate(replace(base, torch_version="1.13.1"), LLAMA_8B)
    assert any("set_to_none=False before 2.0" in a for a in old.assumptions)
    assert any("before 2.0 the per-parameter loop" in a for a in old.assumptions)
    assert old.phases["backward start"] - new.phases["backward start"] == old.component("gradients").size
    # the per-parameter loop's temporaries are one parameter's, not a copy of every parameter
    assert old.phases["optimizer step"] < new.phases["optimizer step"]
    assert estimate(replace(base, torch_version="2.1.2+cu121"), LLAMA_8B).peak == new.peak


def test_a_projects_torch_pin_reaches_the_setup(tmp_path):
    from conftest import lint_project, write_project
    from test_training_setup import _setups

    from cfgfix.training.memory_setup import memory_input

    write_project(tmp_path, {
        "requirements.txt": "torch==1.13.1\ntransformers==4.30.2\n",
        "train.py": ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-8B')\n"
                     "Trainer(model=model, args=TrainingArguments(output_dir='o', bf16=True)).train()\n"),
        "run.sh": "python train.py\n",
    })
    engine, _, _ = lint_project(tmp_path)
    setup = _setups(tmp_path)[0]
    assert memory_input(setup, engine.project).setup.torch_version == "1.13.1"


def test_cuda_context_is_a_range_by_gpu_generation_and_cuda_release():
    from cfgfix.memory.estimator import MIB, cuda_context

    assert cuda_context(MemorySetup(gpu="H200", cuda_version="13.0"))[1:3] == (765 * MIB, 765 * MIB)
    point, low, high, words = cuda_context(MemorySetup(gpu="RTX 4090", cuda_version="12.4"))
    assert (point, low, high) == (765 * MIB, 450 * MIB, 1024 * MIB) and "RTX 4090 (ada)" in words
    point, low, high, words = cuda_context(MemorySetup(gpu="A100 80GB", cuda_version="11.8"))
    assert high == 2048 * MIB and "loads kernels eagerly" in words
    base = MemorySetup(weights="bf16", micro_batch=1, seq_len=1024)
    measured = estimate(replace(base, gpu="H200", cuda_version="13.0"), LLAMA_8B)
    unknown = estimate(base, LLAMA_8B)
    assert measured.peak == unknown.peak  # the point stays the measured figure
    assert unknown.high - measured.high == (1024 - 765) * MIB and measured.low - unknown.low == (765 - 450) * MIB


def test_cuda_release_from_the_torch_wheel_tag():
    from cfgfix.training.memory_setup import _cuda_of

    assert _cuda_of("2.1.2+cu121") == "12.1" and _cuda_of("1.13.1+cu117") == "11.7" and _cuda_of("2.3.0") is None
