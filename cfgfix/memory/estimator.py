"""The analytic memory model: a `MemorySetup` and a `ModelShape` -> bytes per GPU.

Pure functions, no torch. Sources (facts.md section letters):
- model states: HF "Model memory anatomy" bytes per parameter, ZeRO paper and DeepSpeed's own
  estimators `estimate_zero2/3_model_states_mem_needs` (C14), torch Adam state dtype (A6, C15f);
- activations: Korthikanti et al. 2022 (arXiv:2205.05198) per-layer terms (C14), re-derived for
  HF's implementations and checked on CPU with `cfgfix.memory.live_bytes` (verify-notes.md,
  "Simulating"): HF up-casts RMSNorm inputs and the logits to fp32, SwiGLU keeps four
  intermediate-sized tensors, SDPA / flash attention keeps no s^2 scores;
- the peak is the largest of three moments of a step: the start of backward (all activations
  and the loss gradient), the end of backward (all gradients), the optimizer step.
"""

from __future__ import annotations

from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import ModelShape, params_only, with_head
from cfgfix.records import dataclass, field, replace

GIB = 1024**3
MIB = 1024**2
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# The CUDA context, the loaded kernels and the library handles sit outside torch's allocator but
# inside the card's capacity (never in `max_memory_allocated`). Measured, not derived: a fresh
# process after a bf16 matmul, an SDPA forward and backward and a fused and a foreach AdamW
# step held 801,964,032 B (765 MiB) besides the allocator's reservation on an H200 with CUDA 13
# and torch 2.11 (777 MiB after 28 setups; bench/gpu_results.md). The figure varies with the
# card, driver, CUDA version and torch build (lazy module loading keeps it lower on older ones);
# it replaces the 512 MiB stated before the measurement. A CPU run has none.
CUDA_CONTEXT_BYTES = 765 * MIB

# The context per GPU generation and CUDA release, as a range around the one measurement (765 MiB,
# Hopper, CUDA 13). CUDA 11.7 began loading kernels lazily and 11.8 modules (CUDA C++ Programming
# Guide, "Lazy Loading"); lazy loading is the default on Linux from CUDA 12.2 (NVIDIA developer
# forum, "Lazy Loading", 2023): before it every kernel of cuBLAS / cuDNN loads at the first call,
# which users report as 1-2 GiB of context. Unmeasured cases keep the 765 MiB point and widen the
# band by the range: a stated guess until a GPU run checks it.
CUDA_CONTEXT_RANGES = {  # (generation measured?, CUDA lazy by default) -> (low MiB, high MiB)
    "measured": (765, 765),
    "lazy": (450, 1_024),
    "eager": (765, 2_048),
}
_GENERATIONS = (  # catalog-name prefix -> generation (NVIDIA's architecture names)
    ("h100", "hopper"), ("h200", "hopper"), ("gh200", "hopper"), ("h20", "hopper"), ("b200", "blackwell"),
    ("rtx 50", "blackwell"), ("rtx 40", "ada"), ("rtx 6000 ada", "ada"), ("l4", "ada"), ("l40", "ada"),
    ("a100", "ampere"), ("a10", "ampere"), ("a40", "ampere"), ("rtx a", "ampere"), ("rtx 30", "ampere"),
    ("rtx 20", "turing"), ("tesla t4", "turing"), ("tesla v100", "volta"), ("tesla p100", "pascal"),
)


def gpu_generation(name: str | None) -> str | None:
    lowered = (name or "").lower()
    return next((gen for prefix, gen in _GENERATIONS if lowered.startswith(prefix)), None)


def cuda_context(setup: MemorySetup) -> tuple[int, int, int, str]:
    """(point, low, high, in words) for the CUDA context of the run's GPU and CUDA release."""
    generation = gpu_generation(setup.gpu)
    major_minor = None
    if setup.cuda_version:
        from cfgfix.memory.transformers_versions import release

        major_minor = release(setup.cuda_version)
    eager = major_minor is not None and major_minor < (12, 2)
    if generation == "hopper" and major_minor is not None and major_minor >= (13,):
        key, words = "measured", "measured on an H200 with CUDA 13 and torch 2.11"
    elif eager:
        key, words = "eager", (f"CUDA {setup.cuda_version} loads kernels eagerly by default (lazy loading is the Linux "
                               "default from 12.2): 765 MiB measured with lazy loading, up to 2 GiB reported without; not "
                               "measured here")
    else:
        key = "lazy"
        which = f"{setup.gpu} ({generation})" if generation else (setup.gpu or "an unknown card")
        words = (f"765 MiB measured on an H200 with CUDA 13; {which}"
                 f"{' with CUDA ' + setup.cuda_version if setup.cuda_version else ', CUDA release unknown'}: "
                 "not measured, 450-1,024 MiB assumed")
    low, high = CUDA_CONTEXT_RANGES[key]
    return CUDA_CONTEXT_BYTES, low * MIB, high * MIB, words


# cuBLAS workspaces: torch gives each (cuBLAS handle, stream) a workspace through its caching
# allocator, so they are in `max_memory_allocated` (aten/src/ATen/cuda/CublasHandlePool.cpp,
# `parseChosenWorkspaceSize`: 4096 KiB x 8 = 32 MiB on Hopper (sm90), ":4096:2:16:8" =
# 8 MiB + 128 KiB on other cards, unless CUBLAS_WORKSPACE_CONFIG says otherwise). A training
# step uses two handles, the forward's thread and the autograd engine's: measured on an H200,
# 33,554,432 B after one fp32 matmul and as much again after its backward (bench/gpu_results.md).
# The card is not known here: the Hopper figure (the larger) is counted.
CUBLAS_WORKSPACE_BYTES = 32 * MIB
CUBLAS_HANDLES = 2

# bitsandbytes NF4 / FP4: half a byte per weight plus one fp32 absmax per 64-weight block
# (QLoRA paper, Dettmers et al. 2023, arXiv:2305.14314; no double quantisation: with it 0.516).
NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
INT8_BYTES_PER_PARAM = 1.0  # LLM.int8: one byte per weight (row scales, tiles and outliers: memory/llm_int8.py)

DEFAULT_SEQ = {"t5": 512, "bert": 512}  # others: 2048 (decoder LMs)
DEFAULT_RESOLUTION = {"unet": 1024}
DIFFUSION_TRANSFORMER_TEXT_TOKENS = {"flux": 512, "sd3": 333}

# Reserved memory against the predicted peak for batches whose shapes vary from step to step
# (qlora.py runs with group_by_length, reported in issue 21: 1.6-1.7x): the caching allocator
# rounds and keeps blocks cut for earlier batches, which later, differently-sized requests cannot
# reuse. A reported range, not a derivation, and not verified on a GPU here: it widens the band's
# top where the setup says its batches vary, and is stated otherwise.
VARIABLE_LENGTH_RESERVED = (1.6, 1.7)

COMPONENTS = ("weights", "gradients", "optimizer_states", "master_weights", "activations", "temporaries", "cuda_context")


@dataclass(frozen=True)
class Component:
    name: str
    size: int  # bytes this component needs on one GPU at its largest
    at_peak: int  # bytes of it that are live at the step's peak
    formula: str  # how it was computed, with its source


