"""The fuzz harness's generated kinds (issue 24): inputs an independent fuzzer found
tracebacks and hostile costs with, which mutating one seed file rarely reaches.

- notebook: notebooks built from the Python seeds' (mostly fixable) code, then bent out of
  shape: cells that are not objects, sources that are numbers, objects or lists of non-strings,
  missing keys, odd cell types and metadata, nested garbage; run through check and the fixer.
- filename: a seed project whose file (or folder) is renamed to bytes that are not UTF-8,
  terminal escapes, newlines, `::`, `,` or `%`; run through the real command line in-process
  under a strict UTF-8 stdout (PYTHONIOENCODING=utf-8) in every output format and `fix --diff`;
  a JSON or SARIF report must parse.
- launch-huge: launch lines with up to 400,000 arguments (flags, values, quotes, variables,
  line continuations, links to configs repeated), in a run.sh, a Makefile or a Dockerfile.
- big-config: a fixable launch whose linked YAML/JSON configs are padded to megabytes.

Each generator returns (files by name, the file to fix, how to run it); `big=False` keeps the
sizes small for the test suite's slice.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
from pathlib import Path

_TRAIN = (
    "import torch\n"
    "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
    "model = AutoModelForCausalLM.from_pretrained('gpt2', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.to(device)\n"
    "model.half()\n"
    "Trainer(model=model, args=TrainingArguments('out', fp16=True)).train()\n"
)
_PROJECT = {  # a fixable launch with every kind of linked config
    "train.py": _TRAIN,
    "run.sh": "accelerate launch --config_file acc.yaml --num_processes 2 train.py --deepspeed ds.json --config train.yaml\n",
    "acc.yaml": "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 2\n",
    "ds.json": '{"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}\n',
    "train.yaml": "learning_rate: 1e-5\nbf16: true\nper_device_train_batch_size: 4\ngradient_checkpointing: true\n",
}


# ------------------------------------------------------------------------------ notebooks

def _garbage(rng: random.Random, depth: int = 0):
    choices = [7, -1, 1e309, "x", "", None, True, [], {}, [1, [2, [3]]], {"cell_type": "code"},
               {"cell_type": "code", "source": 3}, {"cell_type": "code", "source": {"a": ["b"]}},
               {"cell_type": "code", "source": [1, None, "x = 1\n", ["y"]]}, {"cell_type": 5, "source": "model.half()\n"},
               {"cell_type": None}, {"cell_type": "CODE", "source": "model.half()\n"}, {"source": "model.half()\n"},
               {"cell_type": "raw", "source": "model.to('cuda')\n"}, {"cell_type": "markdown", "source": ["# t\n", 5]}]
    if depth < 2 and rng.random() < 0.2:
        return [_garbage(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.05:
        nested = "x"
        for _ in range(rng.choice((50, 400, 900))):
            nested = [nested] if rng.random() < 0.5 else {"k": nested}
        return nested
    return rng.choice(choices)


def _code_cell(source, rng: random.Random) -> dict:
    cell = {"cell_type": "code", "execution_count": rng.choice((None, 1, "1")), "metadata": {}, "outputs": [], "source": source}
    for key in rng.sample(["execution_count", "metadata", "outputs"], rng.randrange(0, 3)):
        del cell[key]
    return cell


def notebook(pools, rng: random.Random, donors, big: bool):
    from fuzz.harness import _mutate_bytes, _mutate_text

    project, name = rng.choice(pools["python"])
    lines = project[name].splitlines(keepends=True) or ["model.half()\n"]
    if rng.random() < 0.3:
        lines = [rng.choice(("%pip install -q peft\n", "!nvidia-smi\n", "%%time\n", "%env X=1\n", "?model\n")), *lines]
    cuts = sorted(rng.sample(range(len(lines) + 1), min(len(lines) + 1, rng.randrange(1, 5))))
    cells = []
    for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True):
        if a < b:
            part = lines[a:b]
            cells.append(_code_cell(part if rng.random() < 0.7 else "".join(part), rng))
    data: dict = {"cells": cells, "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
                  "nbformat": 4, "nbformat_minor": 5}
    for _ in range(rng.randrange(1, 5)):
        _bend(data, rng)
    text = json.dumps(data, indent=rng.choice((None, 1, 2, "\t")), ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.2:
        text = _mutate_text(text, rng, donors)
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:
        raw = _mutate_bytes(raw, rng)
    return {"nb.ipynb": raw, **({"run.sh": project["run.sh"].encode()} if "run.sh" in project else {})}, "nb.ipynb", None


def _bend(data: dict, rng: random.Random) -> None:
    cells = data["cells"] if isinstance(data.get("cells"), list) else None
    op = rng.randrange(10)
    if cells is not None and op <= 3:  # an odd entry next to the code
        cells.insert(rng.randrange(len(cells) + 1), _garbage(rng))
    elif cells and op == 4:  # a code cell's source of the wrong shape
        target = rng.choice(cells)
        if isinstance(target, dict):
            target["source"] = rng.choice((3, None, {"a": 1}, ["x = 1\n", 5, None], [["model.half()\n"]], "", []))
    elif cells and op == 5:  # a key missing or of the wrong type
        target = rng.choice(cells)
        if isinstance(target, dict) and target:
            key = rng.choice(list(target))
            if rng.random() < 0.5:
                del target[key]
            else:
                target[key] = _garbage(rng)
    elif op == 6:  # metadata of every shape
        data["metadata"] = rng.choice(([], "x", None, {"language_info": 5}, {"language_info": {"name": 7}},
                                       {"kernelspec": {"language": ["python"]}}, {"kernelspec": "python"}))
    elif op == 7:
        data[rng.choice(("nbformat", "nbformat_minor", "worksheets"))] = _garbage(rng)
    elif op == 8 and rng.random() < 0.3:  # no cells list at all
        data["cells"] = rng.choice(({"0": {"cell_type": "code", "source": "model.half()\n"}}, "model.half()\n", None, 5))
    elif cells:  # outputs with garbage inside
        target = rng.choice(cells)
        if isinstance(target, dict):
            target["outputs"] = [_garbage(rng) for _ in range(rng.randrange(1, 4))]


# ------------------------------------------------------------------------------ file names

_NAME_PIECES = (b"\xe9", b"\xff", b"\x80", b"\xc3(", b"\xed\xa0\x80", b"\xf0\x9f\x98", "\u00fc".encode(),
                "\U0001f600".encode(), "\u202e".encode(), b"\x1b[31m", b"\n", b"\r", b"\t", b"::", b",", b"%",
                b"%0A", b" ", b"'", b'"', b"\\", b"\x7f", b"-", b"=", b"$(x)", b"*", b"[a]")


def _hostile_name(rng: random.Random, stem: str) -> bytes:
    pieces = [rng.choice(_NAME_PIECES) for _ in range(rng.randrange(1, 4))]
    at = rng.randrange(len(stem) + 1)
    return stem[:at].encode() + b"".join(pieces) + stem[at:].encode()


def filename(pools, rng: random.Random, donors, big: bool):
    kind = rng.choice(("python", "python", "shell", "yaml", "json", "dockerfile", "makefile", "env"))
    project, name = rng.choice(pools[kind] or pools["python"])
    files = {n: t.encode("utf-8", "surrogatepass") for n, t in project.items()}
    files.setdefault("run.sh", b"torchrun --nproc_per_node 2 train.py\n")
    folder, base = os.path.split(name)
    stem, dot, suffix = base.rpartition(".")
    new_base = _hostile_name(rng, stem or suffix) + (dot + suffix).encode() if stem else _hostile_name(rng, base)
    new_folder = folder.encode()
    if rng.random() < 0.3:
        new_folder = os.path.join(_hostile_name(rng, "d"), new_folder) if new_folder else _hostile_name(rng, "d")
    new_name = os.fsdecode(os.path.join(new_folder, new_base))
    files[new_name] = files.pop(name)
    if rng.random() < 0.4:  # the launches name it as it is now: bytes that are not UTF-8 in the launch files
        raw = os.fsencode(new_name)
        files = {n: d.replace(name.encode(), raw) if n != new_name else d for n, d in files.items()}
    return files, new_name, run_cli


_FORMATS = ("text", "concise", "json", "sarif", "github")


def run_cli(root: Path, files: dict[str, bytes], mutated: str) -> tuple[str, str]:
    """The real command line in-process, with stdout and stderr strict UTF-8 streams as under
    PYTHONIOENCODING=utf-8: every format and `fix --diff`; a traceback is a crash, an output
    that a JSON reader refuses an internal error."""
    from fuzz.harness import write_files

    write_files(root, files)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for args in ([["check", "--no-cache", "--output-format", f] for f in _FORMATS]
                     + [["check", "--statistics"], ["fix", "--diff", "--no-cache"], ["fix", "--unsafe-fixes"]]):
            code, out, err = _in_process(args)
            if "internal error" in err or "Traceback" in err:
                return "internal", f"{args}: {err[-500:]}"
            if code not in (0, 1, 2):
                return "internal", f"{args}: exit {code}: {err[-300:]}"
            if "json" in args or "sarif" in args:
                try:
                    json.loads(out)
                except ValueError as exc:
                    return "internal", f"{args}: invalid JSON ({exc}): {out[:300]!r}"
        return "ok", ""
    finally:
        os.chdir(cwd)


def _in_process(args: list[str]) -> tuple[object, str, str]:
    """Run `cfgfix args` here with strict UTF-8 stdout/stderr; exceptions other than the exit propagate."""
    from cfgfix.cli import main

    saved = sys.stdout, sys.stderr
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    sys.stdout, sys.stderr = out, err
    code = 0
    try:
        main(args)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) or done.code is None else 1
    finally:
        sys.stdout, sys.stderr = saved
        for stream in (out, err):
            stream.flush()
    text = [s.buffer.getvalue().decode("utf-8") for s in (out, err)]  # strict: the bytes must be UTF-8
    return code or 0, text[0], text[1]


# ------------------------------------------------------------------------------ huge launches

_LAUNCHERS = ("torchrun --nproc_per_node 2 train.py", "accelerate launch --config_file acc.yaml --num_processes 2 train.py",
              "python train.py", "deepspeed --num_gpus 2 train.py", "CUDA_VISIBLE_DEVICES=0,1 python -m torch.distributed.run --nproc_per_node=2 train.py")


def _argument(rng: random.Random, i: int) -> str:
    return rng.choice((
        f"--a{i} {i}", f"--a{i}={i}", "--bf16 True", "--fp16", "--deepspeed ds.json", "--config train.yaml",
        f"'{i} x'", f'"${{V{i}}}"', f"$X{i}", f"x{i}", "\\\n ", "--per_device_train_batch_size 8",
        "--gradient_checkpointing", f"--lr=1e-{i % 9}", "--output_dir out", "--mixed_precision fp16",
    ))


def launch_huge(pools, rng: random.Random, donors, big: bool):
    count = rng.choice((1_000, 10_000, 50_000, 100_000, 400_000) if big else (100, 1_000))
    style = rng.random()
    if style < 0.3:  # one argument shape repeated (the cheapest to make, the most regular)
        one = _argument(rng, 1)
        args = [one] * count
    else:
        args = [_argument(rng, i) for i in range(count)]
    launcher = rng.choice(_LAUNCHERS)
    files = {n: t.encode() for n, t in _PROJECT.items()}
    where = rng.random()
    if where < 0.7:
        files["run.sh"] = f"#!/bin/bash\n{launcher} {' '.join(args)}\n".encode()
        mutated = "run.sh"
    elif where < 0.85:
        files["Makefile"] = f"train:\n\t{launcher} {' '.join(args)}\n".encode()
        mutated = "Makefile"
    else:
        words = [*launcher.split(), *(w for a in args for w in a.split() if w != "\\")]
        files["Dockerfile"] = ("FROM pytorch/pytorch\nCMD " + json.dumps(words) + "\n").encode()
        mutated = "Dockerfile"
    if rng.random() < 0.3:
        mutated = "train.py"
    return files, mutated, None


# ------------------------------------------------------------------------------ big configs

def _big_yaml(rng: random.Random, size: int) -> str:
    base = _PROJECT["train.yaml"]
    style = rng.randrange(5)
    unit = (
        lambda i: f"key_{i}: {i}\n",
        lambda i: f"- item {i}\n",
        lambda i: f"block_{i}:\n  a: {i}\n  b: [1, 2, {{c: {i}}}]\n  s: 'text {i}'\n",
        lambda i: f"long_{i}: {'x' * 200}\n",
        lambda i: f"n_{i}: &a{i} {{x: {i}}}\nm_{i}: *a{i}\n",
    )[style]
    parts, total, i = [], 0, 0
    while total < size:
        piece = unit(i)
        parts.append(piece)
        total += len(piece)
        i += 1
    body = "".join(parts)
    if style == 1:
        body = "items:\n" + body
    return base + body if rng.random() < 0.5 else body + base


def _big_json(rng: random.Random, size: int) -> str:
    data = json.loads(_PROJECT["ds.json"])
    count = max(1, size // 24)
    data["pad"] = rng.choice((
        lambda: {f"key_{i}": i for i in range(count)},
        lambda: list(range(count * 3)),
        lambda: "x" * size,
        lambda: [{"a": i, "b": [i]} for i in range(count // 2)],
    ))()
    return json.dumps(data, indent=rng.choice((None, 2)))


def big_config(pools, rng: random.Random, donors, big: bool):
    size = int(rng.choice((1, 2, 4, 6.4) if big else (0.05,)) * 1_000_000)
    files = {n: t.encode() for n, t in _PROJECT.items()}
    for name in rng.sample(["train.yaml", "ds.json", "acc.yaml"], rng.randrange(1, 3)):
        files[name] = (_big_json(rng, size) if name.endswith(".json") else _big_yaml(rng, size)).encode()
    return files, rng.choice(("train.py", "run.sh", "train.py")), None


GENERATED = {"notebook": notebook, "filename": filename, "launch-huge": launch_huge, "big-config": big_config}
