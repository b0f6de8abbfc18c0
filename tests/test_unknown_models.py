"""Models cfgfix has no config for (issue 21 item 4): a bare parameter count gets guessed
decoder shapes whose band runs from a small vocabulary with SDPA to a Gemma-sized vocabulary
with eager attention; a name that states a size gives a parameter range; catalog entries read
from published configs agree with their cards."""

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.memory.estimator import estimate
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import (
    ShapeError,
    catalog_entry,
    guessed_decoder_shapes,
    params_only,
    resolve_shape,
    shape_from_catalog,
    size_from_name,
)
from cfgfix.records import replace


@pytest.mark.parametrize("params", [0.5e9, 3e9, 7.72e9, 70e9])
def test_guessed_shapes_keep_the_count_and_the_stated_proportions(params):
    guesses = guessed_decoder_shapes(int(params))
    assert [g.vocab for g in guesses.values()] == [32_000, 128_256, 262_144]
    for end, guess in guesses.items():
        assert guess.params == int(params)
        assert guess.hidden % 128 == 0
        per_layer = {"low": 128, "point": 96, "high": 56}[end]
        assert guess.layers == max(round(guess.hidden / per_layer), 1)
    assert guesses["high"].head_dim == 64 and guesses["point"].head_dim == 128
    # the body (without embedding and head) is ~12 h^2 per layer
    low = guesses["low"]
    body = params - 2 * low.vocab * low.hidden
    assert body == pytest.approx(12 * low.hidden**2 * low.layers, rel=0.25)


def test_a_bare_count_puts_the_vocabulary_and_eager_attention_at_the_top():
    setup = MemorySetup(params=int(7e9), weights="bf16", micro_batch=2, seq_len=4096, checkpointing=True)
    result = estimate(setup)
    top = estimate(replace(setup, params=None, attention="eager"), guessed_decoder_shapes(int(7e9))["high"])
    bottom = estimate(replace(setup, params=None), guessed_decoder_shapes(int(7e9))["low"])
    assert result.high == top.high and result.low <= bottom.low
    # the top holds the fp32 logits of 262,144 entries: more than the point's 128,256 by that much at least
    assert result.high - result.peak >= 4 * 2 * 4096 * (262_144 - 128_256)
    assert result.shape.family == "params" and result.shape.params == int(7e9)
    assert any("262,144" in a for a in result.assumptions)
    # a run that names its attention keeps it at the top too (activations dominate a LoRA run)
    lora = replace(setup, lora_rank=16, checkpointing=False)
    assert estimate(replace(lora, attention="sdpa")).high < estimate(lora).high


@pytest.mark.parametrize("name, stated", [
    ("bigscience/bloom-3b", 3e9), ("someone/open-thing-7B-chat", 7e9), ("bigscience/bloom-560m", 560e6),
    ("local/qwen-1.8b-tuned", 1.8e9),
])
def test_a_size_in_the_name_gives_a_range(name, stated):
    shape = size_from_name(name)
    assert shape.family == "params" and shape.params == int(stated)
    assert shape.params_range == (int(stated * 0.9), int(stated * 1.25))
    assert "read from the name" in shape.notes[0]
    result = estimate(MemorySetup(weights="bf16", seq_len=512), shape)
    at_top = estimate(MemorySetup(weights="bf16", seq_len=512), params_only(int(stated * 1.25)))
    assert result.high == at_top.high


def test_experts_in_the_name_and_names_without_one_size():
    moe = size_from_name("acme/secret-8x22B")
    assert moe.params == int(0.8 * 176e9) and moe.params_range == (int(0.75 * 176e9), int(176e9))
    assert size_from_name("Qwen/Qwen1.5-MoE-A2.7B-x") is None  # an active size is not the model's
    assert size_from_name("org/model-7b-to-13b") is None
    assert size_from_name("org/no-size-here") is None
    assert size_from_name("x/llama-3-8b-vision-tuned") is None  # a VL model is not a text decoder of that size
    with pytest.raises(ShapeError):
        resolve_shape("org/no-size-here")
    assert resolve_shape("bigscience/bloom-3b").params_range


@pytest.mark.parametrize("model_id, family, card, rel", [
    ("Qwen/Qwen-7B-Chat", "qwen2", 7.72e9, 0.01),
    ("Qwen/Qwen3-4B-Instruct-2507", "qwen3", 4.0e9, 0.01),
    ("mistral-community/Mixtral-8x22B-v0.1", "mixtral", 141e9, 0.01),
    ("openlm-research/open_llama_3b_v2", "llama", 3.43e9, 0.01),
    ("google/gemma-3-12b-it", "gemma3_text", 12.2e9, 0.01),
    ("openai/whisper-large-v2", "whisper", 1.55e9, 0.01),
    ("openai/clip-vit-base-patch16", "clip", 149.6e6, 0.01),
])
def test_catalog_entries_from_published_configs(model_id, family, card, rel):
    shape = shape_from_catalog(model_id)
    assert shape.family == family
    assert shape.params == pytest.approx(card, rel=rel)
    assert catalog_entry(model_id)["source"]


def test_mixtral_8x22b_active_parameters_match_the_announcement():
    assert shape_from_catalog("Mixtral-8x22B").active_params == pytest.approx(39e9, rel=0.01)


def test_whisper_takes_a_target_length():
    args = ["estimate", "--model", "openai/whisper-large-v2", "--precision", "amp-fp16", "--seq", "1500",
            "--target-seq", "225", "--checkpointing", "--output-format", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 1), result.output
    longer = CliRunner().invoke(cli, [*args[:-4], "--target-seq", "448", *args[-3:]])
    assert '"peak_bytes"' in result.output and result.output != longer.output
