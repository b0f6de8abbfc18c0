"""`cfgfix estimate --simulate`: measure a full-size training step without a GPU.

The model is built from its HF config under `FakeTensorMode` on the CPU device: every
tensor has its real shape and dtype but no data, so a 1B-parameter step at batch 4x2048
runs in seconds in a few hundred MB. The resolved setup (weights dtype, autocast,
optimizer, gradient checkpointing, LoRA, gradient accumulation, batch and sequence length)
runs for `steps` optimizer steps, and `LiveBytes` counts the peak of live tensor bytes.

Why this design (verify-notes.md, "Simulating a full-size step without a GPU"): fake
tensors on device cpu give the same peak as the same steps on real CPU tensors (to the
byte for tiny Llama, Mixtral-bf16 and T5 models with checkpointing, bf16, autocast,
Adafactor, accumulation; LoRA within 16 bytes: tests/test_simulate.py); a fake *cuda*
device aborts the process on the CPU build, and meta-device models mis-measure attention
and crash with checkpointing, so neither is used. One transformers check that reads
tensor values is answered as real data would answer it (`_unpacked_batches`).

torch, transformers (and peft for LoRA) are imported inside `simulate`, never at import; a
diffusers config (UNet2DConditionModel, FLUX, SD3) runs `simulate_diffusers`, which imports diffusers.
"""

from __future__ import annotations

import importlib
import logging
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext

from packaging.version import Version

from cfgfix.memory.estimator import CUDA_CONTEXT_BYTES
from cfgfix.memory.setup import MemorySetup
from cfgfix.records import dataclass, field

INSTALL_HINT = "pip install 'cfgfix[verify]'"

MIB = 1 << 20

# What a CUDA run adds on top of live tensor bytes, as separate fields. The CUDA context
# (driver, kernels loaded lazily since CUDA 11.7, library handles) is outside the caching
# allocator: `max_memory_allocated` never shows it, nvidia-smi does. The same measured figure
# as estimator.py's CUDA_CONTEXT_BYTES (765 MiB on an H200, bench/gpu_results.md).
# The caching allocator rounds blocks up (512 B small, 2 MiB-aligned large segments) and
# fragments: reserved exceeds allocated. Stated as a fraction of the simulated peak; the
# same 5% that estimator.py adds to the top of its band.
ALLOCATOR_MARGIN = 0.05

# How far the simulated peak may sit from a CUDA run's `max_memory_allocated`. Fake vs
# real CPU tensors agree within 1% (tests/test_simulate.py); CPU vs CUDA differences
# (autocast op lists, attention kernels, cuBLAS workspaces) are not measured: the band is
# a stated guess until a GPU run checks it.
ERROR_BAND = (-0.05, 0.10)

# DeepSpeed ZeRO / FSDP / offload shard or move state across ranks and devices, and
# bitsandbytes kernels have no CPU fake implementation: one fake CPU process cannot
# reproduce them. The analytic estimator covers these setups.
_UNSUPPORTED = {
    "zero_stage": "DeepSpeed ZeRO sharding",
    "fsdp": "FSDP sharding",
    "offload_optimizer": "optimizer offload",
    "offload_params": "parameter offload",
    "deepspeed_half": "DeepSpeed's 16-bit engine with fp32 master weights",
    "quantization": "4/8-bit quantized weights (bitsandbytes)",
}

# when the setup names no sequence length: the estimator's defaults (estimator.py DEFAULT_SEQ)
DEFAULT_SEQ_LEN = 2048
DEFAULT_SEQ_LEN_BY_TYPE = {"t5": 512, "bert": 512, "deberta-v2": 512, "whisper": 448, "clip": 77, "siglip": 64}

# families whose input is not (only) token ids: the batch the model's processor would give
IMAGE_CLASSIFIERS = ("vit",)  # pixel_values + one label per image
SPEECH_SEQ2SEQ = ("whisper",)  # log-mel input_features (2 x max_source_positions frames) + target tokens
DUAL_ENCODERS = ("clip", "siglip")  # input_ids + pixel_values, the contrastive loss
# encoders whose usual fine-tune is sequence classification (the estimator's default too)
CLASSIFIERS = ("bert", "deberta-v2") + IMAGE_CLASSIFIERS


