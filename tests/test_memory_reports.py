"""bench/memory_reports is well formed and its scorer states every row with flags that
`cfgfix estimate` accepts. Offline: it parses the flags with the CLI's own parser and never
runs an estimate (that is bench/memory_reports/score.py's job, outside the test suite)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cfgfix.commands import cli
from cfgfix.memory.gpus import find_gpu

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "bench" / "memory_reports"
ROWS = [json.loads(line) for line in (FOLDER / "manifest.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
TO_GIB = {"MiB": 1 / 1024, "bytes": 1 / 2**30}


def _score_module():
    spec = importlib.util.spec_from_file_location("memory_reports_score", FOLDER / "score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_set_meets_the_issue_s_size():
    assert len(ROWS) >= 40
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    assert sum(r["outcome"] == "oom" for r in ROWS) >= 12


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_row_is_well_formed(row):
    assert row["outcome"] in ("oom", "ran")
    assert row["source"]["url"].startswith("https://")
    assert row["quote"]["setup"] and row["quote"]["outcome"] and row["uncertain"]
    setup = row["setup"]
    assert find_gpu(setup["gpu"]) is not None, setup["gpu"]
    assert set(setup["model_ref"]) <= {"catalog", "params"} and setup["model_ref"]
    measured = row["measured"]
    if measured is not None:
        assert row["outcome"] == "ran"
        factor = next((f for unit, f in TO_GIB.items() if measured["unit"].startswith(unit)), None)
        if factor is not None:
            assert measured["gib"] == pytest.approx(measured["value"] * factor, abs=0.01)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_scorer_flags_parse_with_the_estimate_command(row):
    flags, _ = _score_module().flags_for(row)
    ctx = cli.commands["estimate"].make_context("estimate", list(flags))
    assert ctx.params["gpu"] == row["setup"]["gpu"]
    assert ctx.params["num_gpus"] == row["setup"]["num_gpus"]
    assert ctx.params["checkpointing"] is bool(row["setup"]["gradient_checkpointing"])
