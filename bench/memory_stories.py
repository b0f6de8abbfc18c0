"""The five user stories: cfgfix's memory estimate of each launch (project mode, from the
files as they are and from the fixed twin) next to the figures the story's authors wrote in
their README, and the GPU's usable memory. Run: `.venv/bin/python bench/memory_stories.py`.

The authors' figures are quoted from fixtures/*/project/README.md (what they believed);
cfgfix's figures are computed here, by the real `cfgfix estimate --output-format json`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3
CLAIMS = {
    "sdxl-zero2-offload": "'about 32-34 GB in total in fp16, so with gradient checkpointing it fits in 24 GB'; "
                          "ZeRO-2 offload 'leaving ~12-14 GB for 2.6B parameters'",
    "flan-t5-xl-trainer": "'2.85B x 2 bytes is under 6 GB' (the model, so the 32 GB card has room)",
    "mm-8b-47gb": "'weights 17 GB, gradients 17 GB, Adam's two states 31.66 GB' (~66 GB / 8 GPUs with ZeRO-3)",
    "mm-encoder-8b": "'8.5B x 2 bytes = 17 GB of weights', 'with 8 GPUs the data parallelism spreads the rest'",
    "qwen7b-lora": "no figure (memory 'creeps up during an epoch')",
}


def estimate(folder: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "cfgfix", "estimate", "--output-format", "json", "."],
                         cwd=folder, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    print("| story | launch | authors' figure | cfgfix: as written | cfgfix: fixed twin | GPU usable |")
    print("|---|---|---|---|---|---|")
    for story in sorted(CLAIMS):
        project, fixed = (estimate(REPO / "fixtures" / story / v) for v in ("project", "fixed"))
        fixed_by_launch = {(e["launch"]["path"], e["launch"]["script"]): e for e in fixed}
        for entry in project:
            if entry["estimate"] is None or entry["launch"]["script"] in ("smoke_test.py",):
                continue
            est = entry["estimate"]
            twin = fixed_by_launch.get((entry["launch"]["path"], entry["launch"]["script"]))
            gpu = est.get("gpu") or {}
            def cell(e):
                if e is None or e["estimate"] is None:
                    return "-"
                d = e["estimate"]
                host = f", host {d['cpu_bytes'] / GIB:.1f} GiB" if d.get("cpu_bytes") else ""
                return f"{d['peak_bytes'] / GIB:.1f} GiB ({d['verdict']['text'].split(':')[0]}){host}" if d.get("verdict") else f"{d['peak_bytes'] / GIB:.1f} GiB"
            usable = f"{gpu['usable_bytes'] / GIB:.2f} GiB ({gpu['name']})" if gpu else "-"
            print(f"| {story} | {entry['launch']['path']}:{entry['launch']['line']} | {CLAIMS[story]} | {cell(entry)} | {cell(twin)} | {usable} |")


def first_attempt() -> None:
    """SDXL as the authors first ran it (README step 1: AMP fp16 + checkpointing, no ZeRO),
    from flags, since the repository only holds the later ZeRO-2 setup."""
    out = subprocess.run([sys.executable, "-m", "cfgfix", "estimate", "--model", "stabilityai/stable-diffusion-xl-base-1.0",
                          "--precision", "amp-fp16", "--checkpointing", "--batch", "2", "--resolution", "1024",
                          "--num-gpus", "4", "--gpu", "RTX 4090", "--output-format", "json"],
                         capture_output=True, text=True, check=False).stdout  # exit 1: does not surely fit
    d = json.loads(out)["estimate"]
    print(f"| sdxl-zero2-offload | first attempt (flags: AMP fp16, checkpointing, batch 2, 1024 px, DDP x4) | "
          f"{CLAIMS['sdxl-zero2-offload'].split(';')[0]} | {d['peak_bytes'] / GIB:.1f} GiB "
          f"({d['verdict']['text'].split(':')[0]}) | - | {d['gpu']['usable_bytes'] / GIB:.2f} GiB (RTX 4090) |")


if __name__ == "__main__":
    main()
    first_attempt()
