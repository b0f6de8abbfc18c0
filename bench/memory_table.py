"""The memory model against measurements: the table issue 13 asks for.

    .venv/bin/python bench/memory_table.py [--cpu]

prints the tables that bench/memory_table.md holds (with a summary written from them).

Part 1, every setup of bench/gpu_results.json (measured on an H200 by bench/gpu_memory.py):
the analytic peak on CUDA kernels against `torch.cuda.max_memory_allocated()`, and the
analytic peak on CPU kernels against cfgfix's FakeTensor simulator run on the same machine's
CPU (transformers 5.17 there). The estimates are recomputed with this checkout's model; the
measurements are the stored ones.

Part 2 (`--cpu`): a few of the same models at micro batch 1 x 256 tokens, run for real on
this machine's CPU (live tensor bytes, `LiveBytes`), next to the analytic CPU estimate and the
simulator run here. Needs torch, transformers and peft.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from cfgfix.memory.estimator import estimate  # noqa: E402
from cfgfix.memory.setup import MemorySetup  # noqa: E402
from cfgfix.memory.shapes import shape_from_config  # noqa: E402

MIB = 2**20
FAMILY = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma2": "Gemma-2", "gpt2": "GPT-2",
          "gpt_neox": "GPT-NeoX", "phi3": "Phi-3", "t5": "T5", "bert": "BERT"}


def setup_of(spec: dict, device: str, version: str | None = None, **changes) -> MemorySetup:
    """`version`: the transformers release the measurement ran (its default attention, T5's
    tied head): the GPU machine's for part 1, this machine's for part 2."""
    fields = dict(spec["setup"], **changes)
    if fields.get("lora_targets"):
        fields["lora_targets"] = tuple(fields["lora_targets"])
    impl = {"forloop": "for-loop"}.get(spec["optim_impl"], spec["optim_impl"])
    if device == "cpu":
        impl = "foreach"  # the simulator's step
    head = {"causal": "causal-lm", "mlm": "masked-lm", "seqcls": "classification", "composite": "classification"}.get(spec["head"])
    frozen = ()
    if spec.get("extra"):  # a frozen model moved to the device (issue 13, item 5)
        extra = spec["extra"]
        frozen = (("frozen " + extra["config"]["model_type"], shape_from_config(extra["config"]).params,
                   4 if extra["dtype"] == "fp32" else 2),)
    return MemorySetup(**fields, device=device, attention=spec["attn"], optimizer_impl=impl, head=head, frozen=frozen,
                       transformers_version=version)


def composite_of(spec: dict):
    """The bench's composite (bench/gpu_memory.py `build_composite`): two BERT towers built with
    AutoModel, nn.Linear(2h, h) fusion, one nn.TransformerEncoderLayer(h, 8, 4h), nn.Linear(h, 3),
    sized as the sum of its parts (memory/parts.py), as cfgfix sizes such a class in a project."""
    from cfgfix.memory.parts import Part, composite_shape, torch_layer_params

    tower = shape_from_config(spec["config"])
    h = tower.hidden
    parts = [Part("text", "bert", tower.params, tower), Part("other", "bert", tower.params, tower),
             Part("fuse", "nn.Linear", torch_layer_params("Linear", [2 * h, h], {})),
             Part("mixer", "nn.TransformerEncoderLayer",
                  torch_layer_params("TransformerEncoderLayer", [h, 8], {"dim_feedforward": 4 * h})),
             Part("head", "nn.Linear", torch_layer_params("Linear", [h, 3], {}))]
    return composite_shape(parts, "bench composite")


def analytic(spec: dict, device: str, version: str | None = None, **changes):
    """(allocated bytes, band low, band high, phase) or None where the estimator has no model."""
    try:
        shape = composite_of(spec) if spec["head"] == "composite" else shape_from_config(spec["config"])
        result = estimate(setup_of(spec, device, version, **changes), shape)
    except (ValueError, TypeError) as err:
        return None, str(err)
    context = result.component("cuda_context").size
    return (result.peak - context, result.low - context, result.high - context, result.peak_phase), ""


def pct(a, b) -> str:
    return f"{(a - b) / b:+.1%}" if a is not None and b else "-"


def mib(x) -> str:
    return f"{x / MIB:,.0f}" if x else "-"


def gpu_table(results: dict) -> list[str]:
    lines = ["| # | family | setup | GPU measured | analytic (CUDA) | error | in band | simulated (CPU) | analytic (CPU) | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n, row in enumerate(results["rows"], 1):
        spec = row["spec"]
        family = "composite" if spec["head"] == "composite" else FAMILY.get(spec["config"]["model_type"], "?")
        measured = row["measured"].get("peak_bytes")
        version = results["meta"]["transformers"]
        cuda, _ = analytic(spec, "cuda", version)
        cpu, _ = analytic(spec, "cpu", version)
        sim = (row.get("simulated") or {}).get("peak_bytes")
        if spec["attn"]:  # the stored simulation built the family's default attention: not like with like
            sim = None
        band = "yes" if cuda and cuda[1] <= measured <= cuda[2] else "no"
        lines.append(f"| {n} | {family} | {spec['name']} | {mib(measured)} | {mib(cuda and cuda[0])} | "
                     f"{pct(cuda and cuda[0], measured)} | {band} | {mib(sim)} | {mib(cpu and cpu[0]) if sim else '-'} | "
                     f"{pct(cpu and cpu[0], sim) if sim else '-'} |")
    return lines


CPU_ROWS = ("llama fp32 adamw-foreach", "llama amp-bf16", "llama bf16 lora-r16", "llama fp32 checkpointing",
            "qwen2 bf16 sdpa", "gemma2 bf16 eager", "gpt2 fp32", "gpt_neox bf16", "phi3 fp32", "t5 fp32",
            "bert-cls fp32", "bert-mlm fp32")


def cpu_table(results: dict, only=None) -> list[str]:
    import gpu_memory
    import torch
    import transformers

    from cfgfix.memory.simulate import SimulationUnsupported, simulate

    transformers.logging.set_verbosity_error()
    lines = [f"CPU: torch {torch.__version__}, transformers {transformers.__version__}; micro batch 1 x 256 tokens "
             "(T5: 256 / 64), one optimizer step (foreach AdamW), live tensor bytes.", "",
             "| setup (1 x 256) | CPU measured | analytic (CPU) | error | simulated here | error | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = {r["spec"]["name"]: r for r in results["rows"]}
    for name in CPU_ROWS:
        if only and name not in only:
            continue
        spec = dict(rows[name]["spec"])
        spec["setup"] = dict(spec["setup"], micro_batch=1, seq_len=256)
        if "target_len" in spec["setup"]:
            spec["setup"]["target_len"] = 64
        spec["optim_impl"] = "foreach"
        started = time.perf_counter()
        measured = gpu_memory.measure(torch, transformers, spec, "cpu", steps=1)["peak_bytes"]
        seconds = time.perf_counter() - started
        est, _ = analytic(spec, "cpu", transformers.__version__)
        sim = None
        if spec["head"] != "composite" and not spec["extra"]:
            try:
                sim = simulate(setup_of(spec, "cpu", transformers.__version__), spec["config"], steps=1).peak_bytes
            except SimulationUnsupported:
                sim = None
        lines.append(f"| {name} | {mib(measured)} | {mib(est and est[0])} | {pct(est and est[0], measured)} | "
                     f"{mib(sim)} | {pct(sim, measured) if sim else '-'} | {seconds:.0f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="also run real CPU steps (part 2)")
    parser.add_argument("--rows", nargs="*", help="part 2: only these setups (about a minute each)")
    args = parser.parse_args()
    results = json.loads((ROOT / "bench" / "gpu_results.json").read_text("utf-8"))
    meta = results["meta"]
    out = [f"GPU: {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, "
           f"measured {meta['date']} (rows 29-42: {meta.get('second_run', {}).get('date', '-')}); "
           "MiB = 2^20 B; error = (estimate - measured) / measured.", ""]
    out += gpu_table(results)
    if args.cpu:
        out += [""] + cpu_table(results, args.rows)
    print("\n".join(out))


if __name__ == "__main__":
    main()
