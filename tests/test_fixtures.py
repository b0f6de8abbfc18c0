"""The five user stories in fixtures/: every finding their expected.json lists for the rules
built so far, no other finding, and nothing on their fixed twins."""

import json
import os
from pathlib import Path

import pytest

from cfgfix.fixing import fix_file
from cfgfix.rules.base import all_rules
from conftest import REPO, lint_project

STORIES = sorted(p.name for p in (REPO / "fixtures").iterdir() if (p / "expected.json").exists())
BUILT = {rule.code for rule in all_rules()}


def _expected(story: str) -> set[tuple[str, str, int]]:
    entries = json.loads((REPO / "fixtures" / story / "expected.json").read_text())
    return {(e["code"], e["path"], e["line"]) for e in entries if e["code"] in BUILT and "needs" not in e}


def _found(folder: Path) -> set[tuple[str, str, int]]:
    _, _, result = lint_project(folder)
    return {(f.code, f.path, f.span.line) for f in result.findings}


def test_there_are_five_stories():
    assert STORIES == ["flan-t5-xl-trainer", "mm-8b-47gb", "mm-encoder-8b", "qwen7b-lora", "sdxl-zero2-offload"]


@pytest.mark.parametrize("story", STORIES)
def test_story_findings(story):
    assert _found(REPO / "fixtures" / story / "project") == _expected(story)


@pytest.mark.parametrize("story", STORIES)
def test_fixed_twin_is_clean(story):
    assert _found(REPO / "fixtures" / story / "fixed") == set()


@pytest.mark.parametrize("story", STORIES)
def test_fixing_a_copy_leaves_only_findings_without_fix(story, tmp_path):
    """`fix --unsafe-fixes` on a copy: every fixable finding goes, files still parse."""
    import shutil

    copy = tmp_path / story
    shutil.copytree(REPO / "fixtures" / story / "project", copy)
    engine, files, result = lint_project(copy)
    cwd = os.getcwd()
    os.chdir(copy)
    try:
        for sf in files:
            if any(f.path == sf.display and f.fix for f in result.findings):
                outcome = fix_file(engine, sf, sf.path.read_bytes(), unsafe=True)
                assert outcome.changed
                assert not [f for f in outcome.remaining if f.fix is not None]
    finally:
        os.chdir(cwd)
