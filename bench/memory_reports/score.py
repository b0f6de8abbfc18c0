"""Score `cfgfix estimate` against the labelled real reports in manifest.jsonl (issue 21).

Each row becomes one real `cfgfix estimate --output-format json` run, with flags built from the
row's structured setup (never from what cfgfix is expected to say), in an empty folder
(`--model`/`--params` read no settings file). The script reports verdict agreement (fits vs OOM),
the real OOMs called "fits", predicted/measured for the rows with a measured peak (median and
spread), and every row that was not estimated, with the reason.

    python bench/memory_reports/score.py --repo /path/to/cfgfix-checkout --label before \
        [--python /path/to/venv/bin/python] [--json out.json] [--markdown out.md]

`--repo` is put first on PYTHONPATH, so the checkout scored is the one named (a worktree at an
older commit scores that commit). Only the standard library is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 2**30
# The flags' optimizer vocabulary; a row's optimizer outside it is mapped to the nearest and the
# approximation is written next to the result.
OPTIMIZERS = {"adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor"}
SEQ_FAMILIES = {"decoder", "encoder", "encoder-decoder", "speech-encoder-decoder", "vlm"}
IMAGE_FAMILIES = {"unet", "dit", "clip", "vit"}


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flags_for(row: dict) -> tuple[list[str], list[str]]:
    """The `cfgfix estimate` flags that state the row's setup, and what they cannot state."""
    s = row["setup"]
    flags: list[str] = []
    approx: list[str] = []
    ref = s["model_ref"]
    if "catalog" in ref:
        flags += ["--model", ref["catalog"]]
    else:
        flags += ["--params", repr(float(ref["params"]))]
    flags += ["--precision", s["precision"], "--gpu", s["gpu"], "--num-gpus", str(s["num_gpus"])]
    flags += ["--batch", str(int(s["micro_batch"]))]
    if s.get("task") == "dpo":
        # --task dpo: chosen+rejected in one batch and TRL's frozen reference model (none with LoRA)
        flags += ["--task", "dpo"]
    if s.get("grad_accum"):
        flags += ["--grad-accum", str(s["grad_accum"])]
    family = s["family"]
    if family in SEQ_FAMILIES and s.get("seq_len"):
        flags += ["--seq", str(s["seq_len"])]
        if family in ("encoder-decoder", "speech-encoder-decoder") and s.get("target_seq"):
            flags += ["--target-seq", str(s["target_seq"])]
    if family in IMAGE_FAMILIES and s.get("resolution"):
        flags += ["--resolution", str(s["resolution"])]
    if s["method"] != "full":
        flags += ["--lora-rank", str(s.get("lora_rank") or 8)]
        if s.get("lora_targets"):
            targets = lora_targets(s["lora_targets"], "catalog" in ref)
            if targets is None:
                approx.append(f"LoRA targets '{s['lora_targets']}' are not expressible: all-linear taken")
            else:
                flags += ["--lora-targets", targets]
    torch = re.search(r"\bpytorch (\d+\.\d+(?:\.\d+)?)", s.get("framework") or "")
    if torch:
        flags += ["--torch-version", torch.group(1)]
    if s.get("quantize"):
        flags += ["--quantize", s["quantize"]]
    if s.get("zero"):
        flags += ["--zero", str(s["zero"])]
    if s.get("fsdp"):
        flags += ["--fsdp", s["fsdp"]]
    offload = s.get("offload") or "none"
    if s.get("fsdp_offload_params"):
        offload = "optimizer+params"
    if offload != "none":
        flags += ["--offload", offload]
    gc = s.get("gradient_checkpointing")
    flags.append("--checkpointing" if gc else "--no-checkpointing")
    if gc is None:
        approx.append("checkpointing not stated: off")
    optimizer = s["optimizer"]
    if optimizer not in OPTIMIZERS:
        approx.append(f"optimizer {optimizer} stated as adamw")
        optimizer = "adamw"
    flags += ["--optimizer", optimizer]
    if s.get("attention"):
        flags += ["--attention", s["attention"]]
    if s.get("head"):
        flags += ["--head", s["head"]]
    if family == "vlm":
        approx.append("vision tower and image tokens not expressible: language model only")
    if family == "clip":
        approx.append("two-tower contrastive model: not expressible with flags")
    return flags, approx


# The row's target spellings as `--lora-targets` values: lit-gpt's query/value are the q/v roles;
# Qwen-1's finetune.py default c_attn,c_proj,w1,w2 adapts every Linear of a QWenBlock (c_attn,
# attn.c_proj, mlp.w1, mlp.w2, mlp.c_proj: Qwen/Qwen-7B modeling_qwen.py), i.e. all-linear, which
# is what a --params row (no layer names) can state.
_TARGET_WORDS = {"query": "q", "key": "k", "value": "v", "all linear": "all-linear"}


