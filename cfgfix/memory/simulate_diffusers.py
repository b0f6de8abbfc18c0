"""The FakeTensor simulator for diffusers' UNet2DConditionModel (`estimate --simulate` on a UNet).

The same method as memory/simulate.py: the model built from its config under `FakeTensorMode`
on the CPU, `steps` training steps of the diffusers training scripts' shape
(`examples/text_to_image/train_text_to_image*.py`: the UNet predicts the noise of latents at
resolution / 8 given the timestep and the text encoders' hidden states, and the loss is
`F.mse_loss(model_pred.float(), target.float())`), `LiveBytes` counting the peak. SDXL's added
conditioning (pooled text embeds and the six time ids) is built when the config asks for it.
The text encoders and the VAE are not part of the step (their outputs are inputs here).

diffusers is imported inside `simulate_unet`, never at import.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from cfgfix.memory.setup import MemorySetup

DIFFUSERS_HINT = "pip install diffusers"
TEXT_TOKENS = 77  # CLIP's max_position_embeddings: the encoder_hidden_states' length


# diffusers models the simulator builds, by the config's `_class_name`
CLASSES = ("UNet2DConditionModel", "FluxTransformer2DModel", "SD3Transformer2DModel")
# text tokens of the diffusion transformers' prompts (FLUX: T5 at 512; SD3: 77 CLIP + 256 T5)
DIT_TEXT_TOKENS = {"FluxTransformer2DModel": 512, "SD3Transformer2DModel": 333}


def is_unet_config(config: dict) -> bool:
    return config.get("_class_name") in CLASSES or "down_block_types" in config


def simulate_unet(setup: MemorySetup, config: dict, *, steps: int = 2, fake: bool = True):
    """Run `steps` training steps of a UNet2DConditionModel built from `config` and measure
    the peak of live tensor bytes (a memory/simulate.py SimulationResult)."""
    from cfgfix.memory import simulate as sim

    if steps < 1:
        raise ValueError("steps must be at least 1")
    sim._refuse_unsupported(setup)
    torch, _ = sim._import_torch_stack()
    try:
        import diffusers
    except ImportError as err:
        raise sim.SimulatorUnavailable(f"simulating a UNet needs diffusers: {DIFFUSERS_HINT}") from err
    from cfgfix.memory.live_bytes import LiveBytes, model_state_bytes

    assumptions: list[str] = []
    resolution = setup.resolution or 1024
    if setup.resolution is None:
        assumptions.append("image resolution unknown: 1024 px assumed")
    micro_batches = max(1, min(setup.gradient_accumulation, 2))
    started = time.perf_counter()
    with ExitStack() as stack:
        if fake:
            fake_mode = stack.enter_context(sim._fake_mode())
            stack.enter_context(sim._module_moves_under(fake_mode))
        counter = stack.enter_context(LiveBytes())
        values = {k: v for k, v in config.items() if not k.startswith("_")}
        kind = config.get("_class_name") or "UNet2DConditionModel"
        model = getattr(diffusers, kind).from_config(values).to(sim._dtype(torch, setup.weights))
        model.train()
        if setup.checkpointing:
            model.enable_gradient_checkpointing()
        optimizer = sim._build_optimizer(torch, model, setup.optimizer, setup.optimizer_impl or "foreach")
        counter.track_existing(model, optimizer)
        phases = {"model": counter.current}
        build_peak = counter.peak
        dtype = next(model.parameters()).dtype
        autocast = sim._autocast(torch, setup.autocast)
        for step in range(steps):
            for _ in range(micro_batches):
                batch = _batch(torch, model.config, setup.micro_batch, resolution, dtype, kind)
                target = torch.zeros_like(batch["hidden_states" if "hidden_states" in batch else "sample"])
                counter.reset_peak()
                with autocast:
                    prediction = model(**batch).sample
                loss = torch.nn.functional.mse_loss(prediction.float(), target.float())
                del prediction
                phases["forward"] = max(phases.get("forward", 0), counter.peak)
                counter.reset_peak()
                loss.backward()
                del loss, batch, target
                phases["backward"] = max(phases.get("backward", 0), counter.peak)
                counter.reset_peak()
            optimizer.step()
            if step < steps - 1:
                optimizer.zero_grad(set_to_none=True)
            phases["optimizer"] = max(phases.get("optimizer", 0), counter.peak)
            counter.reset_peak()
        state = model_state_bytes(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model, optimizer
    peak = max(build_peak, *phases.values())
    return sim.SimulationResult(
        peak_bytes=peak, phases=phases, state=state, params=params, trainable_params=trainable,
        cuda_context_bytes=sim.CUDA_CONTEXT_BYTES, allocator_margin_bytes=round(peak * sim.ALLOCATOR_MARGIN),
        error_band=sim.ERROR_BAND, steps=steps, micro_batches=micro_batches, wall_seconds=time.perf_counter() - started,
        fake=fake, assumptions=assumptions,
    )


def _batch(torch, config, batch: int, resolution: int, dtype, kind: str = "UNet2DConditionModel") -> dict:
    """The UNet's inputs as the training scripts give them: noisy latents (the VAE's 8x
    down-sampling, `in_channels` channels), one timestep per sample, the text encoders' hidden
    states (77 tokens of `cross_attention_dim`), and SDXL's pooled text embeds and time ids."""
    side = resolution // 8
    if kind == "FluxTransformer2DModel":
        # the latents packed in 2 x 2 patches (pipeline_flux.py _pack_latents), T5 prompt tokens
        tokens, text = (side // 2) ** 2, DIT_TEXT_TOKENS[kind]
        out = {"hidden_states": torch.zeros(batch, tokens, config.in_channels, dtype=dtype),
               "encoder_hidden_states": torch.zeros(batch, text, config.joint_attention_dim, dtype=dtype),
               "pooled_projections": torch.zeros(batch, config.pooled_projection_dim, dtype=dtype),
               "timestep": torch.zeros(batch, dtype=dtype), "img_ids": torch.zeros(tokens, 3, dtype=dtype),
               "txt_ids": torch.zeros(text, 3, dtype=dtype)}
        if config.guidance_embeds:
            out["guidance"] = torch.zeros(batch, dtype=dtype)
        return out
    if kind == "SD3Transformer2DModel":
        return {"hidden_states": torch.zeros(batch, config.in_channels, side, side, dtype=dtype),
                "encoder_hidden_states": torch.zeros(batch, DIT_TEXT_TOKENS[kind], config.joint_attention_dim, dtype=dtype),
                "pooled_projections": torch.zeros(batch, config.pooled_projection_dim, dtype=dtype),
                "timestep": torch.zeros(batch, dtype=dtype)}
    cross = config.cross_attention_dim
    cross = cross[0] if isinstance(cross, (list, tuple)) else cross
    out = {
        "sample": torch.zeros(batch, config.in_channels, side, side, dtype=dtype),
        "timestep": torch.zeros(batch, dtype=torch.long),
        "encoder_hidden_states": torch.zeros(batch, TEXT_TOKENS, cross, dtype=dtype),
    }
    if config.addition_embed_type == "text_time":
        time_ids = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        out["added_cond_kwargs"] = {"text_embeds": torch.zeros(batch, time_ids, dtype=dtype),
                                    "time_ids": torch.zeros(batch, 6, dtype=dtype)}
    return out
