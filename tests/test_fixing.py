"""Fix mechanics: overlap resolution, the re-parse check, atomic writes and links."""


import pytest

from cfgfix.core import Edit, Finding, Fix, Severity, Span
from cfgfix.fixing import WriteError, apply_edits, select_fixes, still_parses, write_atomically


def _finding(code, start, end, content, line=1):
    edit = Edit("f.py", start, end, content)
    return Finding(code, code.lower(), "m", Severity.INFO, Span("f.py", line, start + 1, line, end + 1, start, end), fix=Fix((edit,), "d"))


def test_overlapping_fixes_first_by_position_wins():
    a = _finding("CFX101", 0, 5, "x")
    b = _finding("CFX103", 3, 8, "y")
    c = _finding("CFX104", 8, 9, "z")
    assert select_fixes([b, c, a]) == [a, c]


def test_identical_edits_from_two_rules_apply_once():
    a = _finding("CFX101", 2, 6, "")
    b = _finding("CFX104", 2, 6, "")
    chosen = select_fixes([a, b])
    assert chosen == [a, b]
    edits = {e for f in chosen for e in f.fix.edits}
    assert apply_edits("0123456789", list(edits)) == "016789"


def test_two_insertions_at_one_point_are_not_both_taken():
    a = _finding("CFX101", 4, 4, "a")
    b = _finding("CFX102", 4, 4, "b")
    assert select_fixes([a, b]) == [a]


def test_reparse_check_per_kind():
    assert still_parses("python", "x = 1\n")
    assert not still_parses("python", "x = (\n")
    assert still_parses("json", '{"a": 1}')
    assert not still_parses("json", '{"a": 1,}')
    assert still_parses("yaml", "a: 1\n")
    assert not still_parses("yaml", "a: [1\n")


def test_atomic_write_keeps_mode_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("old\n")
    path.chmod(0o640)
    write_atomically(path, b"new\n", tmp_path)
    assert path.read_bytes() == b"new\n"
    assert (path.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_write_through_a_link_inside_the_project_keeps_the_link(tmp_path):
    target = tmp_path / "real.py"
    target.write_text("old\n")
    link = tmp_path / "train.py"
    link.symlink_to(target)
    write_atomically(link, b"new\n", tmp_path)
    assert link.is_symlink() and target.read_text() == "new\n"


def test_link_out_of_the_project_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "shared.py"
    target.write_text("old\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").symlink_to(target)
    with pytest.raises(WriteError, match="outside the project"):
        write_atomically(project / "train.py", b"new\n", project)
    assert target.read_text() == "old\n"


def test_a_fix_that_would_break_the_file_is_dropped(in_tmp, monkeypatch):
    """If a rule produced a broken edit, the fixer reports it and writes valid code."""
    from cfgfix.fixing import fix_file
    from cfgfix.rules.loading import cfx101_redundant_dtype_cast as loading
    from conftest import lint_project, write_project

    source = (
        "import torch\nfrom transformers import AutoModel\n"
        "model = AutoModel.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
        "model = model.to(torch.bfloat16)\n"
    )
    write_project(in_tmp, {"train.py": source})
    broken = lambda src, mc: [Edit(src.path, 0, 6, "import (")]  # noqa: E731
    monkeypatch.setattr(loading, "drop_call_edits", broken)
    engine, files, result = lint_project(in_tmp)
    outcome = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=True)
    assert not outcome.changed
    assert outcome.dropped == ["CFX101 at line 4"]


def test_an_edit_shared_by_two_fixes_is_applied_once(tmp_path):
    """Two rules fixing one line with the same deletion (one of them with an extra edit)
    must delete it once, not twice (a second deletion would eat the next line)."""
    from types import SimpleNamespace

    from cfgfix.fixing import fix_file

    text = "a = load()\nmodel.half()\nx = 1\n"
    shared = Edit("f.py", 11, 24, "")
    extra = Edit("f.py", 9, 9, "dtype=1")
    rounds = []

    def lint_one(sf, data, sources):
        if rounds:
            return []
        rounds.append(1)
        span = Span("f.py", 2, 1, 2, 13, 11, 23)
        return [
            Finding("CFX102", "a", "m", Severity.INFO, span, fix=Fix((extra, shared), "d")),
            Finding("CFX104", "b", "m", Severity.INFO, span, fix=Fix((shared,), "d")),
        ]

    engine = SimpleNamespace(lint_one=lint_one)
    sf = SimpleNamespace(display="f.py", kind="python")
    outcome = fix_file(engine, sf, text.encode(), unsafe=True)
    assert outcome.fixed == "a = load(dtype=1)\nx = 1\n"


def test_a_config_fix_may_change_only_the_values_it_edits():
    """The fixer's data check: load the config before and after; every changed value must sit
    under an edited node (a renamed block's children move with it; an inserted key lands in
    the mapping the edit is in)."""
    from cfgfix.core import Edit
    from cfgfix.documents.config_edits import change_is_local

    def check(fmt, old, start, end, content):
        new = old[:start] + content + old[end:]
        return change_is_local(fmt, old, new, [Edit("x", start, end, content)])

    yaml_text = "a: 1\nb: 2\nzero_optimisation:\n  stage: 3\n"
    assert check("yaml", yaml_text, 3, 4, "5")  # a: 5
    assert check("yaml", yaml_text, 10, 27, "zero_optimization")  # the rename moves `stage` too
    assert check("yaml", yaml_text, len(yaml_text), len(yaml_text), "c: 4\n")  # an inserted key
    aliased = "a: &size 1\nb: *size\n"
    assert not check("yaml", aliased, 9, 10, "5")  # edits a, but b (an alias of it) changes too
    json_text = '{"bf16": {"enabled": false}, "fp16": {"enabled": true}}'
    start = json_text.index("true")
    assert check("json", json_text, start, start + 4, '"auto"')
    # edits fp16, but a later duplicate key changes bf16 (the last one wins)
    assert not check("json", json_text, start, start + 4, 'true}, "bf16": {"enabled": true')
