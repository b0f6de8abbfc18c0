"""Jupyter notebooks: code cells read as one Python document (IPython syntax masked with
positions kept), reported per cell like ruff, fixed inside the cells with the rest of the
JSON kept byte for byte; a notebook gives what its flattened `.py` twin gives."""

import json
import re
import shutil

import pytest

from cfgfix.documents.notebook import Notebook, NotebookError, mask
from cfgfix.documents.text import SourceText
from conftest import REPO, lint_project, write_project


def notebook(*cells, language="python", indent=1) -> str:
    """An nbformat-4 notebook; a str cell is code, ("markdown", text) another kind."""
    out = []
    for cell in cells:
        kind, text = ("code", cell) if isinstance(cell, str) else cell
        entry = {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
        if kind == "code":
            entry = {"cell_type": "code", "execution_count": 3, "metadata": {"scrolled": True},
                     "outputs": [{"name": "stdout", "output_type": "stream", "text": ["ok ü\n"]}],
                     "source": entry["source"]}
        out.append(entry)
    meta = {"kernelspec": {"display_name": "Python 3", "language": language, "name": "python3"},
            "language_info": {"name": language}}
    return json.dumps({"cells": out, "metadata": meta, "nbformat": 4, "nbformat_minor": 5},
                      indent=indent, ensure_ascii=False) + "\n"


def as_notebook(code: str) -> str:
    """`code` as a notebook whose joined cells are exactly `code`: a cell starts at every
    blank line before a top-level statement (how people split scripts into cells)."""
    import ast

    lines = code.splitlines(keepends=True)
    firsts = [min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) - 1 for n in ast.parse(code).body]
    starts = [0] + [i for i in firsts[1:] if lines[i - 1].strip() == ""]
    cells = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        text = "".join(lines[a:b])
        cells.append(text[:-1] if text.endswith("\n") and not text.endswith("\n\n") else text)
    # Each cell but the last ends without its newline, which the joining puts back.
    nb = notebook(("markdown", "# Fine-tune\n\nSteps below."), *cells)
    assert Notebook.from_bytes("x.ipynb", nb.encode()).code == code
    return nb


def _masked(*cells):
    nb = Notebook.from_bytes("n.ipynb", notebook(*cells).encode())
    return nb.masked


# -- reading ---------------------------------------------------------------------------------
def test_magics_are_masked_with_positions_kept():
    masked = _masked(
        "!pip install -q transformers==4.44.2 peft\n%matplotlib inline\nimport torch",
        "files = !ls data\nfor f in files:\n    !echo {f}\nmodel?\n",
    )
    assert masked == (
        "0#ip install -q transformers==4.44.2 peft\n0#atplotlib inline\nimport torch\n"
        "files = 0#s data\nfor f in files:\n    0#cho {f}\n#odel?\n"
    )
    compile(masked, "n", "exec")


def test_cell_magics_other_languages_are_comments_python_ones_are_code():
    masked = _masked("%%bash\npip install x\nls -la\n", "%%time\nx = model.to(device)\n")
    assert masked == "#%bash\n#ip install x\n#s -la\n0#time\nx = model.to(device)\n"


def test_percent_inside_brackets_and_strings_is_python():
    """Near miss: a line starting with `%` inside parentheses or a string is Python."""
    code = 'y = (a\n     % b)\ns = """\n!not a shell line\n"""\nz = 3 \\\n    % 2\n'
    nb = Notebook.from_bytes("n.ipynb", notebook(code).encode())
    assert nb.masked == nb.code
    compile(nb.masked, "n", "exec")


def test_magic_continuation_lines_are_masked():
    masked = _masked("!pip install \\\n    peft\nx = 1")
    assert masked == "0#ip install \\\n    #eft\nx = 1\n"


def test_not_a_notebook_is_a_clear_error():
    with pytest.raises(NotebookError, match="invalid JSON"):
        Notebook.from_bytes("n.ipynb", b"{not json")
    with pytest.raises(NotebookError, match="cells"):
        Notebook.from_bytes("n.ipynb", b'{"worksheets": []}')


def test_install_lines_are_requirements():
    nb = Notebook.from_bytes("n.ipynb", notebook(
        "%pip install -q -U transformers==4.44.2 'peft>=0.12' -r req.txt --index-url https://x\n"
        "!python -m pip install accelerate==0.33.0  # pinned\n!pip list\n").encode())
    assert nb.install_lines() == ["transformers==4.44.2", "peft>=0.12", "accelerate==0.33.0"]


