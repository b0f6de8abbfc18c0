"""What a LoRA run on an LLM.int8 (bitsandbytes 8-bit) base holds beyond one byte per weight.

Read from the released code of bitsandbytes 0.37.2 and 0.41.1 (`autograd/_functions.py`
`MatMul8bitLt`, `nn/modules.py` `Linear8bitLt` / `Int8Params`, `functional.py`
`get_transform_buffer` / `get_special_format_str`) and peft 0.2.0 / 0.3.0 (`utils/other.py`
`prepare_model_for_int8_training`):

- weights: `Int8Params.cuda` keeps the row-major int8 weight and one fp32 absmax per output row
  (`SCB`); on cards with int8 tensor cores (compute capability >= 7.5) the first forward turns
  the weight into the tiled `col_turing` (capability 7.x and 9.x) or `col_ampere` (8.x) layout,
  padded to whole tiles (8 or 32 rows by 32 columns), and deletes the row-major copy;
- outliers: every forward splits off the input columns holding a value of magnitude >= the
  threshold (6.0 in transformers' `llm_int8_threshold`) and keeps, per Linear, the matching
  weight columns dequantised to fp16 (`state.subB`, live until the next forward) and, for
  backward, those input columns (`subA`): how many columns is a property of the data, from none
  to every column of the input;
- saved for backward per Linear: the int8 transposed input (`CAt`) and its fp32 column scales;
  0.41.1 also keeps the 16/32-bit input itself (`ctx.tensors = (CAt, subA, A)`), 0.37.2 does not;
- backward, per Linear: the gradient's int8 quantisation (`double_quant`: two int8 copies), then
  the weight back in row-major order (`undo_layout`: int8) and dequantised to fp16 for the
  input's gradient: one Linear at a time; without int8 tensor cores (V100, capability 7.0) the
  forward dequantises the weight to fp16 too (`state.CB.to(A.dtype)`) and clones the input;
- forward, per Linear: `double_quant` (two int8 copies of the input), its `col32` copy, the
  int32 product (`igemmlt`) and the 16-bit output.

Fp32 copies of the non-int8 parameters (embeddings, head, norms) are the weights term of the
estimator (peft >= 0.3 `prepare_model_for_int8_training` casts every 16-bit parameter to fp32;
0.2.0 only norms named `layer_norm` and an fp32 cast of the logits, `CastOutputToFloat`).
"""

from __future__ import annotations

from cfgfix.records import dataclass

# transformers' BitsAndBytesConfig llm_int8_threshold default (Linear8bitLt's threshold)
OUTLIER_THRESHOLD = 6.0
_TILES = {"col_turing": (8, 32), "col_ampere": (32, 32)}


@dataclass(frozen=True)
class Int8Terms:
    weights: int  # bytes beside one byte per int8 weight: row scales, tile padding
    weights_formula: str
    saved_per_layer: int  # kept for backward by one layer's int8 Linears (no checkpointing)
    temporaries: int  # the largest per-Linear transient (forward quantisation or backward dequantisation)
    outliers_high: int  # the band's top: every input column an outlier (fp16 weight columns + saved inputs)
    notes: tuple[str, ...]


def tile_format(generation: str | None) -> str | None:
    """bitsandbytes' weight layout by the card's generation (`get_special_format_str`,
    `supports_igemmlt`): None where igemmlt is not used (Volta, Pascal)."""
    if generation in ("volta", "pascal"):
        return None
    return "col_ampere" if generation in ("ampere", "ada") else "col_turing"


def _padded(rows: int, cols: int, layout: str | None) -> int:
    if layout is None:
        return rows * cols
    tile_rows, tile_cols = _TILES[layout]
    return (-(-rows // tile_rows) * tile_rows) * (-(-cols // tile_cols) * tile_cols)


def int8_terms(linears: list[tuple[int, int, int]], tokens: int, act_bytes: int, input_bytes: int,
               generation: str | None, layers: int, checkpointing: bool) -> Int8Terms:
    """The LLM.int8 terms of a model whose int8 Linears are `linears` (count, in, out), at
    `tokens` tokens per micro batch. act_bytes: the Linears' input dtype (what `A` is);
    input_bytes: 2 (the fp16 cast every input gets)."""
    layout = tile_format(generation)
    scales = sum(n * o * 4 for n, _, o in linears)
    padding = sum(n * (_padded(o, i, layout) - o * i) for n, i, o in linears)
    largest_in, largest_out = max(i for _, i, _ in linears), max(o for _, _, o in linears)
    largest = max(i * o for _, i, o in linears)
    forward = tokens * (3 * largest_in + 4 * largest_out + input_bytes * largest_out)
    if layout is None:
        # no int8 tensor cores: the weight dequantised to fp16 in forward and backward, the input cloned
        forward += 2 * largest + act_bytes * tokens * largest_in
        backward = 2 * largest + 2 * tokens * largest_out
    else:
        # gradient int8 copies (2 x tokens x out), undo_layout's int8 row-major weight + its fp16 copy
        backward = 2 * tokens * largest_out + 3 * largest
    per_layer_linears = [(n // max(layers, 1), i, o) for n, i, o in linears]
    saved = sum(n * tokens * i * 1 + n * i * 4 for n, i, o in per_layer_linears)  # CAt + column scales
    outlier_weights = sum(n * i * o * 2 for n, i, o in linears)
    outlier_inputs = sum(n * tokens * i * input_bytes for n, i, o in per_layer_linears)
    outliers = outlier_weights + (outlier_inputs if checkpointing else outlier_inputs * layers)
    where = {"col_ampere": "col_ampere tiles (8.x cards)", "col_turing": "col_turing tiles",
             None: "row-major (no int8 tensor cores: the weight is dequantised to fp16 in forward and backward)"}[layout]
    notes = (
        (f"LLM.int8 base (bitsandbytes 0.37-0.41): one fp32 scale per weight row ({scales / 2**20:.0f} MiB), weights in "
        f"{where}; per Linear, backward dequantises its weight to fp16 ({temp_words(largest, layout)})"),
        (f"LLM.int8 outliers: input columns with a value of magnitude >= {OUTLIER_THRESHOLD:g} keep their weight columns in "
        f"fp16 (state.subB) and their inputs for backward; how many is a property of the data, from none (counted) to every "
        f"column (the band's top: +{outliers / 2**30:.2f} GiB)"),
    )
    wf = f"+ int8 row scales {scales / 2**20:.0f} MiB" + (f" + tile padding {padding / 2**20:.0f} MiB" if padding else "")
    return Int8Terms(scales + padding, wf, saved, max(forward, backward), outliers, notes)


def temp_words(largest: int, layout: str | None) -> str:
    per_weight = 2 if layout is None else 3
    return f"{per_weight} B x the largest Linear's {largest / 1e6:.0f}M weights at a time"
