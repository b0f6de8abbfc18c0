"""The LLM.int8 (bitsandbytes 8-bit) base under LoRA: each figure derived by hand from the
released code (bitsandbytes 0.37.2 / 0.41.1 MatMul8bitLt and Linear8bitLt, peft 0.3.0
prepare_model_for_int8_training), not from a report."""

import pytest

from cfgfix.memory.estimator import GIB, estimate
from cfgfix.memory.llm_int8 import int8_terms, tile_format
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.records import replace

LLAMA_7B = shape_from_catalog("meta-llama/Llama-2-7b-hf")
# one Llama-2-7B layer's Linears (in, out): q, k, v, o, gate, up, down
LAYER = [(4096, 4096)] * 4 + [(4096, 11008)] * 2 + [(11008, 4096)]
LINEARS = [(32, i, o) for i, o in LAYER]


def test_layout_by_generation_follows_get_special_format_str():
    # capability 8.x -> col_ampere, 7.5 and 9.x -> col_turing, below 7.5 no igemmlt (row-major)
    assert tile_format("ampere") == tile_format("ada") == "col_ampere"
    assert tile_format("turing") == tile_format("hopper") == "col_turing"
    assert tile_format("volta") is None


def test_row_scales_and_tile_padding():
    terms = int8_terms(LINEARS, tokens=1024, act_bytes=2, input_bytes=2, generation="ampere", layers=32,
                       checkpointing=True)
    # SCB: one fp32 per output row of every Linear; Llama's dimensions are whole 32 x 32 tiles
    assert terms.weights == 32 * (4 * 4096 + 2 * 11008 + 4096) * 4
    odd = int8_terms([(1, 4096, 4100)], 8, 2, 2, "ampere", 1, True)
    # 4100 rows pad to 4128 (col_ampere: 32-row tiles); col_turing pads rows to 8 (4104)
    assert odd.weights == 4100 * 4 + (4128 - 4100) * 4096
    assert int8_terms([(1, 4096, 4100)], 8, 2, 2, "turing", 1, True).weights == 4100 * 4 + 4 * 4096
    assert int8_terms([(1, 4096, 4100)], 8, 2, 2, "volta", 1, True).weights == 4100 * 4


def test_backward_dequantisation_and_forward_quantisation_transients():
    tokens = 4 * 256
    terms = int8_terms(LINEARS, tokens, 2, 2, "ampere", 32, True)
    largest = 4096 * 11008
    backward = 2 * tokens * 11008 + 3 * largest  # double_quant(grad) int8 x 2 + undo_layout int8 + fp16 weight
    forward = tokens * (3 * 11008 + 4 * 11008 + 2 * 11008)  # CA, CAt, col32 int8 + int32 product + fp16 output
    assert terms.temporaries == max(forward, backward)
    volta = int8_terms(LINEARS, tokens, 2, 2, "volta", 32, True)
    # no igemmlt: the fp16 dequantised weight in forward, with the cloned input
    assert volta.temporaries == tokens * (3 * 11008 + 4 * 11008 + 2 * 11008) + 2 * largest + 2 * tokens * 11008


def test_saved_inputs_and_outlier_range():
    tokens = 512
    terms = int8_terms(LINEARS, tokens, 2, 2, "ampere", 32, checkpointing=False)
    # CAt (int8, tokens x in) and SCAt (fp32, in) per Linear per layer
    assert terms.saved_per_layer == sum(tokens * i + 4 * i for i, _ in LAYER)
    # every column an outlier: subB is the whole weight in fp16, subA every input in fp16, in every layer
    weights = sum(32 * i * o for i, o in LAYER)
    assert terms.outliers_high == 2 * weights + 32 * sum(2 * tokens * i for i, _ in LAYER)
    ckpt = int8_terms(LINEARS, tokens, 2, 2, "ampere", 32, checkpointing=True)
    assert ckpt.outliers_high == 2 * weights + sum(2 * tokens * i for i, _ in LAYER)


def test_the_estimate_carries_the_int8_terms_and_the_outlier_top():
    setup = MemorySetup(weights="fp16", lora_rank=8, quantization="8bit", micro_batch=4, seq_len=256,
                        checkpointing=True, gpu="RTX 3090")
    result = estimate(setup, LLAMA_7B)
    four_bit = estimate(replace(setup, quantization="4bit"), LLAMA_7B)
    assert "int8 row scales" in result.component("weights").formula
    assert any("outliers" in a and "property of the data" in a for a in result.assumptions)
    # the band's top holds every weight column in fp16 besides the int8 weight
    assert result.high - result.peak > 2 * LLAMA_7B.block_linear_params * 0.99
    assert four_bit.high - four_bit.peak < 2 * GIB
    # a 13B base on a 24 GiB card: the point fits, the top does not -> not "fits" with certainty
    big = estimate(setup, shape_from_catalog("meta-llama/Llama-2-13b-hf"))
    assert big.peak < 23 * GIB < big.high


@pytest.mark.parametrize("autocast", [None, "fp16"])
def test_kbit_preparation_keeps_the_residual_stream_in_fp32(autocast):
    # peft >= 0.3 casts the embeddings and norms to fp32: with checkpointing every layer input is fp32
    base = MemorySetup(weights="fp16", autocast=autocast, lora_rank=8, quantization="4bit", micro_batch=2,
                       seq_len=1024, checkpointing=True)
    saved = estimate(base, LLAMA_7B).component("activations").formula
    assert f"layer inputs {32 * 2048 * 4096 * 4 / GIB:.3g} GiB" in saved
