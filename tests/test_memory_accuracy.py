"""The estimator against real CPU training steps of tiny models (torch, transformers, peft).

Model states (parameters, gradients, optimizer states) must match the tensors' bytes exactly;
activations and the peak must fall inside the estimate's stated band, measured with
`cfgfix.memory.live_bytes.LiveBytes` on a second step (the first one creates the state).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cfgfix.memory.estimator import estimate  # noqa: E402
from cfgfix.memory.live_bytes import LiveBytes, model_state_bytes  # noqa: E402
from cfgfix.memory.setup import MemorySetup  # noqa: E402
from cfgfix.memory.shapes import params_only, shape_from_config  # noqa: E402

V = 1000
ACTIVATION_BAND = 0.15  # the estimator's stated band for decoder LMs (estimator._activations)


def _llama():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=V, max_position_embeddings=512)


def _gpt2():
    # dropout off: on a CPU, SDPA with dropout falls back to the math kernel (s^2 saved), unlike CUDA's flash kernel
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=V, n_positions=256,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _t5():
    return transformers.T5Config(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=2, vocab_size=V,
                                 feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                                 decoder_start_token_id=0, pad_token_id=0)


def _build(config, weights, lora_rank=None, checkpointing=False):
    torch.manual_seed(0)
    if config.model_type == "t5":
        model = transformers.T5ForConditionalGeneration(config)  # SDPA, transformers 5's default (the estimator's assumption)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank:
        peft = pytest.importorskip("peft")
        target = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}[config.model_type]
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora_rank, target_modules=target, lora_dropout=0.0))
    model.train()
    return model


def _optimizer(params, name):
    params = [p for p in params if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=False)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    raise ValueError(name)


def _step(model, optimizer, batch, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _measure(config, *, weights="fp32", autocast=False, optimizer="adamw", lora_rank=None, checkpointing=False, b=4, s=64):
    model = _build(config, weights, lora_rank, checkpointing)
    opt = _optimizer(model.parameters(), optimizer)
    ids = torch.randint(1, V, (b, s))
    batch = {"input_ids": ids, "labels": ids}
    if config.model_type == "t5":
        batch["labels"] = torch.randint(1, V, (b, s))
    _step(model, opt, batch, autocast)
    grads = {}
    for p in model.parameters():  # the gradients' bytes, before zero_grad of a step
        if p.requires_grad:
            grads[p] = p.numel() * p.element_size()
    states = model_state_bytes(model, opt)
    # torch keeps each parameter's step counter as a 0-d fp32 tensor on the CPU (torch/optim/adam.py,
    # non-capturable): not GPU memory, so the estimator leaves it out
    # and Adafactor a 0-d "RMS" per parameter: per-tensor scalars the estimator leaves out
    step_counters = sum(v.nbytes for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() == 0)
    with LiveBytes() as counter:
        counter.track_existing(model, opt)
        base = counter.current
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        activations = counter.current - base
        loss.backward()
        optimizer_step_peak = counter.peak
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "params": states["params"], "grads": sum(grads.values()), "optimizer": states["optimizer"] - step_counters,
        "activations": activations, "peak": max(counter.peak, optimizer_step_peak), "buffers": states["buffers"],
    }


def _setup(*, weights="fp32", autocast=False, optimizer="adamw", lora_rank=None, checkpointing=False, b=4, s=64, **kw):
    # device="cpu": compared with real CPU steps, whose kernels the estimate must then follow
    return MemorySetup(weights=weights, autocast="bf16" if autocast else None, optimizer=optimizer, lora_rank=lora_rank,
                       checkpointing=checkpointing, micro_batch=b, seq_len=s, device="cpu", **kw)


CASES = [
    ("llama", _llama, dict()),
    ("llama", _llama, dict(autocast=True)),
    ("llama", _llama, dict(weights="bf16")),
    ("llama", _llama, dict(checkpointing=True)),
    ("llama", _llama, dict(optimizer="sgd-momentum", b=8)),
    ("llama", _llama, dict(lora_rank=8)),
    ("llama", _llama, dict(weights="bf16", lora_rank=4, s=128)),
    ("gpt2", _gpt2, dict()),
    ("gpt2", _gpt2, dict(autocast=True, s=128)),
    ("t5", _t5, dict(weights="bf16")),
]


@pytest.mark.parametrize("family,config_fn,kw", CASES, ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'fp32'}" for f, _, kw in CASES])
def test_estimate_matches_a_real_cpu_step(family, config_fn, kw):
    config = config_fn()
    shape = shape_from_config(config.to_dict())
    measured = _measure(config, **kw)
    result = estimate(_setup(**kw), shape)
    # model states: exact (the estimator's CUDA-context constant and buckets are not on a CPU)
    assert measured["params"] == result.component("weights").size
    assert measured["grads"] == result.component("gradients").size
    assert measured["optimizer"] == result.component("optimizer_states").size
    # activations (plus autocast's 16-bit weight copies, which the forward also keeps) within the band
    low, high = 1 - ACTIVATION_BAND, 1 + ACTIVATION_BAND
    predicted = result.component("activations").size + (result.component("temporaries").size if kw.get("autocast") else 0)
    if kw.get("autocast"):  # temporaries also hold the loss gradient, which is not live after forward
        predicted -= 2 * 4 * kw.get("b", 4) * kw.get("s", 64) * V
    assert low * predicted <= measured["activations"] <= high * predicted, (measured["activations"], predicted)
    # the peak, without the GPU-only constant (context), inside the estimate's band
    cpu_peak = result.peak - result.component("cuda_context").size
    band_low = result.low - result.component("cuda_context").size
    band_high = result.high - result.component("cuda_context").size
    assert band_low <= measured["peak"] + measured["buffers"] * 0 <= band_high, (measured["peak"], cpu_peak, band_low, band_high)


def test_adafactor_states_exact_on_llama():
    config = _llama()
    measured = _measure(config, optimizer="adafactor", b=2, s=32)
    result = estimate(_setup(optimizer="adafactor", b=2, s=32), shape_from_config(config.to_dict()))
    assert measured["optimizer"] == result.component("optimizer_states").size


def test_small_module_model_states_exact():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.randn(4, 32)).sum().backward()
    grads = sum(p.grad.nbytes for p in model.parameters())
    opt.step()
    states = sum(v.nbytes for st in opt.state.values() for k, v in st.items() if k != "step")
    result = estimate(MemorySetup(params=params), params_only(params))
    assert result.component("weights").size == sum(p.nbytes for p in model.parameters())
    assert result.component("gradients").size == grads
    assert result.component("optimizer_states").size == states


META_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, vocab_size=3000),
    "qwen2": lambda: transformers.Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, vocab_size=3000, tie_word_embeddings=True),
    "mistral": lambda: transformers.MistralConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, vocab_size=3000),
    "gemma": lambda: transformers.GemmaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=1, head_dim=64, vocab_size=3000),
    "gemma2": lambda: transformers.Gemma2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=3000),
    "phi": lambda: transformers.PhiConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8, vocab_size=3000),
    "phi3": lambda: transformers.Phi3Config(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, vocab_size=3000, pad_token_id=0),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8, vocab_size=3000),
    "gpt2": lambda: transformers.GPT2Config(n_embd=256, n_layer=3, n_head=8, vocab_size=3000, n_positions=512),
    "t5": lambda: transformers.T5Config(d_model=256, d_ff=512, d_kv=32, num_heads=8, num_layers=3, num_decoder_layers=2, vocab_size=3000, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "bert": lambda: transformers.BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8, vocab_size=3000),
}


@pytest.mark.parametrize("family", sorted(META_CONFIGS))
def test_param_count_from_config_matches_meta_instantiation(family):
    config = META_CONFIGS[family]()
    auto = {"t5": transformers.AutoModelForSeq2SeqLM, "bert": transformers.AutoModel}.get(family, transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    assert abs(shape_from_config(config.to_dict()).params - real) <= 0.005 * real
