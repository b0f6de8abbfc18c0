"""The analytic model against real CUDA training steps: `torch.cuda.max_memory_allocated()`
of 42 setups measured on an NVIDIA H200 (torch 2.11+cu130, transformers 5.17), stored with
their full description in bench/gpu_results.json by bench/gpu_memory.py. No GPU is needed
here: each setup is re-estimated from its stored config and compared with the stored peak.
Also the resolution of the attention kernel and the optimizer implementation from a project,
and `estimate --device cpu`."""

import importlib.util
import json

import pytest
from click.testing import CliRunner
from conftest import REPO, lint_project, write_project

from cfgfix.commands import cli
from cfgfix.memory.estimator import attention_kernel, estimate
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog, shape_from_config
from cfgfix.records import replace

RESULTS = json.loads((REPO / "bench" / "gpu_results.json").read_text("utf-8"))
ROWS = {row["spec"]["name"]: row for row in RESULTS["rows"]}


def _setup(spec: dict, **changes) -> MemorySetup:
    fields = dict(spec["setup"])
    if fields.get("lora_targets"):
        fields["lora_targets"] = tuple(fields["lora_targets"])
    impl = {"forloop": "for-loop"}.get(spec["optim_impl"], spec["optim_impl"])
    head = {"causal": "causal-lm", "mlm": "masked-lm", "seqcls": "classification", "composite": "classification"}.get(spec["head"])
    # the transformers release the card ran (its default attention per family, T5's tied head)
    version = RESULTS["meta"]["transformers"]
    return replace(MemorySetup(**fields, attention=spec["attn"], optimizer_impl=impl, device="cuda", head=head,
                               transformers_version=version), **changes)


