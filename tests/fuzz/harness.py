"""A seeded, time-bounded fuzzer for cfgfix: mutated projects in, no traceback, no internal
error, no hang out.

Seeds are the sample projects of every rule's VALID/INVALID examples (a training script with
its launch script, configs and pins) and the fixtures' projects. Each input takes one
seed project, mutates one of its files (or its settings file) with byte-level and
structure-aware mutations (integers past Python's 4,300-digit limit, deep nesting, names over
255 bytes, CR/CRLF line endings, NUL and invalid UTF-8, truncation, splices between seeds,
comment and quote noise), writes it to a temporary folder and runs what a user would run
in-process: settings, `check` (engine with the project stage), the fixer on the mutated file
(in memory), and `explain`'s resolution. Per input:

- crash: any exception escaping cfgfix (a traceback for the user);
- internal error: an entry in the run's `errors` (cfgfix's own "internal error ..." lines);
- hang: a run over the per-input time limit.

A SettingsError or a CFX901 is the right answer to bad input, never a failure.

    python -m tests.fuzz.harness --seconds 300 --seed 1 [--out DIR]   (from the repository root)
    python tests/fuzz/harness.py --seconds 300 --seed 1
    python tests/fuzz/harness.py --seconds 600 --kind shell   (one kind)

The test suite runs a slice of a few seconds (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTATED_KINDS = ("python", "yaml", "json", "shell", "makefile", "dockerfile", "env", "settings")
GENERATED_KINDS = ("notebook", "filename", "launch-huge", "big-config")  # tests/fuzz/hostile.py
KINDS = MUTATED_KINDS + GENERATED_KINDS
PER_INPUT_SECONDS = 20.0  # a hang; real inputs take milliseconds
# megabyte inputs run check twice and the fixer in seconds each (tests/test_hostile_input.py
# bounds their cost); for them a hang is over this many times PER_INPUT_SECONDS
SLOW_KINDS = {"launch-huge": 6, "big-config": 6}

_LAUNCH = "accelerate launch --config_file acc.yaml --num_processes 2 train.py --deepspeed ds.json --config train.yaml\n"
_EXTRA_SEEDS = {  # kinds the rule examples hold few of
    "makefile": {"Makefile": "train:\n\tCUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 2 train.py --bf16 True\n",
                 "train.py": "from transformers import Trainer\nTrainer(model=m, args=a).train()\n"},
    "dockerfile": {"Dockerfile": "FROM pytorch/pytorch\nENV PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                                 "CMD [\"torchrun\", \"--nproc_per_node\", \"2\", \"train.py\"]\n",
                   "train.py": "import torch\nmodel.cuda()\n"},
    "env": {".env": "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,garbage_collection_threshold:0.8\nWORLD_SIZE=2\n",
            "run.sh": "set -a; . ./.env; torchrun --nproc_per_node $WORLD_SIZE train.py\n",
            "train.py": "import torch\nx = torch.zeros(2).cuda()\n"},
    "settings": {"cfgfix.toml": 'select = ["CFX"]\nextend-select = ["CFX902"]\ngpu = "RTX 4090"\ngpus = 2\n'
                                '[per-file-ignores]\n"scripts/*" = ["CFX3"]\n',
                 "train.py": "import torch\nmodel = torch.nn.Linear(2, 2).half()\n",
                 "run.sh": _LAUNCH,
                 "acc.yaml": "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 2\n",
                 "ds.json": '{"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4}\n'},
}


@dataclass
class Outcome:
    kind: str
    status: str  # "ok", "crash", "internal", "hang"
    detail: str = ""
    project: dict = field(default_factory=dict)
    mutated: str = ""


# ----------------------------------------------------------------------------- seeds


def _kind(name: str) -> str | None:
    if name in ("cfgfix.toml", ".cfgfix.toml", "pyproject.toml"):
        return "settings"
    from cfgfix.workspace import classify

    kind = classify(Path(name), b"")
    return {"markdown": None}.get(kind, kind)


def seed_projects() -> list[dict[str, str]]:
    """Every rule example's project, the extra seeds above and the fixtures' projects."""
    from cfgfix.rules.base import all_rules

    projects = []
    for rule in all_rules():
        for example in (*getattr(rule, "VALID", ()), *getattr(rule, "INVALID", ())):
            projects.append({example.path: example.code, **example.files})
    projects.extend(_EXTRA_SEEDS.values())
    for folder in sorted((REPO / "fixtures").glob("*/project")):
        files = {}
        for path in folder.rglob("*"):
            if path.is_file() and path.stat().st_size < 200_000:
                try:
                    files[path.relative_to(folder).as_posix()] = path.read_text("utf-8")
                except UnicodeDecodeError:
                    continue
        projects.append(files)
    return projects


def by_kind(projects: list[dict[str, str]]) -> dict[str, list[tuple[dict, str]]]:
    """(project, the file to mutate) for each kind."""
    out: dict[str, list] = {k: [] for k in MUTATED_KINDS}
    for project in projects:
        for name in project:
            kind = _kind(os.path.basename(name))
            if kind in out:
                out[kind].append((project, name))
    return out


# ------------------------------------------------------------------------- mutations


def _huge_int(rng: random.Random) -> str:
    return rng.choice("123456789") + "".join(rng.choice("0123456789") for _ in range(rng.choice((31, 4301, 6000))))


def _mutate_text(text: str, rng: random.Random, donors: list[str]) -> str:
    ops = [
        lambda t: _re_sub_one(t, r"\d+", lambda: _huge_int(rng), rng),
        lambda t: _insert(t, rng, rng.choice("[{(") * rng.choice((50, 150, 1200)) + rng.choice(("", "]}" * 3))),
        lambda t: _re_sub_one(t, r"[\w./-]+\.(?:py|json|yaml|yml|sh)", lambda: "x" * rng.choice((256, 300, 5000)) + ".json", rng),
        lambda t: t.replace("\r\n", "\n").replace("\n", rng.choice(("\r", "\r\n", "\n\r"))),
        lambda t: _insert(t, rng, rng.choice(("\x00", "\ufeff", "\ud800", "\u2028", "\x0c", "\t", "\\", "'", '"', "`", "$(", "${",
                                              "//", "/*", "#", "# cfgfix: ignore[", "<<EOF\n", "!!python/object:x\n",
                                              "*a", "&a ", "- ", ": ", ",", "]", "}", ")", "\\\n", "%", "{a,b}" * 20))),
        lambda t: t[: rng.randrange(len(t) + 1)],
        lambda t: _splice(t, rng.choice(donors) if donors else t, rng),
        lambda t: _delete(t, rng),
        lambda t: _duplicate(t, rng),
        lambda t: _re_sub_one(t, r"\b(true|false|True|False|bf16|fp16|auto|none|None|null)\b",
                              lambda: rng.choice(("yes", "no", "NaN", "-1", "1e309", "[]", "{}", '""', "~", "0x10", "1_000")), rng),
        lambda t: _re_sub_one(t, r"\d+", lambda: rng.choice(("-1", "0", "1e400", "nan", "-0", "2**64", "18446744073709551617")), rng),
        lambda t: _insert(t, rng, "\n" + "  " * rng.choice((60, 200, 600)) + "x: 1\n"),
    ]
    for _ in range(rng.choice((1, 1, 2, 3))):
        text = rng.choice(ops)(text)
    return text


def _re_sub_one(text: str, pattern: str, make, rng: random.Random) -> str:
    import re

    matches = list(re.finditer(pattern, text))
    if not matches:
        return text
    m = rng.choice(matches)
    return text[: m.start()] + make() + text[m.end():]


def _insert(text: str, rng: random.Random, piece: str) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + piece + text[at:]


def _splice(text: str, donor: str, rng: random.Random) -> str:
    a, b = rng.randrange(len(text) + 1), rng.randrange(len(donor) + 1)
    return text[:a] + donor[b: b + rng.randrange(1, 400)] + text[a:]


def _delete(text: str, rng: random.Random) -> str:
    if not text:
        return text
    a = rng.randrange(len(text))
    return text[:a] + text[a + rng.randrange(1, 60):]


def _duplicate(text: str, rng: random.Random) -> str:
    if not text:
        return text
    a = rng.randrange(len(text))
    piece = text[a: a + rng.randrange(1, 200)]
    return text[:a] + piece * rng.choice((2, 10, 200)) + text[a:]


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 8)):
        if not data:
            break
        i = rng.randrange(len(data))
        choice = rng.random()
        if choice < 0.5:
            data[i] = rng.randrange(256)
        elif choice < 0.8:
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        else:
            del data[i: i + rng.randrange(1, 16)]
    return bytes(data)


def mutate(project: dict[str, str], name: str, rng: random.Random, donors: list[str]) -> dict[str, bytes]:
    files = {n: t.encode("utf-8", "surrogatepass") for n, t in project.items()}
    if name.endswith((".py", ".sh")) or "run.sh" not in project and _kind(name) == "python":
        files.setdefault("run.sh", _LAUNCH.encode())
    text = _mutate_text(project[name], rng, donors)
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.25:
        data = _mutate_bytes(data, rng)
    files[name] = data
    return files


# --------------------------------------------------------------------------- running


class _Hang(BaseException):  # not an Exception: the engine's "a reader bug costs one file" handler must not catch it
    pass


def _alarm(_signum, _frame):
    raise _Hang()


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError:  # a mutated name the file system refuses is no input
            continue


def run_one(root: Path, files: dict[str, bytes], mutated: str) -> tuple[str, str]:
    """Write the project under `root` and run settings, check, fix (in memory), explain."""
    from cfgfix.engine import Engine
    from cfgfix.fixing import fix_file
    from cfgfix.settings import SettingsError, load_settings
    from cfgfix.training.resolve import training_setups
    from cfgfix.workspace import discover

    write_files(root, files)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        try:
            settings = load_settings(root)
            engine = Engine(settings, use_cache=bool(len(files) % 2))  # half the runs through the cache
        except SettingsError:
            return "ok", "settings error"
        found, _ = discover([Path(".")], settings)
        result = engine.run(found)
        if result.errors:
            return "internal", result.errors[0][:500]
        if engine.project is not None:
            training_setups(engine.project)
        for sf in found:
            if sf.relpath == mutated:
                fixed = fix_file(engine, sf, files[mutated], True)
                if fixed is not None:
                    fixed.diff()
        result = engine.run(found)  # warm: the cached path
        if result.errors:
            return "internal", result.errors[0][:500]
        return "ok", ""
    finally:
        os.chdir(cwd)


def fuzz(seconds: float, seed: int, out: Path | None = None, per_input: float = PER_INPUT_SECONDS,
         log=lambda m: None, only: tuple[str, ...] = (), big: bool = True) -> dict:
    """Mutated inputs round-robin over the kinds (or the `only` ones) until `seconds` pass; the
    summary. `big=False` keeps the generated kinds' sizes small (the test suite's slice)."""
    import shutil
    import sys as _sys

    from fuzz.hostile import GENERATED

    _sys.setrecursionlimit(max(_sys.getrecursionlimit(), 1000))
    rng = random.Random(seed)
    pools = by_kind(seed_projects())
    donors = [p[n] for kind in pools for p, n in pools[kind][:50]]
    counts: Counter = Counter()
    failures: list[Outcome] = []
    deadline = time.monotonic() + seconds
    previous = signal.signal(signal.SIGALRM, _alarm)
    base = Path(tempfile.mkdtemp(prefix="cfgfix-fuzz-"))
    kinds = [k for k in KINDS if (k in GENERATED or pools[k]) and (not only or k in only)]
    i = 0
    try:
        while time.monotonic() < deadline:
            kind = kinds[i % len(kinds)]
            i += 1
            if kind in GENERATED:
                files, name, runner = GENERATED[kind](pools, rng, donors, big)
            else:
                project, name = rng.choice(pools[kind])
                files, runner = mutate(project, name, rng, donors), None
            root = base / str(i)
            root.mkdir()
            counts[kind] += 1
            limit = per_input * SLOW_KINDS.get(kind, 1)
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                status, detail = (runner or run_one)(root, files, name)
            except _Hang:
                status, detail = "hang", f"over {limit:g} s"
            except RecursionError as exc:  # counted as a crash: the user would see a traceback
                status, detail = "crash", repr(exc)
            except Exception:  # noqa: BLE001 - every escape is a finding of the fuzzer
                status, detail = "crash", traceback.format_exc(limit=-6)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if status != "ok":
                outcome = Outcome(kind, status, detail, {k: v.decode("utf-8", "replace")[:2000] for k, v in files.items()}, name)
                failures.append(outcome)
                log(f"{status} ({kind}, {name}): {detail.strip().splitlines()[-1] if detail.strip() else ''}")
                if out is not None:
                    out.mkdir(parents=True, exist_ok=True)
                    dest = out / f"{status}-{len(failures):04d}"
                    shutil.copytree(root, dest, dirs_exist_ok=True, symlinks=True)
                    (dest / "FUZZ.txt").write_text(f"mutated: {name}\n{detail}\n")
            shutil.rmtree(root, ignore_errors=True)
    finally:
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(base, ignore_errors=True)
    statuses = Counter(f.status for f in failures)
    return {
        "seed": seed,
        "seconds": seconds,
        "inputs": sum(counts.values()),
        "inputs_per_kind": dict(counts),
        "crashes": statuses["crash"],
        "internal_errors": statuses["internal"],
        "hangs": statuses["hang"],
        "failures": [{"kind": f.kind, "status": f.status, "file": f.mutated, "detail": f.detail[-800:]} for f in failures],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-input", type=float, default=PER_INPUT_SECONDS)
    parser.add_argument("--out", type=Path, help="copy each failing project here")
    parser.add_argument("--kind", action="append", choices=KINDS, default=[],
                        help="fuzz only this kind of input (repeatable); every kind when left out")
    parser.add_argument("--small", action="store_true", help="the generated kinds at the test slice's sizes")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    summary = fuzz(args.seconds, args.seed, args.out, args.per_input, log=lambda m: print(m, file=sys.stderr),
                   only=tuple(args.kind), big=not args.small)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        per_kind = ", ".join(f"{k} {n}" for k, n in sorted(summary["inputs_per_kind"].items()))
        print(f"seed {summary['seed']}, {summary['seconds']:g} s: {summary['inputs']} inputs ({per_kind}); "
              f"crashes {summary['crashes']}, internal errors {summary['internal_errors']}, hangs {summary['hangs']}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))  # `fuzz.hostile`, as the test suite imports it
    raise SystemExit(main())
