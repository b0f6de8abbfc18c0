"""diffusers' `weight_dtype` idiom: a dtype chosen by `accelerator.mixed_precision` in an
if/elif chain resolves when the Accelerator's precision is a literal (issue 25: an fp16
UNet under accelerate fp16, the usual "Attempting to unscale FP16 gradients" crash, got no
CFX204)."""

from __future__ import annotations

import pytest

from tests.conftest import lint_project, write_project

SCRIPT = '''import torch
from accelerate import Accelerator
from diffusers import AutoencoderKL, UNet2DConditionModel

accelerator = Accelerator(mixed_precision={precision})
weight_dtype = torch.float32
if accelerator.mixed_precision == "fp16":
    weight_dtype = torch.float16
elif accelerator.mixed_precision == "bf16":
    weight_dtype = torch.bfloat16
vae = AutoencoderKL.from_pretrained("m", subfolder="vae")
unet = UNet2DConditionModel.from_pretrained("m", subfolder="unet")
vae.to(accelerator.device, dtype=weight_dtype)
{cast}unet.train()
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5)
unet, optimizer = accelerator.prepare(unet, optimizer)
for batch in loader:
    loss = unet(batch["x"], batch["t"], batch["c"]).sample.mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
'''


def _codes(tmp_path, precision, cast):
    write_project(tmp_path, {"train.py": SCRIPT.format(precision=precision, cast=cast)})
    _, _, result = lint_project(tmp_path)
    return {f.code for f in result.findings}


def test_an_fp16_unet_under_accelerate_fp16_is_cfx204(tmp_path):
    assert "CFX204" in _codes(tmp_path, '"fp16"', "unet.to(accelerator.device, dtype=weight_dtype)\n")


@pytest.mark.parametrize("precision, cast", [
    ('"bf16"', "unet.to(accelerator.device, dtype=weight_dtype)\n"),  # bf16 gradients do not raise
    ('"fp16"', ""),  # the diffusers example: only the frozen VAE is cast, the UNet stays fp32
    ("args.mixed_precision", "unet.to(accelerator.device, dtype=weight_dtype)\n"),  # decided at launch
])
def test_near_misses_stay_silent(tmp_path, precision, cast):
    assert "CFX204" not in _codes(tmp_path, precision, cast)