class SimulatorUnavailable(RuntimeError):
    """torch / transformers / peft are not installed: the CLI prints this and exits 2."""


class SimulationUnsupported(ValueError):
    """The setup uses something one fake CPU process cannot reproduce."""


@dataclass(frozen=True)
class SimulationResult:
    """Peak live tensor bytes of `steps` full-size training steps, per GPU."""

    peak_bytes: int  # what CUDA's max_memory_allocated should read
    phases: dict[str, int]  # "model" (live after build), "forward"/"backward"/"optimizer" peaks
    state: dict[str, int]  # params / grads / optimizer / buffers bytes after the last step
    params: int
    trainable_params: int
    cuda_context_bytes: int
    allocator_margin_bytes: int
    error_band: tuple[float, float]  # relative (low, high) around peak_bytes
    steps: int
    micro_batches: int  # forward+backward passes per optimizer step
    wall_seconds: float
    fake: bool  # False: the same steps ran on real CPU tensors
    assumptions: list[str] = field(default_factory=list)

    @property
    def device_bytes(self) -> int:
        """What the GPU must hold: peak tensors, allocator margin and CUDA context."""
        return self.peak_bytes + self.allocator_margin_bytes + self.cuda_context_bytes

    @property
    def peak_range(self) -> tuple[int, int]:
        low, high = self.error_band
        return round(self.peak_bytes * (1 + low)), round(self.peak_bytes * (1 + high))


def simulate(
    setup: MemorySetup,
    config: dict,
    *,
    steps: int = 2,
    fake: bool = True,
    foreach: bool = True,
) -> SimulationResult:
    """Run `steps` training steps of `setup` on the model that `config` (a config.json
    dict with `model_type`) describes, and measure the peak of live tensor bytes.

    `fake=False` runs the very same steps on real CPU tensors (to check the simulator on
    small models). `foreach=True` uses the multi-tensor optimizer step, torch's default
    on CUDA (a CPU run defaults to the per-parameter loop, which needs fewer temporaries).
    """
    if is_diffusers_config(config):  # a diffusers UNet / FLUX / SD3: its own builder and batch (needs diffusers)
        return simulate_diffusers(setup, config, steps=steps, fake=fake)
    if steps < 1:
        raise ValueError("steps must be at least 1")
    _refuse_unsupported(setup)
    torch, transformers = _import_torch_stack()
    from cfgfix.memory.live_bytes import LiveBytes, model_state_bytes

    assumptions: list[str] = []
    seq_len = setup.seq_len or _default_seq_len(config, assumptions)
    if setup.num_gpus > 1:
        assumptions.append("data-parallel gradient buckets (DDP) are not simulated")
    micro_batches = max(1, min(setup.gradient_accumulation, 2))
    if setup.gradient_accumulation > 2:
        # gradients live across micro-batches from the second one on; more add nothing
        assumptions.append(f"{setup.gradient_accumulation} accumulation micro-batches simulated as 2")

    started = time.perf_counter()
    with ExitStack() as stack:
        stack.enter_context(_quiet(transformers))
        if fake:
            fake_mode = stack.enter_context(_fake_mode())
            stack.enter_context(_module_moves_under(fake_mode))
            stack.enter_context(_unpacked_batches())
            stack.enter_context(_value_free_inits())
        counter = stack.enter_context(LiveBytes())  # inside the fake mode: it sees ops first
        try:
            model = _build_model(torch, transformers, config, setup, assumptions)
        except SimulationUnsupported:
            raise
        except (ValueError, AssertionError) as err:  # a config transformers rejects
            raise SimulationUnsupported(f"cannot build the model from its config: {err}") from err
        impl = setup.optimizer_impl or ("foreach" if foreach else "for-loop")
        optimizer = _build_optimizer(torch, model, setup.optimizer, impl)
        counter.track_existing(model, optimizer)  # anything built outside the dispatcher
        phases = {"model": counter.current}
        build_peak = counter.peak
        try:
            _run_steps(torch, model, optimizer, counter, phases, setup, seq_len, steps, micro_batches)
        except (RuntimeError, NotImplementedError) as err:
            # fake tensors have no values: an op whose output shape or kernel choice
            # depends on data (MoE routing, some fused kernels' meta checks) cannot run
            where = "on fake tensors" if fake else "on the CPU"
            raise SimulationUnsupported(f"the training step did not run {where}: {err}") from err
        state = model_state_bytes(model, optimizer)  # grads still held: the last zero_grad is pending
        optimizer.zero_grad(set_to_none=True)
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model, optimizer
    wall = time.perf_counter() - started
    peak = max(build_peak, *phases.values())

    return SimulationResult(
        peak_bytes=peak,
        phases=phases,
        state=state,
        params=params,
        trainable_params=trainable,
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        allocator_margin_bytes=round(peak * ALLOCATOR_MARGIN),
        error_band=ERROR_BAND,
        steps=steps,
        micro_batches=micro_batches,
        wall_seconds=wall,
        fake=fake,
        assumptions=assumptions,
    )


