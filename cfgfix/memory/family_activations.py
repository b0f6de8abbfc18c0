"""Activation terms of the families added for issue 21 (memory/families.py): encoders at a
fixed or given token count without vocabulary logits (ViT, CLIP / SigLIP towers, DeBERTa),
Whisper's encoder-decoder over 30 s of audio, and the mixture-of-experts MLP. Each term is
written from the modeling file (transformers 5.24) and checked against the FakeTensor
simulator on shapes it was not written against (tests/test_families.py).
"""

from __future__ import annotations

# transformers' MoE experts (integrations/moe.py `grouped_mm_experts_forward`) per routed
# (token, expert) pair besides the e-byte tensors: the sort permutation, its inverse and the
# token index (int64 each, kept by the gathers) and the fp32 routing weight
MOE_INDEX_BYTES = 3 * 8 + 4


def moe_mlp_saved(shape, sb: int, e: int) -> int:
    """What one MoE MLP keeps for backward, for `sb` tokens (transformers 5 grouped_mm path):
    the router's fp32 softmax (tokens x experts), top-k indices (int64) and normalised weights;
    per routed pair (tokens x top-k): the gathered input (h), gate_up's output (2i: SiLU's
    input and `up`), SiLU's output (i), the product (i, down's input) and down's output (h,
    kept by the multiplication with the routing weight). Qwen2-MoE's shared expert is a gated
    MLP (4 x shared i) whose output is kept with its sigmoid gate."""
    h, k, i = shape.hidden, max(shape.experts_per_token, 1), shape.expert_intermediate
    pairs = sb * k
    router = 4 * sb * shape.experts + 8 * pairs + 2 * 4 * pairs
    experts = pairs * (e * (2 * h + 4 * i) + MOE_INDEX_BYTES)
    shared = 0
    if shape.shared_expert_intermediate:
        shared = 4 * e * sb * shape.shared_expert_intermediate + e * sb * h + e * sb
    return router + experts + shared


def deberta_attention_saved(shape, setup, s: int, b: int, e: int, autocast: bool) -> int:
    """DisentangledSelfAttention (modeling_deberta_v2.py), eager: q (kept by the content and the
    c2p bmm), k and k / scale (p2c and content bmm), v, the context before the output dense;
    the relative-position queries and keys repeated per batch row (b x 2 x span x h each); the c2p
    / p2c scores before their gathers (b x heads x s x 2 span: gather's backward takes its input); per
    score (b x heads x s x s): the softmax output and with dropout its noise (CPU: the dtype;
    CUDA: a 1-byte mask) and the dropped probabilities, fp32 under autocast (softmax is an
    fp32 op) plus the 16-bit copy the context bmm takes; the c2p / p2c gather indices (int64, s x s)."""
    h, a = shape.hidden, shape.heads or 1
    span = shape.relative_span or 256
    drop = shape.dropout > 0
    prob = deberta_score_bytes(setup, e, autocast)
    per_score = prob + ((1 if setup.device == "cuda" else prob) + prob if drop else 0) + (2 if prob == 4 and autocast else 0)
    rel = shape.relative_positions
    # each c2p / p2c score before its gather (b x heads x s x 2 span): gather's backward takes its input
    gathered = rel * e * b * a * s * 2 * span
    return (5 * e * s * b * h + rel * e * b * 2 * span * h + gathered + per_score * b * a * s * s + rel * 8 * s * s)


def deberta_score_bytes(setup, e: int, autocast: bool) -> int:
    """Bytes per attention score: CUDA's autocast runs softmax in fp32 (an fp32-listed op), the
    CPU's autocast keeps it in 16 bits (measured on the simulator: 6 bytes per score with dropout)."""
    return 4 if autocast and setup.device == "cuda" else e


def deberta_transient(shape, setup, s: int, b: int, e: int, autocast: bool) -> int:
    """The scores DisentangledSelfAttention holds at once besides the saved ones (the content
    scores, the relative bias and their sum in forward; their gradients in backward): measured
    on the simulator at 1.35-1.5 score tensors (b x heads x s x s), fp32 and bf16."""
    return int(1.5 * deberta_score_bytes(setup, e, autocast) * b * (shape.heads or 1) * s * s)


def encoder_head(shape, setup, s: int, b: int, e: int, r: int, autocast: bool) -> int:
    """After the last layer of an encoder under a classification head: the final LayerNorm's input
    and its output (kept whole by the pooled slice the classifier reads; under autocast the
    classifier keeps a 16-bit copy of the slice only). A vision encoder's pixel values: the
    batch, live through the step, in the weights' dtype (the simulator's processor output; a
    real processor gives fp32), which the patch convolution keeps, plus its 16-bit copy under
    autocast."""
    saved = r * s * b * shape.hidden + (0 if autocast and r == 4 else r * s * b * shape.hidden)
    if shape.image_size:
        pixels = b * 3 * shape.image_size ** 2
        saved += (4 if setup.weights == "fp32" else 2) * pixels + (2 * pixels if autocast and setup.weights == "fp32" else 0)
    return saved


def whisper_frontend(shape, b: int, e: int, autocast: bool) -> int:
    """WhisperEncoder's convolutions over 2 x max_source_positions frames: conv1 keeps the
    log-mel input, GELU keeps conv1's output, conv2 keeps GELU's output, the second GELU keeps
    conv2's output (at half the frames); under autocast the convolutions keep 16-bit copies."""
    frames = 2 * shape.tokens
    d = shape.hidden
    x = 2 if autocast else e
    return x * b * shape.mel_bins * frames + e * b * d * frames + x * b * d * frames + e * b * d * shape.tokens
