"""UNet2DConditionModel rows of bench/memory_families.md: the analytic UNet term against the
FakeTensor simulator (cfgfix/memory/simulate.py simulate_diffusers; needs diffusers).

    PYTHONPATH=.:<diffusers on the path> .venv/bin/python bench/memory_unet_rows.py >> bench/memory_families.md

Before: the coarse per-level term this replaced (8 C per resnet map, 24 C per transformer
layer, 2 x 5 C per level with checkpointing), kept here to print the comparison. Peaks in MiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from family_configs import DIT_SMALL, UNET_HELDOUT

from cfgfix.memory.estimator import estimate
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import catalog_entry, shape_from_config
from cfgfix.memory.simulate import simulate_diffusers
from cfgfix.memory.unet_activations import unet_activations
from cfgfix.records import replace

MIB = 1 << 20
BASE = MemorySetup(device="cpu", optimizer_impl="foreach", optimizer="sgd")
SETUPS = {"fp32": BASE, "amp-bf16": replace(BASE, autocast="bf16"), "bf16": replace(BASE, weights="bf16"),
          "checkpointing": replace(BASE, checkpointing=True), "amp-fp16+ckpt": replace(BASE, autocast="fp16", checkpointing=True)}
DIT_ROWS = [("flux-small", 2, 512), ("sd3-small", 2, 512)]
ROWS = [  # (config, micro batch, resolution)
    ("sd15", 2, 512), ("sdxl", 2, 768), ("unet-narrow", 4, 512), ("unet-deep", 2, 768),
]


def coarse_before(setup: MemorySetup, shape) -> int:
    """The replaced term's activations (estimator.py before this change), bytes."""
    e = 2 if setup.autocast or setup.weights != "fp32" else 4
    latent, b = setup.resolution // 8, setup.micro_batch
    if setup.checkpointing:
        return sum(2 * 5 * c * ((latent // f) ** 2) * b * e for c, f, _ in shape.unet_levels)
    return sum(5 * 8 * c * (latent // f) ** 2 * b * e + 5 * t * 24 * c * (latent // f) ** 2 * b * e
               for c, f, t in shape.unet_levels)


def config_of(name: str) -> dict:
    return UNET_HELDOUT.get(name) or DIT_SMALL.get(name) or catalog_entry(name)["config"]


def main() -> None:
    print("\n## UNet2DConditionModel (diffusers): held-out shapes and the catalog's UNets\n")
    print("SGD without momentum (no optimizer states), so the step's peak is the activations' moment. "
          "before: the coarse per-level term at the two ends of backward; after: memory/unet_activations.py "
          "with the backward's middle (up-block gradients made while down-block activations wait).\n")
    print("| unet | batch x px | setup | simulated | before | error | after | error | in band |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    errors = []
    for name, batch, px in ROWS:
        config = config_of(name)
        shape = shape_from_config(config)
        for label, base in SETUPS.items():
            setup = replace(base, micro_batch=batch, resolution=px)
            simulated = simulate_diffusers(setup, config).peak_bytes
            after = estimate(setup, shape)
            # the replaced term had two moments of backward: its start (all activations) and its end
            saved = unet_activations(shape, px // 8, batch, 2 if setup.autocast or setup.weights != "fp32" else 4,
                                     setup.checkpointing, shape.unet_layers_per_block,
                                     bool(setup.autocast) and setup.device == "cuda")[0]
            phases = after.phases
            before = max(phases["backward start"] - saved + coarse_before(setup, shape), phases["backward end"],
                         phases["optimizer step"])
            err_b, err_a = (before - simulated) / simulated, (after.peak - simulated) / simulated
            errors.append((abs(err_b), abs(err_a)))
            band = "yes" if after.low <= simulated <= after.high else "no"
            print(f"| {name} | {batch} x {px} | {label} | {simulated / MIB:,.0f} | {before / MIB:,.0f} | {err_b:+.1%} "
                  f"| {after.peak / MIB:,.0f} | {err_a:+.1%} | {band} |", flush=True)
    n = len(errors)
    print(f"\n{n} rows: mean absolute error before {sum(e[0] for e in errors) / n:.1%}, after "
          f"{sum(e[1] for e in errors) / n:.1%}; worst after {max(e[1] for e in errors):.1%}; within 15% after: "
          f"{sum(e[1] < 0.15 for e in errors)} of {n}.")


def diffusion_transformers() -> None:
    print("\n## Diffusion transformers (FLUX, SD3): the generic transformer-layer terms, first checked here\n")
    print("| model | batch x px | setup | simulated | estimate | error | in band |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, batch, px in DIT_ROWS:
        config = config_of(name)
        shape = shape_from_config(config)
        for label in ("fp32", "bf16", "checkpointing"):
            setup = replace(SETUPS[label], micro_batch=batch, resolution=px)
            simulated = simulate_diffusers(setup, config).peak_bytes
            after = estimate(setup, shape)
            band = "yes" if after.low <= simulated <= after.high else "no"
            print(f"| {name} | {batch} x {px} | {label} | {simulated / MIB:,.0f} | {after.peak / MIB:,.0f} "
                  f"| {(after.peak - simulated) / simulated:+.1%} | {band} |", flush=True)


if __name__ == "__main__":
    if "--dit" in sys.argv:
        diffusion_transformers()
    else:
        main()
