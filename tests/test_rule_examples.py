"""One test runs every rule's embedded VALID / INVALID examples through the real engine:
a temporary project holding the example (plus its launch scripts and pins), `check`, and
for INVALID examples the text that `fix --unsafe-fixes` writes."""

import os

import pytest

from cfgfix.fixing import fix_file
from cfgfix.rules.base import all_rules
from conftest import lint_project, write_project

CASES = [
    pytest.param(rule, kind, index, example, id=f"{rule.code}-{kind}-{index}")
    for rule in all_rules()
    for kind, examples in (("valid", rule.VALID), ("invalid", rule.INVALID))
    for index, example in enumerate(examples)
]


def test_every_rule_has_examples_of_both_kinds():
    for rule in all_rules():
        if rule.code == "CFX902":  # engine-emitted: covered by tests/test_suppressions.py
            continue
        assert rule.VALID, f"{rule.code} has no VALID example"
        assert rule.INVALID, f"{rule.code} has no INVALID example"
        for example in rule.VALID + rule.INVALID:
            assert example.why, f"{rule.code}: every example says which case it guards"


@pytest.mark.parametrize("rule, kind, index, example", CASES)
def test_example(tmp_path, rule, kind, index, example):
    write_project(tmp_path, {example.path: example.code, **example.files})
    engine, files, result = lint_project(tmp_path)
    ours = [f for f in result.findings if f.code == rule.code and f.path == example.path]
    if kind == "valid":
        assert not ours, f"near miss flagged: {example.why}\n{[f.message for f in ours]}"
        return
    assert [f.span.line for f in ours] == [example.line], f"{example.why}: {[(f.span.line, f.message) for f in ours]}"
    if example.fixed is None:
        assert rule.fix_availability in ("none", "sometimes") or ours[0].fix is None or rule.code == "CFX901"
        return
    assert ours[0].fix is not None, f"{rule.code} offers no fix for: {example.why}"
    sf = next(f for f in files if f.display == example.path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        outcome = fix_file(engine, sf, sf.path.read_bytes(), unsafe=True)
    finally:
        os.chdir(cwd)
    assert outcome.fixed == example.fixed
    assert not [f for f in outcome.remaining if f.code == rule.code]
