"""The shape of a model as the memory model needs it: parameter counts per kind of block, the
Linear layers that LoRA, quantisation and autocast act on, and the dimensions the activation
terms use. Plain data, shared by the config readers (memory/shapes.py, memory/families.py)."""

from __future__ import annotations

from cfgfix.records import dataclass, field

Linear = tuple[str, int, int]  # module name, in features, out features


@dataclass(frozen=True)
class BlockKind:
    """`count` identical blocks (transformer layers, UNet levels), each holding `params`
    parameters of which `linears` are the Linear layers' weight matrices."""

    count: int
    params: int
    linears: tuple[Linear, ...] = ()


@dataclass(frozen=True)
class ModelShape:
    family: str  # llama, qwen2, gpt2, t5, bert, unet, ... or "params" for a bare count
    params: int
    layers: int = 0  # transformer layers (decoder layers for an encoder-decoder model)
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    vocab: int = 0
    intermediate: int = 0
    encoder_layers: int = 0  # T5 / BERT encoder layers (BERT: all of its layers)
    gated_mlp: bool = True  # SwiGLU / GeGLU (3 matrices) vs a 2-matrix GELU MLP
    # intermediate-sized tensors the MLP keeps for backward: gated 4 (gate, act(gate), up, product);
    # a fused GELU 2 (its input, its output); GPT-2's "gelu_new" is composed of elementwise ops
    # in Python (transformers activations.py NewGELUActivation) and keeps 3 more (tanh, 0.5x, 1+tanh)
    mlp_tensors: int = 4
    norm: str = "rms"  # "rms" (HF up-casts to fp32 inside) or "layer"
    attention: str = "fused"  # "fused" (SDPA / flash: no s^2 term) or "eager" (T5: scores saved)
    dropout: float = 0.0  # hidden / attention dropout while training
    # Gemma-2's logit soft-capping (modeling_gemma2.py): tanh over the attention scores (eager
    # only: SDPA and flash kernels skip or fuse it) and over the output logits
    attn_softcap: bool = False
    logit_softcap: bool = False
    embedding_params: int = 0  # input and position embeddings: never autocast, quantised, or LoRA'd
    head_params: int = 0  # an untied output head (counted in params; 0 when tied)
    largest_module_params: int = 0  # the largest single module (ZeRO-3's "largest layer", facts C14)
    blocks: tuple[BlockKind, ...] = ()
    unet_levels: tuple[tuple[int, int, int], ...] = ()  # UNet: (channels, downsampling factor, transformer layers)
    unet_layers_per_block: int = 2  # UNet: resnets per down block (up blocks have one more)
    # a fixed number of tokens per sample (a ViT: patches + the class token); 0: the run's sequence length
    tokens: int = 0
    max_positions: int = 0  # max_position_embeddings (0: not stated); a longer --seq is warned about
    # a composite model's other backbones (memory/parts.py): (shape, gradient checkpointing on)
    # each, whose activations add to this (the largest) backbone's
    other_parts: tuple = ()
    # mixture of experts (memory/families.py): experts per MoE layer, how many a token visits,
    # their intermediate size, a shared expert's, how many layers are MoE, parameters per token
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0
    moe_layers: int = 0
    active_params: int = 0
    parallel_norms: int = 0  # Falcon: LayerNorms feeding attention and MLP in parallel (1 or 2); 0: sequential
    relative_positions: int = 0  # DeBERTa: disentangled position terms (c2p, p2c) per attention
    relative_span: int = 0  # DeBERTa: position buckets (the relative embeddings are 2 x span)
    image_size: int = 0  # a vision encoder's input side in pixels
    mel_bins: int = 0  # Whisper: input features per frame
    # a parameter count read from the model's name ("-7B"): the (low, high) it may really be;
    # the estimate's band runs over it (estimator._estimate_guessing_the_shape)
    params_range: tuple[int, int] = ()
    source: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def block_linear_params(self) -> int:
        """Weights of the blocks' Linear layers (what bitsandbytes quantises)."""
        return sum(b.count * sum(i * o for _, i, o in b.linears) for b in self.blocks)

    @property
    def linear_params(self) -> int:
        """Weights autocast casts to 16-bit: the blocks' Linear layers and the output head
        (a tied head shares the embedding matrix but is still cast for the matmul)."""
        head = self.head_params or (self.vocab * self.hidden if self.family not in ("bert", "unet", "params") else 0)
        return self.block_linear_params + head

    def lora_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """LoRA A (r x in) and B (out x r) for each targeted Linear; None: every Linear in
        the blocks (PEFT's "all-linear", which leaves the output head out)."""
        total = 0
        for block in self.blocks:
            for name, fan_in, fan_out in block.linears:
                if targets is None or name in targets:
                    total += block.count * rank * (fan_in + fan_out)
        return total

    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "params": self.params,
            "layers": self.layers,
            "encoder_layers": self.encoder_layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab": self.vocab,
            "intermediate": self.intermediate,
            "largest_module_params": self.largest_module_params,
            **({"experts": self.experts, "experts_per_token": self.experts_per_token, "active_params": self.active_params}
               if self.experts else {}),
            **({"tokens_per_sample": self.tokens} if self.tokens else {}),
            "source": self.source,
        }


def gelu_tensors(act: str) -> int:
    """Intermediate-sized tensors a non-gated MLP keeps: fc1's output and fc2's input for a fused
    activation; CLIP's quick_gelu (x * sigmoid(1.702 x), activations.py QuickGELUActivation)
    also keeps the sigmoid's output; the Python-composed tanh GELUs keep five."""
    if act == "quick_gelu":
        return 3
    return 5 if act in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_python") else 2
