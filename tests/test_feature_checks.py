"""Feature fallbacks (analysis/feature_checks.py) and CFX207's silence in them."""

import ast

from conftest import lint_project, write_project

from cfgfix.analysis.feature_checks import fallback_import_names, fallback_nodes

FEATURES = ("torch.amp.GradScaler", "torch.amp")
PIN = {"requirements.txt": "torch==2.6.0\n"}


def _lines(code: str) -> set[int]:
    tree = ast.parse(code)
    inside = fallback_nodes(tree, FEATURES)
    return {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and id(n) in inside}


def test_the_branch_taken_when_the_attribute_is_missing():
    code = ("if hasattr(torch.amp, 'GradScaler'):\n    a = torch.amp.GradScaler('cuda')\n"
            "else:\n    b = torch.cuda.amp.GradScaler()\n"
            "if not hasattr(torch.amp, 'GradScaler'):\n    c = torch.cuda.amp.GradScaler()\n"
            "d = torch.amp.GradScaler('cuda') if hasattr(torch.amp, 'GradScaler') else torch.cuda.amp.GradScaler()\n")
    assert _lines(code) == {4, 6, 7}  # line 7: its else part (checked below)
    tree = ast.parse(code)
    inside = fallback_nodes(tree, FEATURES)
    last = tree.body[-1].value
    assert id(last.orelse) in inside and id(last.body) not in inside


def test_unrelated_tests_and_handlers_are_not_fallbacks():
    code = ("if hasattr(model, 'module'):\n    m = model.module\nelse:\n    s = torch.cuda.amp.GradScaler()\n"
            "try:\n    import apex\nexcept ImportError:\n    s2 = torch.cuda.amp.GradScaler()\n"
            "try:\n    s3 = torch.amp.GradScaler('cuda')\nexcept ValueError:\n    s4 = torch.cuda.amp.GradScaler()\n")
    assert _lines(code) == set()


def test_an_import_fallback_binds_its_names():
    code = "try:\n    from torch.amp import autocast\nexcept ImportError:\n    from torch.cuda.amp import autocast as ac\n"
    assert fallback_import_names(ast.parse(code), FEATURES) == {"ac"}


def _codes(tmp_path, name, code):
    root = tmp_path / name
    write_project(root, {"train.py": code, **PIN})
    _, _, result = lint_project(root)
    return [f.code for f in result.findings]


def test_cfx207_speaks_outside_a_fallback_and_not_in_one(tmp_path):
    guarded = ("import torch\nif hasattr(torch.amp, 'GradScaler'):\n    s = torch.amp.GradScaler('cuda')\n"
               "else:\n    s = torch.cuda.amp.GradScaler()\n")
    plain = ("import torch\nif hasattr(model, 'module'):\n    model = model.module\n"
             "else:\n    s = torch.cuda.amp.GradScaler()\n")
    assert _codes(tmp_path, "guarded", guarded) == []
    assert _codes(tmp_path, "plain", plain) == ["CFX207"]


def test_an_early_return_on_the_feature_and_a_chain_of_hasattr():
    code = ("def make(enabled):\n"
            "    if hasattr(torch, 'amp') and hasattr(torch.amp, 'GradScaler'):\n"
            "        return torch.amp.GradScaler('cuda', enabled=enabled)\n"
            "    return torch.cuda.amp.GradScaler(enabled=enabled)\n"
            "def other():\n"
            "    if hasattr(model, 'module'):\n"
            "        return 1\n"
            "    return torch.cuda.amp.GradScaler()\n")
    assert _lines(code) == {4}
