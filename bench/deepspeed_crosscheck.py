#!/usr/bin/env python3
"""Cross-check cfgfix's DeepSpeed verdicts against DeepSpeed's own config validator.

A script, not a test: it needs a second virtualenv with DeepSpeed installed (CPU is
enough; ``DS_BUILD_OPS=0 pip install deepspeed``), which CI does not have.

For every DeepSpeed config found under PATHS (recognised the way ``cfgfix check``
recognises them) that holds no ``"auto"`` value (those are filled by the HF Trainer or
accelerate first, which this check does not reproduce), it asks two questions:

* **DeepSpeed**: does ``deepspeed.runtime.config.DeepSpeedConfig(path)`` accept the file?
  Run in the other venv, with ``deepspeed.comm``'s ``get_rank``/``get_world_size`` stubbed
  so the batch assertion sees a chosen world size (facts.md C13; without the stub DeepSpeed
  falls back to a world size of 1). YAML configs are loaded with PyYAML and passed as a dict.
* **cfgfix**: does ``cfgfix check --select CFX5,CFX901`` report an error-severity finding?
  Each file is copied alone into a scratch project with ``requirements.txt`` pinning the
  venv's DeepSpeed version (so the version-gated rules CFX507/CFX509 judge the same
  version) and a launch line ``deepspeed --num_gpus W train.py --deepspeed_config FILE``
  (so CFX502 sees the same world size W).

The world size W is not in the file. ``--world-size infer`` (the default) picks the one
that makes ``train_batch_size = micro x accumulation x W`` hold when all three are
integers and that division is exact, else 1; so the world size, which no single file
states, is never the cause of a disagreement. ``--world-size N`` fixes it instead.

Usage::

    .venv/bin/python bench/deepspeed_crosscheck.py --venv /tmp/corpus-venv CORPUS_DIR [...]
    .venv/bin/python bench/deepspeed_crosscheck.py --venv V --json out.json DIR
    .venv/bin/python bench/deepspeed_crosscheck.py --venv V --fill-auto DIR   # "auto" configs too

With ``--fill-auto`` configs with ``"auto"`` are checked too: DeepSpeed sees them with
``"auto"`` replaced as the HF Trainer fills it for default ``TrainingArguments`` (micro batch
1, accumulation 1, fp32, lr 5e-5), cfgfix sees the file as written.

It prints a Markdown table: the confusion matrix (DeepSpeed accepts/rejects x cfgfix
silent/error) and every disagreement with DeepSpeed's message and cfgfix's codes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Run inside the DeepSpeed venv: validate each (path, world size) and print JSON lines.
_VALIDATOR = r'''
import contextlib, io, json, logging, sys
logging.disable(logging.CRITICAL)
import deepspeed
from deepspeed.runtime import config as dsc
print(json.dumps({"deepspeed": deepspeed.__version__}), flush=True)

# What the HF Trainer writes over "auto" for a default TrainingArguments (micro batch 1,
# accumulation 1, fp32, AdamW lr 5e-5, clipping 1.0); ZeRO bucket sizes are model-dependent
# there and are left "auto" (DeepSpeed drops them and uses its default).
FILLED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "enabled": False, "lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
          "warmup_min_lr": 0, "warmup_max_lr": 5e-5, "warmup_num_steps": 0, "total_num_steps": 1000}

def fill(node, world, key=None):
    if isinstance(node, dict):
        out = {k: fill(v, world, k) for k, v in node.items()}
        if out.get("train_batch_size") == "auto":
            out["train_batch_size"] = world
        return out
    if node == "auto" and key in FILLED:
        return FILLED[key]
    return node
for line in sys.stdin:
    item = json.loads(line)
    world = item["world"]
    dsc.dist.get_rank = lambda *a, **k: 0
    dsc.dist.get_world_size = lambda *a, **k: world
    config = item["path"]
    if item["path"].endswith((".yaml", ".yml")):
        import yaml
        config = yaml.safe_load(open(item["path"], encoding="utf-8"))
    if item["fill"]:
        import hjson
        if isinstance(config, str):
            config = hjson.load(open(config, encoding="utf-8"))
        config = fill(config, item["world"])
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            dsc.DeepSpeedConfig(config)
        result = {"accepted": True}
    except Exception as exc:  # every rejection, whatever its type
        text = " ".join(str(exc).split())
        result = {"accepted": False, "error": type(exc).__name__, "message": text[:300]}
    result["path"] = item["path"]
    print(json.dumps(result), flush=True)
'''


def find_configs(paths: list[Path]) -> list[Path]:
    """DeepSpeed configs under `paths`, recognised with cfgfix's own reader."""
    from cfgfix.analysis.config_kinds import config_kinds, looks_like_config
    from cfgfix.documents.config import ConfigError, parse_config
    from cfgfix.documents.text import DecodeError, SourceText

    found = []
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in files:
            if path.suffix.lower() not in (".json", ".yaml", ".yml") or not path.is_file():
                continue
            data = path.read_bytes()
            if not looks_like_config(data):
                continue
            try:
                doc = parse_config(SourceText.from_bytes(str(path), data),
                                   "json" if path.suffix.lower() == ".json" else "yaml")
            except (ConfigError, DecodeError, IndexError, RecursionError):
                # unreadable for cfgfix (CFX901, or a reader crash): kept if it mentions ZeRO
                if b"zero_optimization" in data:
                    found.append(path)
                continue
            if "deepspeed" in config_kinds(doc):
                found.append(path)
    return found


def has_auto(path: Path) -> bool:
    return b'"auto"' in path.read_bytes() or b": auto" in path.read_bytes()


