"""The live-bytes counter and the FakeTensor simulator behind `cfgfix estimate --simulate`."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.simulate import (
    INSTALL_HINT,
    SimulationUnsupported,
    SimulatorUnavailable,
    simulate,
)

LIVE_BYTES_FILE = Path(__file__).resolve().parents[1] / "cfgfix" / "memory" / "live_bytes.py"

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
# TinyLlama-1.1B's shape
ONE_B_LLAMA = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
TINY_T5 = {
    "model_type": "t5",
    "d_model": 64,
    "d_ff": 128,
    "num_layers": 2,
    "num_heads": 4,
    "d_kv": 16,
    "vocab_size": 1000,
}


# -- LiveBytes -------------------------------------------------------------------------


def test_live_bytes_counts_a_known_allocation():
    torch = pytest.importorskip("torch")
    from cfgfix.memory.live_bytes import LiveBytes

    with LiveBytes() as counter:
        a = torch.empty(1000)  # 4000 B
        b = torch.ones(500, dtype=torch.bfloat16)  # 1000 B
        assert counter.current == 5000
        view = a.view(10, 100)
        a.add_(1)
        assert counter.current == 5000  # a view and an in-place op share the storage
        del a
        assert counter.current == 5000  # the view keeps the storage alive
        del view
        assert counter.current == 1000
        assert counter.peak == 5000
        assert counter.reset_peak() == 5000
        assert counter.peak == 1000
        c = torch.empty(10)
        c.resize_(100)
        assert counter.current == 1400  # a storage grown in place is recounted
    del b, c
    assert counter.current == 0  # frees after the mode is left are still seen


def test_live_bytes_counts_fake_tensors_without_memory():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cfgfix.memory.live_bytes import LiveBytes

    with FakeTensorMode(), LiveBytes() as counter:
        x = torch.empty(1 << 30)  # 4 GiB that never exist
        y = x * 2
        assert counter.current == 8 << 30
        del y
    assert counter.current == 4 << 30
    assert counter.peak == 8 << 30
    del x


def test_live_bytes_can_count_one_device_only():
    torch = pytest.importorskip("torch")
    from cfgfix.memory.live_bytes import LiveBytes

    with LiveBytes(device="cuda") as counter:
        _ = torch.empty(1000)
    assert counter.peak == 0


def test_model_state_bytes_by_kind_counts_tied_weights_once():
    torch = pytest.importorskip("torch")
    from cfgfix.memory.live_bytes import LiveBytes, model_state_bytes

    embed = torch.nn.Embedding(10, 8)
    head = torch.nn.Linear(8, 10, bias=False)
    head.weight = embed.weight  # tied, as in many LMs
    model = torch.nn.Sequential(embed, head)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([1, 2, 3])).sum().backward()
    optimizer.step()

    state = model_state_bytes(model, optimizer)
    weight = 10 * 8 * 4
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a 4-byte step counter
    assert state == {"params": weight, "grads": weight, "optimizer": 2 * weight + 4, "buffers": 0}
    assert model_state_bytes(optimizers=optimizer) == state  # all its weights are trained

    # weights made before the counter started: track_existing adds them once
    with LiveBytes() as counter:
        added = counter.track_existing(model, optimizer)
        assert added == sum(state.values())
        assert counter.track_existing(model, optimizer) == 0
        optimizer.zero_grad(set_to_none=True)
        assert counter.current == sum(state.values()) - weight


def test_live_bytes_is_one_file_needing_only_torch():
    """`cfgfix verify` copies live_bytes.py alone into a user's process."""
    tree = ast.parse(LIVE_BYTES_FILE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported - {"torch"} <= set(sys.stdlib_module_names), imported


# -- the simulator against real tensors --------------------------------------------------


def _real_training_steps(config: dict, batch: int, seq_len: int, steps: int = 2) -> int:
    """A plain training loop on real CPU tensors, written independently of the simulator,
    under the same counter: the peak of live bytes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from cfgfix.memory.live_bytes import LiveBytes

    values = dict(config)
    hf_config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    hf_config.use_cache = False
    with LiveBytes() as counter:
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        for _ in range(steps):
            ids = torch.randint(0, hf_config.vocab_size, (batch, seq_len))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss, ids
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return counter.peak


def test_simulator_matches_a_real_cpu_training_step():
    pytest.importorskip("transformers")
    real_peak = _real_training_steps(TINY_LLAMA, batch=4, seq_len=128)
    result = simulate(MemorySetup(micro_batch=4, seq_len=128), TINY_LLAMA)
    assert result.fake
    assert result.peak_bytes == pytest.approx(real_peak, rel=0.01)
    assert result.phases["backward"] == result.peak_bytes  # the peak: the logits' gradient


@pytest.mark.parametrize(
    "setup",
    [
        MemorySetup(micro_batch=4, seq_len=128, checkpointing=True),
        MemorySetup(micro_batch=4, seq_len=128, weights="bf16"),
        MemorySetup(micro_batch=4, seq_len=128, autocast="bf16"),
        MemorySetup(micro_batch=2, seq_len=64, optimizer="sgd-momentum", gradient_accumulation=4),
        MemorySetup(micro_batch=2, seq_len=64, optimizer="adafactor", weights="bf16"),
    ],
    ids=["checkpointing", "bf16-weights", "bf16-autocast", "sgd-accumulation", "adafactor"],
)
def test_fake_steps_match_the_same_steps_on_real_tensors(setup):
    pytest.importorskip("transformers")
    fake = simulate(setup, TINY_LLAMA)
    real = simulate(setup, TINY_LLAMA, fake=False)
    assert not real.fake
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
    assert fake.state == real.state


def test_lora_under_fake_tensors_matches_real_tensors():
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    setup = MemorySetup(micro_batch=4, seq_len=128, lora_rank=8)
    fake = simulate(setup, TINY_LLAMA)
    real = simulate(setup, TINY_LLAMA, fake=False)
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
    assert 0 < fake.trainable_params < fake.params / 10
    # AdamW state (8 bytes each, plus 4-byte step counters) only for the adapters
    assert 8 * fake.trainable_params <= fake.state["optimizer"] < 8 * fake.trainable_params + 4096
    assert any("LoRA target modules" in note for note in fake.assumptions)

    attention_only = simulate(setup.with_(lora_targets=("q_proj", "v_proj")), TINY_LLAMA)
    assert attention_only.trainable_params < fake.trainable_params  # default: every Linear
    assert attention_only.params - attention_only.trainable_params == fake.params - fake.trainable_params
    assert not attention_only.assumptions


def test_seq2seq_model_is_simulated():
    pytest.importorskip("transformers")
    setup = MemorySetup(micro_batch=2, seq_len=64, target_len=16)
    fake = simulate(setup, TINY_T5)
    real = simulate(setup, TINY_T5, fake=False)
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
    # the decoder's logits scale with the target length
    longer = simulate(setup.with_(target_len=64), TINY_T5)
    assert longer.peak_bytes > fake.peak_bytes


def test_mixture_of_experts_in_bf16_is_simulated():
    pytest.importorskip("transformers")
    config = {
        **TINY_LLAMA,
        "model_type": "mixtral",
        "intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    setup = MemorySetup(micro_batch=2, seq_len=64, weights="bf16")
    fake = simulate(setup, config)
    real = simulate(setup, config, fake=False)
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)


def test_a_one_billion_parameter_step_at_batch_4x2048_in_under_a_minute():
    pytest.importorskip("transformers")
    plain = simulate(MemorySetup(micro_batch=4, seq_len=2048), ONE_B_LLAMA)
    checkpointed = simulate(MemorySetup(micro_batch=4, seq_len=2048, checkpointing=True), ONE_B_LLAMA)

    assert plain.wall_seconds < 60 and checkpointed.wall_seconds < 60
    assert 1.0e9 < plain.params < 1.2e9
    # fp32 weights and AdamW: 4 bytes of weights and 8 of state per parameter (plus one
    # 4-byte step counter per tensor)
    assert plain.state["params"] == 4 * plain.params
    assert 8 * plain.params <= plain.state["optimizer"] < 8 * plain.params + 4096
    # after the build: the weights, plus the rotary tables (buffers and a plain attribute)
    assert 0 <= plain.phases["model"] - plain.state["params"] < 1 << 20
    # at this batch activations outweigh the 16 bytes per parameter of model states;
    # checkpointing keeps only the layer inputs
    assert plain.peak_bytes - 16 * plain.params > 16 * plain.params
    assert checkpointed.peak_bytes < 0.6 * plain.peak_bytes
    assert checkpointed.peak_bytes > 16 * plain.params


# -- the result and its refusals -------------------------------------------------------


def test_result_states_cuda_context_and_allocator_margin_separately():
    pytest.importorskip("transformers")
    result = simulate(MemorySetup(micro_batch=1, seq_len=32), TINY_LLAMA, steps=1)
    assert result.cuda_context_bytes > 0 and result.allocator_margin_bytes > 0
    assert result.device_bytes == result.peak_bytes + result.cuda_context_bytes + result.allocator_margin_bytes
    low, high = result.peak_range
    assert low < result.peak_bytes < high
    assert result.steps == 1 and result.wall_seconds > 0


def test_unknown_sequence_length_is_stated():
    pytest.importorskip("transformers")
    config = dict(TINY_LLAMA, max_position_embeddings=64)
    result = simulate(MemorySetup(micro_batch=1), config, steps=1)
    assert result.assumptions == ["sequence length unknown: 64 assumed"]


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"zero_stage": 3}, "ZeRO"),
        ({"fsdp": "full"}, "FSDP"),
        ({"quantization": "4bit"}, "quantized"),
        ({"optimizer": "adamw-8bit"}, "8-bit AdamW"),
    ],
)
def test_setups_one_fake_process_cannot_reproduce_are_refused(changes, named):
    with pytest.raises(SimulationUnsupported, match=named):
        simulate(MemorySetup(micro_batch=1, seq_len=32, **changes), TINY_LLAMA)


@pytest.mark.parametrize("config", [{"hidden_size": 64}, {"model_type": "no-such-model"}])
def test_a_config_that_builds_no_model_is_refused(config):
    pytest.importorskip("transformers")
    with pytest.raises(SimulationUnsupported, match="model"):
        simulate(MemorySetup(micro_batch=1, seq_len=32), config)


def test_without_torch_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(SimulatorUnavailable) as raised:
        simulate(MemorySetup(micro_batch=1, seq_len=32), TINY_LLAMA)
    assert INSTALL_HINT in str(raised.value)
    assert INSTALL_HINT == "pip install 'cfgfix[verify]'"


def test_importing_the_simulator_does_not_import_torch():
    code = "import sys, cfgfix.memory.simulate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
