"""What diffusers' UNet2DConditionModel keeps for backward, module by module (diffusers 0.42.1:
`models/unets/unet_2d_condition.py`, `unet_2d_blocks.py`, `resnet.py` `ResnetBlock2D`,
`transformers/transformer_2d.py` `Transformer2DModel`, `attention.py` `BasicTransformerBlock`,
`attention_processor.py` `AttnProcessor2_0`), in feature maps of C channels x the level's pixels:

- ResnetBlock2D (cin -> cout): GroupNorm keeps its input, SiLU its input (the norm's output),
  the 3x3 conv its input (SiLU's output), twice: 3 cin + 3 cout (dropout 0 keeps nothing; the
  1x1 shortcut reads the block input, already kept);
- Transformer2DModel around its blocks: the GroupNorm's input, proj_in's input (the norm's
  output), proj_out's input (a contiguous copy of the last block's output): 3 C;
- BasicTransformerBlock: the block input (LayerNorm), the norm's output (q, k, v Linears),
  q, k, v and SDPA's output (the flash / efficient kernels keep them with an fp32 logsumexp
  per head and pixel), the output's contiguous copy (to_out), then the same for cross-attention
  after the residual (input, norm output, q, SDPA output, its copy; k and v over 77 text tokens),
  the third norm's input and output, GEGLU's 8 C projection (kept whole: gelu keeps the gate
  half, the product the other), gelu's output (4 C) and the product (4 C, ff.out's input): 30 C;
- a downsampler keeps its conv's input, an upsampler its conv's input at twice the side
  (nearest interpolation keeps nothing); an up block's first ops read the skip concatenation;
- the output: GroupNorm, SiLU and conv_out keep 3 C0 at full resolution.

With `enable_gradient_checkpointing()` each ResnetBlock2D and each BasicTransformerBlock is
recomputed in backward (diffusers checkpoints them one by one); the Transformer2DModel's own
norm and projections, the samplers and the output stay as above, and each checkpointed unit
keeps its input.
"""

from __future__ import annotations

TEXT_TOKENS = 77  # CLIP text encoders' length: the cross-attention's keys and values
RESNET = (3, 3)  # (x cin, x cout) feature maps kept by ResnetBlock2D
TRANSFORMER_WRAPPER = 3
TRANSFORMER_BLOCK = 30


def _resnet_params(cin: int, cout: int, temb: int) -> int:
    shortcut = cin * cout + cout if cin != cout else 0
    return 2 * cin + 9 * cin * cout + cout + temb * cout + cout + 2 * cout + 9 * cout * cout + cout + shortcut


def _transformer_params(c: int, depth: int, cross: int) -> int:
    block = 6 * c + 4 * c * c + c + 2 * c * c + 2 * cross * c + c + 12 * c * c + 9 * c
    return 2 * c + 2 * (c * c + c) + depth * block


