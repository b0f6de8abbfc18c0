"""Estimate vs measured memory on the CPU for a grid of tiny models, and the user stories.

    .venv/bin/python bench/memory_accuracy.py [--json out.json]

Measured: a second training step under cfgfix.memory.live_bytes.LiveBytes (activations = live
bytes after forward minus model states; peak = the step's peak). Estimated: cfgfix.memory.
estimator.estimate without the CUDA-context constant (no GPU here). Needs torch + transformers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cfgfix.memory.estimator import GIB, estimate  # noqa: E402
from cfgfix.memory.shapes import shape_from_config  # noqa: E402


def grid() -> list[dict]:
    import test_memory_accuracy as t  # the tests' step runner

    rows = []
    for family, config_fn, kw in t.CASES + [("llama", t._llama, dict(b=8, s=256)), ("llama", t._llama, dict(autocast=True, checkpointing=True, b=8, s=256))]:
        config = config_fn()
        measured = t._measure(config, **kw)
        result = estimate(t._setup(**kw), shape_from_config(config.to_dict()))
        ctx = result.component("cuda_context").size
        rows.append({"model": family, "setup": kw or {"weights": "fp32"}, "measured_activations": measured["activations"],
                     "estimated_activations": result.component("activations").size, "measured_peak": measured["peak"],
                     "estimated_peak": result.peak - ctx, "band": [result.low - ctx, result.high - ctx]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = grid()
    print("| model | setup | activations measured / estimated (MiB) | peak measured / estimated (MiB) | peak error |")
    print("|---|---|---|---|---|")
    for r in rows:
        err = r["estimated_peak"] / r["measured_peak"] - 1
        print(f"| {r['model']} | {', '.join(f'{k}={v}' for k, v in r['setup'].items())} | "
              f"{r['measured_activations'] / 2**20:.2f} / {r['estimated_activations'] / 2**20:.2f} | "
              f"{r['measured_peak'] / 2**20:.2f} / {r['estimated_peak'] / 2**20:.2f} | {err:+.1%} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