def lora_targets(text: str, named_model: bool) -> str | None:
    """The `--lora-targets` value of a row's `lora_targets`, or None when flags cannot state it."""
    bare = re.sub(r"\s*\(.*\)\s*$", "", text).strip()
    if bare in _TARGET_WORDS:
        return _TARGET_WORDS[bare]
    if "block" in bare:  # one block only: flags name layers, not layer indices
        return None
    names = [_TARGET_WORDS.get(n.strip(), n.strip()) for n in bare.split(",")]
    if names == ["c_attn", "c_proj", "w1", "w2"]:
        return "all-linear"
    return ",".join(names) if named_model else None


def run_estimate(python: str, repo: Path, flags: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=str(repo))
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run([python, "-m", "cfgfix", "estimate", "--output-format", "json", *flags],
                              check=False, cwd=empty, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def parse(stdout: str) -> dict | None:
    """The estimate's figures, tolerant of a list (one entry per launch), of the launch entry
    (`estimate` and `answer`, since the flags go through the one memory answer) or of the bare
    estimate (older checkouts). The answer, when there is one, is kept under "answer"."""
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    if isinstance(data, list):
        data = data[0] if data else None
    if isinstance(data, dict) and isinstance(data.get("estimate"), dict):
        data = {**data["estimate"], "answer": data.get("answer")}
    if not isinstance(data, dict) or "peak_bytes" not in data:
        return None
    return data


# the one memory answer's verdicts, in this report's words
ANSWER_VERDICTS = {"fits": "fits", "does not fit": "over", "conditional": "borderline"}


def verdict_of(est: dict) -> tuple[str, str]:
    """("fits" | "borderline" | "over", cfgfix's own words). "fits" is cfgfix's exit-0 verdict:
    the top of its band fits; "borderline": only the bottom fits (or, from the memory answer,
    a conditional verdict); "over": the estimate is over."""
    answer = est.get("answer") or {}
    if answer.get("verdict") in ANSWER_VERDICTS:
        return ANSWER_VERDICTS[answer["verdict"]], answer.get("text", "")
    v = est.get("verdict") or {}
    text = v.get("text", "")
    fits, certain = v.get("fits"), v.get("certain")
    if fits is None:
        usable = (est.get("gpu") or {}).get("usable_bytes")
        if not usable:
            return "unknown", text
        band = est.get("band_bytes") or [est["peak_bytes"]] * 2
        return ("fits" if band[1] <= usable else "borderline" if band[0] <= usable else "over"), text
    if fits and certain:
        return "fits", text
    if fits:
        return "borderline", text
    return "over", text


def component(est: dict, name: str) -> int:
    for c in est.get("components") or []:
        if c.get("name") == name:
            return int(c.get("at_peak_bytes", c.get("bytes", 0)) or 0)
    return 0


def like_with_like(est: dict, measured: dict) -> float:
    """The predicted figure comparable to what was measured: torch's allocator peaks exclude the
    CUDA context that cfgfix adds outside the allocator; nvidia-smi totals include it."""
    peak = int(est["peak_bytes"])
    if measured["kind"].startswith(("max_memory_allocated", "max_memory_reserved")):
        peak -= component(est, "cuda_context")
    return peak / GIB


def score(rows: list[dict], python: str, repo: Path) -> list[dict]:
    results = []
    for row in rows:
        flags, approx = flags_for(row)
        rc, out, err = run_estimate(python, repo, flags)
        est = parse(out)
        res = {"id": row["id"], "outcome": row["outcome"], "flags": flags, "approx": approx, "rc": rc,
               "family": row["setup"]["family"], "model": row["setup"]["model"], "gpu": row["setup"]["gpu"],
               "num_gpus": row["setup"]["num_gpus"], "url": row["source"]["url"]}
        if est is None:
            res["estimated"] = False
            res["reason"] = first_line(err) or first_line(out) or f"exit {rc}, no output"
        else:
            res["estimated"] = True
            res["peak_gib"] = round(est["peak_bytes"] / GIB, 2)
            band = est.get("band_bytes") or [est["peak_bytes"]] * 2
            res["band_gib"] = [round(band[0] / GIB, 2), round(band[1] / GIB, 2)]
            res["usable_gib"] = round(((est.get("gpu") or {}).get("usable_bytes") or 0) / GIB, 2)
            res["verdict"], res["verdict_text"] = verdict_of(est)
            res["assumptions"] = est.get("assumptions") or []
            res["components_gib"] = {c["name"]: round(int(c.get("at_peak_bytes", c.get("bytes", 0)) or 0) / GIB, 2)
                                     for c in est.get("components") or [] if "name" in c}
            if row.get("measured"):
                m = row["measured"]
                pred = like_with_like(est, m)
                res["measured_gib"] = m["gib"]
                res["measured_kind"] = m["kind"]
                res["predicted_like_gib"] = round(pred, 2)
                res["ratio"] = round(pred / m["gib"], 3)
                lo, hi = band[0] / GIB, band[1] / GIB
                shift = res["peak_gib"] - pred
                res["in_band"] = lo - shift <= m["gib"] <= hi - shift
        results.append(res)
    return results


def agree(res: dict) -> bool:
    """A real OOM agrees with "over" or "borderline" (cfgfix's exit 1); a run agrees with "fits"."""
    return (res["verdict"] == "fits") == (res["outcome"] == "ran")


def quantiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
    return f"median {statistics.median(v):.2f} (min {v[0]:.2f}, p25 {q[0]:.2f}, p75 {q[2]:.2f}, max {v[-1]:.2f})"


def markdown(results: list[dict], label: str, commit: str) -> str:
    est = [r for r in results if r["estimated"] and r["verdict"] != "unknown"]
    ooms = [r for r in est if r["outcome"] == "oom"]
    ran = [r for r in est if r["outcome"] == "ran"]
    oom_fits = [r for r in ooms if r["verdict"] == "fits"]
    ran_over = [r for r in ran if r["verdict"] != "fits"]
    point_agree = [r for r in est if (r["peak_gib"] <= r["usable_gib"]) == (r["outcome"] == "ran")]
    measured = [r for r in results if r.get("ratio") is not None]
    ratios = [r["ratio"] for r in measured]
    lines = [f"## {label} (cfgfix at {commit})", ""]
    lines += [
        f"- rows: {len(results)}; estimated with a verdict: {len(est)}; not estimated: {len(results) - len(est)}",
        f"- **verdict agreement** (cfgfix's exit-0 'fits' vs the report): **{sum(agree(r) for r in est)} of {len(est)}**"
        + (f" ({100 * sum(agree(r) for r in est) / len(est):.0f}%)" if est else ""),
        f"- agreement by the point estimate alone (peak <= usable): {len(point_agree)} of {len(est)}",
        f"- **real OOMs called 'fits'**: **{len(oom_fits)} of {len(ooms)}** estimated OOMs"
        + (f" ({', '.join(r['id'] for r in oom_fits)})" if oom_fits else ""),
        f"- runs that worked but were called 'over' or 'borderline': {len(ran_over)} of {len(ran)}"
        + (f" ({', '.join(r['id'] for r in ran_over)})" if ran_over else ""),
        (f"- **predicted/measured** over {len(ratios)} measured peaks (like with like: the CUDA context removed for "
         f"torch allocator peaks): **{quantiles(ratios)}**; under-predicted: {sum(x < 1 for x in ratios)}; "
         f"within ±10%: {sum(0.9 <= x <= 1.1 for x in ratios)}; measured inside cfgfix's band: "
         f"{sum(bool(r.get('in_band')) for r in measured)}"),
        "",
        "| row | outcome | model | GPU × n | cfgfix peak (band) GiB | usable | verdict | agrees | measured GiB (kind) | pred/meas |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if not r["estimated"]:
            continue
        meas = f"{r['measured_gib']} ({r['measured_kind'].split(' (')[0]})" if r.get("measured_gib") is not None else ""
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else ""
        lines.append(f"| {r['id']} | {r['outcome']} | {r['model'][:38]} | {r['gpu']} × {r['num_gpus']} | "
                     f"{r['peak_gib']} ({r['band_gib'][0]}–{r['band_gib'][1]}) | {r['usable_gib']} | {r['verdict']} | "
                     f"{'yes' if agree(r) else '**no**'} | {meas} | {ratio} |")
    missing = [r for r in results if not r["estimated"] or r.get("verdict") == "unknown"]
    if missing:
        lines += ["", "Not estimated:", "", "| row | outcome | model | reason |", "|---|---|---|---|"]
        for r in missing:
            reason = r.get("reason") or r.get("verdict_text") or "no verdict"
            lines.append(f"| {r['id']} | {r['outcome']} | {r['model'][:40]} | {reason.replace('|', '/')} |")
    approx = [r for r in results if r["approx"]]
    if approx:
        lines += ["", "What the flags could not state (per row): "
                  + "; ".join(f"{r['id']}: {', '.join(r['approx'])}" for r in approx)]
    return "\n".join(lines) + "\n"


def git_commit(repo: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="the cfgfix checkout to score")
    ap.add_argument("--label", default="run", help="the section's title in the report (before, after)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with cfgfix's dependencies")
    ap.add_argument("--manifest", type=Path, default=HERE / "manifest.jsonl")
    ap.add_argument("--json", type=Path, help="write every row's flags and figures here")
    ap.add_argument("--markdown", type=Path, help="append the Markdown section here (default: print it)")
    ap.add_argument("--commit", help="the commit to name when --repo is not a git checkout (an exported tree)")
    args = ap.parse_args(argv)
    rows = load_rows(args.manifest)
    results = score(rows, args.python, args.repo.resolve())
    text = markdown(results, args.label, args.commit or git_commit(args.repo))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown:
        with args.markdown.open("a") as fh:
            fh.write("\n" + text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