def _bench_module(name: str):
    """A module of bench/ (the bench and these tests describe the stored setups one way)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


composite_of = _bench_module("memory_table").composite_of


def _shape(spec: dict):
    return composite_of(spec) if spec["head"] == "composite" else shape_from_config(spec["config"])


def _allocated(result) -> int:
    """What max_memory_allocated can see: the estimate less its stated CUDA context."""
    return result.peak - result.component("cuda_context").size


# Decoders with the kernel stated (sdpa / eager) or resolved (fp32 + grouped KV heads: SDPA's
# math kernel): within 5% of the GPU. Before issue 13 these read -28% (fp32 GQA), -40..-45%
# (eager) and -18% (Gemma-2 on SDPA).
DECODERS = ["llama fp32 adamw-foreach", "llama fp32 adamw-fused", "llama fp32 adamw-forloop", "llama amp-bf16",
            "llama bf16", "llama bf16 lora-r16", "llama fp32 checkpointing", "llama amp-bf16 checkpointing",
            "llama bf16 eager", "qwen2 bf16 sdpa", "qwen2 bf16 eager", "mistral amp-bf16 checkpointing",
            "gemma2 bf16 eager", "gemma2 bf16 sdpa", "gpt2 fp32", "gpt_neox bf16", "phi3 fp32",
            # second run: a fused-kernel fp32 Llama without grouped KV heads, more LoRA / checkpointing
            "llama fp32 MHA (16 KV heads) sdpa", "gemma2 amp-bf16 eager checkpointing", "qwen2 fp32 checkpointing",
            "phi3 bf16 lora-r16", "gpt_neox amp-bf16 checkpointing",
            # heads (issue 13, item 4): BERT's masked-LM head read -48% / -51% before
            "bert-mlm fp32", "bert-mlm amp-bf16",
            # the default attention of transformers 5.17 (SDPA for Gemma-2 there): +34.8% while
            # the estimate assumed eager whatever the version
            "gemma2 bf16 default-attn",
            # T5 with the head transformers 5.x ties: +6.5% while counted untied
            "t5 fp32 no dropout", "t5 fp32", "t5 amp-bf16"]


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_estimates_within_5_percent_of_an_h200(name):
    row = ROWS[name]
    result = estimate(_setup(row["spec"]), shape_from_config(row["spec"]["config"]))
    measured = row["measured"]["peak_bytes"]
    error = (_allocated(result) - measured) / measured
    assert abs(error) < 0.05, f"{name}: {error:+.1%}"


def test_the_whole_table_against_the_h200():
    """All 42 setups: within 5% in 34, within 10% in 41, every one inside the estimate's band,
    mean absolute error under 3% (issue 13 items 1, 2, 3 and 5 measured here: the composite sized
    as the sum of its parts with both towers' activations, -55% -> -5.0%; the transformers 5.17
    defaults; T5's tied head; the cuBLAS workspaces. Before: 29, 36, 39 in band, 6.8%). Left
    beyond 10%: T5 LoRA (eager scores modelled, SDPA run: +16.6%)."""
    errors, in_band = {}, 0
    for name, row in ROWS.items():
        result = estimate(_setup(row["spec"]), _shape(row["spec"]))
        measured = row["measured"]["peak_bytes"]
        errors[name] = (_allocated(result) - measured) / measured
        context = result.component("cuda_context").size
        in_band += result.low - context <= measured <= result.high - context
    assert len(errors) == 42 and in_band == 42
    assert sum(abs(e) < 0.05 for e in errors.values()) >= 34
    assert sum(abs(e) < 0.10 for e in errors.values()) >= 41
    assert sum(abs(e) for e in errors.values()) / len(errors) < 0.03
    assert abs(errors["composite: 2 bert towers + fusion"]) < 0.06
    # cuBLAS's workspaces (64 MiB) tip the smallest LoRA peak past 5%: +1.1% before, +5.8% now
    assert 0 < errors["bert-cls bf16 lora-r8"] < 0.07


def test_the_optimizer_steps_temporaries_by_implementation_match_the_gpu():
    """The optimizer-phase peak of the same fp32 Llama: fused 2,558 MiB, for-loop 2,808,
    foreach 3,181 measured. What each implementation adds over the fused step (its
    temporaries: foreach +623 MiB, for-loop +250 MiB) is modelled within 5%."""
    def step(name):
        row = ROWS[name]
        result = estimate(_setup(row["spec"]), shape_from_config(row["spec"]["config"]))
        return result.phases["optimizer step"], row["measured"]["phases"]["optimizer"]

    fused_model, fused_measured = step("llama fp32 adamw-fused")
    for name in ("llama fp32 adamw-forloop", "llama fp32 adamw-foreach"):
        modelled, measured = step(name)
        extra_model, extra_measured = modelled - fused_model, measured - fused_measured
        assert abs(extra_model - extra_measured) / extra_measured < 0.05, (name, extra_model, extra_measured)


def test_t5_on_cuda_sits_between_the_gpu_and_the_band():
    """T5 on CUDA runs SDPA's math kernel with 1-byte dropout masks: the estimate is above the
    GPU (transformers 5.17 there, 5.2x terms here), and the GPU inside the band."""
    for name in ("t5 fp32", "t5 amp-bf16", "t5 bf16 lora-r16"):
        row = ROWS[name]
        result = estimate(_setup(row["spec"]), shape_from_config(row["spec"]["config"]))
        measured = row["measured"]["peak_bytes"]
        context = result.component("cuda_context").size
        assert result.low - context <= measured <= result.high - context, name
        # above the GPU: T5 is modelled with eager's saved scores while transformers 5.17 runs
        # it through SDPA (the estimate says so); LoRA's +16.6% is the widest
        assert 0 <= (_allocated(result) - measured) / measured < (0.20 if "lora" in name else 0.10), name


def test_attention_kernel_resolution():
    llama = shape_from_config(ROWS["llama bf16"]["spec"]["config"])  # 16 query heads, 8 KV heads
    gemma2 = shape_from_config(ROWS["gemma2 bf16 sdpa"]["spec"]["config"])
    gpt2 = shape_from_config(ROWS["gpt2 fp32"]["spec"]["config"])  # dropout 0.1
    assert attention_kernel(MemorySetup(weights="bf16"), llama) == "fused"
    assert attention_kernel(MemorySetup(weights="fp32"), llama) == "math"  # no fp32 flash, no GQA in mem-efficient
    assert attention_kernel(MemorySetup(weights="fp32", autocast="bf16"), llama) == "fused"
    assert attention_kernel(MemorySetup(weights="bf16", attention="eager"), llama) == "eager"
    assert attention_kernel(MemorySetup(weights="bf16"), gemma2) == "eager"  # soft-capping: eager by default
    assert attention_kernel(MemorySetup(weights="bf16", attention="sdpa"), gemma2) == "fused"
    assert attention_kernel(MemorySetup(weights="bf16", attention="flash"), gemma2) == "fused"
    assert attention_kernel(MemorySetup(weights="fp32"), gpt2) == "fused"  # CUDA: mem-efficient takes dropout
    assert attention_kernel(MemorySetup(weights="fp32", device="cpu"), gpt2) == "math"  # CPU: no fused dropout


def test_gemma2_9b_lora_at_4096_tokens_does_not_fit_80gb_with_eager_attention():
    """The issue's case: Gemma-2-9B LoRA r16 bf16 at 1 x 4096 simulated at ~166 GiB while the
    estimate said "fits H100 80GB, tight". Eager attention keeps b x heads x s^2 x 8 B a layer."""
    shape = shape_from_catalog("google/gemma-2-9b")
    setup = MemorySetup(weights="bf16", lora_rank=16, micro_batch=1, seq_len=4096)
    eager = estimate(setup, shape)  # Gemma-2's default attention
    assert eager.peak > 150 * 1024**3  # 176.8 GiB (78.1 GiB before; the simulation ~166 GiB)
    assert any("default attention is eager" in note for note in eager.assumptions)
    fused = estimate(replace(setup, attention="flash"), shape)
    assert eager.peak - fused.peak > 80 * 1024**3  # 42 layers x 16 heads x 4096^2 x 8 B


def test_estimate_device_cpu_has_no_context_and_takes_no_gpu():
    runner = CliRunner()
    result = runner.invoke(cli, ["estimate", "--model", "gpt2", "--device", "cpu", "--seq", "512",
                                 "--output-format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert next(c for c in data["estimate"]["components"] if c["name"] == "cuda_context")["bytes"] == 0
    refused = runner.invoke(cli, ["estimate", "--model", "gpt2", "--device", "cpu", "--gpu", "A100-80GB"])
    assert refused.exit_code == 2 and "--device cpu estimates a CPU run" in refused.output


def test_the_script_says_which_attention_and_optimizer_implementation(tmp_path):
    write_project(tmp_path, {
        "run.sh": "python train.py\npython loop.py\n",
        "train.py": (
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            "model = AutoModelForCausalLM.from_pretrained('org/model', attn_implementation='flash_attention_2')\n"
            "Trainer(model=model, args=TrainingArguments(output_dir='o')).train()\n"),
        "loop.py": (
            "import torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('org/model', attn_implementation='eager')\n"
            "opt = torch.optim.AdamW(model.parameters(), foreach=False)\n"
            "for batch in data:\n    model(**batch).loss.backward()\n    opt.step()\n"),
    })
    from cfgfix.training.memory_setup import memory_input
    from cfgfix.training.resolve import training_setups

    engine, _, _ = lint_project(tmp_path)
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        setups = {s.launch.script: s for s in training_setups(engine.project)}
    finally:
        os.chdir(cwd)
    trainer = memory_input(setups["train.py"]).setup
    assert (trainer.attention, trainer.optimizer_impl) == ("flash", "fused")  # the Trainer's default optim
    loop = memory_input(setups["loop.py"]).setup
    assert (loop.attention, loop.optimizer_impl) == ("eager", "for-loop")


def test_the_head_the_script_builds(tmp_path):
    """BERT's masked-LM head: its transform and vocabulary bias, no pooler; a decoder's
    classification head drops the untied lm_head and the vocabulary logits."""
    from cfgfix.memory.shapes import with_head

    bert = shape_from_config(ROWS["bert-mlm fp32"]["spec"]["config"])
    h, vocab = bert.hidden, bert.vocab
    assert with_head(bert, "masked-lm").params - bert.params == 2 * h + vocab
    llama = shape_from_config(ROWS["llama bf16"]["spec"]["config"])  # untied head
    cls = with_head(llama, "classification")
    assert llama.params - cls.params == llama.vocab * llama.hidden
    lm = estimate(MemorySetup(weights="bf16", micro_batch=4, seq_len=1024), llama)
    classify = estimate(MemorySetup(weights="bf16", micro_batch=4, seq_len=1024, head="classification"), llama)
    assert lm.peak - classify.peak > 3 * 4 * 1024 * llama.vocab  # the fp32 logits, log-softmax and gradients

    write_project(tmp_path, {
        "run.sh": "python train.py\n",
        "train.py": (
            "from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments\n"
            "model = AutoModelForMaskedLM.from_pretrained('bert-base-uncased')\n"
            "Trainer(model=model, args=TrainingArguments(output_dir='o')).train()\n"),
    })
    import os

    from cfgfix.training.memory_setup import memory_input
    from cfgfix.training.resolve import training_setups

    engine, _, _ = lint_project(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        setup = training_setups(engine.project)[0]
    finally:
        os.chdir(cwd)
    assert memory_input(setup).setup.head == "masked-lm"


def test_the_simulator_builds_the_head_too():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cfgfix.memory.simulate import simulate

    bert = {"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 512, "vocab_size": 4000, "max_position_embeddings": 256}
    for head in ("masked-lm", "classification"):
        setup = MemorySetup(micro_batch=2, seq_len=128, device="cpu", optimizer_impl="foreach", head=head)
        simulated = simulate(setup, bert)
        analytic = estimate(setup, shape_from_config(bert))
        assert abs(simulated.params - analytic.shape.params) < 1000  # the classifier's num_labels x hidden
        assert abs(analytic.peak - simulated.peak_bytes) / simulated.peak_bytes < 0.05, head


def test_frozen_models_moved_to_the_gpu_are_counted():
    """Issue 13, item 5: the SDXL story keeps two text encoders and the VAE on every GPU in
    the training dtype besides the UNet (123M + 695M + 84M parameters x 2 B = 1.68 GiB)."""
    import os

    from cfgfix.training.memory_setup import memory_input
    from cfgfix.training.resolve import training_setups

    root = REPO / "fixtures/sdxl-zero2-offload/project"
    engine, _, _ = lint_project(root)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        setup = training_setups(engine.project)[0]
    finally:
        os.chdir(cwd)
    inputs = memory_input(setup)
    frozen = {name: (params, nbytes) for name, params, nbytes in inputs.setup.frozen}
    assert frozen == {"text_encoder_one": (123_060_480, 2), "text_encoder_two": (694_659_840, 2),
                      "vae": (83_653_863, 2)}
    with_frozen = estimate(inputs.setup, inputs.shape)
    without = estimate(replace(inputs.setup, frozen=()), inputs.shape)
    assert with_frozen.peak - without.peak == sum(p * b for p, b in frozen.values())
    assert any("frozen models on the GPU" in note for note in with_frozen.assumptions)


def test_a_frozen_teacher_on_the_gpu_matches_the_h200():
    """The bf16 GPT-2 teacher beside a Llama LoRA run (rows 27 and 42): counted, the estimate
    stays within 4% of max_memory_allocated (+3.4% and +3.0% with the cuBLAS workspaces)."""
    for name in ("llama bf16 lora-r16 + frozen gpt2 teacher on device", "mistral bf16 lora-r16 + frozen gpt2 on device"):
        row = ROWS[name]
        teacher = shape_from_config(row["spec"]["extra"]["config"])
        setup = _setup(row["spec"], frozen=(("teacher", teacher.params, 2),))
        result = estimate(setup, shape_from_config(row["spec"]["config"]))
        measured = row["measured"]["peak_bytes"]
        assert abs(_allocated(result) - measured) / measured < 0.04, name
