"""The UNet2DConditionModel activation term (memory/unet_activations.py, read from diffusers
0.42.1) and the allocator's range for variable-length batches. The simulator comparison runs
where diffusers is installed (bench/memory_families.md holds the table)."""

import pytest

from cfgfix.memory.estimator import VARIABLE_LENGTH_RESERVED, estimate
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import catalog_entry, shape_from_catalog, shape_from_config
from cfgfix.memory.unet_activations import unet_activations, unet_units
from cfgfix.records import replace

SD15 = shape_from_catalog("sd15")


def test_units_follow_the_diffusers_layout():
    units = unet_units(SD15, latent=64, batch=1, layers_per_block=2)
    kinds = [u[0] for u in units]
    # SD 1.5: 2 resnets per down block (4 levels) + 2 in the mid block + 3 per up block
    assert kinds.count("resnet") == 8 + 2 + 12
    # 16 Transformer2DModels: 2 x 3 down, 1 mid, 3 x 3 up (SD 1.5's cross-attention layers)
    assert kinds.count("transformer") == 16
    assert kinds.count("sampler") == 6 and kinds[-1] == "output"
    # the first up block's first resnet reads the mid output (1280) and the last skip (1280)
    assert kinds[17:20] == ["resnet", "transformer", "resnet"]  # after 8 resnets, 6 transformers, 3 samplers
    assert units[20][:3] == ("resnet", 2560, 1280)
    # the units' parameters are the UNet's, less conv_in and the time embedding
    total = sum(u[5] for u in units)
    c0 = 320
    assert total == SD15.params - (4 * c0 * 9 + c0) - (c0 * 4 * c0 + 4 * c0) - (16 * c0 * c0 + 4 * c0)


def test_saved_tensors_per_unit():
    latent, batch = 64, 2
    saved, *_ = unet_activations(SD15, latent, batch, 4, checkpointing=False)
    by_hand = 0
    for kind, cin, cout, pixels, depth, _ in unet_units(SD15, latent, batch, 2):
        per_map = {"resnet": 3 * cin + 3 * cout, "transformer": (3 + 30 * depth) * cout, "sampler": cin,
                   "output": 3 * cout}[kind]
        by_hand += 4 * per_map * pixels
    assert saved == by_hand
    ckpt, *_ = unet_activations(SD15, latent, batch, 4, checkpointing=True)
    assert ckpt < saved / 5


def test_the_peak_is_in_the_middle_of_backward():
    setup = MemorySetup(micro_batch=2, resolution=512, optimizer="sgd")
    result = estimate(setup, SD15)
    assert result.peak_phase == "backward middle"
    assert result.phases["backward middle"] > max(result.phases["backward start"], result.phases["backward end"])


@pytest.mark.parametrize("name", ["sd15"])
def test_against_the_simulator(name):
    pytest.importorskip("diffusers")
    from cfgfix.memory.simulate import simulate_diffusers

    config = catalog_entry(name)["config"]
    setup = MemorySetup(micro_batch=2, resolution=256, device="cpu", optimizer="sgd", optimizer_impl="foreach")
    simulated = simulate_diffusers(setup, config).peak_bytes
    assert estimate(setup, shape_from_config(config)).peak == pytest.approx(simulated, rel=0.15)


def test_autocast_keeps_a_16_bit_copy_of_every_conv_and_linear_weight():
    # conv2d and linear are both on autocast's 16-bit list, and the casts are cached until the
    # forward's autocast region ends (the simulator: +1.64 GB for SD 1.5 at the end of the forward)
    setup = MemorySetup(micro_batch=1, resolution=256, autocast="fp16", optimizer="sgd")
    temporaries = estimate(setup, SD15).component("temporaries")
    assert temporaries.size >= 2 * SD15.params and "weight copies" in temporaries.formula
    assert "weight copies" not in estimate(replace(setup, autocast=None), SD15).component("temporaries").formula


def test_variable_length_batches_widen_the_top_to_the_reported_ratio():
    shape = shape_from_catalog("mistralai/Mistral-7B-v0.1")
    fixed = MemorySetup(weights="bf16", lora_rank=16, quantization="4bit", micro_batch=4, seq_len=1024,
                        checkpointing=True, gpu="A100 80GB")
    varying = estimate(replace(fixed, variable_length=True), shape)
    assert varying.peak == estimate(fixed, shape).peak
    assert varying.high >= VARIABLE_LENGTH_RESERVED[1] * (varying.peak - varying.component("cuda_context").size)
    assert any("batches vary in shape" in a for a in varying.assumptions)
    assert any("fixed-length" in a for a in estimate(replace(fixed, variable_length=False), shape).assumptions)
