"""The generated rule manifest matches the rule classes, and a run imports only the rule
modules its files need."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from cfgfix.rules import manifest
from cfgfix.rules.base import rule_modules


def test_manifest_is_current():
    current = manifest.render()
    stored = manifest.DATA.read_text(encoding="utf-8")
    assert stored == current, "the rule manifest is stale: run `python -m cfgfix.rules.manifest`"


def test_manifest_lists_every_rule_module():
    assert sorted({entry.module for entry in manifest.entries()}) == sorted(rule_modules())


def test_rule_by_code_loads_one_module():
    probe = textwrap.dedent("""
        import json, sys
        from cfgfix.rules.base import rule_by_code
        rule = rule_by_code("cfx103")
        loaded = sorted(m for m in sys.modules if m.startswith("cfgfix.rules.") and ".cfx" in m)
        print(json.dumps([rule.code, loaded]))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    code, loaded = json.loads(out)
    assert code == "CFX103"
    assert loaded == ["cfgfix.rules.loading.cfx103_move_dispatched_model"]


def _loaded_after_check(tmp_path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    probe = textwrap.dedent("""
        import json, sys
        from cfgfix.cli import main
        try:
            main(["check", "--no-cache", "--quiet", *sys.argv[1:]])
        except SystemExit:
            pass
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("cfgfix.rules.") and ".cfx" in m)))
    """)
    proc = subprocess.run([sys.executable, "-c", probe, *files], capture_output=True, text=True, cwd=tmp_path)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_run_imports_no_rule_for_a_file_without_triggers(tmp_path):
    assert _loaded_after_check(tmp_path, {"util.py": "def add(a, b):\n    return a + b\n"}) == []


def test_a_run_imports_the_rules_whose_triggers_the_file_holds(tmp_path):
    source = (
        "import torch\nfrom transformers import AutoModel\n"
        "model = AutoModel.from_pretrained('m', device_map='auto')\nmodel.to('cuda')\n"
    )
    loaded = _loaded_after_check(tmp_path, {"train.py": source})
    assert "cfgfix.rules.loading.cfx103_move_dispatched_model" in loaded
    assert not any(".deepspeed." in m or ".accelerate." in m or ".setup." in m for m in loaded)
