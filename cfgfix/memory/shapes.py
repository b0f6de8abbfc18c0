"""Model shapes: parameter counts and the dimensions the activation model needs, computed
from a Hugging Face `config.json` (or a diffusers UNet config) without importing torch.

Each family's count follows the module layout of its transformers / diffusers class (cited
per function); a test instantiates the same config on the meta device and compares.
A shape also lists, per kind of block, its Linear layers: LoRA adapters, 4/8-bit
quantisation and autocast's 16-bit weight copies all act on exactly those.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cfgfix.memory import families
from cfgfix.memory.shape_model import BlockKind, Linear, ModelShape, gelu_tensors
from cfgfix.records import replace

__all__ = ["BlockKind", "Linear", "ModelShape", "ShapeError", "resolve_shape", "shape_from_config"]

class ShapeError(ValueError):
    """A config this module cannot read."""


def with_head(shape: ModelShape, head: str | None) -> ModelShape:
    """The shape with the head the script builds. "classification": no vocabulary head (a
    num_labels x hidden score/classifier Linear, left out); BERT's "masked-lm"
    (BertForMaskedLM, modeling_bert.py): no pooler, a transform (dense h x h with bias,
    LayerNorm) and a vocabulary bias; the decoder weight is tied to the word embeddings."""
    from cfgfix.records import replace

    if head is None or shape.family in ("params", "unet", "t5"):
        return shape
    h = shape.hidden
    if shape.family == "bert":
        if head == "masked-lm":
            return replace(shape, params=shape.params - (h * h + h) + (h * h + h + 2 * h) + shape.vocab,
                           head_params=0, source=shape.source + " + masked-LM head")
        return shape  # BertForSequenceClassification: the pooler (counted) + a num_labels classifier
    if head == "classification":
        return replace(shape, params=shape.params - shape.head_params, head_params=0,
                       source=shape.source + " + classification head")
    return shape


def params_only(params: int, source: str = "--params") -> ModelShape:
    """A bare parameter count: the estimator assumes the rest."""
    return ModelShape(family="params", params=int(params), source=source)


# A bare parameter count (--params, an unknown model): the activation terms need a shape, so one
# is guessed for a decoder LM of that size, three times. A layer holds ~12 h^2 weights (attention
# 4 h^2, a SwiGLU MLP of 8/3 h: 8 h^2), so with c channels per layer h^3 ~ c x the non-embedding
# weights / 12. The unknowns that move the peak, each at the end that costs more memory at the top:
# - the vocabulary (fp32 logits): 32,000 (LLaMA-1/2, Mistral v0.1) at the bottom, 128,256
#   (Llama-3) at the point, 262,144 (Gemma-3; BLOOM's 250,880 and Qwen's 151,936 below it) at the top;
# - the depth: 128 channels per layer (Llama-2 7B 4096 / 32, Qwen2.5-7B 3584 / 28) at the bottom,
#   96 at the point (Llama-2 70B 8192 / 80: 102, BLOOM-3B 2560 / 30: 85, Gemma-3-12B 3840 / 48: 80),
#   56 at the top (Qwen2.5-1.5B 1536 / 28, the narrowest of the catalog's models of 1B and more):
#   more layers keep more activations and more per-head attention scores;
# - the head size: 128 (Llama) at the bottom and point, 64 at the top (more heads);
# - attention: SDPA at the bottom and point, eager's per-head score tensors at the top (BLOOM's
#   ALiBi, Gemma-2, remote-code models without SDPA), unless the run names its attention.
GUESSED_DECODERS = {  # end -> (vocabulary, channels per layer, head size)
    "low": (32_000, 128, 128),
    "point": (128_256, 96, 128),
    "high": (262_144, 56, 64),
}


def guessed_decoder_shapes(params: int) -> dict[str, ModelShape]:
    """Three Llama-like decoder shapes of `params` parameters ("low", "point", "high"), each
    with its assumption in words; their parameter count is `params` exactly."""
    out = {}
    for end, (vocab, per_layer, head_dim) in GUESSED_DECODERS.items():
        h = max(int((params * per_layer / 12) ** (1 / 3)), 128)
        for _ in range(4):  # the embedding and head take vocab x h each: solve again without them
            body = max(params - 2 * vocab * h, params // 2)
            h = max(int((body * per_layer / 12) ** (1 / 3)) // 128 * 128, 128)
        layers = max(round(h / per_layer), 1)
        inter = max(int(8 * h / 3) // 256 * 256, 256)
        heads = max(h // head_dim, 1)
        config = {"model_type": "llama", "hidden_size": h, "num_hidden_layers": layers, "vocab_size": vocab,
                  "num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": inter,
                  "tie_word_embeddings": False}
        shape = _llama_like(config, f"guessed from {params / 1e9:.3g}B parameters")
        words = (f"no model shape: Llama-like decoders of {params / 1e9:.3g}B parameters guessed for the activations; "
                 f"the point: hidden {h}, {layers} layers, {heads} heads, vocabulary {vocab:,}" if end == "point" else "")
        out[end] = replace(shape, params=int(params), notes=(words,) if words else ())
    band = ("the band runs from a 32,000-entry vocabulary and 128 channels per layer (bottom) to a 262,144-entry "
            "vocabulary, 56 channels per layer, 64-wide heads and eager attention's score tensors (top)")
    out["point"] = replace(out["point"], notes=(*out["point"].notes, band))
    return out


def shape_from_config_file(path: str | Path) -> ModelShape:
    """`config.json` of a model folder (or the folder itself; a diffusers pipeline folder
    is read through its `unet/config.json`)."""
    path = Path(path)
    if os.path.isdir(path):
        for candidate in (path / "config.json", path / "unet" / "config.json", path / "transformer" / "config.json"):
            if os.path.isfile(candidate):
                path = candidate
                break
        else:
            raise ShapeError(f"{path}: no config.json")
    try:
        config = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested past the JSON decoder's depth
        raise ShapeError(f"{path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ShapeError(f"{path}: not a JSON object")
    return shape_from_config(config, source=str(path))


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    _refuse_absurd_sizes(config, source)
    if config.get("_class_name") == "UNet2DConditionModel" or "down_block_types" in config:
        return _unet(config, source)
    if config.get("_class_name") in DIFFUSERS_BUILDERS:
        return _build(DIFFUSERS_BUILDERS[config["_class_name"]], config, source)
    model_type = config.get("model_type", "")
    if model_type == "llava_next" or "text_config" in config and model_type.startswith("llava"):
        raise ShapeError("multimodal configs: use the catalog entry or --params (text and vision towers are not counted here)")
    builder = _BUILDERS.get(model_type) or BUILDERS.get(model_type)
    if builder is None:
        raise ShapeError(f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_FAMILIES)})")
    return _build(builder, config, source)


def part_shape_from_config(config: dict, source: str = "config.json") -> ModelShape | None:
    """A family sized only as a part of a composite model (a CLIP vision tower), or None."""
    builder = _PART_BUILDERS.get(config.get("model_type"))
    return _build(builder, config, source) if builder is not None else None


# `cfgfix estimate` turns this on: a config.json without a key its family needs is completed
# from the installed transformers' configuration class defaults (configuration_<family>.py).
# `cfgfix check` leaves it off: it must not import transformers.
COMPLETE_FROM_TRANSFORMERS = False


def transformers_defaults(config: dict) -> dict | None:
    """`config` completed with the installed transformers' defaults for its model_type (the
    configuration class's __init__ defaults, as `AutoConfig.for_model` fills them), or None
    when transformers is not installed or does not know the model_type."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return None
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    values = {k: v for k, v in config.items() if k != "model_type"}
    try:
        completed = AutoConfig.for_model(model_type, **values).to_dict()
    except Exception:  # noqa: BLE001 - an unknown model_type or a value transformers rejects: not completed
        return None
    for key, value in completed.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            completed[key] = {**value, **config[key]}
    return {**completed, **{k: v for k, v in config.items() if not isinstance(v, dict)}}