def _run_steps(torch, model, optimizer, counter, phases: dict, setup, seq_len: int, steps: int, micro_batches: int):
    """`steps` optimizer steps of `micro_batches` forward+backward passes each; records
    each phase's peak (the highest over all steps) in `phases`."""
    autocast = _autocast(torch, setup.autocast)
    model_type = model.config.model_type
    vocab = 0 if model_type in IMAGE_CLASSIFIERS else _vocab_size(model)
    encoder_decoder = getattr(model.config, "is_encoder_decoder", False)
    target_len = (setup.target_len or seq_len) if encoder_decoder else None
    classify = not encoder_decoder and _head(setup, model_type) == "classification"
    dtype = next(model.parameters()).dtype

    def phase_ends(name: str) -> None:
        phases[name] = max(phases.get(name, 0), counter.peak)
        counter.reset_peak()

    for step in range(steps):
        for _ in range(micro_batches):
            batch = _batch(torch, vocab, setup.micro_batch, seq_len, target_len, model.config, dtype)
            if classify:  # one label per sequence
                batch["labels"] = torch.zeros(setup.micro_batch, dtype=torch.long)
            counter.reset_peak()
            with autocast:
                loss = model(**batch).loss
            phase_ends("forward")
            loss.backward()
            del loss, batch
            phase_ends("backward")
        optimizer.step()
        if step < steps - 1:
            optimizer.zero_grad(set_to_none=True)
        phase_ends("optimizer")


def _refuse_unsupported(setup: MemorySetup) -> None:
    used = [what for name, what in _UNSUPPORTED.items() if getattr(setup, name)]
    named = {"adamw-8bit": "8-bit AdamW (bitsandbytes)", "paged-adamw-8bit": "paged 8-bit AdamW (bitsandbytes)",
             "paged-adamw": "paged AdamW (bitsandbytes)"}
    if setup.optimizer in named:
        used.append(named[setup.optimizer])
    if used:
        raise SimulationUnsupported("the simulator cannot reproduce " + ", ".join(used) + "; use the analytic estimate")


def _import_torch_stack():
    try:
        import torch
        import transformers
    except ImportError as err:
        raise SimulatorUnavailable(
            f"the memory simulator needs torch and transformers ({err.name} is missing): {INSTALL_HINT}"
        ) from err
    return torch, transformers


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    # a constant real tensor made at import time by a library must not stop the run
    return FakeTensorMode(allow_non_fake_inputs=True)


