"""Model families beyond the first catalog (issue 21): mixture-of-experts decoders, Falcon,
GLM, DeBERTa-v2/v3, Whisper, ViT / CLIP / SigLIP, and the vision-language models whose vision
tower is counted (Qwen2.5-VL, Llama-3.2-Vision). Each builder turns a `config.json` into a
`ModelShape` following the module layout of its transformers class (transformers 5.24,
`models/<family>/modeling_<family>.py`, cited per function); tests/test_families.py builds
the same configs on the meta device and compares the counts, and checks each family's
activation term against the FakeTensor simulator.
"""

from __future__ import annotations

from cfgfix.memory.shape_model import BlockKind, ModelShape
from cfgfix.memory.shape_model import gelu_tensors as _gelu_tensors
from cfgfix.records import replace


def moe(config: dict, source: str, llama_like) -> ModelShape:
    """MixtralForCausalLM / Qwen2MoeForCausalLM / Qwen3MoeForCausalLM (modeling_mixtral.py,
    modeling_qwen2_moe.py, modeling_qwen3_moe.py): a Llama-like attention block whose MLP is a
    router (num_experts x hidden, no bias) and `num_experts` gated experts of
    moe_intermediate_size (Mixtral: intermediate_size), `num_experts_per_tok` of them per token;
    Qwen2-MoE adds a shared expert (shared_expert_intermediate_size) and its 1-output gate.
    Layers in `mlp_only_layers`, or off the `decoder_sparse_step`, keep a dense MLP."""
    family = config["model_type"]
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    mixtral = family == "mixtral"
    # Mixtral says num_local_experts; Qwen MoE checkpoints say num_experts (transformers 5's
    # Qwen3MoeConfig writes num_local_experts)
    experts = config["num_local_experts"] if "num_local_experts" in config else config["num_experts"]
    top_k = config["num_experts_per_tok"]
    expert_i = config["intermediate_size"] if mixtral else config["moe_intermediate_size"]
    shared_i = config.get("shared_expert_intermediate_size", 0) if family == "qwen2_moe" else 0
    dense_i = config.get("intermediate_size", expert_i)
    step = config.get("decoder_sparse_step", 1) or 1
    dense_only = set(config.get("mlp_only_layers") or ())
    sparse_layers = [i for i in range(layers) if i not in dense_only and (i + 1) % step == 0]
    sparse = len(sparse_layers) if experts > 0 else 0
    # the attention block, norms, embeddings and head as Llama-like (an MLP-less layer: intermediate 0)
    base_config = dict(config, model_type={"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}[family],
                       intermediate_size=0)
    if family == "qwen2_moe":
        base_config["attention_bias"] = False  # qwen2 family: q, k, v biases (added by the Llama-like builder)
    base = llama_like(base_config, source)
    attention = tuple(item for item in base.blocks[0].linears if item[1] and item[2])
    attn_params = base.blocks[0].params
    expert = 3 * h * expert_i
    moe_mlp = experts * expert + experts * h + (3 * h * shared_i + h if shared_i else 0)
    dense_mlp = 3 * h * dense_i
    expert_linears = tuple((f"experts.{name}", fin, fout) for name, fin, fout in
                           (("gate_proj", h, expert_i), ("up_proj", h, expert_i), ("down_proj", expert_i, h))) * experts
    shared_linears = (("shared_expert.gate_proj", h, shared_i), ("shared_expert.up_proj", h, shared_i),
                      ("shared_expert.down_proj", shared_i, h)) if shared_i else ()
    blocks = []
    if sparse:
        blocks.append(BlockKind(sparse, attn_params + moe_mlp, attention + expert_linears + shared_linears))
    if layers - sparse:
        blocks.append(BlockKind(layers - sparse, attn_params + dense_mlp,
                                attention + (("gate_proj", h, dense_i), ("up_proj", h, dense_i), ("down_proj", dense_i, h))))
    params = base.params + sparse * moe_mlp + (layers - sparse) * dense_mlp
    active = params - sparse * (experts - top_k) * expert
    return replace(
        base, family=family, params=params, intermediate=expert_i if sparse else dense_i, blocks=tuple(blocks),
        experts=experts if sparse else 0, experts_per_token=top_k, expert_intermediate=expert_i,
        shared_expert_intermediate=shared_i, moe_layers=sparse, active_params=active,
        largest_module_params=max(base.largest_module_params, experts * expert * 2 // 3),
        notes=((f"mixture of experts: {params / 1e9:.3g}B parameters, {active / 1e9:.3g}B active per token "
               f"({top_k} of {experts} experts)"),),
    )


def falcon(config: dict, source: str) -> ModelShape:
    """FalconForCausalLM (modeling_falcon.py): fused query_key_value (3h; multi-query: h + 2
    head_dim; new decoder architecture: (heads + 2 kv heads) x head_dim), dense, a GELU MLP
    dense_h_to_4h / dense_4h_to_h, biases when `bias`; LayerNorms: input_layernorm (+
    post_attention_layernorm without parallel attention), or ln_attn + ln_mlp in the new
    architecture; word embeddings, ln_f, head tied by default."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    d = h // heads
    new_arch = bool(config.get("new_decoder_architecture", False))
    multi_query = config.get("multi_query", True)
    kv = config.get("num_kv_heads") or heads if new_arch else (1 if multi_query else heads)
    qkv_out = (heads + 2 * kv) * d
    ffn = config.get("ffn_hidden_size") or 4 * h
    bias = bool(config.get("bias", False))
    linears = (("query_key_value", h, qkv_out), ("dense", h, h), ("dense_h_to_4h", h, ffn), ("dense_4h_to_h", ffn, h))
    parallel = config.get("parallel_attn", True)
    if new_arch:
        norms = 2 if (config.get("num_ln_in_parallel_attn") or 2) == 2 else 1
    else:
        norms = 1 if parallel else 2
    per_layer = sum(i * o for _, i, o in linears) + (qkv_out + h + ffn + h if bias else 0) + norms * 2 * h
    embed = vocab * h
    head = 0 if config.get("tie_word_embeddings", True) else vocab * h
    params = embed + head + layers * per_layer + 2 * h
    # the new architecture broadcasts k / v to every head before attention (_split_heads): as
    # activations they are full multi-head tensors
    return ModelShape(
        family="falcon", params=params, layers=layers, hidden=h, heads=heads, kv_heads=heads if new_arch else kv,
        head_dim=d, vocab=vocab,
        intermediate=ffn, gated_mlp=False, mlp_tensors=2, norm="layer", attention="fused",
        dropout=float(config.get("attention_dropout", 0.0) or 0.0), embedding_params=embed, head_params=head,
        largest_module_params=max(embed, h * ffn), blocks=(BlockKind(layers, per_layer, linears),), source=source,
        parallel_norms=norms if parallel or new_arch else 0,
    )


def glm(config: dict, source: str) -> ModelShape:
    """GlmForCausalLM / Glm4ForCausalLM (modeling_glm.py, modeling_glm4.py): Llama-like q, k, v
    (biased when attention_bias, GLM's default) and o; a fused gate_up_proj (h -> 2 x
    intermediate) and down_proj; Glm4 adds post-self-attention and post-MLP RMSNorms."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    linears = (("q_proj", h, heads * d), ("k_proj", h, kv * d), ("v_proj", h, kv * d), ("o_proj", heads * d, h),
               ("gate_up_proj", h, 2 * inter), ("down_proj", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + (heads * d + 2 * kv * d if config.get("attention_bias", True) else 0)
    per_layer += (4 if config["model_type"] == "glm4" else 2) * h
    embed = vocab * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    return ModelShape(
        family=config["model_type"], params=embed + head + layers * per_layer + h, layers=layers, hidden=h, heads=heads,
        kv_heads=kv, head_dim=d, vocab=vocab, intermediate=inter, gated_mlp=True, norm="rms", attention="fused",
        dropout=float(config.get("attention_dropout", 0.0) or 0.0), embedding_params=embed, head_params=head,
        largest_module_params=max(embed, 2 * h * inter), blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def chatglm(config: dict, source: str) -> ModelShape:
    """THUDM ChatGLM2/3 and GLM-4 (trust_remote_code, modeling_chatglm.py): fused
    query_key_value (heads + 2 x multi_query_group_num heads of kv_channels, biased),
    dense, dense_h_to_4h (2 x ffn_hidden_size, SwiGLU) and dense_4h_to_h, two RMSNorms;
    embedding, final RMSNorm and an untied output_layer."""
    h, layers = config["hidden_size"], config["num_layers"]
    vocab = config.get("padded_vocab_size") or config["vocab_size"]
    heads = config["num_attention_heads"]
    d = config.get("kv_channels") or h // heads
    kv = config.get("multi_query_group_num", heads) if config.get("multi_query_attention") else heads
    ffn = config["ffn_hidden_size"]
    qkv = (heads + 2 * kv) * d
    linears = (("query_key_value", h, qkv), ("dense", heads * d, h), ("dense_h_to_4h", h, 2 * ffn), ("dense_4h_to_h", ffn, h))
    per_layer = sum(i * o for _, i, o in linears) + (qkv if config.get("add_qkv_bias", True) else 0) + 2 * h
    embed = vocab * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    return ModelShape(
        family="chatglm", params=embed + head + layers * per_layer + h, layers=layers, hidden=h, heads=heads, kv_heads=kv,
        head_dim=d, vocab=vocab, intermediate=ffn, gated_mlp=True, norm="rms", attention="fused",
        embedding_params=embed, head_params=head, largest_module_params=max(embed, 2 * h * ffn),
        blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


# -- encoders -------------------------------------------------------------------------------------

def deberta_v2(config: dict, source: str) -> ModelShape:
    """DebertaV2Model + ContextPooler + classifier (modeling_deberta_v2.py): word embeddings
    (embedding_size, projected when it differs from hidden), absolute positions only when
    position_biased_input, token types when type_vocab_size; per layer query/key/value_proj
    and output dense with biases (pos_key/pos_query projections only without share_att_key),
    intermediate and output dense, two LayerNorms; relative-position embeddings (2 x
    position_buckets, or 2 x max_relative_positions) with their LayerNorm; the pooler dense."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    inter = config["intermediate_size"]
    emb = config.get("embedding_size") or h
    linears = (("query_proj", h, h), ("key_proj", h, h), ("value_proj", h, h), ("attention.output.dense", h, h),
               ("intermediate.dense", h, inter), ("output.dense", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 4 * h + inter + h + 4 * h
    relative = config.get("relative_attention", False)
    pos_types = config.get("pos_att_type") or []
    if isinstance(pos_types, str):
        pos_types = [t.strip() for t in pos_types.lower().split("|")]
    if relative and not config.get("share_att_key", False):
        per_layer += (h * h + h if "c2p" in pos_types else 0) + (h * h + h if "p2c" in pos_types else 0)
    embed = vocab * emb + 2 * emb
    if config.get("position_biased_input", True):
        embed += config.get("max_position_embeddings", 512) * emb
    embed += (config.get("type_vocab_size", 0) or 0) * emb
    if emb != h:
        embed += emb * h
    extra = span = 0
    if relative:
        buckets = config.get("position_buckets", -1)
        span = buckets if buckets and buckets > 0 else (config.get("max_relative_positions", -1) if (config.get("max_relative_positions", -1) or -1) > 0
                                                        else config.get("max_position_embeddings", 512))
        extra += 2 * span * h
        if "layer_norm" in str(config.get("norm_rel_ebd", "none")):
            extra += 2 * h
    if config.get("conv_kernel_size", 0):
        k = config["conv_kernel_size"]
        extra += h * h * k + h + 2 * h  # ConvLayer: Conv1d(h, h, k, groups=conv_groups=1) + LayerNorm
    pooler = config.get("pooler_hidden_size", h) * h + config.get("pooler_hidden_size", h)
    params = embed + layers * per_layer + extra + pooler
    return ModelShape(
        family="deberta-v2", params=params, layers=layers, encoder_layers=layers, hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, vocab=vocab, intermediate=inter, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("hidden_act", "gelu")), norm="layer", attention="deberta",
        dropout=float(config.get("hidden_dropout_prob", 0.1)), embedding_params=embed + extra,
        largest_module_params=max(vocab * emb, h * inter), blocks=(BlockKind(layers, per_layer, linears),),
        relative_positions=len(pos_types) if relative else 0, relative_span=span if relative else 0, source=source,
    )


def vit(config: dict, source: str) -> ModelShape:
    """ViTForImageClassification (modeling_vit.py, ViTModel without its pooler): patch Conv2d
    with bias, the class token and position embeddings for every patch + 1; per layer a
    pre-LayerNorm, query/key/value (qkv_bias) and output dense, intermediate and output dense,
    a second LayerNorm; the final LayerNorm; the classifier (num_labels x hidden) left out."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, inter = config["num_attention_heads"], config["intermediate_size"]
    patch, image, channels = config["patch_size"], config["image_size"], config.get("num_channels", 3)
    tokens = (image // patch) ** 2 + 1
    linears = (("query", h, h), ("key", h, h), ("value", h, h), ("attention.output.dense", h, h),
               ("intermediate.dense", h, inter), ("output.dense", inter, h))
    bias = 3 * h if config.get("qkv_bias", True) else 0
    per_layer = sum(i * o for _, i, o in linears) + bias + h + inter + h + 4 * h
    embed = channels * patch * patch * h + h + h + tokens * h
    params = embed + layers * per_layer + 2 * h
    return ModelShape(
        family="vit", params=params, layers=layers, encoder_layers=layers, hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, vocab=0, intermediate=inter, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("hidden_act", "gelu")), norm="layer", attention="fused",
        dropout=float(config.get("hidden_dropout_prob", 0.0) or 0.0), embedding_params=embed, tokens=tokens,
        largest_module_params=inter * h, blocks=(BlockKind(layers, per_layer, linears),), source=source,
        image_size=image,
    )


def clip_like_vision(config: dict, source: str, family: str) -> ModelShape:
    """CLIPVisionModel / SiglipVisionModel (modeling_clip.py, modeling_siglip.py): patch Conv2d
    (CLIP without bias, SigLIP with), position embeddings (CLIP: + the class token and a
    pre-LayerNorm), per layer q, k, v, out_proj with biases, fc1 / fc2, two LayerNorms; the
    post-LayerNorm; SigLIP's attention-pooling head when vision_use_head (its default)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, inter = config["num_attention_heads"], config["intermediate_size"]
    patch, image, channels = config["patch_size"], config["image_size"], config.get("num_channels", 3)
    clip = family == "clip_vision"
    tokens = (image // patch) ** 2 + (1 if clip else 0)
    linears = (("q_proj", h, h), ("k_proj", h, h), ("v_proj", h, h), ("out_proj", h, h), ("fc1", h, inter), ("fc2", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 4 * h + inter + h + 4 * h
    embed = channels * patch * patch * h + tokens * h + (h + 2 * h if clip else h)
    params = embed + layers * per_layer + 2 * h
    if not clip and config.get("vision_use_head", True):
        # SiglipMultiheadAttentionPoolingHead: probe, nn.MultiheadAttention, LayerNorm, MLP
        params += h + (4 * h * h + 4 * h) + 2 * h + (2 * h * inter + inter + h)
    return ModelShape(
        family=family, params=params, layers=layers, encoder_layers=layers, hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, vocab=0, intermediate=inter, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("hidden_act", "quick_gelu" if clip else "gelu_pytorch_tanh")),
        norm="layer", attention="fused", dropout=float(config.get("attention_dropout", 0.0) or 0.0),
        embedding_params=embed, tokens=tokens, largest_module_params=inter * h,
        blocks=(BlockKind(layers, per_layer, linears),), source=source, image_size=image,
    )


def _clip_text(config: dict, source: str) -> ModelShape:
    """CLIPTextModel (modeling_clip.py): token and position embeddings, pre-LN layers like the
    vision tower's, final LayerNorm."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, inter = config["num_attention_heads"], config["intermediate_size"]
    linears = (("q_proj", h, h), ("k_proj", h, h), ("v_proj", h, h), ("out_proj", h, h), ("fc1", h, inter), ("fc2", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + 4 * h + inter + h + 4 * h
    positions = config.get("max_position_embeddings", 77)
    embed = vocab * h + positions * h
    return ModelShape(
        family="clip_text", params=embed + layers * per_layer + 2 * h, layers=layers, encoder_layers=layers, hidden=h,
        heads=heads, kv_heads=heads, head_dim=h // heads, vocab=vocab, intermediate=inter, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("hidden_act", "quick_gelu")), norm="layer", attention="fused",
        embedding_params=embed, largest_module_params=max(vocab * h, inter * h),
        blocks=(BlockKind(layers, per_layer, linears),), source=source,
    )


def dual_encoder(config: dict, source: str) -> ModelShape:
    """CLIPModel / SiglipModel (contrastive image-text): both towers, CLIP's two projections
    (no bias) and logit scale, SigLIP's logit scale and bias. The vision tower gives the
    activation dimensions; the text tower's activations are added as another part."""
    family = config["model_type"]
    vision_cfg = dict(config.get("vision_config") or {})
    text_cfg = dict(config.get("text_config") or {})
    defaults = _TOWER_DEFAULTS[family]
    vision = clip_like_vision({**defaults["vision"], **vision_cfg}, source, "clip_vision" if family == "clip" else "siglip_vision")
    text_config = {**defaults["text"], **text_cfg}
    text = _clip_text(text_config, source)
    if family == "clip":
        proj = config.get("projection_dim", 512)
        extra = proj * vision.hidden + proj * text.hidden + 1
    else:
        # SiglipTextTransformer: no causal mask, a head Linear(h, projection_size or h) with bias
        out = text_config.get("projection_size") or text.hidden
        extra = text.hidden * out + out + 2
    params = vision.params + text.params + extra
    text_part = replace(text, tokens=text_config.get("max_position_embeddings", 77 if family == "clip" else 64))
    return replace(vision, family=f"{family}", params=params, other_parts=((text_part, None),),
                   notes=(f"{family}: vision {vision.params / 1e6:.0f}M + text {text.params / 1e6:.0f}M parameters",))


_TOWER_DEFAULTS = {  # configuration_clip.py / configuration_siglip.py defaults (transformers 5.24)
    "clip": {"vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                        "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu"},
             "text": {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                      "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu"}},
    "siglip": {"vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                          "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh"},
               "text": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                        "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh"}},
}


def whisper(config: dict, source: str) -> ModelShape:
    """WhisperForConditionalGeneration (modeling_whisper.py): encoder conv1 (num_mel_bins ->
    d, kernel 3) and conv2 (d -> d, kernel 3, stride 2) with biases, fixed sinusoidal positions
    (max_source_positions x d, a parameter without gradient), layers of self-attention (q, v,
    out with bias, k without) and fc1 / fc2, two LayerNorms, final LayerNorm; decoder token
    and learned positions, layers adding cross-attention (three LayerNorms), final LayerNorm;
    proj_out tied to the token embedding."""
    d, vocab = config["d_model"], config["vocab_size"]
    enc_layers, dec_layers = config["encoder_layers"], config["decoder_layers"]
    heads = config["encoder_attention_heads"]
    enc_ffn, dec_ffn = config["encoder_ffn_dim"], config["decoder_ffn_dim"]
    mels = config.get("num_mel_bins", 80)
    src = config.get("max_source_positions", 1500)
    tgt = config.get("max_target_positions", 448)

    def attn(prefix):
        return ((f"{prefix}.q_proj", d, d), (f"{prefix}.k_proj", d, d), (f"{prefix}.v_proj", d, d), (f"{prefix}.out_proj", d, d))
    attn_params = 4 * d * d + 3 * d
    enc_linears = attn("self_attn") + (("fc1", d, enc_ffn), ("fc2", enc_ffn, d))
    dec_linears = attn("self_attn") + attn("encoder_attn") + (("fc1", d, dec_ffn), ("fc2", dec_ffn, d))
    enc_block = attn_params + 2 * d * enc_ffn + enc_ffn + d + 4 * d
    dec_block = 2 * attn_params + 2 * d * dec_ffn + dec_ffn + d + 6 * d
    convs = mels * d * 3 + d + d * d * 3 + d
    embed = vocab * d + tgt * d
    params = convs + src * d + enc_layers * enc_block + 2 * d + embed + dec_layers * dec_block + 2 * d
    return ModelShape(
        family="whisper", params=params, layers=dec_layers, encoder_layers=enc_layers, hidden=d, heads=heads,
        kv_heads=heads, head_dim=d // heads, vocab=vocab, intermediate=enc_ffn, gated_mlp=False,
        mlp_tensors=_gelu_tensors(config.get("activation_function", "gelu")), norm="layer", attention="fused",
        dropout=float(config.get("dropout", 0.0) or 0.0), embedding_params=embed + src * d, tokens=src,
        largest_module_params=max(vocab * d, d * enc_ffn),
        blocks=(BlockKind(enc_layers, enc_block, enc_linears), BlockKind(dec_layers, dec_block, dec_linears)),
        max_positions=tgt, mel_bins=mels, source=source,
    )


# -- vision-language models: the vision tower counted ---------------------------------------------

def _qwen2_5_vl_vision(v: dict, out_hidden: int, source: str) -> ModelShape:
    """Qwen2_5_VisionTransformerPretrainedModel (modeling_qwen2_5_vl.py): Conv3d patch embed
    (in_chans x temporal_patch_size x patch^2 -> hidden, no bias), per block RMSNorm, fused qkv
    (bias), proj, a gated MLP (gate/up/down with bias) of intermediate_size, RMSNorm; the
    PatchMerger (RMSNorm over hidden, MLP hidden x merge^2 -> same -> out_hidden_size)."""
    h, depth = v.get("hidden_size", 1280), v.get("depth", 32)
    inter = v.get("intermediate_size", 3420)
    patch, temporal, chans = v.get("patch_size", 14), v.get("temporal_patch_size", 2), v.get("in_chans", v.get("in_channels", 3))
    merge = v.get("spatial_merge_size", 2)
    heads = v.get("num_heads", 16)
    linears = (("qkv", h, 3 * h), ("proj", h, h), ("gate_proj", h, inter), ("up_proj", h, inter), ("down_proj", inter, h))
    per_block = sum(i * o for _, i, o in linears) + 3 * h + h + 2 * inter + h + 2 * h
    merged = h * merge * merge
    params = chans * temporal * patch * patch * h + depth * per_block + h + merged * merged + merged + merged * out_hidden + out_hidden
    return ModelShape(
        family="qwen2_5_vl_vision", params=params, layers=depth, encoder_layers=depth, hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, vocab=0, intermediate=inter, gated_mlp=True, norm="rms", attention="fused",
        tokens=1024, largest_module_params=merged * merged, blocks=(BlockKind(depth, per_block, linears),), source=source,
    )


def _mllama_vision(v: dict, source: str) -> ModelShape:
    """MllamaVisionModel (modeling_mllama.py): patch Conv2d without bias, class embedding,
    gated position embedding and tile embeddings (max_num_tiles), pre/post tile position
    embeddings, LayerNorms; `num_hidden_layers` local layers and `num_global_layers` gated
    global layers of q, k, v, o (no bias) and fc1 / fc2; tokens per tile (image/patch)^2 + 1."""
    h, local, global_ = v.get("hidden_size", 1280), v.get("num_hidden_layers", 32), v.get("num_global_layers", 8)
    inter, heads = v.get("intermediate_size", 5120), v.get("attention_heads", 16)
    patch, image, chans = v.get("patch_size", 14), v.get("image_size", 560), v.get("num_channels", 3)
    tiles = v.get("max_num_tiles", 4)
    aspect = len(v.get("supported_aspect_ratios") or [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]])
    tokens = (image // patch) ** 2 + 1
    linears = (("q_proj", h, h), ("k_proj", h, h), ("v_proj", h, h), ("o_proj", h, h), ("fc1", h, inter), ("fc2", inter, h))
    per_layer = sum(i * o for _, i, o in linears) + inter + h + 4 * h
    embed = chans * patch * patch * h + h + tokens * h + 1 + (aspect + 1) * tiles * tokens * h + 2 * ((aspect + 1) * tiles * h + 1)
    params = embed + local * per_layer + global_ * (per_layer + 2) + 4 * h
    return ModelShape(
        family="mllama_vision", params=params, layers=local + global_, encoder_layers=local + global_, hidden=h, heads=heads,
        kv_heads=heads, head_dim=h // heads, vocab=0, intermediate=inter, gated_mlp=False, mlp_tensors=2, norm="layer",
        attention="fused", tokens=tokens * tiles, largest_module_params=max(h * inter, (aspect + 1) * tiles * tokens * h),
        blocks=(BlockKind(local + global_, per_layer, linears),), source=source,
    )


def vision_language(config: dict, source: str, shape_from_config) -> ModelShape:
    """Qwen2_5_VLForConditionalGeneration and MllamaForConditionalGeneration: the language model
    (its text config, as its own family) plus the vision tower (counted, its activations added
    as another part at its own token count); Mllama's cross-attention layers and projector."""
    family = config["model_type"]
    if family == "qwen2_5_vl":
        text_cfg = dict(config.get("text_config") or {k: v for k, v in config.items() if k != "vision_config"})
        text_cfg["model_type"] = "qwen2"
        text = shape_from_config(text_cfg, source)
        vision = _qwen2_5_vl_vision(dict(config.get("vision_config") or {}), text.hidden, source)
        extra = 0
        text = replace(text, notes=(*text.notes, "Qwen2.5-VL: the vision tower sized at 1,024 patches per sample (one "
                                    "448 x 448 image; its patch count follows each image's size)"))
    else:  # mllama
        text_cfg = dict(config["text_config"])
        cross = list(text_cfg.get("cross_attention_layers") or [])
        text_cfg = dict(text_cfg, model_type="llama", num_hidden_layers=text_cfg["num_hidden_layers"])
        text = shape_from_config(text_cfg, source)
        text = replace(text, params=text.params + 8 * text.hidden)  # 8 extra image-token embeddings (vocab + 8)
        # a cross-attention layer replaces a self-attention one: the same projections plus its
        # q / k RMSNorms (head_dim each) and two scalar tanh gates
        extra = len(cross) * (2 * text.head_dim + 2)
        v = dict(config.get("vision_config") or {})
        vision = _mllama_vision(v, source)
        extra += v.get("vision_output_dim", 7680) * text.hidden + text.hidden  # multi_modal_projector
    params = text.params + vision.params + extra
    return replace(text, family=text.family, params=params, other_parts=text.other_parts + ((vision, None),),
                   source=source, notes=text.notes + ((f"{family}: language model {text.params / 1e9:.3g}B + vision tower "
                                                        f"{vision.params / 1e9:.3g}B counted; activations: the language "
                                                        f"model's + the vision tower's at {vision.tokens} tokens per sample"),))


# -- diffusion transformers -----------------------------------------------------------------------

def sd3(config: dict, source: str) -> ModelShape:
    """diffusers SD3Transformer2DModel (transformers/transformer_sd3.py): PatchEmbed (conv,
    fixed positions), timestep + pooled-text embedding, context_embedder, `num_layers` joint
    blocks (AdaLayerNormZero x2: 6 x dim each, attention with q/k/v/out and add_q/k/v/to_add_out
    for the context, qk RMSNorm when qk_norm, FeedForward 4x GELU for both streams; the last
    block's context path is pre-only), AdaLayerNormContinuous and proj_out."""
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    layers = config["num_layers"]
    patch, cin = config.get("patch_size", 2), config.get("in_channels", 16)
    cout = config.get("out_channels") or cin
    joint, pooled = config.get("joint_attention_dim", 4096), config.get("pooled_projection_dim", 2048)
    ff = 4 * dim
    attn = 4 * (dim * dim + dim)  # q, k, v, out with bias
    ctx_attn = 4 * (dim * dim + dim)
    block = 2 * (dim * 6 * dim + 6 * dim) + attn + ctx_attn + 2 * (2 * dim * ff + ff + dim)
    linears = (("to_q", dim, dim), ("to_k", dim, dim), ("to_v", dim, dim), ("to_out", dim, dim),
               ("add_q_proj", dim, dim), ("add_k_proj", dim, dim), ("add_v_proj", dim, dim), ("to_add_out", dim, dim),
               ("ff.proj", dim, ff), ("ff.out", ff, dim), ("ff_context.proj", dim, ff), ("ff_context.out", ff, dim))
    if config.get("qk_norm"):
        block += 4 * config["attention_head_dim"]
    dual = len(config.get("dual_attention_layers") or ())
    embed = cin * patch * patch * dim + dim + (256 * dim + dim + dim * dim + dim) + (pooled * dim + dim + dim * dim + dim) + joint * dim + dim
    params = embed + layers * block + dual * (attn + 2 * config["attention_head_dim"]) + dim * 2 * dim + 2 * dim + dim * patch * patch * cout + patch * patch * cout
    return ModelShape(family="sd3", params=params, layers=layers, hidden=dim, heads=config["num_attention_heads"],
                      head_dim=config["attention_head_dim"], intermediate=ff, gated_mlp=False, norm="layer",
                      largest_module_params=dim * 6 * dim, blocks=(BlockKind(layers, block, linears),), source=source,
                      notes=(("diffusion transformer: parameters counted; activations by the generic transformer-layer "
                             "terms at the latent's patch tokens, checked against the simulator on small configs only"),))


def flux(config: dict, source: str) -> ModelShape:
    """diffusers FluxTransformer2DModel (transformers/transformer_flux.py): x_embedder,
    time / guidance / pooled-text embeddings, context_embedder, `num_layers` double-stream
    blocks (AdaLayerNormZero x2, joint attention with qk RMSNorms, two 4x GELU FeedForwards)
    and `num_single_layers` single-stream blocks (AdaLayerNormZeroSingle, attention q/k/v,
    proj_mlp 4x, proj_out over attention + MLP), AdaLayerNormContinuous, proj_out."""
    heads, head_dim = config.get("num_attention_heads", 24), config.get("attention_head_dim", 128)
    dim = heads * head_dim
    double, single = config.get("num_layers", 19), config.get("num_single_layers", 38)
    cin = config.get("in_channels", 64)
    cout = config.get("out_channels") or cin
    joint, pooled = config.get("joint_attention_dim", 4096), config.get("pooled_projection_dim", 768)
    ff = 4 * dim
    lin = lambda i, o: i * o + o
    double_block = 2 * lin(dim, 6 * dim) + 8 * lin(dim, dim) + 4 * head_dim + 2 * (lin(dim, ff) + lin(ff, dim))
    single_block = lin(dim, 3 * dim) + 3 * lin(dim, dim) + 2 * head_dim + lin(dim, ff) + lin(dim + ff, dim)
    embed = lin(cin, dim) + lin(256, dim) + lin(dim, dim) + lin(pooled, dim) + lin(dim, dim) + lin(joint, dim)
    if config.get("guidance_embeds", True):
        embed += lin(256, dim) + lin(dim, dim)
    params = embed + double * double_block + single * single_block + lin(dim, 2 * dim) + lin(dim, cout)
    linears = (("to_q", dim, dim), ("to_k", dim, dim), ("to_v", dim, dim), ("to_out", dim, dim), ("proj_mlp", dim, ff),
               ("proj_out", dim + ff, dim))
    return ModelShape(family="flux", params=params, layers=double + single, hidden=dim, heads=heads, head_dim=head_dim,
                      intermediate=ff, gated_mlp=False, norm="layer", largest_module_params=(dim + ff) * dim,
                      blocks=(BlockKind(double, double_block, linears), BlockKind(single, single_block, linears)),
                      source=source, notes=(("diffusion transformer: parameters counted; activations by the generic "
                                            "transformer-layer terms at the latent's patch tokens, checked against the "
                                            "simulator on small configs only"),))