@dataclass(frozen=True)
class Estimate:
    setup: MemorySetup
    shape: ModelShape
    components: tuple[Component, ...]  # per GPU; at_peak values add up to `peak`
    peak: int  # bytes per GPU at the largest moment of a step
    peak_phase: str  # "backward start", "backward middle" (a UNet), "backward end", "optimizer step", "recompute"
    low: int  # the error band around `peak`
    high: int
    cpu: tuple[Component, ...] = ()  # host RAM per node when offloading
    assumptions: tuple[str, ...] = ()
    trainable_params: int = 0
    phases: dict = field(default_factory=dict, compare=False)  # bytes per GPU at each moment of a step

    def component(self, name: str) -> Component:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(name)

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer states + master weights on one GPU (what
        DeepSpeed's estimators count)."""
        return sum(self.component(n).size for n in ("weights", "gradients", "optimizer_states", "master_weights"))

    @property
    def cpu_bytes(self) -> int:
        return sum(c.size for c in self.cpu)

    def to_dict(self) -> dict:
        return {
            "params": self.shape.params,
            "trainable_params": self.trainable_params,
            "peak_bytes": self.peak,
            "peak_phase": self.peak_phase,
            "band_bytes": [self.low, self.high],
            "components": [
                {"name": c.name, "bytes": c.size, "at_peak_bytes": c.at_peak, "formula": c.formula} for c in self.components
            ],
            "cpu_components": [{"name": c.name, "bytes": c.size, "formula": c.formula} for c in self.cpu],
            "cpu_bytes": self.cpu_bytes,
            "assumptions": list(self.assumptions),
            "shape": self.shape.to_dict(),
        }


@dataclass
class _Notes:
    items: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if text not in self.items:
            self.items.append(text)


# -- model states -------------------------------------------------------------------------------

def _trainable(setup: MemorySetup, shape: ModelShape, notes: _Notes) -> int:
    if setup.lora_rank is None:
        if setup.frozen_params:
            notes.add(f"{setup.frozen_params / 1e9:.3g}B frozen parameters: no gradients or optimizer states for them")
        return max(shape.params - setup.frozen_params, 0)
    if shape.blocks:
        if setup.lora_targets is None:
            notes.add("LoRA adapts every Linear layer in the blocks (PEFT target_modules='all-linear')")
        return shape.lora_params(setup.lora_rank, setup.lora_targets)
    # no shape: all-linear LoRA on a 7B Llama/Qwen at r=16 is ~0.53% of the weights
    notes.add("LoRA adapter size unknown without the model's config: assumed rank x 3.3e-4 x params (all-linear on a 7B decoder)")
    return int(shape.params * setup.lora_rank * 3.3e-4)


def _optimizer_bytes_per_param(optimizer: str, state_bytes: int) -> float | None:
    """Bytes of optimizer state per trainable parameter; None: Adafactor (shape-dependent).
    AdamW: exp_avg + exp_avg_sq (HF anatomy, C14: 8 bytes in fp32); torch keeps them in the
    parameter's dtype (A6, C15f). bitsandbytes 8-bit AdamW: 2 bytes (HF anatomy, C14).
    SGD with momentum: one buffer (HF anatomy: 4 bytes in fp32)."""
    return {"adamw": 2 * state_bytes, "adamw-8bit": 2, "paged-adamw": 8, "paged-adamw-8bit": 2, "sgd": 0,
            "sgd-momentum": state_bytes}.get(optimizer)


def _adafactor_state_elements(shape: ModelShape, trainable: int, lora: bool, notes: _Notes) -> int:
    """HF `Adafactor` (beta1=None, the default): a matrix W (out x in) keeps a row and a column
    second-moment vector (out + in floats, Shazeer & Stern 2018, arXiv:1804.04235); a vector
    keeps a full one. Matrices: the blocks' Linears and the embedding / head."""
    if lora or not shape.blocks:
        notes.add("Adafactor state estimated at 2% of the trainable elements (no per-matrix shapes)")
        return int(trainable * 0.02)
    matrices = [(b.count, i, o) for b in shape.blocks for _, i, o in b.linears]
    if shape.vocab and shape.hidden:
        matrices.append((1, shape.vocab, shape.hidden))
        if shape.head_params:
            matrices.append((1, shape.vocab, shape.hidden))
    in_matrices = sum(n * i * o for n, i, o in matrices)
    return sum(n * (i + o) for n, i, o in matrices) + max(shape.params - in_matrices, 0)


@dataclass(frozen=True)
class _States:
    weights: int
    grads: int  # at their largest (end of backward)
    grads_persistent: bool  # live through the forward too
    optimizer: int
    master: int
    gathered: int  # ZeRO-3 / FSDP full shard: the largest module gathered at once
    cpu: tuple[Component, ...]
    weights_formula: str
    grads_formula: str
    optimizer_formula: str
    master_formula: str
    step_temp: int  # optimizer-step temporaries (foreach / for-loop; fused none)


# torch 2.0 changed two defaults that move the peak (PyTorch 2.0.0 release notes, "Backwards
# incompatible changes", torch.optim; stated from the notes, not read from a 1.x wheel here):
# optimizers default to their foreach implementation on CUDA (`_default_to_fused_or_foreach`,
# before: the per-parameter loop), and Optimizer.zero_grad / Module.zero_grad default to
# set_to_none=True (before: gradients zeroed in place, so they stay allocated through the next
# forward). Both are what `torch_before_2` decides.
TORCH_DEFAULTS_CHANGED = "2.0.0"


def torch_before_2(setup: MemorySetup) -> bool:
    if not setup.torch_version:
        return False
    from cfgfix.memory.transformers_versions import release

    parsed = release(setup.torch_version.split("+")[0])
    return parsed is not None and parsed < (2,)


def optimizer_impl(setup: MemorySetup) -> str:
    """torch's optimizer implementation the run uses: the setup's, else torch's default for
    the device (torch/optim/optimizer.py `_default_to_fused_or_foreach`: foreach when every
    parameter is on CUDA, the per-parameter loop otherwise; the loop everywhere before 2.0)."""
    if setup.optimizer_impl:
        return setup.optimizer_impl
    return "foreach" if setup.device == "cuda" and not torch_before_2(setup) else "for-loop"


def _step_temporaries(setup: MemorySetup, shape: ModelShape, trainable: int, t_bytes: int, notes: _Notes) -> int:
    """What torch's AdamW / SGD-momentum step allocates besides the states, measured on an
    H200 (bench/gpu_results.md: a 160M fp32 Llama, weights + grads + states 2,558 MiB):
    foreach builds sqrt(exp_avg_sq) for every parameter at once (`_multi_tensor_adamw`,
    torch._foreach_sqrt: +623 MiB, one copy of the 610 MiB of parameters); the per-parameter
    loop two temporaries of one parameter at a time (+250 MiB, twice the 125 MiB embedding);
    the fused kernel none (+0)."""
    impl = optimizer_impl(setup)
    if setup.optimizer_impl is None:
        notes.add(f"optimizer implementation not stated: torch's default on {setup.device.upper()} ({impl}) assumed"
                  + (f" (torch {setup.torch_version}: before 2.0 the per-parameter loop was the default)"
                     if torch_before_2(setup) else ""))
    if impl == "fused":
        return 0
    if impl == "foreach":
        return trainable * t_bytes
    if setup.lora_rank is not None and shape.blocks:
        largest = setup.lora_rank * max(max(i, o) for b in shape.blocks for _, i, o in b.linears)
    else:
        largest = shape.largest_module_params or int(trainable * 0.02)
    return 2 * min(largest, trainable) * t_bytes


def _model_states(setup: MemorySetup, shape: ModelShape, trainable: int, notes: _Notes) -> _States:
    psi = shape.params
    n = max(setup.num_gpus, 1)
    lora = setup.lora_rank is not None
    largest = shape.largest_module_params or 0
    if setup.zero_stage == 3 and not largest:
        notes.add("largest layer unknown: ZeRO-3's gathered-layer term (4L) assumed 2% of the parameters")
        largest = int(psi * 0.02)

    # the optimizer's state elements per trainable parameter
    if setup.optimizer == "adafactor":
        state_elements = _adafactor_state_elements(shape, trainable, lora, notes)
    else:
        state_elements = None

    if setup.deepspeed_half and not lora:
        return _deepspeed_states(setup, shape, psi, n, largest, state_elements, notes, trainable)

    # torch-owned weights (plain, autocast, DDP, FSDP) and (Q)LoRA
    w_bytes = DTYPE_BYTES[setup.weights]
    if lora:
        adapter_bytes = 4  # PEFT up-casts adapters to fp32 (autocast_adapter_dtype=True, peft >= 0.12)
        frozen = psi
        if setup.quantization:
            qbytes = NF4_BYTES_PER_PARAM if setup.quantization == "4bit" else INT8_BYTES_PER_PARAM
            quantized = shape.block_linear_params if shape.blocks else int(psi * 0.9)
            if not shape.blocks:
                notes.add("quantised share of the weights unknown: assumed 90% (the blocks' Linear layers)")
            rest = psi - quantized
            notes.add("QLoRA: prepare_model_for_kbit_training up-casts the non-quantised weights (embeddings, "
                      "head, norms) to fp32 (peft utils/other.py, prepare_model_for_kbit_training)")
            base = int(quantized * qbytes) + rest * 4
            wf = (f"{quantized / 1e9:.3g}B quantised x {qbytes:g} B ({setup.quantization}) + "
                  f"{rest / 1e9:.3g}B others x 4 B (k-bit up-cast) + {trainable / 1e6:.3g}M adapters x 4 B")
        else:
            base = frozen * w_bytes
            wf = f"{frozen / 1e9:.3g}B frozen x {w_bytes} B ({setup.weights}) + {trainable / 1e6:.3g}M adapters x 4 B (fp32)"
        weights = base + trainable * adapter_bytes
        t_bytes = adapter_bytes
    else:
        weights = psi * w_bytes
        wf = f"{psi / 1e9:.3g}B x {w_bytes} B ({setup.weights})"
        t_bytes = w_bytes
        if setup.autocast and not setup.fsdp:
            notes.add("autocast keeps the weights, gradients and optimizer states in fp32 and casts each op's inputs "
                      "(PyTorch AMP docs); it adds 16-bit weight copies")
    grads = trainable * t_bytes
    per_param = _optimizer_bytes_per_param(setup.optimizer, t_bytes)
    if per_param is None:
        optimizer = state_elements * t_bytes
        of = f"Adafactor factored second moments: {state_elements / 1e6:.3g}M elements x {t_bytes} B"
    else:
        optimizer = int(trainable * per_param)
        of = f"{trainable / 1e9:.3g}B x {per_param:g} B ({setup.optimizer}; torch keeps the states in the parameters' dtype)"
    gf = f"{trainable / 1e9:.3g}B trainable x {t_bytes} B"
    grads_persistent = setup.gradient_accumulation > 1
    if torch_before_2(setup):
        # zero_grad() zeroes in place before torch 2.0: the gradients stay allocated through the forward
        grads_persistent = True
        notes.add(f"torch {setup.torch_version}: zero_grad() keeps the gradients allocated (set_to_none=False before 2.0), "
                  "so they are live during the forward too")
    gathered = 0
    cpu: tuple[Component, ...] = ()

    if setup.fsdp:
        # FSDP flattens every parameter of a unit into one FlatParameter and shards it, frozen
        # ones too: a (Q)LoRA run's base is sharded like a full fine-tune's (use_orig_params=True,
        # which accelerate / PEFT set for mixed requires_grad; FSDP paper arXiv:2304.11277 s3.2).
        # FSDP MixedPrecision (accelerate's mixed_precision under FSDP sets param_dtype) casts
        # each gathered unit, never the whole model: no autocast weight copies (_activations).
        unit_bytes = _fsdp_unit_bytes(setup, w_bytes, lora)
        weights, grads, optimizer = weights // n, grads // n, optimizer // n
        wf += f" / {n} GPUs (FSDP {'full shard' if setup.fsdp == 'full' else 'SHARD_GRAD_OP'}{', frozen base too' if lora else ''})"
        gf += f" / {n}"
        of += f" / {n}"
        layer, root = _fsdp_units(shape, largest)
        if setup.fsdp == "full":
            # one transformer layer per unit (transformer auto-wrap), the next one prefetched;
            # the root unit (embeddings, head, final norm) stays gathered from forward to backward
            gathered = (2 * layer + root) * unit_bytes
            notes.add("FSDP full shard: one transformer layer per unit, two gathered at once (backward prefetch), "
                      "the root unit (embeddings, head) gathered through the step")
        else:
            # SHARD_GRAD_OP reshards only after backward: the whole model gathered during the step
            gathered = psi * unit_bytes
            notes.add("FSDP SHARD_GRAD_OP: parameters stay gathered from forward through backward (a whole-model copy "
                      "in the compute dtype)")
        if setup.offload_params:
            # CPUOffload(offload_params=True): the parameter shards and their gradients live in host
            # memory and the optimizer steps there (torch FSDP docs, CPUOffload); the GPU holds the
            # gathered units only
            cpu = (Component("parameters", weights * n, 0, wf.replace(f" / {n} GPUs", "") + ", offloaded (FSDP CPUOffload), all ranks"),
                   Component("gradients", grads * n, 0, gf.removesuffix(f" / {n}") + ", offloaded (FSDP CPUOffload), all ranks"),
                   Component("optimizer_states", optimizer * n, 0, of.removesuffix(f" / {n}") + ", on the CPU (FSDP CPUOffload), all ranks"))
            weights = grads = optimizer = 0
            wf, gf, of = ("offloaded to CPU (FSDP CPUOffload)", "offloaded to CPU (FSDP CPUOffload)",
                          "on the CPU: the optimizer steps the offloaded shards there")
            notes.add("FSDP CPU offload: parameter shards, gradients and optimizer states in host RAM (summed over "
                      "the ranks of one node); every unit is copied to the GPU when gathered")
    elif setup.zero_stage and n > 1:
        # DeepSpeed with a torch-precision model (fp32 engine, or LoRA): ZeRO partitions
        optimizer //= n
        of += f" / {n} (ZeRO-{setup.zero_stage})"
        if setup.zero_stage >= 2:
            grads //= n
            gf += f" / {n}"
        if setup.zero_stage == 3:
            weights //= n
            wf += f" / {n}"
            gathered = 2 * largest * t_bytes
    elif n > 1 and not setup.zero_stage:
        notes.add("DDP: its gradient buckets hold a second copy of the gradients (gradient_as_bucket_view=False, "
                  "torch DistributedDataParallel docs)")
    if setup.offload_optimizer and setup.zero_stage:
        cpu = (Component("optimizer_states", optimizer, 0, of + ", offloaded"),)
        optimizer = 0
        of = "offloaded to CPU"
    if setup.optimizer.startswith("paged-") and not cpu:
        # bitsandbytes' paged optimizers keep their states in CUDA unified memory
        # (cudaMallocManaged, outside torch's allocator) that the driver pages out to host RAM
        # when the GPU runs short, and page in per parameter for its update (QLoRA paper,
        # arXiv:2305.14314, "Paged Optimizers"; bitsandbytes `Optimizer8bit.prefetch_state`):
        # what must be resident is one parameter's states during the step
        largest = shape.largest_module_params or int(trainable * 0.02)
        resident = int(min(largest, trainable) * (per_param or 0))
        cpu = (Component("optimizer_states", optimizer, 0,
                         of + ", paged (unified memory: on the GPU while it has room, in host RAM when it runs short)"),)
        notes.add("paged optimizer: its states page out to host RAM when the GPU runs short (then each step waits on "
                  "PCIe transfers); sized here as what must be resident: one parameter's states during its update")
        of = f"paged: {resident / GIB:.3g} GiB resident (the largest parameter's states, {per_param:g} B each)"
        optimizer = resident
    if setup.offload_params and setup.zero_stage == 3:
        # ZeRO-3 parameter offload keeps every parameter's partition in host memory, frozen ones
        # too (a LoRA run's base: DeepSpeed partitions all of the module's parameters, trainable
        # or not, stage3.py): the GPU holds the layers being gathered (DeepSpeed's 4L term)
        cpu = cpu + (Component("parameters", weights, 0, wf + ", offloaded (ZeRO-3 offload_param)"),)
        weights = 0
        wf = "offloaded to CPU (ZeRO-3 offload_param, frozen weights included)"
        gathered = max(gathered, 2 * largest * (w_bytes if lora else t_bytes))
    step_temp = 0
    if setup.optimizer == "adamw" and not setup.offload_optimizer and not (setup.fsdp and setup.offload_params):
        step_temp = _step_temporaries(setup, shape, trainable // (n if setup.zero_stage or setup.fsdp else 1),
                                      t_bytes, notes)
    return _States(weights, grads, grads_persistent, optimizer, 0, gathered, cpu, wf, gf, of, "none: torch keeps no master copy", step_temp)


def _fsdp_unit_bytes(setup: MemorySetup, w_bytes: int, lora: bool) -> int:
    """Bytes per weight of a gathered FSDP unit: MixedPrecision's param_dtype (accelerate sets it
    from mixed_precision, so autocast under FSDP computes on 16-bit gathered weights), else the
    stored dtype. A quantised (QLoRA) base gathers in its quant_storage dtype (bf16 in the
    FSDP-QLoRA recipes)."""
    if setup.autocast:
        return 2
    return 2 if setup.quantization else w_bytes


def _fsdp_units(shape: ModelShape, largest: int) -> tuple[int, int]:
    """(parameters of one wrapped layer, parameters of the root unit): transformer auto-wrap puts
    each transformer block in its own unit and leaves embeddings, head and final norm in the root."""
    if shape.blocks:
        layer = max(block.params for block in shape.blocks)
        return layer, shape.embedding_params + shape.head_params
    return largest, 0


def _deepspeed_states(setup, shape, psi, n, largest, state_elements, notes, trainable=None) -> _States:
    """DeepSpeed's bf16/fp16 engines keep 16-bit weights and, in the optimizer, fp32 master
    weights, fp32 gradients and fp32 Adam states. Per GPU, with G GPUs (facts C14):
    ZeRO-2: 2Psi + 18Psi/G (2 grads16 + 4 grads32 + 4 params32 + 8 Adam, stage_1_and_2.py
    estimate_zero2_model_states_mem_needs); ZeRO-3: 4L + 18Psi/G (stage3.py); offload moves the
    fp32 part to the CPU, sized Psi*max(4G,16)*1.5 (stage 2) or 16 or 18 Psi*1.5 (stage 3)."""
    stage = setup.zero_stage
    adam_bytes = 8 if state_elements is None else 0
    # the optimizer holds only parameters that need a gradient (a frozen part keeps its 16-bit weights)
    tr = psi if trainable is None else trainable
    if setup.optimizer != "adamw":
        notes.add(f"DeepSpeed with {setup.optimizer}: its fp32 states sized like torch's {setup.optimizer}")
        per = _optimizer_bytes_per_param(setup.optimizer, 4)
        opt_total = state_elements * 4 if per is None else int(tr * per)
    else:
        opt_total = tr * adam_bytes
    shard = lambda total, from_stage: total // n if stage >= from_stage else total
    weights16 = shard(psi * 2, 3)
    # ZeRO-3 reduce-scatters the 16-bit gradients straight into the fp32 partition: only the
    # layer being reduced holds them (inside DeepSpeed's 4L), hence 18 and not 20 bytes / G
    grads16 = 0 if stage == 3 else shard(tr * 2, 2)
    grads32 = shard(tr * 4, 1)
    master = shard(tr * 4, 1)
    optimizer = shard(opt_total, 1)
    gathered = 0
    cpu: tuple[Component, ...] = ()
    wf = f"{psi / 1e9:.3g}B x 2 B ({setup.deepspeed_half} engine)" + (f" / {n}" if stage >= 3 else "")
    gf = ("" if stage == 3 else f"16-bit {tr / 1e9:.3g}B x 2 B{f' / {n}' if stage >= 2 else ''} + ") + f"fp32 {tr / 1e9:.3g}B x 4 B{f' / {n}' if stage >= 1 else ''}"
    of = f"{opt_total / max(tr, 1):g} B x {tr / 1e9:.3g}B{f' / {n}' if stage >= 1 else ''} (fp32 states)"
    mf = f"fp32 {tr / 1e9:.3g}B x 4 B{f' / {n}' if stage >= 1 else ''}"
    if stage == 3:
        gathered = 4 * largest  # DeepSpeed's 4L: the largest layer's 16-bit params and grads
    if setup.offload_optimizer and stage >= 2:
        if stage == 2:
            cpu_total = int(psi * max(4 * n, 16) * 1.5)
            cpu_formula = "Psi x max(4G, 16) x 1.5 (DeepSpeed's estimate_zero2_model_states_mem_needs)"
        else:
            cpu_total = int((18 if setup.offload_params else 16) * psi * 1.5)
            cpu_formula = f"{18 if setup.offload_params else 16} x Psi x 1.5 (DeepSpeed's estimate_zero3_model_states_mem_needs)"
        cpu = (Component("offloaded_states", cpu_total, 0, cpu_formula),)
        grads16, grads32, master, optimizer = 0, 0, 0, 0
        gf, mf, of = "offloaded to CPU", "offloaded to CPU", "offloaded to CPU"
        if stage == 3 and setup.offload_params:
            weights16 = 0
            wf = "offloaded to CPU"
    return _States(weights16, grads16 + grads32, True, optimizer, master, gathered, cpu, wf, gf, of, mf, 0)


# -- activations -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Activations:
    saved: int  # kept for backward at the end of forward
    layer_full: int  # one layer's saved tensors (what checkpointing recomputes at once)
    loss_backward: int  # transient at the start of backward (the fp32 logits gradient)
    layer_backward: int  # transient inside one layer's backward
    autocast_copies: int
    formula: str
    band: tuple[float, float]  # relative error of the activation terms (low, high)
    # (saved bytes still waiting, share of the gradients made) as backward reaches each unit
    # (a UNet: memory/unet_activations.py); empty: the two ends of backward are its largest moments
    backward_profile: tuple[tuple[int, float], ...] = ()


def _act_dtypes(setup: MemorySetup) -> tuple[int, int]:
    """(activation bytes, residual-stream bytes). Under autocast the residual stream stays fp32
    (the embedding output is fp32 and fp32 + bf16 -> fp32); with 16-bit weights both are 16-bit."""
    if setup.deepspeed_half:
        return 2, 2
    if setup.quantization and setup.lora_rank is not None and not setup.fsdp:
        # peft's prepare_model_for_kbit_training (>= 0.3: prepare_model_for_int8_training) casts
        # the embeddings and norms to fp32 (peft utils/other.py): the embedding output, and so
        # the residual stream and every norm's output, are fp32 (fp32 + 16-bit -> fp32)
        return (2 if setup.autocast else DTYPE_BYTES[setup.weights]), 4
    if setup.autocast and setup.fsdp:
        return 2, 2  # FSDP MixedPrecision: 16-bit weights in compute, so the residual stream is 16-bit too
    if setup.autocast:
        return 2, 4 if setup.weights == "fp32" else 2
    return DTYPE_BYTES[setup.weights], DTYPE_BYTES[setup.weights]


# transformers' default attention per family where it is not SDPA: Gemma-2 asks for eager
# attention (its logit soft-capping; transformers PR #32865, 4.45; `_supports_sdpa = False` in
# 5.24's modeling_gemma2.py). transformers 5.17 built it with SDPA (measured on an H200,
# bench/gpu_results.md): eager is the higher of the two, so the estimate errs on the safe side.
EAGER_BY_DEFAULT = ("gemma2",)


def attention_kernel(setup: MemorySetup, shape: ModelShape, notes: _Notes | None = None) -> str:
    """Which attention kernel a decoder / encoder layer runs, as its saved tensors go:
    "fused" (flash or memory-efficient SDPA: no s^2 tensor), "math" (SDPA's fallback: fp32
    probabilities per head) or "eager" (transformers' eager_attention_forward).
    SDPA picks its kernel by device, dtype and arguments (torch `sdp_utils`): on CUDA flash
    needs 16-bit inputs and the memory-efficient kernel takes no `enable_gqa`, which
    transformers passes for grouped-query attention, so fp32 compute with fewer KV heads falls
    back to the math kernel (measured: +2,283 MiB on a 160M Llama, bench/gpu_results.md); on the
    CPU the fused kernel takes no dropout (GPT-2 +64% in the simulator)."""
    notes = notes if notes is not None else _Notes()
    impl = setup.attention
    if impl is None and setup.transformers_version is not None:
        from cfgfix.memory.transformers_versions import default_attention

        default = default_attention(shape.family, setup.transformers_version)
        if default == "eager":
            impl = "eager"
            notes.add(f"{shape.family}: transformers {setup.transformers_version} builds it with eager attention when the "
                      "load names none (its modeling file: no SDPA support, or SDPA disabled by default); pass "
                      "attn_implementation='sdpa' or 'flash_attention_2' to keep no score tensors")
        elif default == "sdpa":
            impl = "sdpa"
    if impl is None and shape.family in EAGER_BY_DEFAULT:
        impl = "eager"
        notes.add(f"{shape.family}: transformers' default attention is eager (logit soft-capping) in 4.45 and from 5.21 on, "
                  "SDPA in 4.42 and 4.48-5.20; the transformers version is not known, so eager (the larger) is assumed; "
                  "pass attn_implementation='sdpa' or 'flash_attention_2' to the load to keep no score tensors")
    if shape.attention == "deberta":
        return "deberta"  # DisentangledSelfAttention computes its own scores: no SDPA path
    if shape.family == "falcon" and shape.kv_heads < shape.heads and impl != "eager":
        # FalconAttention passes k / v with fewer heads to SDPA without enable_gqa: only the math
        # kernel broadcasts them (modeling_falcon.py; torch sdp_utils: flash and memory-efficient
        # kernels need equal head counts), on CUDA too
        notes.add("Falcon: k / v with fewer heads than q reach SDPA without enable_gqa, which only its math kernel "
                  "accepts: probabilities per head and layer are kept")
        return "math"
    if impl == "eager":
        return "eager"
    if impl == "flash":
        return "fused"
    compute_fp32 = setup.weights == "fp32" and not setup.autocast and not setup.deepspeed_half
    if setup.device == "cuda":
        if compute_fp32 and shape.kv_heads and shape.kv_heads < shape.heads:
            notes.add("fp32 attention with grouped KV heads: SDPA falls back to its math kernel on CUDA "
                      "(fp32 probabilities per head and layer)")
            return "math"
        return "fused"
    if shape.dropout > 0:
        notes.add("CPU SDPA with attention dropout runs the math kernel (fp32 probabilities, dropout noise "
                  "and dropped probabilities per head)")
        return "math"
    return "fused"


def _attention_saved(kernel: str, shape: ModelShape, setup: MemorySetup, q_tokens: int, kv_tokens: int, b: int,
                     e: int) -> int:
    """What one attention keeps for backward beyond the projections' own inputs: q, k, v and the
    output (o_proj's input), by kernel (measured per layer, bench/gpu_results.md):
    - fused: q, k, v, out in the activation dtype + an fp32 logsumexp per head and token;
    - math: q and k, v expanded to every head in fp32, the output, and b x heads x s^2 fp32
      probabilities (x3 with dropout: noise and dropped probabilities);
    - eager: q and k, v repeated to every head (repeat_kv), the output, the fp32 softmax and its
      16-bit copy (Llama bf16: 390 MiB per layer measured, 392 modelled), the soft-capping's tanh
      (Gemma-2: 264 measured, 272 modelled) and with dropout its mask and the dropped probabilities."""
    a = shape.heads or 1
    d = shape.head_dim or shape.hidden // a
    kv = shape.kv_heads or a
    scores = b * a * q_tokens * kv_tokens
    drop = shape.dropout > 0
    if kernel == "deberta":
        from cfgfix.memory.family_activations import deberta_attention_saved

        return deberta_attention_saved(shape, setup, q_tokens, b, e, bool(setup.autocast) and not setup.deepspeed_half)
    if kernel == "fused":
        return e * b * d * (2 * a * q_tokens + 2 * kv * kv_tokens) + 4 * b * a * q_tokens
    if kernel == "math":
        return 4 * b * d * a * (q_tokens + 2 * kv_tokens) + e * b * a * d * q_tokens + 4 * scores * (3 if drop else 1)
    per_score = 4 + (e if e < 4 else 0)
    if shape.attn_softcap:
        per_score += e
    if drop:
        per_score += (1 if setup.device == "cuda" else e) + e
    return e * b * d * a * (2 * q_tokens + 2 * kv_tokens) + per_score * scores


def _transformer_layer(shape: ModelShape, setup: MemorySetup, s: int, b: int, e: int, r: int, autocast: bool,
                       kernel: str) -> int:
    """Bytes one transformer layer saves for backward, HF implementation, per micro batch.
    Korthikanti et al.'s 34sbh + 5as^2b (16-bit, GELU MLP, dropout) becomes, measured on HF's
    code with live_bytes (tests/test_memory_accuracy.py) and on a GPU (bench/gpu_results.md):
    - each norm: RMSNorm keeps its input up-cast to fp32 (4 B) and the normalised tensor (r);
      Gemma's RMSNorm computes in fp32 and keeps the normalised tensor in fp32 (4 B), and
      Gemma-2 has four norms per layer (post-attention and post-MLP norms feed the residual
      add, which keeps nothing); LayerNorm keeps its input (r); a norm's output is kept once
      (r) or, under autocast, once per consuming Linear as a 16-bit cast (2 B each);
    - attention: by kernel (`_attention_saved`);
    - MLP: SwiGLU/GeGLU keeps gate, act(gate), up and their product (4 x i x e); a fused GELU
      MLP 2 x i x e, GPT-2's Python-composed gelu_new 5 x i x e (shape.mlp_tensors);
    - dropout after attention and MLP when dropout is on: CUDA keeps a 1-byte bool mask,
      the CPU its noise in the activation dtype (ATen `_dropout_impl`)."""
    h, i = shape.hidden, shape.intermediate
    sb = s * b
    rms = shape.norm == "rms"
    gemma = shape.family.startswith("gemma")

    def norm(consumers: int, fused: bool) -> int:
        kept_input = (4 if rms else r) * sb * h
        normed = (4 if gemma else r) * sb * h if rms else 0
        out = (2 * (1 if fused else consumers)) * sb * h if autocast and r == 4 else r * sb * h
        return kept_input + normed + out + (4 * sb if rms else 8 * sb)

    fused_qkv = shape.family in ("phi3", "gpt2", "gpt_neox", "falcon", "chatglm", "qwen2_5_vl_vision")
    if shape.parallel_norms == 1:
        # Falcon-7B: one LayerNorm feeds attention and the MLP in parallel
        total = norm(2, fused_qkv)
    elif shape.parallel_norms == 2:
        # Falcon-40B / 180B: ln_attn and ln_mlp read the same input (kept once)
        total = norm(1, True) + norm(1, True) - (4 if rms else r) * sb * h
    else:
        total = norm(3, fused_qkv)
        total += norm(2, fused_qkv or not shape.gated_mlp)
    total += _attention_saved(kernel, shape, setup, s, s, b, e)
    if shape.family in ("gemma2", "gemma3_text", "glm4"):  # post-attention and post-feedforward norms: no output kept
        total += 2 * (norm(1, True) - r * sb * h)
    if shape.experts:
        from cfgfix.memory.family_activations import moe_mlp_saved

        total += moe_mlp_saved(shape, sb, e)
    else:
        total += shape.mlp_tensors * e * sb * i
    if shape.dropout:
        total += 2 * sb * h * (1 if setup.device == "cuda" else e)
    return total


def _activations(setup: MemorySetup, shape: ModelShape, notes: _Notes) -> _Activations:
    b = max(setup.micro_batch, 1) * setup.sequences_per_sample  # DPO: chosen + rejected
    e, r = _act_dtypes(setup)
    autocast = bool(setup.autocast) and not setup.deepspeed_half
    # FSDP MixedPrecision casts each gathered unit (counted with the gathered units), never the whole model
    copies = 2 * shape.linear_params if autocast and setup.weights == "fp32" and not setup.fsdp else 0

    if shape.family == "params":
        # no shape: the textbook per-layer formula cannot be applied; a coarse share of the
        # model states instead, with a wide band
        notes.add("no model shape: activations taken as 1 byte per parameter per 1k tokens of micro batch (wide band)")
        s = setup.seq_len or 2048
        saved = int(shape.params * b * s / 1024 * (0.1 if setup.checkpointing else 1.0))
        return _Activations(saved, saved // 10, 0, 0, 0, "rough: params x tokens / 1024", (0.7, 1.5))

    if shape.family == "unet":
        return _unet_activations(setup, shape, notes, b, e)
    if shape.family == "whisper":
        return _whisper_activations(setup, shape, notes, b, e, r, autocast, copies)
    if shape.family in ENCODER_FAMILIES:
        return _encoder_activations(setup, shape, notes, b, e, r, autocast, copies)

    s = setup.seq_len or DEFAULT_SEQ.get(shape.family, 2048)
    if shape.family in DIFFUSION_TRANSFORMER_TEXT_TOKENS:
        # the latent (VAE 8x down) in 2 x 2 patches, joined by the text tokens (FLUX: 512 T5
        # tokens; SD3: 77 CLIP + 256 T5)
        res = setup.resolution or DEFAULT_RESOLUTION["unet"]
        s = (res // 16) ** 2 + DIFFUSION_TRANSFORMER_TEXT_TOKENS[shape.family]
        notes.add(f"{shape.family}: {s} tokens per sample ({res} px image: ({res} / 16)^2 latent patches + "
                  f"{DIFFUSION_TRANSFORMER_TEXT_TOKENS[shape.family]} text tokens); activations by the generic "
                  "transformer-layer terms (the double / single-stream and joint blocks are not modelled one by one): "
                  "-11% to +23% against the FakeTensor simulator on small configs only (bench/memory_families.md), "
                  "so the band stays wide")
    elif setup.seq_len is None:
        notes.add(f"sequence length unknown: assumed {s} tokens")
    if shape.family == "t5":
        return _t5_activations(setup, shape, notes, s, b, e, r, autocast, copies)
    kernel = attention_kernel(setup, shape, notes)
    layer = _transformer_layer(shape, setup, s, b, e, r, autocast, kernel)
    n_layers = shape.layers
    per_layer_total = n_layers * layer
    layer_inputs = n_layers * s * b * shape.hidden * r
    layer_full = layer
    s_logits = s
    band = (0.15, 0.15) if shape.family not in ("bert",) else (0.3, 0.3)
    if shape.family in DIFFUSION_TRANSFORMER_TEXT_TOKENS:
        band = (0.5, 1.0)  # checked on small configs only (bench/memory_families.md): kept wide
    h, V = shape.hidden, shape.vocab
    # after the blocks: the final norm, and the loss. HF's ForCausalLMLoss up-casts the
    # logits to fp32 and cross_entropy's log_softmax keeps its fp32 output (b s V x 4);
    # backward then holds two such fp32 tensors at once (nll_loss and log_softmax grads).
    gemma = shape.family.startswith("gemma")  # its final RMSNorm keeps the normalised tensor in fp32
    head = (4 + (4 if gemma else r) + (2 if autocast and r == 4 else r)) * s_logits * b * h
    loss_saved = 4 * s_logits * b * V
    loss_backward = 2 * 4 * s_logits * b * V
    if shape.logit_softcap:
        # Gemma-2: logits / cap -> tanh -> x cap; tanh keeps its output (the logits' dtype)
        loss_saved += (2 if autocast else e) * s_logits * b * V
    head_kind = setup.head or ("classification" if shape.family == "bert" else "causal-lm")
    if head_kind == "classification":
        if setup.head is None:
            notes.add("BERT: a classification head assumed (no vocabulary logits); a masked-LM head "
                      "(AutoModelForMaskedLM) adds b x s x vocab x ~12 B")
        loss_saved, loss_backward = 0, 0
    elif head_kind == "masked-lm" or shape.family == "bert":
        # BertForMaskedLM: the transform's dense input, GELU input and LayerNorm input, the
        # decoder's input; CrossEntropyLoss on the logits in their dtype (no up-cast; fp32 under
        # autocast, an fp32-listed op) keeps the log_softmax output, and backward holds its
        # gradient and the logits' gradient (H200: fp32 +2,785 MiB, amp-bf16 +2,377 MiB over the
        # classification head at 16 x 512 x 30,522)
        logits = 4 if autocast else e
        head = 4 * e * s_logits * b * h
        loss_saved = logits * s_logits * b * V
        loss_backward = (logits + (2 if autocast else e)) * s_logits * b * V
    notes.add("the training loop drops the model's outputs before backward (HF Trainer); a loop that keeps "
              "`outputs` alive also holds the logits (b x s x vocab x 2-4 B)")
    layer_backward = 2 * e * s * b * shape.intermediate + 2 * 4 * s * b * h
    if setup.checkpointing:
        # HF checkpoints each layer: only its input stays (Korthikanti: full recomputation, 2sbh)
        saved = layer_inputs + head + loss_saved
        formula = f"checkpointing: layer inputs {layer_inputs / GIB:.3g} GiB + head/loss {(head + loss_saved) / GIB:.3g} GiB"
    else:
        saved = per_layer_total + head + loss_saved
        formula = f"layers {per_layer_total / GIB:.3g} GiB + head/loss {(head + loss_saved) / GIB:.3g} GiB (HF terms, Korthikanti et al.)"
    if setup.lora_rank is not None and shape.blocks:
        lora_extra = _lora_activation_delta(setup, shape, s, b, e, autocast)
        if lora_extra:
            saved += lora_extra if not setup.checkpointing else 0
            layer_full += lora_extra // max(shape.layers + shape.encoder_layers, 1)
            formula += f" + LoRA fp32 input copies {lora_extra / GIB:.3g} GiB"
    return _Activations(saved, layer_full, loss_backward, layer_backward, copies, formula, band)


# encoders trained under a classification (or contrastive) head: no vocabulary logits
ENCODER_FAMILIES = ("deberta-v2", "vit", "clip", "siglip", "clip_vision", "siglip_vision", "clip_text",
                    "qwen2_5_vl_vision", "mllama_vision")
DEFAULT_SEQ.update({"deberta-v2": 512, "clip_text": 77, "whisper": 448})


def _encoder_activations(setup: MemorySetup, shape: ModelShape, notes: _Notes, b: int, e: int, r: int,
                         autocast: bool, copies: int) -> _Activations:
    """An encoder's layers at its token count (a vision tower's patches, else the run's sequence
    length), the final norm and the image input; no vocabulary logits (memory/family_activations.py)."""
    from cfgfix.memory.family_activations import encoder_head

    if shape.tokens:
        s = shape.tokens
        notes.add(f"{shape.family}: {s} tokens per image ((image / patch)^2{' + the class token' if shape.family in ('vit', 'clip', 'clip_vision') else ''})")
    else:
        s = setup.seq_len or DEFAULT_SEQ.get(shape.family, 512)
        if setup.seq_len is None:
            notes.add(f"sequence length unknown: assumed {s} tokens")
    kernel = attention_kernel(setup, shape, notes)
    layer = _transformer_layer(shape, setup, s, b, e, r, autocast, kernel)
    head = encoder_head(shape, setup, s, b, e, r, autocast)
    layers = shape.encoder_layers or shape.layers
    if setup.checkpointing:
        saved = layers * s * b * shape.hidden * r + head
        formula = f"checkpointing: layer inputs at {s} tokens + final norm {saved / GIB:.3g} GiB"
    else:
        saved = layers * layer + head
        formula = f"{layers} encoder layers at {s} tokens {layers * layer / GIB:.3g} GiB + final norm/input {head / GIB:.3g} GiB"
    # inside one layer's backward: its output's and input's gradients (a GELU MLP's intermediate
    # gradient is freed before the next one is made; measured on the simulator, ViT and CLIP)
    layer_backward = 2 * 4 * s * b * shape.hidden
    transient, band = 0, (0.15, 0.15)
    if shape.attention == "deberta":
        from cfgfix.memory.family_activations import deberta_transient

        transient = deberta_transient(shape, setup, s, b, e, autocast)
        layer_backward += transient
        band = (0.25, 0.15)  # the attention's transient scores: 1.35-1.5 score tensors measured, 1.5 counted
    return _Activations(saved, layer, transient, layer_backward, copies, formula, band)


def _whisper_activations(setup: MemorySetup, shape: ModelShape, notes: _Notes, b: int, e: int, r: int,
                         autocast: bool, copies: int) -> _Activations:
    """WhisperForConditionalGeneration (modeling_whisper.py): the convolution front end and the
    encoder at max_source_positions (1500) frames whatever the audio's length (the feature
    extractor pads to 30 s), the decoder at the target length with cross-attention over the
    encoder's output (kept once by the k / v projections; 16-bit casts per layer under autocast),
    the logits' loss in their dtype (fp32 under autocast)."""
    from cfgfix.memory.family_activations import whisper_frontend

    s = shape.tokens
    t = setup.target_len or setup.seq_len or DEFAULT_SEQ["whisper"]
    if setup.target_len is None and setup.seq_len is None:
        notes.add(f"Whisper target length unknown: assumed {t} tokens (max_target_positions)")
    notes.add(f"Whisper: the encoder runs {s} frames per sample whatever the audio's length (30 s, padded)")
    kernel = attention_kernel(setup, shape, notes)
    h, a, V = shape.hidden, shape.heads or 1, shape.vocab
    enc = _transformer_layer(shape, setup, s, b, e, r, autocast, kernel)
    cross_norm = (2 * r) * t * b * h + 8 * t * b
    cross = cross_norm + e * b * h * (2 * t + 2 * s) + 4 * b * a * t + (2 * 2 * s * b * h if autocast and r == 4 else 0)
    dec = _transformer_layer(shape, setup, t, b, e, r, autocast, kernel) + cross
    front = whisper_frontend(shape, b, e, autocast)
    encoder_out = 2 * r * s * b * h  # the final LayerNorm's input and output (every layer's k / v input)
    logits = 4 if autocast else e
    head = (2 * r + (2 if autocast and r == 4 else 0)) * t * b * h
    loss_saved = logits * t * b * V
    loss_backward = 2 * logits * t * b * V
    if setup.checkpointing:
        saved = (shape.encoder_layers * s + shape.layers * t) * b * h * r + front + encoder_out + head + loss_saved
        formula = "checkpointing: layer inputs + front end, encoder output, head and loss"
    else:
        saved = shape.encoder_layers * enc + shape.layers * dec + front + encoder_out + head + loss_saved
        formula = (f"encoder {shape.encoder_layers} x {s} frames {shape.encoder_layers * enc / GIB:.3g} GiB + decoder "
                   f"{shape.layers} x {t} tokens {shape.layers * dec / GIB:.3g} GiB + front end {front / GIB:.3g} GiB "
                   f"+ head/loss {(encoder_out + head + loss_saved) / GIB:.3g} GiB")
    layer_backward = 2 * 4 * s * b * h
    return _Activations(saved, max(enc, dec), loss_backward, layer_backward, copies, formula, (0.15, 0.15))


# T5 under transformers 5 (models/t5/modeling_t5.py) runs attention through SDPA with the relative
# position bias as a float mask that needs a gradient (`create_position_bias_mask`,
# integrations/sdpa_attention.py). torch picks the math kernel for it, which computes in fp32 even
# for 16-bit inputs: it keeps fp32 copies of q, k and v and, per head, the fp32 softmax and (with
# dropout) the dropout noise and the dropped probabilities (measured per op with
# `torch.autograd.graph.saved_tensors_hooks` under FakeTensorMode, torch 2.13 CPU).
T5_SDPA_BYTES = 4
# torch's CPU `dropout` keeps its noise as a tensor of the input's dtype (ATen `_dropout_impl`);
# CUDA's fused `native_dropout` keeps a 1-byte bool mask. The simulator runs the CPU path.
def _t5_dropout_mask_bytes(dtype_bytes: int, device: str = "cpu") -> int:
    return dtype_bytes if device == "cpu" else 1


def _t5_activations(setup: MemorySetup, shape: ModelShape, notes: _Notes, s: int, b: int, e: int, r: int,
                    autocast: bool, copies: int) -> _Activations:
    """T5ForConditionalGeneration's saved tensors, term by term from modeling_t5.py (transformers
    5.23) and checked per op against the simulator (tests/test_estimate_vs_simulator.py).
    s: source tokens, t: target tokens; e: activation bytes, r: residual-stream bytes."""
    t = setup.target_len or s
    if setup.target_len is None:
        notes.add(f"T5 target length unknown: assumed {t} (same as the source)")
    cpu = setup.device == "cpu"
    # Both devices run SDPA's math kernel for the self-attention (the position bias is a float
    # mask with a gradient): fp32 probabilities per head. A CUDA run measured on an H200
    # (bench/gpu_results.md) sits 13-19% under the CPU simulator, not at the memory-efficient
    # kernel's figure (15-37% under it): CUDA's dropout keeps 1-byte bool masks (native_dropout)
    # where the CPU keeps its noise in the activation dtype.
    notes.add("T5: SDPA's math kernel (the position bias is a float mask with a gradient): fp32 probabilities "
              "per head" + ("; dropout noise in the activation dtype (CPU)" if cpu else "; 1-byte dropout masks (CUDA)"))
    h, i, a, V = shape.hidden, shape.intermediate, shape.heads or 1, shape.vocab
    inner = a * (shape.head_dim or h // a)
    drop = shape.dropout > 0

    def mask(nbytes: int, elements: int) -> int:
        return _t5_dropout_mask_bytes(nbytes, setup.device) * elements if drop else 0

    def norm(tokens: int, consumers: int) -> int:
        """T5LayerNorm (modeling_t5.py T5LayerNorm.forward): `hidden_states.to(float32).pow(2)`
        keeps an fp32 copy of the input; `hidden_states * rsqrt(variance)` keeps the input itself
        too when it is 16-bit (a second tensor) and rsqrt (fp32, one per token); `weight * x`
        keeps the normalised x. Its output is kept once by the next Linear, or under autocast
        once per consuming Linear as a 16-bit cast."""
        kept = (4 + (r if r < 4 else 0) + r) * tokens * b * h + 4 * tokens * b
        out = 2 * consumers if autocast and r == 4 else r
        return kept + out * tokens * b * h

    def attention(q_tokens: int, kv_tokens: int) -> int:
        """q, k, v projections -> SDPA math: fp32 copies of q, k and v (scaled q, scaled k^T,
        contiguous v), the fp32 softmax, and with dropout its noise and the dropped
        probabilities (b x a x q x kv each); the output before `o` in the activation dtype."""
        qkv = T5_SDPA_BYTES * b * inner * (q_tokens + 2 * kv_tokens)
        # the softmax; with dropout its mask (CPU: fp32 noise, CUDA: bool) and the dropped probabilities
        per_score = T5_SDPA_BYTES * (2 if drop else 1) + (_t5_dropout_mask_bytes(4, setup.device) if drop else 0)
        scores = per_score * b * a * q_tokens * kv_tokens
        return qkv + scores + e * q_tokens * b * inner

    def cross_attention(q_tokens: int, kv_tokens: int) -> int:
        """Cross-attention's bias is a constant zero tensor (modeling_t5.py T5Attention.forward,
        `torch.zeros(...)` without a gradient): with dropout off SDPA takes the fused kernel,
        which keeps q, k, v and its output (also `o`'s input) in the activation dtype and an
        fp32 logsumexp; with dropout on, the math kernel as for self-attention."""
        if drop:
            return attention(q_tokens, kv_tokens)
        return e * b * inner * (2 * q_tokens + 2 * kv_tokens) + 4 * b * a * q_tokens

    def feed_forward(tokens: int) -> int:
        """T5LayerFF: norm (2 consumers gated: wi_0, wi_1), the MLP's intermediate-sized tensors
        (shape.mlp_tensors: gated-gelu keeps NewGELU's four, its output, wi_1's output and the
        product), the dropout noise on the product (T5DenseGatedActDense.dropout), and the
        residual dropout's noise (T5LayerFF.dropout)."""
        return (norm(tokens, 2 if shape.gated_mlp else 1) + shape.mlp_tensors * e * tokens * b * i
                + mask(e, tokens * b * i) + mask(e, tokens * b * h))

    # encoder block: self-attention sublayer (norm, attention, residual dropout) + FF
    enc = norm(s, 3) + attention(s, s) + mask(e, s * b * h) + feed_forward(s)
    # decoder block: causal self-attention (+ the bool causal mask torch.where keeps,
    # sdpa_attention.py create_position_bias_mask), cross-attention over the encoder's s tokens
    # (under autocast k and v each keep a 16-bit copy of the encoder output), FF
    cross_inputs = 2 * 2 * s * b * h if autocast and r == 4 else 0
    dec = (norm(t, 3) + attention(t, t) + t * t + mask(e, t * b * h)
           + norm(t, 1) + cross_attention(t, s) + cross_inputs + mask(e, t * b * h) + feed_forward(t))
    layers = shape.encoder_layers * enc + shape.layers * dec

    def stack_ends(tokens: int) -> int:
        """Per stack (T5Stack.forward): the embedding dropout's noise, the final T5LayerNorm
        (its output goes to the dropout, which keeps only its noise) and that noise."""
        kept = (4 + (r if r < 4 else 0) + r) * tokens * b * h + 4 * tokens * b
        return mask(r, tokens * b * h) + kept + mask(r, tokens * b * h)

    ends = stack_ends(s) + stack_ends(t)
    # the lm_head's input (a 16-bit cast under autocast; for tied embeddings
    # `sequence_output * model_dim**-0.5` replaces the tensor rather than adding one)
    head_in = (2 if autocast and r == 4 else r) * t * b * h
    # the loss: CrossEntropyLoss on the logits in their own dtype (T5 does not up-cast them, unlike
    # ForCausalLMLoss); log_softmax keeps its output, fp32 under autocast (an fp32-listed op)
    logit_bytes = 4 if autocast else e
    loss_saved = logit_bytes * t * b * V
    loss_backward = 2 * logit_bytes * t * b * V

    if setup.checkpointing:
        # HF checkpoints each T5Block (GradientCheckpointingLayer) and keeps its inputs: the hidden
        # states (r), the encoder output (every decoder block's input), the position bias shared by
        # a stack's blocks (1 x a x tokens x tokens, the bias weights' dtype) and the decoder's
        # cross-attention zero bias (1 x a x t x s, activation dtype, made by block 0)
        block_inputs = (shape.encoder_layers * s + shape.layers * t + s) * b * h * r
        biases = r * a * (s * s + t * t) + e * a * t * s
        saved = block_inputs + biases + ends + head_in + loss_saved
        formula = (f"checkpointing: block inputs and position biases {(block_inputs + biases) / GIB:.3g} GiB "
                   f"+ stack ends/head/loss {(ends + head_in + loss_saved) / GIB:.3g} GiB")
    else:
        # the encoder's output, kept once by the cross-attention k/v Linears (under autocast they
        # keep 16-bit copies instead, counted per layer); the relative-position bucket ids (int64,
        # tokens^2 per stack) that the bias Embedding keeps
        encoder_out = 0 if autocast and r == 4 else r * s * b * h
        buckets = 8 * (s * s + t * t)
        # the fused kernel keeps its mask: the zero cross-attention bias, made once by block 0
        cross_bias = 0 if drop else e * a * t * s
        saved = layers + ends + encoder_out + buckets + cross_bias + head_in + loss_saved
        formula = (f"encoder {shape.encoder_layers * enc / GIB:.3g} GiB + decoder {shape.layers * dec / GIB:.3g} GiB "
                   f"+ stack ends/head/loss {(ends + encoder_out + head_in + loss_saved) / GIB:.3g} GiB "
                   f"(modeling_t5.py terms, SDPA math kernel, {'CPU' if cpu else 'CUDA'} dropout masks)")
    if setup.lora_rank is not None and shape.blocks:
        enc_delta, dec_delta, model_delta = _t5_lora_delta(setup, shape, s, t, b, e, r, autocast)
        enc, dec = enc + enc_delta, dec + dec_delta
        if not setup.checkpointing:
            saved += shape.encoder_layers * enc_delta + shape.layers * dec_delta + model_delta - head_in
            saved -= mask(r, s * b * h) + mask(r, t * b * h) + 8 * (s * s + t * t)
            formula += f" + LoRA {(saved - layers - ends) / GIB:+.3g} GiB"
    layer_full = max(enc, dec)
    # The end of backward is the encoder's first block: with checkpointing the peak sits in its
    # recomputation, at the FF's dropout (measured on three shapes, s up to 1024), not in its
    # attention's backward. Besides the block's own tensors: its input, the gradient of its
    # output, and the stack's position bias.
    layer_backward = 2 * r * s * b * h + r * a * s * s
    # band: within 3.5% of the simulator on the shapes measured; the low side is wide because a GPU's
    # attention kernel and bool dropout masks may keep less than the CPU path modelled here
    return _Activations(saved, layer_full, loss_backward, layer_backward, copies, formula, (0.35, 0.10))


def _t5_lora_delta(setup: MemorySetup, shape: ModelShape, s: int, t: int, b: int, e: int, r: int,
                   autocast: bool) -> tuple[int, int, int]:
    """What PEFT LoRA changes in T5's saved tensors (per encoder block, per decoder block, once;
    measured per op on the simulator, peft 0.21). Each adapter keeps its input cast to fp32
    (peft lora/layer.py `_cast_input_dtype`, when the base is 16-bit without autocast) and
    lora_B's rank-sized input; a frozen base Linear keeps no input, a frozen T5LayerNorm weight
    no normalised tensor, and with everything frozen before them the embedding dropout, the
    position-bias Embedding, each stack's first norm and the frozen lm_head keep nothing."""
    rank, targets = setup.lora_rank, setup.lora_targets
    cast = e < 4 and not autocast
    low_rank_bytes = 2 if autocast else 4
    h, inner = shape.hidden, shape.heads * (shape.head_dim or shape.hidden // max(shape.heads, 1))

    def adapted(name: str) -> bool:
        return targets is None or any(name == x or name.endswith("." + x) for x in targets)

    def block(linears, q_tokens: int) -> int:
        names = {name for name, _, _ in linears}
        def tokens(name: str) -> int:  # cross-attention k and v read the encoder's s tokens
            return s if name in ("EncDecAttention.k", "EncDecAttention.v") else q_tokens

        delta = sum((4 * fin * cast + low_rank_bytes * rank) * tokens(name) * b
                    for name, fin, _ in linears if adapted(name))
        if cast:  # base inputs nobody keeps any more: a group of Linears reading one tensor
            for group, width in ((("SelfAttention.q", "SelfAttention.k", "SelfAttention.v"), h),
                                 (("SelfAttention.o",), inner), (("EncDecAttention.q",), h), (("EncDecAttention.o",), inner),
                                 (("wi_0", "wi_1", "wi"), h), (("wo",), shape.intermediate)):
                present = [g for g in group if g in names]
                if present and all(adapted(g) for g in present):
                    delta -= e * q_tokens * b * width
        norms = 3 if "EncDecAttention.q" in names else 2
        return delta - norms * r * q_tokens * b * h  # frozen norm weights: no normalised tensor

    enc_linears, dec_linears = shape.blocks[0].linears, shape.blocks[-1].linears
    once = 0
    if cast and all(adapted(n) for n in ("EncDecAttention.k", "EncDecAttention.v")):
        once -= r * s * b * h  # the encoder output, no longer kept by the frozen cross k/v
    for n in (s, t):
        once -= (4 + (r if r < 4 else 0)) * n * b * h + 4 * n * b  # the stack's first norm: input needs no gradient
        once -= r * n * b * h  # the final norm's normalised tensor (frozen weight)
    return block(enc_linears, s), block(dec_linears, t), once


def _lora_activation_delta(setup: MemorySetup, shape: ModelShape, s: int, b: int, e: int, autocast: bool) -> int:
    """PEFT runs fp32 adapters on a 16-bit base by casting each adapted Linear's input to fp32
    (peft/tuners/lora/layer.py, `_cast_input_dtype`): one fp32 copy per adapter is kept for
    backward, while the frozen Linears no longer keep their (16-bit) inputs: the norms'
    outputs and the MLP product. Under autocast, or with an fp32 base, the adapters share
    the base's saved input: no change."""
    if autocast or e == 4:
        return 0
    sb = s * b
    delta = 0
    for block in shape.blocks:
        adapted_in = sum(i for name, i, _ in block.linears if setup.lora_targets is None or name in setup.lora_targets)
        delta += block.count * sb * (4 * adapted_in - e * (2 * shape.hidden + shape.intermediate))
    return max(delta, 0)


def _unet_activations(setup: MemorySetup, shape: ModelShape, notes: _Notes, b: int, e: int) -> _Activations:
    """UNet2DConditionModel's saved tensors module by module (memory/unet_activations.py, read
    from diffusers 0.42.1), checked against the FakeTensor simulator (bench/memory_families.md)."""
    from cfgfix.memory.unet_activations import unet_activations

    res = setup.resolution or DEFAULT_RESOLUTION.get("unet", 1024)
    if setup.resolution is None:
        notes.add(f"image resolution unknown: assumed {res} px")
    latent = res // 8
    # CUDA autocast's fp32 norms and per-op casts (memory/unet_activations.py); CPU autocast keeps the norms 16-bit
    autocast = bool(setup.autocast) and not setup.deepspeed_half and setup.device == "cuda"
    cross = next((i for name, i, _ in shape.blocks[0].linears if name == "to_k" and i != shape.hidden), 768) if shape.blocks else 768
    saved, largest, transient, profile = unet_activations(shape, latent, b, e, setup.checkpointing,
                                                          shape.unet_layers_per_block, autocast, cross)
    formula = (f"{'checkpointing: unit inputs + norms and projections outside the checkpoints' if setup.checkpointing else 'resnets 3 cin + 3 cout, transformer blocks 30 C, wrappers 3 C per level'} "
               f"at {latent} x {latent} latents (diffusers UnetBlocks)")
    # autocast casts every conv weight as well as every Linear's (conv2d and linear are both on its
    # 16-bit list) and caches the casts until the forward's autocast region ends: a UNet's weights are
    # nearly all conv and Linear, so the copies are 2 B per parameter (the simulator: +1.64 GB of
    # bf16 copies for SD 1.5 at the end of the forward)
    copies = 2 * shape.params if setup.autocast and setup.weights == "fp32" and not setup.deepspeed_half and not setup.fsdp else 0
    return _Activations(saved, largest, 0, transient, copies, formula, (0.15, 0.15), profile)


def _with_other_parts(setup: MemorySetup, shape: ModelShape, act: _Activations, notes: _Notes) -> _Activations:
    """A composite model (memory/parts.py): each other backbone keeps its own activations for
    backward, with the run's micro batch, the run's sequence length (or its own fixed token
    count: a ViT's patches), no vocabulary logits (a base model under the user's head), and
    checkpointing where its `gradient_checkpointing_enable()` was called."""
    saved, layer_full, copies, parts = act.saved, act.layer_full, act.autocast_copies, []
    for part, checkpointed in shape.other_parts:
        # None: a tower of the same transformers model (CLIP's text tower, a VLM's vision tower),
        # checkpointed when the run's model is
        part_setup = replace(setup, seq_len=part.tokens or setup.seq_len, head="classification", lora_rank=None,
                             checkpointing=setup.checkpointing if checkpointed is None else checkpointed, params=None)
        part_act = _activations(part_setup, part, _Notes())
        saved += part_act.saved
        layer_full = max(layer_full, part_act.layer_full)
        copies += part_act.autocast_copies
        parts.append(f"{part.family} {part_act.saved / GIB:.3g} GiB")
    notes.add(f"composite model: the other backbones' activations added ({', '.join(parts)}); the torch layers "
              "between the backbones keep activations that are not counted")
    return replace(act, saved=saved, layer_full=layer_full, autocast_copies=copies,
                   formula=act.formula + f" + other backbones {', '.join(parts)}")


# -- communication buffers ---------------------------------------------------------------------

# DeepSpeed's zero_optimization defaults (runtime/zero/config.py, DeepSpeed 0.16.5): buckets in
# elements; overlap_comm defaults to True at stage 3 and False below (`overlap_comm_valid`)
DEEPSPEED_ZERO_DEFAULTS = {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "prefetch_bucket_size": 5e7,
                           "max_live_parameters": 1e9, "param_persistence_threshold": 1e5}


def _deepspeed_option(setup: MemorySetup, shape: ModelShape, key: str, notes: _Notes) -> float:
    """A zero_optimization size from the run's DeepSpeed config, its "auto" as the HF integration
    fills it (transformers integrations/deepspeed.py `trainer_config_finalize`: reduce h x h,
    prefetch 0.9 h x h, persistence 10 h), else DeepSpeed's default."""
    value = (setup.extras or {}).get(key)
    h = shape.hidden
    if value == "auto":
        auto = {"reduce_bucket_size": h * h, "prefetch_bucket_size": int(0.9 * h * h),
                "param_persistence_threshold": 10 * h}.get(key)
        if auto:
            notes.add(f"DeepSpeed {key} \"auto\": {auto:,.0f} as the HF Trainer fills it from hidden_size {h}")
            return float(auto)
        value = None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEEPSPEED_ZERO_DEFAULTS[key]


def _persistent_params(shape: ModelShape, threshold: float) -> int:
    """ZeRO-3 keeps every parameter tensor under stage3_param_persistence_threshold elements whole
    on each GPU (never partitioned): the norms and biases, and Linear weights that small."""
    if not shape.blocks:
        return 0
    total = 0
    for block in shape.blocks:
        large = sum(i * o for _, i, o in block.linears if i * o >= threshold)
        total += block.count * max(block.params - large, 0)
    return total


def _buckets(setup: MemorySetup, shape: ModelShape, states: _States, notes: _Notes) -> tuple[int, str]:
    n = setup.num_gpus
    if setup.deepspeed_half or setup.zero_stage:
        extras = setup.extras or {}
        stated = [k for k in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size", "overlap_comm",
                              "max_live_parameters", "param_persistence_threshold") if k in extras]
        if stated:
            notes.add("from the DeepSpeed config: " + ", ".join(f"{k} {extras[k]}" for k in stated))
        reduce = _deepspeed_option(setup, shape, "reduce_bucket_size", notes)
        overlap = extras.get("overlap_comm", setup.zero_stage == 3)
        if setup.zero_stage == 3:
            prefetch = _deepspeed_option(setup, shape, "prefetch_bucket_size", notes)
            live = _deepspeed_option(setup, shape, "max_live_parameters", notes)
            threshold = _deepspeed_option(setup, shape, "param_persistence_threshold", notes)
            if "reduce_bucket_size" not in extras or "prefetch_bucket_size" not in extras:
                notes.add("DeepSpeed ZeRO-3 bucket sizes not stated: DeepSpeed's defaults assumed for the missing ones "
                          "(reduce 5e8, prefetch 5e7 elements)")
            # the prefetched parameters are capped by stage3_max_live_parameters
            prefetched = min(prefetch, live)
            persistent = _persistent_params(shape, threshold) * (n - 1) // max(n, 1)
            formula = (f"ZeRO-3 reduce bucket {reduce:.3g} + prefetched parameters {prefetched:.3g} (min of "
                       f"prefetch_bucket_size and max_live_parameters) x 2 B")
            if persistent:
                formula += f" + {persistent / 1e6:.3g}M persistent small parameters (under {threshold:.3g} elements) x 2 B"
            return int((reduce + prefetched + persistent) * 2), formula
        allgather = _deepspeed_option(setup, shape, "allgather_bucket_size", notes)
        if "reduce_bucket_size" not in extras or "allgather_bucket_size" not in extras:
            notes.add("DeepSpeed bucket sizes not stated: DeepSpeed's defaults assumed for the missing ones "
                      "(5e8 elements, overlap_comm off below stage 3)")
        if n <= 1 and setup.zero_stage < 2:
            return 0, "single GPU: no reduction buckets"
        # HF DeepSpeed docs: "overlap_comm uses 4.5x the allgather_bucket_size and
        # reduce_bucket_size values ... 5e8 x 2Bytes x 2 x 4.5 = 9GB"
        factor = 4.5 if overlap else 1.0
        return int((reduce + allgather) * 2 * factor), (f"(reduce {reduce:.3g} + allgather {allgather:.3g} buckets) x 2 B "
                                                        f"x {factor:g} (overlap_comm {'on' if overlap else 'off'}; HF DeepSpeed docs)")
    if n > 1 and not setup.fsdp:
        return states.grads, "DDP buckets: a copy of the gradients (torch DDP docs, gradient_as_bucket_view)"
    return 0, "none"


# -- the estimate ---------------------------------------------------------------------------------

def estimate(setup: MemorySetup, shape: ModelShape | None = None) -> Estimate:
    """The per-GPU memory of one training step of `setup` on a model of `shape` (or of
    `setup.params` parameters when no shape is known)."""
    notes = _Notes()
    if shape is None:
        if not setup.params:
            raise ValueError("estimate needs a model shape or setup.params")
        shape = params_only(setup.params)
    elif setup.params and setup.params != shape.params:
        notes.add(f"parameter count from the setup ({setup.params / 1e9:.3g}B) replaces the shape's ({shape.params / 1e9:.3g}B)")
        shape = replace(shape, params=int(setup.params))
    if shape.family == "params" and shape.params > 0 and not setup.impossible():
        return _estimate_guessing_the_shape(setup, shape, notes)
    if setup.weights == "fp16" and setup.optimizer == "adamw" and not setup.deepspeed_half and setup.lora_rank is None:
        notes.add("pure fp16 weights with torch AdamW underflow at the default eps=1e-8 (it rounds to 0 in fp16): sized anyway")
    problems = setup.impossible()
    if problems:
        raise ValueError("; ".join(problems))
    for note in shape.notes:  # what reading the model's config assumed or found (MoE's active share, defaults)
        notes.add(note)
    shape = with_head(shape, setup.head)
    shape = _t5_head(setup, shape, notes)
    for conflict in setup.conflicts():
        notes.add(f"{conflict} (estimated as it would run)")
    trainable = _trainable(setup, shape, notes)
    states = _model_states(setup, shape, trainable, notes)
    frozen = sum(params * nbytes for _, params, nbytes in setup.frozen)
    if frozen:
        # a frozen model moved to the device sits whole on every GPU (it is not in the DeepSpeed
        # engine, so ZeRO does not shard it); its no-grad forward keeps no activations
        listed = ", ".join(f"{name} {params / 1e6:.0f}M x {nbytes} B" for name, params, nbytes in setup.frozen)
        notes.add(f"frozen models on the GPU: {listed} = {frozen / GIB:.2f} GiB")
        states = replace(states, weights=states.weights + frozen,
                         weights_formula=f"{states.weights_formula} + frozen models {frozen / GIB:.3g} GiB ({listed})")
    act = _activations(setup, shape, notes)
    if shape.other_parts:
        act = _with_other_parts(setup, shape, act, notes)
    states, act, data_high = _llm_int8(setup, shape, states, act, notes)
    buckets, bucket_formula = _buckets(setup, shape, states, notes)
    ctx_low = ctx_high = 0
    if setup.device == "cuda":
        ctx, ctx_low, ctx_high, ctx_words = cuda_context(setup)
        workspaces = CUBLAS_WORKSPACE_BYTES * CUBLAS_HANDLES
        notes.add(f"CUDA context, kernels and library handles: {ctx / MIB:.0f} MiB outside torch's allocator ({ctx_words}; "
                  "the band carries the range)")
        if setup.variable_length:
            notes.add(f"allocator: batches vary in shape from step to step, so the caching allocator keeps blocks cut for "
                      f"earlier batches: reserved memory was reported at {VARIABLE_LENGTH_RESERVED[0]:g}-"
                      f"{VARIABLE_LENGTH_RESERVED[1]:g}x the predicted peak (qlora.py with group_by_length, issue 21), so "
                      f"the band's top is {VARIABLE_LENGTH_RESERVED[1]:g}x the peak; PYTORCH_CUDA_ALLOC_CONF="
                      "expandable_segments:True lets the allocator grow segments instead (not verified on a GPU here)")
        else:
            notes.add("allocator: the band's top adds 5% for the caching allocator's rounding and cache with fixed-length "
                      "batches" + (" (the run's batches are fixed-length)" if setup.variable_length is False else
                                   "; batches whose shapes vary from step to step (group_by_length, dynamic padding) were "
                                   f"reported at {VARIABLE_LENGTH_RESERVED[0]:g}-{VARIABLE_LENGTH_RESERVED[1]:g}x the "
                                   "predicted peak (qlora.py reports, issue 21): expect up to that much reserved memory "
                                   "there, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (not verified on a GPU "
                                   "here)"))
        notes.add(f"cuBLAS workspaces: {workspaces / MIB:.0f} MiB in torch's allocator (torch's default, 32 MiB per handle on "
                  "Hopper cards, 8.1 MiB on others; one handle for the forward, one for the autograd thread)")
    else:
        ctx = workspaces = 0
        notes.add("CPU kernels (--device cpu): no CUDA context; what `verify --device cpu` and the simulator measure")

    buckets_and_workspaces = buckets + workspaces
    static = states.weights + states.master + states.optimizer + buckets_and_workspaces + ctx
    grads_fwd = states.grads if states.grads_persistent else 0
    temps_start = act.autocast_copies + act.loss_backward + states.gathered
    phases = {
        "backward start": static + grads_fwd + act.saved + temps_start,
        "backward end": static + states.grads + act.layer_backward + states.gathered
        + (act.layer_full if setup.checkpointing else 0),
        "optimizer step": static + states.grads + states.step_temp,
    }
    if setup.checkpointing:
        phases["recompute"] = static + grads_fwd + act.saved + act.layer_full + act.layer_backward + states.gathered
    middle_act = middle_grads = 0
    if act.backward_profile:
        middle_act, middle_grads = max(
            ((waiting, states.grads if states.grads_persistent else int(share * states.grads))
             for waiting, share in act.backward_profile), key=sum)
        phases["backward middle"] = static + middle_act + middle_grads + act.layer_backward + states.gathered
    phase = max(phases, key=phases.get)
    peak = phases[phase]

    live = {
        "weights": states.weights,
        "master_weights": states.master,
        "optimizer_states": states.optimizer,
        "cuda_context": ctx,
    }
    if phase == "backward start":
        live |= {"gradients": grads_fwd, "activations": act.saved, "temporaries": temps_start + buckets_and_workspaces}
    elif phase == "recompute":
        live |= {"gradients": grads_fwd, "activations": act.saved + act.layer_full,
                 "temporaries": act.layer_backward + states.gathered + buckets_and_workspaces}
    elif phase == "backward middle":
        live |= {"gradients": middle_grads, "activations": middle_act,
                 "temporaries": act.layer_backward + states.gathered + buckets_and_workspaces}
    elif phase == "backward end":
        live |= {"gradients": states.grads, "activations": act.layer_full if setup.checkpointing else 0,
                 "temporaries": act.layer_backward + states.gathered + buckets_and_workspaces}
    else:
        live |= {"gradients": states.grads, "activations": 0, "temporaries": states.step_temp + buckets_and_workspaces}

    temp_formula = "; ".join(
        part for part in (
            f"autocast 16-bit weight copies {act.autocast_copies / GIB:.3g} GiB (autocast's per-op weight casts)" if act.autocast_copies else "",
            f"fp32 loss gradient {act.loss_backward / GIB:.3g} GiB" if act.loss_backward else "",
            f"gathered {'FSDP units' if setup.fsdp else 'layer'} {states.gathered / GIB:.3g} GiB" if states.gathered else "",
            f"buckets {buckets / GIB:.3g} GiB: {bucket_formula}" if buckets else "",
            f"{optimizer_impl(setup)} optimizer step {states.step_temp / GIB:.3g} GiB" if states.step_temp else "",
            f"cuBLAS workspaces {workspaces / MIB:.0f} MiB (torch's default per handle)" if workspaces else "",
        ) if part
    ) or "none"
    sizes = {
        "weights": states.weights,
        "gradients": states.grads,
        "optimizer_states": states.optimizer,
        "master_weights": states.master,
        "activations": max(act.saved, live["activations"]),
        "temporaries": max(live["temporaries"], temps_start + buckets_and_workspaces),
        "cuda_context": ctx,
    }
    formulas = {
        "weights": states.weights_formula + (f" + {'units' if setup.fsdp else 'largest layer'} gathered ({states.gathered / GIB:.3g} GiB, in temporaries)" if states.gathered else ""),
        "gradients": states.grads_formula,
        "optimizer_states": states.optimizer_formula,
        "master_weights": states.master_formula,
        "activations": act.formula,
        "temporaries": temp_formula,
        "cuda_context": (f"{ctx / MIB:.0f} MiB (range {ctx_low / MIB:,.0f}-{ctx_high / MIB:,.0f} MiB): outside torch's allocator"
                         if ctx else "none (CPU)"),
    }
    components = tuple(Component(name, sizes[name], live[name], formulas[name]) for name in COMPONENTS)
    # the band: model states are exact; activations and temporaries carry the activation
    # model's relative error; the allocator's caching and fragmentation add up to 5% more
    variable = live["activations"] + live["temporaries"]
    if phase == "backward middle":  # which gradients exist by then is part of the modelled backward order
        variable += middle_grads
    low = int(peak - variable * act.band[0] - (ctx - ctx_low))
    high = int(peak + variable * act.band[1] + 0.05 * peak + (ctx_high - ctx) + data_high)
    if setup.variable_length and setup.device == "cuda":
        high = max(high, int(VARIABLE_LENGTH_RESERVED[1] * (peak - ctx) + ctx_high))
    return Estimate(
        setup=setup, shape=shape, components=components, peak=peak, peak_phase=phase, low=low, high=high,
        cpu=states.cpu, assumptions=tuple(notes.items), trainable_params=trainable, phases=dict(phases),
    )


def _estimate_guessing_the_shape(setup: MemorySetup, shape: ModelShape, notes: _Notes) -> Estimate:
    """A bare parameter count: the estimate of a guessed decoder of that size (memory/shapes.py
    `guessed_decoder_shapes`), its band from the guesses' ends: the bottom with a 32,000-entry
    vocabulary, the top with a 262,144-entry one and eager attention (unless the run names its
    attention), so the top carries the vocabulary and attention terms a bare count leaves open."""
    from cfgfix.memory.shapes import guessed_decoder_shapes

    plain = replace(setup, params=None)
    top_setup = plain if setup.attention else replace(plain, attention="eager")
    ends = {}
    low_params, high_params = shape.params_range or (shape.params, shape.params)
    counts = {"low": low_params, "point": shape.params, "high": high_params}
    for end, guess in guessed_decoder_shapes(shape.params).items():
        if counts[end] != shape.params:  # a count read from the name: each end at its own count
            guess = guessed_decoder_shapes(counts[end])[end]
        guess = replace(guess, largest_module_params=max(guess.largest_module_params, shape.largest_module_params),
                        notes=guess.notes + shape.notes)
        ends[end] = estimate(top_setup if end == "high" else plain, guess)
    point = ends["point"]
    assumptions = tuple(dict.fromkeys((*notes.items, *point.assumptions)))
    return replace(point, shape=shape, low=min(e.low for e in ends.values()), high=max(e.high for e in ends.values()),
                   assumptions=assumptions)


def _llm_int8(setup: MemorySetup, shape: ModelShape, states: _States, act: _Activations,
              notes: _Notes) -> tuple[_States, _Activations, int]:
    """A LoRA run on a bitsandbytes 8-bit base: the row scales and tile padding with the weights,
    the int8 copies each Linear keeps for backward, its quantisation / dequantisation transients,
    and the data-dependent outlier columns as the band's top (memory/llm_int8.py). Returns the
    bytes the band's top adds."""
    if setup.quantization != "8bit" or setup.lora_rank is None:
        return states, act, 0
    if not shape.blocks:
        # no Linear shapes: the outlier top over the quantised share, the rest unknown
        quantized = int(shape.params * 0.9)
        notes.add("LLM.int8 outliers: input columns with a value of magnitude >= 6.0 keep their weight columns in fp16; "
                  f"from none (counted) to every column (the band's top: +{2 * quantized / GIB:.2f} GiB over the assumed "
                  "90% quantised share)")
        return states, act, 2 * quantized
    from cfgfix.memory.llm_int8 import int8_terms

    linears = [(block.count, i, o) for block in shape.blocks for _, i, o in block.linears]
    e, _ = _act_dtypes(setup)
    tokens = max(setup.micro_batch, 1) * setup.sequences_per_sample * (setup.seq_len or DEFAULT_SEQ.get(shape.family, 2048))
    terms = int8_terms(linears, tokens, e, 2, gpu_generation(setup.gpu), shape.layers, setup.checkpointing)
    for note in terms.notes:
        notes.add(note)
    saved = 0 if setup.checkpointing else shape.layers * terms.saved_per_layer
    states = replace(states, weights=states.weights + terms.weights,
                     weights_formula=f"{states.weights_formula} {terms.weights_formula}")
    act = replace(act, saved=act.saved + saved, layer_full=act.layer_full + terms.saved_per_layer,
                  layer_backward=act.layer_backward + terms.temporaries,
                  formula=act.formula + (f" + int8 saved inputs {saved / GIB:.3g} GiB" if saved else ""))
    return states, act, terms.outliers_high


def _t5_head(setup: MemorySetup, shape: ModelShape, notes: _Notes) -> ModelShape:
    """T5 v1.1 / FLAN-T5 configs say `tie_word_embeddings: false` (an untied lm_head); from
    transformers 5.0 T5Config ties it whatever the config says (memory/transformers_versions.py)."""
    if shape.family != "t5":
        return shape
    from cfgfix.memory.transformers_versions import default_attention, t5_head_tied

    version = setup.transformers_version
    if default_attention("t5", version) == "sdpa":
        notes.add(f"transformers {version} runs T5's attention through SDPA (position bias as the mask); the estimate "
                  "keeps eager's saved scores and probabilities, so it errs high")
    if not shape.head_params:
        return shape
    tied = t5_head_tied(version)
    if tied:
        notes.add(f"transformers {version} ties T5's lm_head to the shared embedding whatever the config says "
                  f"(T5Config since 5.0): {shape.head_params / 1e6:.0f}M fewer parameters than the config's untied head")
        return replace(shape, params=shape.params - shape.head_params, head_params=0,
                       largest_module_params=shape.largest_module_params, source=shape.source + " + head tied (transformers >= 5)")
    if tied is None:
        notes.add(f"T5's lm_head counted untied as its config says ({shape.head_params / 1e6:.0f}M); transformers >= 5.0 ties "
                  "it, transformers 4.x follows the config (the version is not known)")
    return shape


# -- verdicts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    fits: bool  # the estimate's peak is under the GPU's usable memory
    certain: bool  # the whole error band is on the same side
    margin: int  # usable - peak (negative: short by that much)
    usable: int
    text: str


def verdict(result: Estimate, usable_bytes: int, gpu_name: str = "the GPU") -> Verdict:
    margin = usable_bytes - result.peak
    fits = margin >= 0
    certain = result.high <= usable_bytes if fits else result.low > usable_bytes
    if fits and certain:
        text = f"fits {gpu_name}: {margin / GIB:.1f} GiB to spare (even at the band's top)"
    elif fits:
        text = f"fits {gpu_name} with {margin / GIB:.1f} GiB to spare, but the band's top ({result.high / GIB:.1f} GiB) does not: tight"
    elif certain:
        text = f"does not fit {gpu_name}: {-margin / GIB:.1f} GiB over"
    else:
        text = f"probably does not fit {gpu_name}: {-margin / GIB:.1f} GiB over (the band's bottom, {result.low / GIB:.1f} GiB, would)"
    return Verdict(fits, certain, margin, usable_bytes, text)