@contextmanager
def _quiet(transformers):
    """The simulated run's deprecation warnings and config notices are not the user's."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    # the fake mode logs a traceback before raising an op's failure; the raise is enough
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        fake_log.setLevel(fake_level)


@contextmanager
def _module_moves_under(fake_mode):
    """Let `Module.to()` work on fake parameters (peft moves its adapters with it).

    `Module._apply` swaps fake parameters with `torch.utils.swap_tensors`, which refuses
    tensors that have weakrefs, and the fake mode's own memo holds one to every tensor
    it made. Dropping a tensor's memo entry just before the swap is harmless: the memo
    only maps real tensors to their fakes, and these tensors were never real.
    """
    import torch.utils

    memo = fake_mode.fake_tensor_converter.tensor_memo
    original = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        for key, value in list(memo.items()):
            if value is t1 or value is t2:
                del memo[key]
        return original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextmanager
def _value_free_inits():
    """Skip the weight initialisers that read values (trunc_normal_ clamps with a data-dependent
    bound: ViT's position embeddings): fake tensors have no values, and the memory is the same."""
    try:
        init = importlib.import_module("transformers.initialization")
    except ImportError:
        init = None
    table = getattr(init, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict) or "trunc_normal_" not in table:
        yield
        return
    original = table["trunc_normal_"]
    table["trunc_normal_"] = lambda tensor, *args, **kwargs: tensor
    try:
        yield
    finally:
        table["trunc_normal_"] = original


@contextmanager
def _unpacked_batches():
    """Answer transformers' "are these packed sequences?" check as real data would.

    Without an attention mask, transformers reads the position ids to detect several
    sequences packed in one row; a fake tensor has no values, so it assumes packing and
    builds an explicit 4-D mask, which also moves SDPA off its causal kernel (+5% on a
    tiny Llama). The simulated batch holds one full sequence per row: not packed.
    """
    try:
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError:
        masking = None
    if masking is None or not hasattr(masking, "find_packed_sequence_indices"):
        yield  # older transformers: no such check
        return
    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def _default_seq_len(config: dict, assumptions: list[str]) -> int:
    default = DEFAULT_SEQ_LEN_BY_TYPE.get(config.get("model_type"), DEFAULT_SEQ_LEN)
    limit = config.get("max_position_embeddings") or config.get("n_positions") or default
    seq_len = min(default, limit)
    assumptions.append(f"sequence length unknown: {seq_len} assumed")
    return seq_len


_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(torch, name: str):
    return getattr(torch, _DTYPES[name])


def _build_model(torch, transformers, config: dict, setup: MemorySetup, assumptions: list[str]):
    values = dict(config)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise SimulationUnsupported("the model config has no model_type: cannot build the model")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "quantization_config"):
        values.pop(key, None)
    hf_config = transformers.AutoConfig.for_model(model_type, **values)
    hf_config.use_cache = False  # a training step keeps no KV cache
    head = _head(setup, model_type)
    if model_type in SPEECH_SEQ2SEQ:
        auto_class = transformers.AutoModelForSpeechSeq2Seq
    elif model_type in DUAL_ENCODERS:
        auto_class = transformers.AutoModel  # CLIPModel / SiglipModel: return_loss gives the contrastive loss
    elif model_type in IMAGE_CLASSIFIERS:
        auto_class = transformers.AutoModelForImageClassification
    elif getattr(hf_config, "is_encoder_decoder", False):
        auto_class = transformers.AutoModelForSeq2SeqLM
    elif head == "masked-lm":
        auto_class = transformers.AutoModelForMaskedLM
    elif head == "classification":
        auto_class = transformers.AutoModelForSequenceClassification
        if getattr(hf_config, "pad_token_id", None) is None:  # decoders pool the last non-pad token
            hf_config.pad_token_id = 0
        # the Trainer's labels are class ids: DeBERTa's problem_type=None path indexes them with
        # nonzero(), whose output shape fake tensors cannot know; the loss is the same
        hf_config.problem_type = "single_label_classification"
    else:
        auto_class = transformers.AutoModelForCausalLM
    dtype = _dtype(torch, setup.weights)
    # transformers 4.56 renamed torch_dtype to dtype (facts.md A2)
    dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    kwargs = {dtype_key: dtype}
    if setup.attention:  # the load's attn_implementation; None: the family's default
        kwargs["attn_implementation"] = {"flash": "sdpa", "sdpa": "sdpa", "eager": "eager"}[setup.attention]
        if setup.attention == "flash":
            assumptions.append("flash attention is not available on the CPU: SDPA simulated (no s^2 tensors either)")
    try:
        model = auto_class.from_config(hf_config, **kwargs)
    except ValueError as err:  # no causal-LM / seq2seq head for this model type
        raise SimulationUnsupported(f"cannot build a language model for {model_type!r}: {err}") from err
    model.train()
    if setup.checkpointing:
        # transformers 5 renamed the method; the old name still works there, with a warning
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup.lora_rank:
        model = _with_lora(model, setup.lora_rank, setup.lora_targets, assumptions)
    return model