def infer_world(path: Path, fixed: str) -> int:
    if fixed != "infer":
        return int(fixed)
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return 1  # not plain JSON/YAML (comments): no batch numbers to read
    numbers = [data.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps")]
    # DeepSpeed divides the world size by sequence_parallel_size before the batch check
    sp = data.get("sequence_parallel_size")
    sp = sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 0 else 1
    if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        total, micro, steps = numbers
        if total % (micro * steps) == 0:
            return total // (micro * steps) * sp
    return sp


def deepspeed_verdicts(python: Path, items: list[tuple[Path, int]], fill: bool) -> tuple[str, dict[str, dict]]:
    feed = "".join(json.dumps({"path": str(p), "world": w, "fill": fill}) + "\n" for p, w in items)
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([str(python), "-c", _VALIDATOR], input=feed, capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"the DeepSpeed venv could not run the validator:\n{proc.stderr[-2000:]}")
    version = lines[0]["deepspeed"]
    return version, {r["path"]: r for r in lines[1:]}


def cfgfix_verdict(path: Path, world: int, ds_version: str, scratch: Path) -> list[dict]:
    project = scratch / f"p{len(list(scratch.iterdir()))}"
    project.mkdir()
    shutil.copy2(path, project / path.name)
    (project / "requirements.txt").write_text(f"deepspeed=={ds_version}\n")
    (project / "run.sh").write_text(f"deepspeed --num_gpus {world} train.py --deepspeed_config {path.name}\n")
    proc = subprocess.run([sys.executable, "-m", "cfgfix", "check", "--no-cache", "--output-format", "json",
                           "--select", "CFX5,CFX901", "."], cwd=project, capture_output=True, text=True,
                          timeout=120, check=False)
    if proc.returncode not in (0, 1):
        return [{"code": "CRASH", "severity": "error", "message": proc.stderr.strip().splitlines()[-1:]}]
    findings = json.loads(proc.stdout or "[]")
    return [f for f in findings if f["filename"] == path.name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="corpus folders or files")
    parser.add_argument("--venv", type=Path, required=True, help="a virtualenv with deepspeed installed")
    parser.add_argument("--world-size", default="infer", help="'infer' (default) or a number")
    parser.add_argument("--fill-auto", action="store_true",
                        help='also check configs with "auto": DeepSpeed sees them filled as the HF Trainer '
                             "fills them for default TrainingArguments; cfgfix sees the file as written")
    parser.add_argument("--json", type=Path, help="also write every row as JSON here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))

    configs = find_configs([p.resolve() for p in args.paths])
    plain = configs if args.fill_auto else [p for p in configs if not has_auto(p)]
    items = [(p, infer_world(p, args.world_size)) for p in plain]
    version, ds = deepspeed_verdicts(args.venv / "bin" / "python", items, args.fill_auto)

    rows = []
    with tempfile.TemporaryDirectory(prefix="ds-crosscheck-") as tmp:
        for path, world in items:
            findings = cfgfix_verdict(path, world, version, Path(tmp))
            errors = sorted({f["code"] for f in findings if f["severity"] == "error"})
            # CFX507 reports top-level keys DeepSpeed ignores without a word: an error by design
            ignored = bool(errors) and all(f["code"] == "CFX507" and "top-level" in f["message"]
                                           for f in findings if f["severity"] == "error")
            verdict = ds.get(str(path), {"accepted": None, "error": "no answer"})
            rows.append({"path": str(path), "world": world, "deepspeed_accepts": verdict["accepted"],
                         "deepspeed_error": verdict.get("error"), "deepspeed_message": verdict.get("message"),
                         "cfgfix_errors": errors, "ignored_top_level_key": ignored,
                         "cfgfix_other": sorted({f["code"] for f in findings if f["severity"] != "error"})})

    common = os.path.commonpath([r["path"] for r in rows]) if rows else ""
    def short(p: str) -> str:
        return os.path.relpath(p, common) if common else p

    matrix = {(a, bool(e)): 0 for a in (True, False) for e in (False, True)}
    for r in rows:
        if r["deepspeed_accepts"] is not None:
            matrix[(r["deepspeed_accepts"], bool(r["cfgfix_errors"]))] += 1
    left_out = "auto values filled as the HF Trainer would" if args.fill_auto else \
        f'{len(configs) - len(plain)} with "auto" left out'
    print(f"DeepSpeed {version}; {len(configs)} DeepSpeed configs found, {left_out}, {len(rows)} checked "
          f"(world size: {args.world_size}).\n")
    print("| | cfgfix: no error | cfgfix: error |\n| --- | ---: | ---: |")
    print(f"| DeepSpeed accepts | {matrix[(True, False)]} | {matrix[(True, True)]} |")
    print(f"| DeepSpeed rejects | {matrix[(False, False)]} | {matrix[(False, True)]} |\n")
    print("| file | W | DeepSpeed | cfgfix errors | other cfgfix findings |\n| --- | ---: | --- | --- | --- |")
    for r in rows:
        ds_text = "accepts" if r["deepspeed_accepts"] else f"{r['deepspeed_error']}: {r['deepspeed_message']}"
        agree = r["deepspeed_accepts"] is (not r["cfgfix_errors"])
        mark = "" if agree else " (silently ignored key)" if r["ignored_top_level_key"] else " **(disagree)**"
        print(f"| {short(r['path'])}{mark} | {r['world']} | {ds_text} | {', '.join(r['cfgfix_errors']) or '-'} "
              f"| {', '.join(r['cfgfix_other']) or '-'} |")
    if args.json:
        args.json.write_text(json.dumps({"deepspeed": version, "world_size": args.world_size, "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