def _build(builder, config: dict, source: str) -> ModelShape:
    """A builder's shape; a config.json with a missing or mistyped dimension (a user's edit,
    a truncated download) is a ShapeError naming it, never a crash of the rules that size it.
    With COMPLETE_FROM_TRANSFORMERS, a missing key is first taken from transformers' defaults."""
    filled: dict = {}
    completed = None
    while True:
        try:
            shape = _build_once(builder, {**config, **filled}, source)
        except _MissingKey as exc:
            if not COMPLETE_FROM_TRANSFORMERS or exc.key in filled:
                raise
            completed = completed if completed is not None else transformers_defaults(config)
            if completed is None or exc.key not in completed:
                raise
            filled[exc.key] = completed[exc.key]
            continue
        if filled:
            listed = ", ".join(f"{key} {value!r}" for key, value in filled.items())
            note = (f"not in the config, taken from transformers' {config.get('model_type')} configuration defaults: {listed}")
            shape = replace(shape, notes=(*shape.notes, note))
        return shape


class _MissingKey(ShapeError):
    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def _build_once(builder, config: dict, source: str) -> ModelShape:
    _refuse_absurd_sizes(config, source)
    try:
        shape = builder(config, source)
        positions = next((config[k] for k in ("max_position_embeddings", "n_positions", "n_ctx")
                          if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)), 0)
        return replace(shape, max_positions=positions) if positions > 0 else shape
    except KeyError as exc:
        raise _MissingKey(f"{source}: no {exc.args[0]!r} in the config", exc.args[0]) from exc
    except (TypeError, ValueError, ZeroDivisionError, ArithmeticError) as exc:
        raise ShapeError(f"{source}: a dimension is not a positive number ({exc})") from exc