def _head(setup: MemorySetup, model_type: str) -> str:
    """The head to build: the setup's, else the family's default (BERT: classification)."""
    return setup.head or ("classification" if model_type in CLASSIFIERS else "causal-lm")


def _with_lora(model, rank: int, targets: tuple[str, ...] | None, assumptions: list[str]):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise SimulatorUnavailable(f"simulating LoRA needs peft: {INSTALL_HINT}") from err
    if targets is None:
        # what MemorySetup's None means (and the estimator assumes): every Linear in the
        # blocks; peft's "all-linear" leaves the output head out too
        assumptions.append("LoRA target modules unknown: every Linear in the blocks assumed")
        target_modules = "all-linear"
    else:
        target_modules = list(targets)
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=target_modules))


def _build_optimizer(torch, model, name: str, impl: str):
    """`impl`: torch's implementation, "foreach", "fused" (AdamW) or "for-loop"."""
    params = [p for p in model.parameters() if p.requires_grad]
    foreach = impl == "foreach"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if impl == "fused" else {"foreach": foreach}))
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=foreach)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        # HF Trainer's `optim="adafactor"` is transformers' implementation
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    raise SimulationUnsupported(f"optimizer {name!r} is not simulated")


def _autocast(torch, dtype_name: str | None):
    if dtype_name is None or dtype_name == "fp32":
        return nullcontext()
    # CPU autocast stands in for CUDA's; their op lists differ slightly (ERROR_BAND)
    return torch.autocast("cpu", dtype=_dtype(torch, dtype_name))


def _vocab_size(model) -> int:
    config = model.config
    return getattr(config, "vocab_size", None) or config.get_text_config().vocab_size


def _batch(torch, vocab: int, batch: int, seq_len: int, target_len: int | None, config=None, dtype=None) -> dict:
    """Token ids as a data collator gives them, every row a full sequence (no padding).
    `target_len`: the decoder's length for an encoder-decoder model, None otherwise. Images
    and audio as their processors give them: pixel_values at the config's image size, Whisper's
    log-mel features for 30 s (2 x max_source_positions frames), in the weights' dtype."""
    model_type = getattr(config, "model_type", None)
    if model_type in IMAGE_CLASSIFIERS or model_type in DUAL_ENCODERS:
        vision = config.vision_config if model_type in DUAL_ENCODERS else config
        pixels = torch.zeros(batch, getattr(vision, "num_channels", 3), vision.image_size, vision.image_size, dtype=dtype)
        if model_type in IMAGE_CLASSIFIERS:
            return {"pixel_values": pixels}
        return {"input_ids": torch.randint(0, vocab, (batch, seq_len)), "pixel_values": pixels, "return_loss": True}
    if model_type in SPEECH_SEQ2SEQ:
        features = torch.zeros(batch, config.num_mel_bins, 2 * config.max_source_positions, dtype=dtype)
        targets = torch.randint(0, vocab, (batch, target_len or seq_len))
        return {"input_features": features, "labels": targets, "decoder_input_ids": targets}
    ids = torch.randint(0, vocab, (batch, seq_len))
    if target_len is None:
        return {"input_ids": ids, "labels": ids}
    targets = torch.randint(0, vocab, (batch, target_len))
    # decoder ids given explicitly: a config may lack the decoder_start_token_id that
    # shifting the labels needs
    return {"input_ids": ids, "labels": targets, "decoder_input_ids": targets}


# -- diffusers models ---------------------------------------------------------------------------------