# -- the engine ----------------------------------------------------------------------------
LOAD = (
    "import torch\n"
    "from transformers import AutoModelForCausalLM\n"
)
MOVE = (
    'model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto", torch_dtype=torch.bfloat16)\n'
    "model.to('cuda')\n"
)


def test_notebook_findings_are_reported_per_cell(tmp_path):
    write_project(tmp_path, {"nb.ipynb": notebook(("markdown", "model.to('cuda')\n"), "%pip install -q peft\n" + LOAD, MOVE)})
    _, files, result = lint_project(tmp_path)
    assert [sf.kind for sf in files] == ["notebook"]
    [finding] = result.findings  # the markdown cell's text is not code
    assert (finding.code, finding.span.line, finding.span.column) == ("CFX103", 5, 1)  # joined lines

    from cfgfix.report import ReportContext, render
    from cfgfix.rules.base import all_rules

    ctx = ReportContext(result.sources, all_rules())
    text = render("text", result.findings, ctx)
    assert text.startswith("nb.ipynb:cell 3:2:1: CFX103 [*]")
    assert "(cell 3, line 1)" in text  # the message names the load's cell line too
    assert "\n2 | model.to('cuda')\n" in text  # the frame numbers lines per cell
    [item] = json.loads(render("json", result.findings, ctx))
    assert (item["cell"], item["location"], item["end_location"]) == (3, {"row": 2, "column": 1}, {"row": 2, "column": 17})
    assert item["fix"]["edits"][0]["location"]["row"] == 2
    sarif = json.loads(render("sarif", result.findings, ctx))
    location = sarif["runs"][0]["results"][0]["locations"][0]
    assert location["properties"]["cell"] == 3 and location["properties"]["cellRegion"]["startLine"] == 2
    assert "(cell 3%3A2%3A1)" in render("github", result.findings, ctx)  # lines: tests/test_notebook_locations.py


def test_python_files_keep_a_null_cell(tmp_path):
    write_project(tmp_path, {"train.py": LOAD + MOVE})
    _, _, result = lint_project(tmp_path)
    from cfgfix.report import ReportContext, render
    from cfgfix.rules.base import all_rules

    [item] = json.loads(render("json", result.findings, ReportContext(result.sources, all_rules())))
    assert item["cell"] is None and item["location"] == {"row": 4, "column": 1}


def test_broken_notebook_is_a_parse_error_and_other_kernels_are_skipped(tmp_path):
    write_project(tmp_path, {
        "broken.ipynb": '{"cells": [',
        "empty.ipynb": "",  # near miss: no code at all (an empty .py is not reported either)
        "r.ipynb": notebook("model.to('cuda')\nlibrary(torch)\n", language="R"),
        "syntax.ipynb": notebook(LOAD + MOVE, "def f(:\n"),  # parsed: a rule's trigger words are in it
    })
    _, _, result = lint_project(tmp_path)
    found = {(f.path, f.code) for f in result.findings}
    # a broken cell is left out (a warning at its cell); the other cells are still checked
    assert found == {("broken.ipynb", "CFX901"), ("syntax.ipynb", "CFX901"), ("syntax.ipynb", "CFX103")}
    severities = {(f.path, f.code): f.severity.value for f in result.findings}
    assert severities[("broken.ipynb", "CFX901")] == "error" and severities[("syntax.ipynb", "CFX901")] == "warning"
    from cfgfix.report import ReportContext, render
    from cfgfix.rules.base import all_rules

    text = render("text", result.findings, ReportContext(result.sources, all_rules()))
    assert "syntax.ipynb:cell 2:1:" in text


def test_notebook_install_lines_are_version_evidence(tmp_path):
    """CFX102 depends on transformers' default dtype (float32 before 5): a `%pip install`
    pin in the notebook decides, even when the project pins nothing."""
    cast = (
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        'model = AutoModelForCausalLM.from_pretrained("gpt2")\nmodel = model.half()\n'
    )
    write_project(tmp_path, {
        "old.ipynb": notebook("%pip install transformers==4.44.2", cast),
        "new.ipynb": notebook("!pip install -q transformers==5.0.0", cast),
    })
    _, _, result = lint_project(tmp_path)
    found = [f for f in result.findings if f.code == "CFX102"]
    assert [f.path for f in found] == ["old.ipynb"]
    assert "4.44.2" in found[0].message


