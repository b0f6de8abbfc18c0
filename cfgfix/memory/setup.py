"""What the memory model needs to know about one training run, as plain values.

The project model resolves a `TrainingSetup` per launch (values with their origins); the
estimator and the simulator read this flattened form, so they can also be driven from
command-line flags. `None` means "unknown": the estimator states the assumption it makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Dtype = Literal["fp32", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor"]


@dataclass(frozen=True)
class MemorySetup:
    """One training run, per GPU unless said otherwise."""

    params: int | None = None  # total parameter count (from the shape, a catalog, or --params)
    model: str | None = None  # model id or local folder, as the project names it
    weights: Dtype = "fp32"  # storage dtype of the trained weights
    autocast: Dtype | None = None  # torch autocast / accelerate mixed_precision; None: off
    # DeepSpeed's fp16/bf16 engine keeps 16-bit weights and fp32 master copies in the optimizer
    deepspeed_half: Dtype | None = None
    optimizer: Optimizer = "adamw"
    zero_stage: int = 0  # DeepSpeed ZeRO 0-3
    fsdp: Literal["full", "grad-op"] | None = None  # FSDP full / SHARD_GRAD_OP sharding
    offload_optimizer: bool = False
    offload_params: bool = False
    num_gpus: int = 1  # data-parallel world size
    micro_batch: int = 1
    seq_len: int | None = None  # tokens per sample (or latent pixels for a UNet)
    resolution: int | None = None  # image side for diffusion UNets
    checkpointing: bool = False
    lora_rank: int | None = None  # None: full fine-tune
    quantization: Literal["4bit", "8bit"] | None = None  # frozen base of a (Q)LoRA run
    gradient_accumulation: int = 1
    target_len: int | None = None  # decoder tokens of an encoder-decoder model (T5); None: seq_len
    lora_targets: tuple[str, ...] | None = None
    # The device whose kernels the activation terms follow: "cuda" (the target of every
    # estimate) or "cpu" (what the FakeTensor simulator and the CPU tests run). Only T5 differs.
    device: Literal["cuda", "cpu"] = "cuda"  # Linear names LoRA adapts; None: every Linear in the blocks
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def with_(self, **changes) -> "MemorySetup":
        return replace(self, **changes)