_MAX_SIZE = 2**40  # no model dimension, count or vocabulary comes near; sizes past it overflow floats


def _refuse_absurd_sizes(config: dict, source: str) -> None:
    """A config.json number past any model's (a fuzzed `num_attention_heads` of 120 digits)
    is a ShapeError, not a float overflow in the estimator (issue 24)."""
    for key, value in config.items():
        for item in (value.values() if isinstance(value, dict) else (value,)):
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not abs(item) <= _MAX_SIZE:
                raise ShapeError(f"{source}: {key} is too large to be a model's size")  # NaN and inf too


_gelu_tensors = gelu_tensors


# -- decoder-only transformers ---------------------------------------------------------------

def _llama_like(config: dict, source: str) -> ModelShape:
    """LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3 / Gemma / Gemma2 /
    Phi3ForCausalLM (transformers `models/<family>/modeling_<family>.py`): per layer q, k, v,
    o projections, a gated MLP (gate, up, down), RMSNorms; final norm; embedding and head."""
    family = config["model_type"]
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    tie = config.get("tie_word_embeddings", family in ("gemma", "gemma2", "gemma3_text"))
    qkv_bias = family == "qwen2" or bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    if family == "phi3":  # fused projections (modeling_phi3.py: qkv_proj, gate_up_proj)
        linears = (("qkv_proj", h, heads * d + 2 * kv * d), ("o_proj", heads * d, h),
                   ("gate_up_proj", h, 2 * inter), ("down_proj", inter, h))
    else:
        linears = (("q_proj", h, heads * d), ("k_proj", h, kv * d), ("v_proj", h, kv * d), ("o_proj", heads * d, h),
                   ("gate_proj", h, inter), ("up_proj", h, inter), ("down_proj", inter, h))
    per_layer = sum(i * o for _, i, o in linears)
    if qkv_bias:
        per_layer += heads * d + 2 * kv * d + (h if family != "qwen2" and config.get("attention_bias") else 0)
    if mlp_bias:
        per_layer += 2 * inter + h
    norms = 4 if family in ("gemma2", "gemma3_text") else 2  # gemma2: pre/post norms around attention and MLP
    per_layer += norms * h
    if family in ("qwen3", "gemma3_text"):  # q_norm / k_norm over head_dim
        per_layer += 2 * d
    embed = vocab * h
    head = 0 if tie else vocab * h
    params = embed + head + layers * per_layer + h
    gemma2 = family == "gemma2"
    return ModelShape(
        family=family, params=params, layers=layers, hidden=h, heads=heads, kv_heads=kv, head_dim=d,
        vocab=vocab, intermediate=inter, gated_mlp=True, norm="rms", attention="fused",
        dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        # Gemma2Config's defaults: attn_logit_softcapping 50.0, final_logit_softcapping 30.0
        attn_softcap=gemma2 and config.get("attn_logit_softcapping", 50.0) is not None,
        logit_softcap=gemma2 and config.get("final_logit_softcapping", 30.0) is not None,
        embedding_params=embed, head_params=head,
        largest_module_params=max(embed, max(i * o for _, i, o in linears)),
        blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def _phi(config: dict, source: str) -> ModelShape:
    """PhiForCausalLM (phi-1/1.5/2, modeling_phi.py): q, k, v, dense with biases, fc1/fc2
    MLP with biases, one LayerNorm per layer (parallel block), final LayerNorm, head with bias."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = h // heads
    inter = config["intermediate_size"]
    linears = (("q_proj", h, heads * d), ("k_proj", h, kv * d), ("v_proj", h, kv * d), ("dense", heads * d, h),
               ("fc1", h, inter), ("fc2", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + heads * d + 2 * kv * d + h + inter + h + 2 * h
    if config.get("qk_layernorm"):
        per_layer += 4 * d
    embed = vocab * h
    tie = config.get("tie_word_embeddings", False)
    head = 0 if tie else vocab * h + vocab
    params = embed + head + layers * per_layer + 2 * h
    return ModelShape(
        family="phi", params=params, layers=layers, hidden=h, heads=heads, kv_heads=kv, head_dim=d, vocab=vocab,
        intermediate=inter, gated_mlp=False, mlp_tensors=_gelu_tensors(config.get("hidden_act", "gelu_new")), norm="layer", attention="fused",
        dropout=float(config.get("resid_pdrop", 0.0) or 0.0), embedding_params=embed, head_params=head,
        largest_module_params=max(embed, inter * h), blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def _gpt_neox(config: dict, source: str) -> ModelShape:
    """GPTNeoXForCausalLM (modeling_gpt_neox.py): fused query_key_value, dense, MLP
    dense_h_to_4h / dense_4h_to_h, all with biases; two LayerNorms per layer; untied embed_out."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    inter = config["intermediate_size"]
    bias = config.get("attention_bias", True)
    linears = (("query_key_value", h, 3 * h), ("dense", h, h), ("dense_h_to_4h", h, inter), ("dense_4h_to_h", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + (4 * h if bias else 0) + inter + h + 4 * h
    embed = vocab * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    params = embed + head + layers * per_layer + 2 * h
    return ModelShape(
        family="gpt_neox", params=params, layers=layers, hidden=h, heads=heads, kv_heads=heads, head_dim=h // heads,
        vocab=vocab, intermediate=inter, gated_mlp=False, mlp_tensors=_gelu_tensors(config.get("hidden_act", "gelu")),
        norm="layer", attention="fused", dropout=float(config.get("hidden_dropout", 0.0) or 0.0), embedding_params=embed, head_params=head,
        largest_module_params=max(embed, h * inter), blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def _gpt2(config: dict, source: str) -> ModelShape:
    """GPT2LMHeadModel (modeling_gpt2.py): Conv1D c_attn (h -> 3h), c_proj, c_fc (h -> n_inner),
    mlp c_proj, all with biases; ln_1, ln_2; wte, wpe, ln_f; head tied to wte."""
    h, layers, vocab = config["n_embd"], config["n_layer"], config["vocab_size"]
    heads = config["n_head"]
    inter = config.get("n_inner") or 4 * h
    linears = (("c_attn", h, 3 * h), ("attn.c_proj", h, h), ("c_fc", h, inter), ("mlp.c_proj", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 3 * h + h + inter + h + 4 * h
    embed = vocab * h + config.get("n_positions", 1024) * h
    params = embed + layers * per_layer + 2 * h
    return ModelShape(
        family="gpt2", params=params, layers=layers, hidden=h, heads=heads, kv_heads=heads, head_dim=h // heads,
        vocab=vocab, intermediate=inter, gated_mlp=False, mlp_tensors=_gelu_tensors(config.get("activation_function", "gelu_new")),
        norm="layer", attention="fused", dropout=float(config.get("resid_pdrop", 0.1)), embedding_params=embed, head_params=0,
        largest_module_params=max(vocab * h, h * inter), blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


# -- encoders and encoder-decoders ----------------------------------------------------------

def _bert(config: dict, source: str) -> ModelShape:
    """BertModel with its pooler (modeling_bert.py): word, position and token-type
    embeddings + LayerNorm; per layer q, k, v, output dense with biases, intermediate and
    output dense with biases, two LayerNorms; pooler dense."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    inter = config["intermediate_size"]
    linears = (("query", h, h), ("key", h, h), ("value", h, h), ("attention.output.dense", h, h),
               ("intermediate.dense", h, inter), ("output.dense", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 4 * h + inter + h + 4 * h
    embed = (vocab + config.get("max_position_embeddings", 512) + config.get("type_vocab_size", 2)) * h + 2 * h
    params = embed + layers * per_layer + h * h + h
    return ModelShape(
        family="bert", params=params, layers=layers, encoder_layers=layers, hidden=h,
        heads=config["num_attention_heads"], kv_heads=config["num_attention_heads"],
        head_dim=h // config["num_attention_heads"], vocab=vocab, intermediate=inter, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("hidden_act", "gelu")), norm="layer",
        attention="fused", dropout=float(config.get("hidden_dropout_prob", 0.1)), embedding_params=embed,
        largest_module_params=max(vocab * h, h * inter), blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def _t5(config: dict, source: str) -> ModelShape:
    """T5ForConditionalGeneration (modeling_t5.py): shared embedding; encoder blocks of
    self-attention (q, k, v, o without biases) + FF; decoder blocks add cross-attention;
    relative position bias in each stack's first block; T5LayerNorm (weight only);
    lm_head untied for T5 v1.1 / FLAN-T5 (`tie_word_embeddings: false`)."""
    d, vocab = config["d_model"], config["vocab_size"]
    heads, d_kv, d_ff = config["num_heads"], config["d_kv"], config["d_ff"]
    enc_layers = config["num_layers"]
    dec_layers = config.get("num_decoder_layers") or enc_layers
    inner = heads * d_kv
    proj = str(config.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated")
    dropout = float(config.get("dropout_rate", 0.1))
    mlp_tensors = _t5_mlp_tensors(proj, gated, dropout)
    attn = lambda prefix: ((f"{prefix}.q", d, inner), (f"{prefix}.k", d, inner), (f"{prefix}.v", d, inner), (f"{prefix}.o", inner, d))  # noqa: E731
    ff = (("wi_0", d, d_ff), ("wi_1", d, d_ff), ("wo", d_ff, d)) if gated else (("wi", d, d_ff), ("wo", d_ff, d))
    enc_linears = attn("SelfAttention") + ff
    dec_linears = attn("SelfAttention") + attn("EncDecAttention") + ff
    enc_block = sum(i * o for _, i, o in enc_linears) + 2 * d
    dec_block = sum(i * o for _, i, o in dec_linears) + 3 * d
    buckets = config.get("relative_attention_num_buckets", 32) * heads
    embed = vocab * d
    head = 0 if config.get("tie_word_embeddings", True) else vocab * d
    params = embed + head + enc_layers * enc_block + dec_layers * dec_block + 2 * buckets + 2 * d
    return ModelShape(
        family="t5", params=params, layers=dec_layers, encoder_layers=enc_layers, hidden=d, heads=heads,
        kv_heads=heads, head_dim=d_kv, vocab=vocab, intermediate=d_ff, gated_mlp=gated, mlp_tensors=mlp_tensors,
        norm="rms", attention="eager", dropout=dropout, embedding_params=embed + 2 * buckets, head_params=head,
        largest_module_params=max(embed, d * d_ff),
        blocks=(BlockKind(enc_layers, enc_block, enc_linears), BlockKind(dec_layers, dec_block, dec_linears)),
        source=source,
    )


def _t5_mlp_tensors(proj: str, gated: bool, dropout: float) -> int:
    """Intermediate-sized tensors T5's FF keeps for backward (modeling_t5.py T5DenseActDense /
    T5DenseGatedActDense; counted per op on the simulator). The activation: "gated-gelu" runs
    transformers' NewGELUActivation (configuration_t5.py: dense_act_fn "gelu_new"), composed in
    Python, which keeps x, tanh(.), 0.5x and 1 + tanh(.); relu keeps its output (the tensor the
    next op keeps anyway); other activations keep their input. Gated: + the activation's output,
    wi_1's output and their product (wo's input); plain: + wo's input. A dropout on the
    intermediate tensor keeps its noise (estimator) and gives wo a new input: one more tensor
    only where the activation's own output was that input (plain relu)."""
    act = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
    own = {"gelu_new": 4, "relu": 0}.get(act, 1)
    if gated:
        return own + 3
    return own + 1 + (1 if act == "relu" and dropout > 0 else 0)


# -- diffusers UNet ---------------------------------------------------------------------------

def _unet(config: dict, source: str) -> ModelShape:
    """UNet2DConditionModel (diffusers `models/unets/unet_2d_condition.py` with
    `unet_2d_blocks.py`, `resnet.py`, `transformers/transformer_2d.py`, `attention.py`):
    conv_in, time embedding, (SDXL) added time/text embedding, down blocks of ResnetBlock2D
    (+ Transformer2DModel), mid block, up blocks with skip connections, conv_out."""
    boc = list(config["block_out_channels"])
    layers_per_block = config.get("layers_per_block", 2)
    down_types, up_types = config["down_block_types"], config["up_block_types"]
    n = len(boc)
    tlayers = config.get("transformer_layers_per_block", 1)
    tlayers = [tlayers] * n if isinstance(tlayers, int) else list(tlayers)
    cross = config.get("cross_attention_dim", 768)
    cross = cross[0] if isinstance(cross, list) else cross
    c0 = boc[0]
    temb = c0 * 4
    linears: list[Linear] = []

    def resnet(cin, cout):
        p = 2 * cin + cin * cout * 9 + cout + temb * cout + cout + 2 * cout + cout * cout * 9 + cout
        return p + (cin * cout + cout if cin != cout else 0)

    def transformer(c, depth):
        linears.extend([("to_q", c, c), ("to_k", c, c), ("to_v", c, c), ("to_out", c, c),
                        ("to_q", c, c), ("to_k", cross, c), ("to_v", cross, c), ("to_out", c, c),
                        ("ff.proj", c, 8 * c), ("ff.out", 4 * c, c)] * depth)
        per_block = 2 * c + 4 * c * c + c + 2 * c + 2 * c * c + 2 * cross * c + c + 2 * c + c * 8 * c + 8 * c + 4 * c * c + c
        return 2 * c + (c * c + c) * 2 + depth * per_block

    params = config.get("in_channels", 4) * c0 * 9 + c0 + (c0 * temb + temb) + (temb * temb + temb)
    if config.get("addition_embed_type") == "text_time":
        add_in = config["projection_class_embeddings_input_dim"]
        params += add_in * temb + temb + temb * temb + temb
    levels = []
    channels = c0
    for i, kind in enumerate(down_types):
        cout = boc[i]
        has_attn = kind.startswith("CrossAttn")
        for j in range(layers_per_block):
            params += resnet(channels if j == 0 else cout, cout)
            if has_attn:
                params += transformer(cout, tlayers[i])
        if i < n - 1:
            params += cout * cout * 9 + cout
        channels = cout
        levels.append((cout, 2**i, tlayers[i] if has_attn else 0))
    # mid block: resnet, (transformer, resnet)
    cmid = boc[-1]
    params += 2 * resnet(cmid, cmid) + transformer(cmid, tlayers[-1])
    rboc, rtl = list(reversed(boc)), list(reversed(tlayers))
    prev = boc[-1]
    for i, kind in enumerate(up_types):
        cout = rboc[i]
        cin = rboc[min(i + 1, n - 1)]
        has_attn = kind.startswith("CrossAttn")
        for j in range(layers_per_block + 1):
            skip = cin if j == layers_per_block else cout
            params += resnet((prev if j == 0 else cout) + skip, cout)
            if has_attn:
                params += transformer(cout, rtl[i])
        if i < n - 1:
            params += cout * cout * 9 + cout
        prev = cout
    params += 2 * c0 + c0 * config.get("out_channels", 4) * 9 + config.get("out_channels", 4)
    block_linear = sum(i * o for _, i, o in linears)
    return ModelShape(
        family="unet", params=params, hidden=c0, heads=0, vocab=0, gated_mlp=True, norm="group", attention="fused",
        largest_module_params=max(boc[-1] * boc[-1] * 9 * 2, max(i * o for _, i, o in linears) if linears else 0),
        blocks=(BlockKind(1, block_linear, tuple(linears)),), unet_levels=tuple(levels),
        unet_layers_per_block=layers_per_block, source=source,
    )


def _clip_vision(config: dict, source: str) -> ModelShape:
    """CLIPVisionModel (modeling_clip.py CLIPVisionTransformer): patch Conv2d without bias,
    class embedding, position embeddings for every patch + the class token, pre-LayerNorm;
    per layer q, k, v, out_proj with biases, fc1/fc2 MLP with biases, two LayerNorms;
    post-LayerNorm. No head (CLIPVisionModel returns the hidden states)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, inter = config["num_attention_heads"], config["intermediate_size"]
    patch, image, channels = config["patch_size"], config["image_size"], config.get("num_channels", 3)
    tokens = (image // patch) ** 2 + 1
    linears = (("q_proj", h, h), ("k_proj", h, h), ("v_proj", h, h), ("out_proj", h, h), ("fc1", h, inter), ("fc2", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 4 * h + inter + h + 4 * h
    embed = channels * patch * patch * h + h + tokens * h
    params = embed + 2 * h + layers * per_layer + 2 * h
    return ModelShape(
        family="clip_vision", params=params, layers=layers, encoder_layers=layers, hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, vocab=0, intermediate=inter, gated_mlp=False, mlp_tensors=2, norm="layer", attention="fused",
        dropout=float(config.get("attention_dropout", 0.0) or 0.0), embedding_params=embed, tokens=tokens,
        largest_module_params=inter * h, blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


_BUILDERS = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like,
    "gemma": _llama_like, "gemma2": _llama_like, "gemma3_text": _llama_like, "phi3": _llama_like,
    "phi": _phi, "gpt_neox": _gpt_neox, "gpt2": _gpt2, "t5": _t5, "mt5": _t5, "bert": _bert,
}
# Families sized only as a part of a composite model (their activations are not modelled: a
# composite takes its activation dimensions from its largest backbone, memory/parts.py)
# the families of memory/families.py (their builders get what they reuse from here)
BUILDERS = {
    "mixtral": lambda c, s: families.moe(c, s, _llama_like), "qwen2_moe": lambda c, s: families.moe(c, s, _llama_like),
    "qwen3_moe": lambda c, s: families.moe(c, s, _llama_like), "falcon": families.falcon, "glm": families.glm,
    "glm4": families.glm, "chatglm": families.chatglm, "deberta-v2": families.deberta_v2, "vit": families.vit,
    "clip": families.dual_encoder, "siglip": families.dual_encoder, "whisper": families.whisper,
    "qwen2_5_vl": lambda c, s: families.vision_language(c, s, shape_from_config),
    "mllama": lambda c, s: families.vision_language(c, s, shape_from_config),
    "clip_vision_model": lambda c, s: families.clip_like_vision(c, s, "clip_vision"),
    "siglip_vision_model": lambda c, s: families.clip_like_vision(c, s, "siglip_vision"),
}
# diffusers transformers by `_class_name` (no model_type in their config.json)
DIFFUSERS_BUILDERS = {"SD3Transformer2DModel": families.sd3, "FluxTransformer2DModel": families.flux}
_PART_BUILDERS = {"clip_vision_model": _clip_vision}
SUPPORTED_FAMILIES = tuple(sorted({*_BUILDERS, "mixtral", "qwen2_moe", "qwen3_moe", "falcon", "glm", "glm4", "chatglm",
                                   "deberta-v2", "vit", "clip", "siglip", "whisper", "qwen2_5_vl", "mllama"})) + (
    "UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel")


# -- the catalog of well-known ids ------------------------------------------------------------

def _catalog_key(name: str) -> str:
    return name.strip().lower().rstrip("/")


def _load_catalog() -> dict[str, dict]:
    from importlib import resources

    data = json.loads(resources.files("cfgfix.memory").joinpath("data/models.json").read_text("utf-8"))
    by_key: dict[str, dict] = {}
    for row in data["models"]:
        for name in [row["id"], *row["aliases"]]:
            by_key.setdefault(_catalog_key(name), row)
            by_key.setdefault(_catalog_key(name.split("/")[-1]), row)  # without the organisation
    return by_key


_CATALOG: dict[str, dict] | None = None


def catalog_entry(model_id: str) -> dict | None:
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = _load_catalog()
    key = _catalog_key(model_id)
    return _CATALOG.get(key) or _CATALOG.get(key.split("/")[-1])


def catalog_ids() -> list[str]:
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = _load_catalog()
    return sorted({row["id"] for row in _CATALOG.values()})


def shape_from_catalog(model_id: str) -> ModelShape | None:
    row = catalog_entry(model_id)
    if row is None:
        return None
    shape = shape_from_config(row["config"], source=f"catalog: {row['id']} ({row['source']})")
    if "params" in row:  # multimodal: the catalog's total overrides the language model's count
        from cfgfix.records import replace

        shape = replace(shape, params=int(row["params"]), family=shape.family,
                        notes=shape.notes + ("activation dimensions are the language model's",))
    return shape


# A fine-tune keeps its base model's architecture, and its name usually says which base and
# size: "vicuna-13b-v1.5", "zephyr-7b-beta", "./llama-7b-hf". (family words, size) -> catalog id.
_NAME_FAMILIES = (
    (("llama-3", "llama3", "llama-3.1", "llama3.1"), {"8b": "meta-llama/Llama-3.1-8B", "70b": "meta-llama/Llama-3.1-70B"}),
    (("llama", "vicuna", "alpaca", "wizardlm", "tulu"), {"7b": "meta-llama/Llama-2-7b-hf", "13b": "meta-llama/Llama-2-13b-hf",
                                                         "70b": "meta-llama/Llama-2-70b-hf"}),
    (("mistral", "zephyr", "openhermes"), {"7b": "mistralai/Mistral-7B-v0.1"}),
    (("qwen2.5-vl", "qwen2_5_vl", "qwen2.5vl"), {"7b": "Qwen/Qwen2.5-VL-7B-Instruct"}),
    (("mixtral",), {"8x7b": "mistralai/Mixtral-8x7B-v0.1"}),
    (("falcon",), {"7b": "tiiuae/falcon-7b", "40b": "tiiuae/falcon-40b"}),
    (("qwen2.5",), {"0.5b": "Qwen/Qwen2.5-0.5B", "1.5b": "Qwen/Qwen2.5-1.5B", "3b": "Qwen/Qwen2.5-3B", "7b": "Qwen/Qwen2.5-7B",
                    "14b": "Qwen/Qwen2.5-14B", "32b": "Qwen/Qwen2.5-32B", "72b": "Qwen/Qwen2.5-72B"}),
)


# a name that says it is a vision-language model is never read as a text-only one
_VISION_MARKERS = __import__("re").compile(r"(?:^|[-_.])(?:vl|vision|llava|mllama|omni|visual)(?:$|[-_.\d])")
_VISION_LANGUAGE = ("qwen2_5_vl", "mllama")


def _shape_from_name(model: str) -> ModelShape | None:
    """The catalog shape of the base model a name points to, or None when the name does not
    say both the family and the size unambiguously."""
    import re

    from cfgfix.records import replace

    name = model.strip().rstrip("/").split("/")[-1].lower()
    sizes = set(re.findall(r"(?<![\d.])(\d+(?:x\d+)?(?:\.\d+)?b)(?![a-z])", name))
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    for words, by_size in _NAME_FAMILIES:
        if any(word in name for word in words):
            base = by_size.get(size)
            if base is None:
                return None
            if _VISION_MARKERS.search(name) and catalog_entry(base)["config"].get("model_type") not in _VISION_LANGUAGE:
                return None  # "Qwen2.5-VL-7B", "llama-3.2-11b-vision": not the text-only model of that size
            shape = shape_from_catalog(base)
            return replace(shape, source=f"{model!r} read as {base}'s shape (a fine-tune keeps its base's architecture)",
                           notes=shape.notes + (f"shape guessed from the name {model!r}",))
    return None


# A name that states a size ("Qwen-7B-Chat", "open_llama_3b_v2", "Mixtral-8x22B", "bloom-560m")
# when nothing else knows the model: names round the count, mostly to the nearest size class.
# In the catalog, named N billion is 0.96-1.22 N (Llama-2-7B 6.74B, Qwen-7B 7.72B, Gemma-7B
# 8.54B); a mixture of experts named A x B shares its attention and embeddings across the A
# experts: Mixtral-8x7B is 46.7B of 56 (0.83), Mixtral-8x22B 141B of 176 (0.80).
NAMED_SIZE_RANGE = (0.9, 1.0, 1.25)  # (low, point, high) x the stated size
NAMED_EXPERTS_RANGE = (0.75, 0.8, 1.0)  # x experts x expert size
_SIZE = __import__("re").compile(r"(?<![\d.a-z])(?:(\d+)x)?(\d+(?:\.\d+)?)([bm])(?![a-z\d])")


def size_from_name(model: str) -> ModelShape | None:
    """A bare parameter count, with its range, from a size the name states; None when it
    states none or more than one."""
    name = model.strip().rstrip("/").split("/")[-1].lower()
    sizes = set(_SIZE.findall(name))
    if len(sizes) != 1 or _VISION_MARKERS.search(name):
        return None  # a vision-language name: its tower and image tokens are not in a text decoder's guess
    experts, size, unit = sizes.pop()
    stated = float(size) * (1e9 if unit == "b" else 1e6)
    factors = NAMED_EXPERTS_RANGE if experts else NAMED_SIZE_RANGE
    total = stated * (int(experts) if experts else 1)
    low, point, high = (int(total * f) for f in factors)
    said = f"{experts + ' x ' if experts else ''}{size}{unit.upper()}"
    words = (f"{model!r} is not a model cfgfix knows: its parameter count is read from the name ({said}) as "
             f"{low / 1e9:.3g}-{high / 1e9:.3g}B ({point / 1e9:.3g}B at the point; "
             + ("a mixture of experts shares attention and embeddings: 0.75-1.0 x experts x size"
                if experts else "names round the count: 0.9-1.25 x the stated size")
             + "); pass --params or a local config.json for its real size")
    return ModelShape(family="params", params=point, params_range=(low, high), source=f"the name {model!r}",
                      notes=(words,))


def hf_cache_folder(model_id: str) -> Path | None:
    """The snapshot folder of `model_id` ("org/name") in the user's local Hugging Face cache
    that holds a config.json (itself, or a diffusers pipeline's `unet/` or `transformer/`):
    analysis/hub_cache.py, the one reader of that cache. Nothing is downloaded."""
    from cfgfix.analysis.hub_cache import snapshot_with

    return snapshot_with(model_id, ("config.json", "unet/config.json", "transformer/config.json"))


def resolve_shape(model: str) -> ModelShape:
    """A local model folder or config.json first, then the id's config.json in the local
    Hugging Face cache, then the catalog; ShapeError otherwise."""
    path = Path(model)
    if os.path.exists(path):  # os.path: a name over 255 bytes is simply not a folder
        return shape_from_config_file(path)
    cached = hf_cache_folder(model)
    if cached is not None:
        try:
            shape = shape_from_config_file(cached)
            return replace(shape, source=f"{model} config.json in the local Hugging Face cache ({cached})")
        except ShapeError:
            pass  # a family this module does not read: the catalog may still know the id
    shape = shape_from_catalog(model)
    if shape is None:
        shape = _shape_from_name(model)
    if shape is None:
        shape = size_from_name(model)
    if shape is None:
        raise ShapeError(f"unknown model {model!r}: pass a local folder with config.json, --params, "
                         f"or one of the catalog ids (`cfgfix estimate --list-models`)")
    return shape


def resolve_part_shape(model: str) -> ModelShape:
    """`resolve_shape`, plus the families sized only as parts of a composite model."""
    try:
        return resolve_shape(model)
    except ShapeError:
        path = Path(model)
        config_path = path / "config.json" if os.path.isdir(path) else path
        try:
            config = json.loads(config_path.read_text("utf-8")) if os.path.isfile(config_path) else None
        except (OSError, ValueError, RecursionError):
            config = None
        shape = part_shape_from_config(config, str(config_path)) if isinstance(config, dict) else None
        if shape is None:
            raise
        return shape
