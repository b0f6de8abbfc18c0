#!/usr/bin/env python3
"""Write `accepted.jsonl`: config dict literals from DeepSpeed's unit tests that the tests run
(a false-error check: cfgfix should report no error on them).

    python bench/deepspeed_tests/harvest_accepted.py GIT_DIR COMMIT

It reads every tests/unit/**/*.py at COMMIT with `git show` and `ast`, and keeps each dict
literal assigned to a name containing "config" that `ast.literal_eval` reads, that holds a
batch size key, and that is not inside a `with pytest.raises(...)` block. Caveat, written in
each row: a test may change the dict before use, or assert a failure elsewhere; the rows
cfgfix flags are read by hand (score.py --cases accepted.jsonl --details)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path


def main(git_dir: str, commit: str) -> None:
    names = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", commit, "--", "tests/unit"],
                           capture_output=True, text=True, check=True).stdout.split()
    rows, seen = [], set()
    for name in sorted(n for n in names if n.endswith(".py")):
        text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{name}"], capture_output=True,
                              text=True).stdout
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        raising = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any("raises" in ast.unparse(item.context_expr) for item in node.items):
                raising.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and id(node) not in raising):
                continue
            if not any(isinstance(t, ast.Name) and "config" in t.id.lower() for t in node.targets):
                continue
            try:
                config = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                continue
            if not (isinstance(config, dict) and {"train_batch_size", "train_micro_batch_size_per_gpu"} & config.keys()):
                continue
            key = json.dumps(config, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"id": f"a{len(rows) + 1:03d}", "source": f"{name}:{node.lineno}", "world_size": None,
                         "expected": "accept", "config": config})
    out = Path(__file__).with_name("accepted.jsonl")
    out.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    print(f"{len(rows)} configs -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