# -- fixing ----------------------------------------------------------------------------------
def _without_code_sources(text: str) -> dict:
    data = json.loads(text)
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            cell.pop("source")
    return data


def test_fix_edits_only_the_cell_and_keeps_every_other_byte(tmp_path, monkeypatch):
    from cfgfix.fixing import fix_file

    original = notebook(LOAD, "# not a cell to touch\nx = 1 # ü", MOVE + "print('done')", indent=2)
    write_project(tmp_path, {"nb.ipynb": original})
    engine, files, _ = lint_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    outcome = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=False)
    assert outcome.changed and [f.code for f in outcome.applied] == ["CFX103"]
    fixed = outcome.fixed
    assert _without_code_sources(fixed) == _without_code_sources(original)
    # Byte for byte: the only difference is the removed line of the third cell.
    removed = [line for line in original.splitlines(keepends=True) if line not in fixed.splitlines(keepends=True)]
    assert removed == ['        "model.to(\'cuda\')\\n",\n']
    assert json.loads(fixed)["cells"][2]["source"] == [MOVE.splitlines(keepends=True)[0], "print('done')"]
    assert outcome.remaining == []


def test_fix_keeps_a_single_string_source_and_ascii_escapes(tmp_path, monkeypatch):
    from cfgfix.fixing import fix_file

    data = json.loads(notebook(LOAD, "# é\n" + MOVE))
    data["cells"][1]["source"] = "".join(data["cells"][1]["source"])  # nbformat allows one string
    original = json.dumps(data, indent=1, ensure_ascii=True)
    write_project(tmp_path, {"nb.ipynb": original})
    engine, files, _ = lint_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    outcome = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=False)
    assert json.loads(outcome.fixed)["cells"][1]["source"] == "# \u00e9\n" + MOVE.splitlines(keepends=True)[0]
    assert "\\u00e9" in outcome.fixed and outcome.fixed.isascii()
    assert outcome.fixed.count("\n") == original.count("\n")


def test_fix_that_rewraps_a_loop_keeps_the_magic_line(tmp_path, monkeypatch):
    """CFX303's fix re-indents a loop built from the masked text: the `!nvidia-smi` inside it
    comes back as written, not as its mask."""
    from cfgfix.fixing import fix_file

    code = (
        "import torch\n\n"
        "def evaluate(model, loader):\n"
        "    model.eval()\n"
        "    total = 0.0\n"
        "    for batch in loader:\n"
        "        !nvidia-smi\n"
        "        out = model(**batch)\n"
        "        total += out.loss.item()\n"
        "    return total\n"
    )
    write_project(tmp_path, {"nb.ipynb": notebook(code)})
    engine, files, result = lint_project(tmp_path)
    assert [f.code for f in result.findings] == ["CFX303"]
    monkeypatch.chdir(tmp_path)
    outcome = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=True)
    fixed_code = Notebook.from_text(SourceText("nb.ipynb", outcome.fixed)).code
    assert "            !nvidia-smi\n" in fixed_code and "0#" not in fixed_code
    assert "    with torch.no_grad():\n" in fixed_code


def test_fix_across_cells_is_refused():
    nb = Notebook.from_bytes("n.ipynb", notebook("a = 1\n", "b = 2\n").encode())
    from cfgfix.core import Edit

    with pytest.raises(NotebookError, match="two cells"):
        nb.apply([Edit("n.ipynb", 2, 8, "")])


# -- twins: the fixtures' training scripts as notebooks ----------------------------------
STORY_SCRIPTS = sorted(
    (story.name, path.name)
    for story in (REPO / "fixtures").iterdir() if (story / "expected.json").exists()
    for path in (story / "project").glob("*.py")
)


def _key(finding, related_paths=True):
    message = re.sub(r"cell \d+, line \d+|line \d+", "line N", finding.message)
    return (finding.code, finding.span.line, finding.span.column, finding.span.end_line, finding.span.end_column,
            message, finding.fix.applicability.value if finding.fix else None)


