"""What the memory model needs to know about one training run, as plain values.

The project model resolves a `TrainingSetup` per launch (values with their origins); the
estimator and the simulator read this flattened form, so they can also be driven from
command-line flags. `None` means "unknown": the estimator states the assumption it makes.
"""

from __future__ import annotations

from typing import Literal

from cfgfix.records import dataclass, field, replace

Dtype = Literal["fp32", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor"]
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor")
ATTENTIONS = ("sdpa", "eager", "flash")
HEADS = ("causal-lm", "masked-lm", "classification")
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")


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
    # sequences the model runs per sample: 2 under DPO (TRL's concatenated_forward runs chosen
    # and rejected as one batch of 2 x micro_batch); the activations follow the product
    sequences_per_sample: int = 1
    seq_len: int | None = None  # tokens per sample (or latent pixels for a UNet)
    resolution: int | None = None  # image side for diffusion UNets
    checkpointing: bool = False
    lora_rank: int | None = None  # None: full fine-tune
    quantization: Literal["4bit", "8bit"] | None = None  # frozen base of a (Q)LoRA run
    gradient_accumulation: int = 1
    target_len: int | None = None  # decoder tokens of an encoder-decoder model (T5); None: seq_len
    lora_targets: tuple[str, ...] | None = None  # Linear names LoRA adapts; None: every Linear in the blocks
    # The device whose kernels the activation terms follow: "cuda" (the target of every
    # estimate) or "cpu" (what the FakeTensor simulator, `verify --device cpu` and the CPU
    # tests run): attention kernels, dropout masks and the CUDA context differ.
    device: Literal["cuda", "cpu"] = "cuda"
    # transformers' attn_implementation; None: the family's default (estimator.attention_kernel)
    attention: Literal["sdpa", "eager", "flash"] | None = None
    # torch's optimizer implementation; None: torch's default for the device (foreach on CUDA,
    # the per-parameter loop on the CPU). The HF Trainer's default optim is the fused AdamW.
    optimizer_impl: Literal["foreach", "fused", "for-loop"] | None = None
    # the head the script builds (its Auto class): a causal-LM head (decoders' default), BERT's
    # masked-LM head, or a classification head (BERT's default: no vocabulary logits).
    # Encoder-decoders (T5) always build their LM head. None: the family's default.
    head: Literal["causal-lm", "masked-lm", "classification"] | None = None
    # frozen models the script moves to the GPU besides the trained one (text encoders, a VAE,
    # a teacher): (name, parameters, bytes per weight) each; on every GPU, outside ZeRO
    frozen: tuple[tuple[str, int, int], ...] = ()
    # the transformers release the run uses (a project's exact pin, else the installed one):
    # its default attention kernel per family and whether T5 ties its head
    # (memory/transformers_versions.py); None: unknown, the cautious reading
    transformers_version: str | None = None
    # parameters of the trained model that get no gradient (a composite's frozen backbone:
    # `self.vision.requires_grad_(False)`): no gradients, no optimizer states, no master copy
    frozen_params: int = 0
    # the torch release the run uses (a project's exact pin); None: unknown (torch >= 2.0's
    # defaults assumed: foreach optimizers on CUDA, zero_grad(set_to_none=True))
    torch_version: str | None = None
    # the target GPU's catalog name and the CUDA release torch was built for ("12.1"): the CUDA
    # context's range (estimator.cuda_context); None: unknown
    gpu: str | None = None
    cuda_version: str | None = None
    # batches whose shapes change from step to step (group_by_length, dynamic padding, bucketing):
    # the caching allocator keeps blocks sized for earlier batches (estimator.VARIABLE_LENGTH_RESERVED);
    # None: not known (fixed-length batches assumed, said in the assumptions)
    variable_length: bool | None = None
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def with_(self, **changes) -> "MemorySetup":
        return replace(self, **changes)

    def impossible(self) -> list[str]:
        """Values no training run can have (a batch of 0, a negative length), in words. The
        estimator refuses them: they would print negative or zero GiB."""
        out = []
        for name, label in (("num_gpus", "the number of GPUs"), ("micro_batch", "the micro batch"),
                            ("gradient_accumulation", "gradient accumulation steps")):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                out.append(f"{label} must be a whole number of at least 1, not {value!r}")
        for name, label in (("seq_len", "the sequence length"), ("target_len", "the target length"),
                            ("lora_rank", "the LoRA rank"), ("params", "the parameter count")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                out.append(f"{label} must be at least 1, not {value!r}")
        if self.resolution is not None and (not isinstance(self.resolution, int) or self.resolution < 8):
            out.append(f"the image resolution must be at least 8 pixels (one latent pixel), not {self.resolution!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(f"DeepSpeed ZeRO has stages 0 to 3, not {self.zero_stage!r}")
        return out

    def conflicts(self) -> list[str]:
        """Combinations that cannot run as described, each with the reason. The CLI refuses
        them; a project's files that combine them get an estimate of what actually runs
        (the estimator notes what it left out)."""
        out = []
        if self.fsdp and (self.zero_stage or self.deepspeed_half):
            out.append("FSDP and DeepSpeed both own the model's sharding and precision: a run uses one of them, not both")
        if self.offload_optimizer and self.fsdp and not self.offload_params:
            out.append("FSDP offloads the optimizer only with the parameters (CPUOffload(offload_params=True): "
                       "parameters, gradients and the optimizer step on the CPU); choose optimizer+params offload")
        elif self.offload_optimizer and self.zero_stage < 2 and not self.fsdp:
            out.append("optimizer offload is a DeepSpeed ZeRO feature (zero_optimization.offload_optimizer): "
                       + ("without ZeRO nothing is offloaded" if not self.zero_stage else "ZeRO-1 offload is not modelled")
                       + "; choose ZeRO stage 2 or 3 (the stages DeepSpeed's own memory estimators cover)")
        if self.offload_params and self.zero_stage != 3 and not self.fsdp:
            out.append("parameter offload (zero_optimization.offload_param) works only under ZeRO-3: DeepSpeed "
                       "ignores it at lower stages")
        if self.quantization and self.lora_rank is None:
            out.append("4/8-bit weights are not trained directly: QLoRA trains LoRA adapters on the quantized, "
                       "frozen base; give a LoRA rank")
        return out