def unet_units(shape, latent: int, batch: int, layers_per_block: int, cross: int = 768):
    """Every unit of the UNet in forward order: (kind, channels in, channels out, pixels,
    transformer depth, parameters); kind is "resnet", "transformer", "sampler" (a conv's input)
    or "output"."""
    levels = shape.unet_levels
    temb = 4 * levels[0][0]
    units = []

    def resnet(cin, cout, pixels):
        units.append(("resnet", cin, cout, pixels, 0, _resnet_params(cin, cout, temb)))

    def transformer(c, pixels, depth):
        units.append(("transformer", c, c, pixels, depth, _transformer_params(c, depth, cross)))

    skips = [(levels[0][0], (latent // levels[0][1]) ** 2 * batch)]  # conv_in's output
    channels = levels[0][0]
    for index, (c, factor, depth) in enumerate(levels):
        pixels = (latent // factor) ** 2 * batch
        for _ in range(layers_per_block):
            resnet(channels, c, pixels)
            channels = c
            if depth:
                transformer(c, pixels, depth)
            skips.append((c, pixels))
        if index < len(levels) - 1:
            units.append(("sampler", c, c, pixels, 0, 9 * c * c + c))
            skips.append((c, pixels // 4))
    c, factor, depth = levels[-1]
    pixels = (latent // factor) ** 2 * batch
    resnet(c, c, pixels)
    transformer(c, pixels, depth or 1)
    resnet(c, c, pixels)
    for index, (c, factor, depth) in reversed(list(enumerate(levels))):
        pixels = (latent // factor) ** 2 * batch
        for _ in range(layers_per_block + 1):
            skip, _ = skips.pop()
            resnet(channels + skip, c, pixels)
            channels = c
            if depth:
                transformer(c, pixels, depth)
        if index > 0:
            units.append(("sampler", c, c, pixels * 4, 0, 9 * c * c + c))  # the conv after upsampling
    c0 = levels[0][0]
    units.append(("output", c0, c0, (latent // levels[0][1]) ** 2 * batch, 0, 2 * c0 + 9 * c0 * 4 + 4))
    return units


# Under CUDA autocast (16-bit compute) GroupNorm and LayerNorm run in fp32 (CUDA autocast's fp32
# list; CPU autocast runs them in their input's dtype, so on the CPU the whole UNet is 16-bit after
# conv_in and the plain 16-bit terms apply: what the simulator checks) and keep an fp32 copy of their input, while every conv and Linear keeps its own 16-bit cast of its
# input (q, k and v one each): bytes per feature map, not multiples of one dtype. A ResnetBlock2D
# keeps 4 (norm input) + 4 (SiLU's fp32 input) + 2 (the conv's cast) per map, twice; a wrapper
# 4 + 2 + 2; a BasicTransformerBlock 10 (norm1 and three casts) + 10 (q, k, v, SDPA output, copy)
# + 6 + 6 (cross-attention) + 6 + 16 + 8 + 8 (norm3, GEGLU's 8 C, gelu, product) = 70; the output 10.
AUTOCAST_BYTES = {"resnet": (10, 10), "wrapper": 8, "block": 70, "output": 10, "input": 2}


def _unit_saved(kind: str, cin: int, cout: int, pixels: int, depth: int, e: int, checkpointing: bool,
                autocast: bool = False) -> int:
    if autocast:
        nbytes = AUTOCAST_BYTES
        if kind == "resnet":
            return (nbytes["input"] * cin if checkpointing else nbytes["resnet"][0] * cin + nbytes["resnet"][1] * cout) * pixels
        if kind == "transformer":
            return (nbytes["wrapper"] + (nbytes["input"] if checkpointing else nbytes["block"]) * depth) * cout * pixels
        if kind == "sampler":
            return nbytes["input"] * cin * pixels
        return nbytes["output"] * cout * pixels
    if kind == "resnet":
        return (cin if checkpointing else RESNET[0] * cin + RESNET[1] * cout) * pixels * e
    if kind == "transformer":
        per_block = 1 if checkpointing else TRANSFORMER_BLOCK
        return (TRANSFORMER_WRAPPER + per_block * depth) * cout * pixels * e
    if kind == "sampler":
        return cin * pixels * e
    return 3 * cout * pixels * e


def unet_activations(shape, latent: int, batch: int, e: int, checkpointing: bool, layers_per_block: int = 2,
                     autocast: bool = False, cross: int = 768):
    """(saved for backward, the largest unit recomputed at once, one unit's backward transients,
    the backward's profile). The profile: for each unit as backward reaches it (the output first),
    (the saved bytes of the units still waiting, the share of the parameters whose gradients
    exist by then): the UNet's weights sit at the low resolutions and its activations at the
    high ones, so the step's peak is in the middle of backward, not at either end."""
    units = unet_units(shape, latent, batch, layers_per_block, cross)
    kept = [_unit_saved(*unit[:5], e, checkpointing, autocast) for unit in units]
    saved = sum(kept)
    full = [_unit_saved(kind, cin, cout, pixels, depth, e, False, autocast) for kind, cin, cout, pixels, depth, _ in units]
    largest = max(f - (k if checkpointing else 0) for f, k, u in zip(full, kept, units) if u[0] in ("resnet", "transformer"))
    # backward inside a transformer block's feed-forward: the gradients of GEGLU's 8 C projection,
    # its two halves and the block's output: ~16 C at the largest level
    transient = max((16 * cout * pixels * e for kind, _, cout, pixels, _, _ in units if kind == "transformer"), default=0)
    total_params = sum(u[5] for u in units) or 1
    profile, remaining, done = [], saved, 0
    for unit, k, f in zip(reversed(units), reversed(kept), reversed(full)):
        remaining -= k
        done += unit[5]
        # the unit's own tensors (recomputed under checkpointing) are live while its gradients are made
        profile.append((remaining + (f if checkpointing else k), done / total_params))
    return saved, largest, transient, tuple(profile)