DIFFUSERS_HINT = "pip install diffusers"
UNET_TEXT_TOKENS = 77  # CLIP's max_position_embeddings: the encoder_hidden_states' length
# diffusers models the simulator builds, by the config's `_class_name`
DIFFUSERS_CLASSES = ("UNet2DConditionModel", "FluxTransformer2DModel", "SD3Transformer2DModel")
# text tokens of the diffusion transformers' prompts (FLUX: T5 at 512; SD3: 77 CLIP + 256 T5)
DIT_TEXT_TOKENS = {"FluxTransformer2DModel": 512, "SD3Transformer2DModel": 333}


def is_diffusers_config(config: dict) -> bool:
    return config.get("_class_name") in DIFFUSERS_CLASSES or "down_block_types" in config


def simulate_diffusers(setup: MemorySetup, config: dict, *, steps: int = 2, fake: bool = True):
    """Run `steps` training steps of the diffusers model `config` describes (a UNet, FLUX or SD3
    transformer: `DIFFUSERS_CLASSES`) and measure the peak of live tensor bytes. The training scripts'
    shape (`examples/text_to_image/train_text_to_image*.py`, `examples/dreambooth/
    train_dreambooth_flux.py`): the model predicts the noise of latents at resolution / 8 given
    the timestep and the text encoders' outputs, and the loss is
    `F.mse_loss(model_pred.float(), target.float())`; the text encoders and the VAE are not part
    of the step (their outputs are inputs here). diffusers is imported here, never at import."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    _refuse_unsupported(setup)
    torch, _ = _import_torch_stack()
    try:
        import diffusers
    except ImportError as err:
        raise SimulatorUnavailable(f"simulating a UNet needs diffusers: {DIFFUSERS_HINT}") from err
    from cfgfix.memory.live_bytes import LiveBytes, model_state_bytes

    assumptions: list[str] = []
    resolution = setup.resolution or 1024
    if setup.resolution is None:
        assumptions.append("image resolution unknown: 1024 px assumed")
    micro_batches = max(1, min(setup.gradient_accumulation, 2))
    started = time.perf_counter()
    with ExitStack() as stack:
        if fake:
            fake_mode = stack.enter_context(_fake_mode())
            stack.enter_context(_module_moves_under(fake_mode))
        counter = stack.enter_context(LiveBytes())
        values = {k: v for k, v in config.items() if not k.startswith("_")}
        kind = config.get("_class_name") or "UNet2DConditionModel"
        model = getattr(diffusers, kind).from_config(values).to(_dtype(torch, setup.weights))
        model.train()
        if setup.checkpointing:
            model.enable_gradient_checkpointing()
        optimizer = _build_optimizer(torch, model, setup.optimizer, setup.optimizer_impl or "foreach")
        counter.track_existing(model, optimizer)
        phases = {"model": counter.current}
        build_peak = counter.peak
        dtype = next(model.parameters()).dtype
        autocast = _autocast(torch, setup.autocast)
        for step in range(steps):
            for _ in range(micro_batches):
                batch = _diffusers_batch(torch, model.config, setup.micro_batch, resolution, dtype, kind)
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
    return SimulationResult(
        peak_bytes=peak, phases=phases, state=state, params=params, trainable_params=trainable,
        cuda_context_bytes=CUDA_CONTEXT_BYTES, allocator_margin_bytes=round(peak * ALLOCATOR_MARGIN),
        error_band=ERROR_BAND, steps=steps, micro_batches=micro_batches, wall_seconds=time.perf_counter() - started,
        fake=fake, assumptions=assumptions,
    )


def _diffusers_batch(torch, config, batch: int, resolution: int, dtype, kind: str = "UNet2DConditionModel") -> dict:
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
        "encoder_hidden_states": torch.zeros(batch, UNET_TEXT_TOKENS, cross, dtype=dtype),
    }
    if config.addition_embed_type == "text_time":
        time_ids = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        out["added_cond_kwargs"] = {"text_embeds": torch.zeros(batch, time_ids, dtype=dtype),
                                    "time_ids": torch.zeros(batch, 6, dtype=dtype)}
    return out
