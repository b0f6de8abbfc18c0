"""Tiny configs of the families added for issue 21 (built locally, nothing downloaded), and the
setups their activation terms are checked on against the FakeTensor simulator. CONFIGS are the
shapes the terms were written against; HELDOUT are other shapes (other widths, depths, head
counts, expert counts, image and patch sizes) the terms never saw: tests assert on those."""

from cfgfix.memory.setup import MemorySetup
from cfgfix.records import replace

CONFIGS = {
    "mixtral": {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 8000, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "intermediate_size": 512, "moe_intermediate_size": 128,
                  "shared_expert_intermediate_size": 512, "vocab_size": 8000, "num_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 512, "moe_intermediate_size": 128,
                  "vocab_size": 8000, "num_experts": 8, "num_experts_per_tok": 2},
    "falcon": {"model_type": "falcon", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
               "vocab_size": 8000, "multi_query": True, "parallel_attn": True},
    "glm4": {"model_type": "glm4", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512, "vocab_size": 8000, "pad_token_id": 0},
    "deberta-v2": {"model_type": "deberta-v2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                   "intermediate_size": 1024, "vocab_size": 8000, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                   "position_biased_input": False, "position_buckets": 64, "max_relative_positions": -1,
                   "norm_rel_ebd": "layer_norm", "share_att_key": True, "type_vocab_size": 0},
    "vit": {"model_type": "vit", "hidden_size": 192, "num_hidden_layers": 3, "num_attention_heads": 3,
            "intermediate_size": 768, "image_size": 224, "patch_size": 16},
    "clip": {"model_type": "clip", "projection_dim": 64,
             "vision_config": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "image_size": 224, "patch_size": 32},
             "text_config": {"hidden_size": 96, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                             "vocab_size": 1000}},
    "whisper": {"model_type": "whisper", "d_model": 128, "encoder_layers": 2, "decoder_layers": 2,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 512, "decoder_ffn_dim": 512,
                "vocab_size": 1000, "num_mel_bins": 80, "max_source_positions": 1500, "pad_token_id": 0, "bos_token_id": 1,
                "eos_token_id": 2, "decoder_start_token_id": 1},
}

HELDOUT = {
    "mixtral": dict(CONFIGS["mixtral"], hidden_size=384, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                    intermediate_size=768, num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(CONFIGS["qwen2_moe"], hidden_size=320, num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5,
                      moe_intermediate_size=160, shared_expert_intermediate_size=640, num_experts=6, num_experts_per_tok=4),
    "qwen3_moe": dict(CONFIGS["qwen3_moe"], hidden_size=384, num_hidden_layers=3, num_attention_heads=4, head_dim=64,
                      moe_intermediate_size=96, num_experts=16, num_experts_per_tok=4),
    "falcon": dict(CONFIGS["falcon"], hidden_size=384, num_hidden_layers=3, num_attention_heads=6, multi_query=False,
                   new_decoder_architecture=True, num_kv_heads=2),
    "glm4": dict(CONFIGS["glm4"], hidden_size=384, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
                 head_dim=64, intermediate_size=1024),
    "deberta-v2": dict(CONFIGS["deberta-v2"], hidden_size=384, num_hidden_layers=3, num_attention_heads=6,
                       intermediate_size=1536, position_buckets=128),
    "vit": dict(CONFIGS["vit"], hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                image_size=192, patch_size=12),
    "clip": dict(CONFIGS["clip"], vision_config=dict(CONFIGS["clip"]["vision_config"], hidden_size=192, num_attention_heads=6,
                                                     intermediate_size=768, image_size=160, patch_size=16),
                 text_config=dict(CONFIGS["clip"]["text_config"], hidden_size=128, num_hidden_layers=3)),
    "whisper": dict(CONFIGS["whisper"], d_model=192, encoder_layers=3, decoder_layers=2, encoder_attention_heads=6,
                    decoder_attention_heads=6, encoder_ffn_dim=768, decoder_ffn_dim=768),
}

# the simulator runs CPU kernels and torch's foreach optimizer step; MoE experts run
# transformers' grouped_mm, which takes 16-bit weights on the CPU: MoE rows are bf16
BASE = MemorySetup(micro_batch=4, seq_len=512, device="cpu", optimizer_impl="foreach")
SETUPS = {
    "fp32": BASE, "amp-bf16": replace(BASE, autocast="bf16"), "bf16": replace(BASE, weights="bf16"),
    "checkpointing": replace(BASE, checkpointing=True),
}
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


def setup_for(family: str, name: str, shape) -> MemorySetup | None:
    """The setup `name` for `family`, or None where it does not apply."""
    setup = SETUPS[name]
    if family in MOE:
        if name in ("fp32", "amp-bf16"):
            return None  # grouped_mm on CPU fake tensors needs 16-bit weights
        setup = replace(setup, weights="bf16")
    if family == "whisper":
        setup = replace(setup, seq_len=None, target_len=128)
    if family == "clip":
        setup = replace(setup, seq_len=77, micro_batch=32)
    if family == "vit":
        setup = replace(setup, seq_len=None, micro_batch=16)
    return replace(setup, params=shape.params)

# diffusers UNet2DConditionModel shapes (bench/memory_families.py, tests/test_unet_activations.py):
# the catalog's SD 1.5 and SDXL UNets and held-out ones (other widths, depths, transformer depths,
# cross-attention widths, one resnet per block)
UNET_HELDOUT = {
    "unet-narrow": {"_class_name": "UNet2DConditionModel", "block_out_channels": [128, 256, 384], "layers_per_block": 1,
                    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
                    "cross_attention_dim": 512, "attention_head_dim": 8, "in_channels": 4, "out_channels": 4,
                    "sample_size": 32},
    "unet-deep": {"_class_name": "UNet2DConditionModel", "block_out_channels": [160, 320, 640], "layers_per_block": 2,
                  "transformer_layers_per_block": [1, 2, 3],
                  "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                  "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                  "cross_attention_dim": 768, "attention_head_dim": [5, 10, 20], "use_linear_projection": True,
                  "in_channels": 4, "out_channels": 4, "sample_size": 32},
}

# diffusion transformers, small (their catalog dimensions scaled down; rope axes summing to the head size)
DIT_SMALL = {
    "flux-small": {"_class_name": "FluxTransformer2DModel", "num_layers": 2, "num_single_layers": 4,
                   "num_attention_heads": 4, "attention_head_dim": 64, "in_channels": 64, "joint_attention_dim": 512,
                   "pooled_projection_dim": 128, "guidance_embeds": True, "axes_dims_rope": [8, 28, 28]},
    "sd3-small": {"_class_name": "SD3Transformer2DModel", "num_layers": 4, "num_attention_heads": 4, "attention_head_dim": 64,
                  "patch_size": 2, "in_channels": 16, "joint_attention_dim": 512, "pooled_projection_dim": 256,
                  "caption_projection_dim": 256, "pos_embed_max_size": 96, "sample_size": 64},
}