@pytest.mark.parametrize("story,script", STORY_SCRIPTS)
def test_notebook_twin_of_each_fixture_script(story, script, tmp_path, monkeypatch):
    """Same findings (code, joined position, message up to line references, fix) and the same
    fixed code as the `.py` it was made from. Findings that need a launch of the script
    (CFX105's world size) are the `.py`'s alone: nothing launches a notebook."""
    from cfgfix.fixing import fix_file

    project = tmp_path / story
    shutil.copytree(REPO / "fixtures" / story / "project", project)
    code = (project / script).read_text()
    (project / (script[:-3] + "_nb.ipynb")).write_text(as_notebook(code), encoding="utf-8")
    engine, files, result = lint_project(project)
    py = [f for f in result.findings if f.path == script and not any(r.span.path != script for r in f.related)]
    nb = [f for f in result.findings if f.path == script[:-3] + "_nb.ipynb"]
    assert sorted(map(_key, nb)) == sorted(map(_key, py))
    monkeypatch.chdir(project)
    by_name = {sf.display: sf for sf in files}
    fixed_py = fix_file(engine, by_name[script], by_name[script].path.read_bytes(), unsafe=True)
    fixed_nb = fix_file(engine, by_name[script[:-3] + "_nb.ipynb"], by_name[script[:-3] + "_nb.ipynb"].path.read_bytes(), unsafe=True)
    if fixed_py is None or not fixed_py.changed:
        assert fixed_nb is None or not fixed_nb.changed
        return
    nb_code = Notebook.from_text(SourceText("x.ipynb", fixed_nb.fixed)).code
    py_only = {f.code for f in fixed_py.applied} - {f.code for f in fixed_nb.applied}
    if not py_only:
        assert nb_code == fixed_py.fixed
    assert _without_code_sources(fixed_nb.fixed) == _without_code_sources(fixed_nb.original)


def test_twins_cover_findings():
    """The twin test is not vacuous: the fixture scripts carry findings of several rules."""
    import tempfile
    from pathlib import Path

    codes = set()
    with tempfile.TemporaryDirectory() as tmp:
        for story in {s for s, _ in STORY_SCRIPTS}:
            shutil.copytree(REPO / "fixtures" / story / "project", Path(tmp) / story)
            _, _, result = lint_project(Path(tmp) / story)
            codes |= {f.code for f in result.findings if f.path.endswith(".py")}
    assert len(codes) >= 6


def test_fix_diff_is_per_cell(tmp_path, monkeypatch):
    from cfgfix.fixing import fix_file

    write_project(tmp_path, {"nb.ipynb": notebook(LOAD, MOVE)})
    engine, files, _ = lint_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    diff = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=False).diff()
    assert diff.startswith("--- a/nb.ipynb:cell 2\n+++ b/nb.ipynb:cell 2\n")
    assert "-model.to('cuda')\n" in diff and '"source"' not in diff


def test_check_does_not_pay_for_notebooks_it_does_not_see(tmp_path):
    """Reading notebooks must not slow a run without them: the module loads only when a
    notebook needs it, not for reporting a `.py` finding."""
    import subprocess
    import sys

    write_project(tmp_path, {"train.py": LOAD + MOVE})
    # main() given its arguments returns by SystemExit (the entry point itself ends the
    # process without teardown once it has reported, so nothing could print after it)
    code = ("import sys\nfrom cfgfix.cli import main\n"
            "try:\n main(['check', '--no-cache', '-q', '.'])\nexcept SystemExit: pass\n"
            "print('cfgfix.documents.notebook' in sys.modules, 'cfgfix.engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip().endswith("False True"), out.stdout + out.stderr


def test_broken_cells_are_left_out_and_the_rest_is_checked(tmp_path):
    """Jupyter runs each cell on its own: a fragment, or a cell IPython dedents, fails alone.
    Near miss: `pip install x` (IPython's automagic for %pip) is masked, not a broken cell."""
    write_project(tmp_path, {"nb.ipynb": notebook(
        "pip install -q peft\n" + LOAD,
        "--resume_from_checkpoint ./out/checkpoint-310 \\\n",
        "  history = {}\n  history['a'] = 1\n",
        MOVE,
    )})
    _, _, result = lint_project(tmp_path)
    from cfgfix.report import ReportContext, render
    from cfgfix.rules.base import all_rules

    text = render("text", result.findings, ReportContext(result.sources, all_rules()))
    assert sorted((f.code, f.severity.value) for f in result.findings) == [
        ("CFX103", "warning"), ("CFX901", "warning"), ("CFX901", "warning")]
    assert "nb.ipynb:cell 2:1:1: CFX901" in text and "nb.ipynb:cell 3:1:1: CFX901" in text
    assert "nb.ipynb:cell 4:2:1: CFX103" in text
