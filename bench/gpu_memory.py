"""Measure the peak memory of real training steps, next to cfgfix's analytic estimate.

    python bench/gpu_memory.py --device cuda --out DIR          # on a GPU machine
    python bench/gpu_memory.py --device cpu --tiny --out DIR    # the same code path on the CPU

Each setup builds a model from a config (no download), runs `steps` optimizer steps of
random token batches and records the peak: `torch.cuda.max_memory_allocated()` on CUDA,
live tensor bytes (`cfgfix.memory.live_bytes.LiveBytes`, real tensors) on the CPU. The
setups are described as data (config, head, MemorySetup fields, attention kernel, optimizer
implementation) and written to the JSON next to the measurement, so that
`bench/memory_table.py` can re-estimate them with the current model without a GPU.

torch, transformers and peft are needed; cfgfix only for the estimate column.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import sys
import time
from pathlib import Path

LLAMA = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
         "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
         "tie_word_embeddings": False}
QWEN2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 8,
         "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
         "tie_word_embeddings": True}
MISTRAL = {"model_type": "mistral", "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 6,
           "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
           "sliding_window": None, "tie_word_embeddings": False}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 6,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32000,
          "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
          "query_pre_attn_scalar": 128, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh"}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 6, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
NEOX = {"model_type": "gpt_neox", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 6,
        "num_attention_heads": 16, "vocab_size": 50304, "max_position_embeddings": 2048, "rotary_pct": 0.25,
        "tie_word_embeddings": False}
PHI3 = {"model_type": "phi3", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 6,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32064, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "pad_token_id": 0}
T5 = {"model_type": "t5", "d_model": 512, "d_ff": 1024, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
      "d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
      "dropout_rate": 0.1, "decoder_start_token_id": 0, "pad_token_id": 0}
BERT = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "num_labels": 2}


def _s(name, config, setup, head="causal", attn=None, optim_impl="foreach", extra=None):
    """One setup: `setup` holds MemorySetup fields; `attn` the attn_implementation passed to
    from_config (None: transformers' default for the family); `optim_impl` torch AdamW's
    implementation (foreach, fused, forloop); `extra` a frozen model moved to the device."""
    return {"name": name, "config": config, "head": head, "setup": setup, "attn": attn,
            "optim_impl": optim_impl, "extra": extra}


B4S1K = {"micro_batch": 4, "seq_len": 1024}
SETUPS = [
    _s("llama fp32 adamw-foreach", LLAMA, {"weights": "fp32", **B4S1K}),
    _s("llama fp32 adamw-fused", LLAMA, {"weights": "fp32", **B4S1K}, optim_impl="fused"),
    _s("llama fp32 adamw-forloop", LLAMA, {"weights": "fp32", **B4S1K}, optim_impl="forloop"),
    _s("llama amp-bf16", LLAMA, {"weights": "fp32", "autocast": "bf16", **B4S1K}),
    _s("llama bf16", LLAMA, {"weights": "bf16", **B4S1K}),
    _s("llama bf16 lora-r16", LLAMA, {"weights": "bf16", "lora_rank": 16, **B4S1K}),
    _s("llama fp32 checkpointing", LLAMA, {"weights": "fp32", "checkpointing": True, **B4S1K}),
    _s("llama amp-bf16 checkpointing", LLAMA, {"weights": "fp32", "autocast": "bf16", "checkpointing": True, **B4S1K}),
    _s("llama bf16 eager", LLAMA, {"weights": "bf16", **B4S1K}, attn="eager"),
    _s("qwen2 bf16 sdpa", QWEN2, {"weights": "bf16", **B4S1K}, attn="sdpa"),
    _s("qwen2 bf16 eager", QWEN2, {"weights": "bf16", **B4S1K}, attn="eager"),
    _s("mistral amp-bf16 checkpointing", MISTRAL, {"weights": "fp32", "autocast": "bf16", "checkpointing": True, **B4S1K}),
    _s("gemma2 bf16 default-attn", GEMMA2, {"weights": "bf16", **B4S1K}),
    _s("gemma2 bf16 eager", GEMMA2, {"weights": "bf16", **B4S1K}, attn="eager"),
    _s("gemma2 bf16 sdpa", GEMMA2, {"weights": "bf16", **B4S1K}, attn="sdpa"),
    _s("gemma2 bf16 lora-r16 default-attn", GEMMA2, {"weights": "bf16", "lora_rank": 16, **B4S1K}),
    _s("gpt2 fp32", GPT2, {"weights": "fp32", **B4S1K}),
    _s("gpt2 amp-bf16", GPT2, {"weights": "fp32", "autocast": "bf16", **B4S1K}),
    _s("gpt_neox bf16", NEOX, {"weights": "bf16", **B4S1K}),
    _s("phi3 fp32", PHI3, {"weights": "fp32", "micro_batch": 2, "seq_len": 1024}),
    _s("t5 fp32", T5, {"weights": "fp32", "micro_batch": 4, "seq_len": 512, "target_len": 128}, head="seq2seq"),
    _s("t5 amp-bf16", T5, {"weights": "fp32", "autocast": "bf16", "micro_batch": 4, "seq_len": 512, "target_len": 128},
       head="seq2seq"),
    _s("t5 bf16 lora-r16", T5, {"weights": "bf16", "lora_rank": 16, "lora_targets": ["q", "v"], "micro_batch": 4,
                                "seq_len": 512, "target_len": 128}, head="seq2seq"),
    _s("bert-cls fp32", BERT, {"weights": "fp32", "micro_batch": 16, "seq_len": 512}, head="seqcls"),
    _s("bert-cls amp-bf16", BERT, {"weights": "fp32", "autocast": "bf16", "micro_batch": 16, "seq_len": 512},
       head="seqcls"),
    _s("bert-mlm fp32", BERT, {"weights": "fp32", "micro_batch": 16, "seq_len": 512}, head="mlm"),
    _s("llama bf16 lora-r16 + frozen gpt2 teacher on device", LLAMA,
       {"weights": "bf16", "lora_rank": 16, **B4S1K}, extra={"config": GPT2, "dtype": "bf16"}),
    _s("composite: 2 bert towers + fusion", BERT, {"weights": "fp32", "micro_batch": 8, "seq_len": 256},
       head="composite"),
]

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "n_embd": 64, "n_layer": 2, "n_head": 4,
        "d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 16,
        "query_pre_attn_scalar": 16}


def tiny(spec: dict) -> dict:
    """The same setup, shrunk so that a CPU runs it in a second (the CPU path's test)."""
    config = {k: (TINY[k] if k in TINY else v) for k, v in spec["config"].items()}
    if config["model_type"] in ("llama", "qwen2", "mistral", "phi3", "gpt_neox", "bert") and "head_dim" not in spec["config"]:
        config.pop("head_dim", None)
    if config["model_type"] in ("phi3", "gpt_neox", "bert"):
        config.pop("num_key_value_heads", None)
    setup = dict(spec["setup"], micro_batch=1, seq_len=32)
    if "target_len" in setup:
        setup["target_len"] = 16
    extra = spec["extra"] and dict(spec["extra"], config={k: (TINY[k] if k in TINY else v)
                                                          for k, v in spec["extra"]["config"].items()})
    return dict(spec, config=config, setup=setup, extra=extra)


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def hf_config(transformers, config: dict, attn: str | None):
    values = dict(config)
    model_type = values.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **values)
    cfg.use_cache = False
    if attn:
        cfg._attn_implementation = attn
    return cfg


def build(torch, transformers, spec: dict, device: str):
    dtype = getattr(torch, DTYPES[spec["setup"]["weights"]])
    head = spec["head"]
    if head == "composite":
        return build_composite(torch, transformers, spec, device, dtype)
    cfg = hf_config(transformers, spec["config"], spec["attn"])
    auto = {"causal": transformers.AutoModelForCausalLM, "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "seqcls": transformers.AutoModelForSequenceClassification, "mlm": transformers.AutoModelForMaskedLM}[head]
    kwargs = {"dtype": dtype}
    if spec["attn"]:
        kwargs["attn_implementation"] = spec["attn"]
    with torch.device(device):
        model = auto.from_config(cfg, **kwargs)
    return model


def build_composite(torch, transformers, spec, device, dtype):
    """A user model made of parts: two BERT towers (text, "other"), a Linear fusion, one
    nn.TransformerEncoderLayer and a classification head (issue 13, item 1's pattern)."""
    nn = torch.nn
    cfg = hf_config(transformers, spec["config"], spec["attn"])

    class Composite(nn.Module):
        def __init__(self):
            super().__init__()
            self.text = transformers.AutoModel.from_config(cfg)
            self.other = transformers.AutoModel.from_config(cfg)
            h = cfg.hidden_size
            self.fuse = nn.Linear(2 * h, h)
            self.mixer = nn.TransformerEncoderLayer(d_model=h, nhead=8, dim_feedforward=4 * h, batch_first=True)
            self.head = nn.Linear(h, 3)

        def forward(self, input_ids, labels):
            a = self.text(input_ids=input_ids).last_hidden_state
            b = self.other(input_ids=input_ids).last_hidden_state
            x = self.mixer(self.fuse(torch.cat([a, b], dim=-1)))
            logits = self.head(x[:, 0])
            loss = nn.functional.cross_entropy(logits.float(), labels)

            class Out:  # the `.loss` the step reads
                pass

            out = Out()
            out.loss = loss
            return out

    with torch.device(device):
        model = Composite().to(dtype)
    return model


def batch(torch, spec: dict, model, device: str) -> dict:
    s = spec["setup"]
    b, n = s["micro_batch"], s["seq_len"]
    vocab = spec["config"].get("vocab_size", 512)
    ids = torch.randint(0, vocab, (b, n), device=device)
    head = spec["head"]
    if head == "seq2seq":
        t = s.get("target_len") or n
        targets = torch.randint(0, vocab, (b, t), device=device)
        return {"input_ids": ids, "labels": targets, "decoder_input_ids": targets}
    if head == "seqcls":
        return {"input_ids": ids, "labels": torch.randint(0, 2, (b,), device=device)}
    if head == "composite":
        return {"input_ids": ids, "labels": torch.randint(0, 3, (b,), device=device)}
    return {"input_ids": ids, "labels": ids}


def optimizer(torch, model, impl: str):
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}[impl]
    return torch.optim.AdamW(params, lr=1e-4, **kwargs)


class Meter:
    """Peak bytes since the last reset: the CUDA allocator's counter, or live CPU tensors."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device
        self.counter = None
        if device == "cpu":
            from cfgfix.memory.live_bytes import LiveBytes

            self.counter = LiveBytes()

    def __enter__(self):
        if self.counter is not None:
            self.counter.__enter__()
        return self

    def __exit__(self, *exc):
        if self.counter is not None:
            self.counter.__exit__(*exc)

    def track(self, *modules_and_optimizers):
        if self.counter is not None:
            mods = [m for m in modules_and_optimizers if isinstance(m, self.torch.nn.Module)]
            opts = [o for o in modules_and_optimizers if not isinstance(o, self.torch.nn.Module)]
            self.counter.track_existing(mods, opts)

    def current(self) -> int:
        return self.torch.cuda.memory_allocated() if self.counter is None else self.counter.current

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated() if self.counter is None else self.counter.peak

    def reset(self) -> None:
        if self.counter is None:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            self.counter.reset_peak()


def measure(torch, transformers, spec: dict, device: str, steps: int) -> dict:
    s = spec["setup"]
    autocast_dtype = s.get("autocast")
    result: dict = {}
    started = time.perf_counter()
    with Meter(torch, device) as meter:
        meter.reset()
        model = build(torch, transformers, spec, device)
        model.train()
        result["attn_implementation"] = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if s.get("checkpointing"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if s.get("lora_rank"):
            from peft import LoraConfig, get_peft_model

            targets = s.get("lora_targets") or "all-linear"
            model = get_peft_model(model, LoraConfig(r=s["lora_rank"], lora_alpha=2 * s["lora_rank"],
                                                     target_modules=targets))
        teacher = None
        if spec.get("extra"):
            extra = spec["extra"]
            tdtype = getattr(torch, DTYPES[extra["dtype"]])
            with torch.device(device):
                teacher = transformers.AutoModelForCausalLM.from_config(hf_config(transformers, extra["config"], None),
                                                                        dtype=tdtype)
            teacher.eval().requires_grad_(False)
        opt = optimizer(torch, model, spec["optim_impl"])
        meter.track(model, opt, *([teacher] if teacher is not None else []))
        result["params"] = sum(p.numel() for p in model.parameters())
        result["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        result["after_build_bytes"] = meter.current()
        phases: dict[str, int] = {"build": meter.peak()}
        ctx = torch.autocast(device, dtype=getattr(torch, DTYPES[autocast_dtype])) if autocast_dtype else _null()
        for step in range(steps):
            data = batch(torch, spec, model, device)
            meter.reset()
            if teacher is not None:
                with torch.no_grad():  # a frozen model's forward (distillation teacher, text encoder)
                    teacher(input_ids=data["input_ids"] % extra["config"]["vocab_size"])
            with ctx:
                loss = model(**data).loss
            phases["forward"] = max(phases.get("forward", 0), meter.peak())
            meter.reset()
            loss.backward()
            del loss, data
            phases["backward"] = max(phases.get("backward", 0), meter.peak())
            meter.reset()
            opt.step()
            phases["optimizer"] = max(phases.get("optimizer", 0), meter.peak())
            if step < steps - 1:
                opt.zero_grad(set_to_none=True)
        result["after_step_bytes"] = meter.current()
        if device == "cuda":
            torch.cuda.synchronize()
            result["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        del model, opt, teacher
    result["phases"] = phases
    result["peak_bytes"] = max(phases.values())
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def analytic(spec: dict, device: str) -> dict | None:
    """cfgfix's analytic estimate of the same setup (the version found on sys.path)."""
    try:
        from cfgfix.memory.estimator import estimate
        from cfgfix.memory.setup import MemorySetup
        from cfgfix.memory.shapes import shape_from_config
    except ImportError as err:
        return {"error": f"cfgfix not importable: {err}"}
    fields = dict(spec["setup"])
    if fields.get("lora_targets"):
        fields["lora_targets"] = tuple(fields["lora_targets"])
    impl = {"forloop": "for-loop"}.get(spec["optim_impl"], spec["optim_impl"])
    try:
        setup = MemorySetup(**fields, device=device, attention=spec["attn"], optimizer_impl=impl)
        result = estimate(setup, shape_from_config(spec["config"]))
    except Exception as err:  # noqa: BLE001 - a setup the estimator refuses is a result too
        return {"error": f"{type(err).__name__}: {err}"}
    context = result.component("cuda_context").size  # max_memory_allocated never shows it
    return {"peak_bytes": result.peak - context, "low": result.low - context, "high": result.high - context,
            "phase": result.peak_phase, "params": result.shape.params, "trainable_params": result.trainable_params}


def simulated(spec: dict) -> dict | None:
    """cfgfix's FakeTensor simulator (CPU kernels, foreach AdamW, the family's default
    attention) on the same setup; None where it cannot build this setup."""
    if spec["head"] not in ("causal", "seq2seq") or spec["extra"]:
        return None
    from cfgfix.memory.setup import MemorySetup
    from cfgfix.memory.simulate import simulate

    fields = dict(spec["setup"])
    if fields.get("lora_targets"):
        fields["lora_targets"] = tuple(fields["lora_targets"])
    started = time.perf_counter()
    try:
        result = simulate(MemorySetup(**fields, device="cpu"), spec["config"], steps=2)
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    return {"peak_bytes": result.peak_bytes, "phases": result.phases, "wall_s": round(time.perf_counter() - started, 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="shrink every model (a CPU test of this script)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated substrings of setup names")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulate", action="store_true",
                        help="also run cfgfix's FakeTensor simulator (CPU) on the setups it supports")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting new setups after this many seconds")
    args = parser.parse_args(argv)
    began = time.perf_counter()

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    specs = [tiny(s) if args.tiny else s for s in SETUPS]
    if args.only:
        specs = [s for s in specs if any(w in s["name"] for w in args.only.split(","))]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
        "measure": "torch.cuda.max_memory_allocated" if args.device == "cuda" else "LiveBytes (live CPU tensor bytes)",
        "steps": args.steps, "tiny": args.tiny,
    }
    try:
        import peft

        meta["peft"] = peft.__version__
    except ImportError:
        pass
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / f"memory_{args.device}.json"

    def save() -> None:  # after every setup: a run stopped at its time limit keeps what it measured
        out_file.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")

    for spec in specs:
        if time.perf_counter() - began > args.budget_s:
            print(f"budget spent: {spec['name']} not run", flush=True)
            continue
        row = {"spec": spec}
        try:
            row["measured"] = measure(torch, transformers, spec, args.device, args.steps)
        except Exception as err:  # noqa: BLE001 - record and go on to the next setup
            row["measured"] = {"error": f"{type(err).__name__}: {err}"[:500]}
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        row["analytic"] = analytic(spec, args.device)
        m, a = row["measured"].get("peak_bytes"), (row["analytic"] or {}).get("peak_bytes")
        row["error"] = round((a - m) / m, 4) if m and a else None
        rows.append(row)
        print(f"{spec['name']:<55} measured {m / 2**20 if m else float('nan'):9.1f} MiB  "
              f"analytic {a / 2**20 if a else float('nan'):9.1f} MiB  err {row['error']}  "
              f"{row['measured'].get('attn_implementation', '')} {row['measured'].get('error', '')}", flush=True)
        save()
    if args.device == "cuda":
        # what the card holds outside torch's allocator (CUDA context, loaded kernels, cuBLAS
        # handles) after all the setups above ran in this process
        free, total = torch.cuda.mem_get_info()
        meta["outside_allocator_bytes"] = total - free - torch.cuda.memory_reserved()
        meta["card_total_bytes"] = total
        save()
    if args.simulate:
        for row in rows:
            if time.perf_counter() - began > args.budget_s:
                break
            row["simulated"] = simulated(row["spec"])
            print(f"simulated {row['spec']['name']:<45} {row['simulated']}", flush=True)
            save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
