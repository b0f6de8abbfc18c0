"""Notebook findings where viewers look: SARIF regions, GitHub annotations, reviewdog and PR
review comments address the .ipynb file as stored (its JSON lines), never a line of the
joined cells; a finding no JSON line can show goes to the review body."""

import json

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.report import ReportContext, render
from cfgfix.rules.base import all_rules
from conftest import lint_project, write_project
from test_notebook import LOAD, MOVE, notebook
from test_review import _git


def _nb():
    return notebook(("markdown", "model.to('cuda')\n"), "%pip install -q peft\n" + LOAD, MOVE)


def _result(tmp_path, text=None):
    write_project(tmp_path, {"nb.ipynb": text or _nb()})
    _, _, result = lint_project(tmp_path)
    return result, (tmp_path / "nb.ipynb").read_text(encoding="utf-8")


def _at(text, line, column, end_line, end_column):
    lines = text.split("\n")
    assert line == end_line
    return lines[line - 1][column - 1:end_column - 1]


def test_sarif_region_is_the_json_line_with_the_cell_as_property(tmp_path):
    result, text = _result(tmp_path)
    ctx = ReportContext(result.sources, all_rules())
    [res] = json.loads(render("sarif", result.findings, ctx))["runs"][0]["results"]
    location = res["locations"][0]
    region = location["physicalLocation"]["region"]
    assert _at(text, region["startLine"], region["startColumn"], region["endLine"], region["endColumn"]) == "model.to('cuda')"
    assert region["startLine"] != 2  # not the cell's own line number
    assert location["properties"] == {"cell": 3, "cellRegion": {"startLine": 2, "startColumn": 1, "endLine": 2, "endColumn": 17}}
    # the fix's replacement, applied to the stored file, is what `cfgfix fix` writes
    [change] = res["fixes"][0]["artifactChanges"]
    [replacement] = change["replacements"]
    deleted = replacement["deletedRegion"]
    lines = text.splitlines(keepends=True)
    start = sum(map(len, lines[:deleted["startLine"] - 1])) + deleted["startColumn"] - 1
    end = sum(map(len, lines[:deleted["endLine"] - 1])) + deleted["endColumn"] - 1
    patched = text[:start] + replacement["insertedContent"]["text"] + text[end:]
    CliRunner().invoke(cli, ["fix", "--no-cache", str(tmp_path / "nb.ipynb")], catch_exceptions=False)
    assert patched == (tmp_path / "nb.ipynb").read_text(encoding="utf-8") != text
    json.loads(patched)  # still a notebook


def test_github_annotation_is_on_the_json_line(tmp_path):
    result, text = _result(tmp_path)
    out = render("github", result.findings, ReportContext(result.sources, all_rules()))
    props = dict(p.split("=", 1) for p in out.split(" ", 1)[1].split("::", 1)[0].split(","))
    assert props["title"] == "CFX103 move-dispatched-model (cell 3%3A2%3A1)"
    assert _at(text, int(props["line"]), int(props["col"]), int(props["endLine"]), int(props["endColumn"])) == "model.to('cuda')"


def test_rdjson_location_is_the_json_line(tmp_path):
    result, text = _result(tmp_path)
    [diag] = json.loads(render_rdjson(result))["diagnostics"]
    start, end = diag["location"]["range"]["start"], diag["location"]["range"]["end"]
    assert _at(text, start["line"], start["column"], end["line"], end["column"]) == "model.to('cuda')"


def render_rdjson(result):
    from cfgfix.report.rdjson import render as rd

    return rd(result.findings, ReportContext(result.sources, all_rules()))


def test_escaped_text_maps_to_the_escape_in_the_file(tmp_path):
    # `\u00e9` and `\"` in the JSON: columns count the file's characters, not the cell's
    code = "print(\"é\"); model.to('cuda')\n"
    text = notebook(LOAD + 'model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto")\n' + code)
    text = text.replace("é", "\\u00e9")
    result, stored = _result(tmp_path, text)
    [res] = json.loads(render("sarif", result.findings, ReportContext(result.sources, all_rules())))["runs"][0]["results"]
    region = res["locations"][0]["physicalLocation"]["region"]
    assert _at(stored, region["startLine"], region["startColumn"], region["endLine"], region["endColumn"]) == "model.to('cuda')"


def test_unmappable_cell_points_at_the_cell_never_a_guessed_line(tmp_path, monkeypatch):
    from cfgfix.documents import notebook as nbmod

    monkeypatch.setattr(nbmod, "_cell_file_offsets", lambda notebook: {})
    result, text = _result(tmp_path)
    [res] = json.loads(render("sarif", result.findings, ReportContext(result.sources, all_rules())))["runs"][0]["results"]
    region = res["locations"][0]["physicalLocation"]["region"]
    assert text.split("\n")[region["startLine"] - 1].strip().startswith('"source"')
    assert "fixes" not in res  # no JSON edit can be computed for it


# -- the review bot ----------------------------------------------------------------------
@pytest.fixture
def nb_repo(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "nb.ipynb").write_text(notebook("%pip install -q peft\n" + LOAD, "x = 1\n"), encoding="utf-8")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    _git(root, "checkout", "-qb", "feature")
    (root / "nb.ipynb").write_text(_nb(), encoding="utf-8")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "pr")
    monkeypatch.chdir(root)
    for name in ("GITHUB_BASE_REF", "GITHUB_EVENT_PATH", "GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    return root


def _review(*args):
    return CliRunner().invoke(cli, ["review", "--no-cache", "--base", "main", *args], catch_exceptions=False)


def test_review_comments_a_notebook_on_its_json_line_with_a_committable_suggestion(nb_repo):
    from cfgfix.core import Finding
    from cfgfix.review.review import Comment, apply_suggestion

    text = (nb_repo / "nb.ipynb").read_text(encoding="utf-8")
    body = json.loads(_review("--output-format", "github-review").output)
    [comment] = body["comments"]
    assert comment["path"] == "nb.ipynb"
    assert "model.to('cuda')" in text.split("\n")[comment["line"] - 1]
    assert "in notebook cell 3:2:1" in comment["body"] and "```suggestion" in comment["body"]
    [item] = json.loads(_review("--output-format", "json").output)
    finding = Finding.from_dict(item["finding"])
    suggested = apply_suggestion(text, Comment(finding, item["path"], item["start_line"], item["line"], finding.span,
                                               suggestion=item["suggestion"]))
    json.loads(suggested)  # GitHub's "Commit suggestion" leaves a valid notebook
    CliRunner().invoke(cli, ["fix", "--no-cache", "nb.ipynb"], catch_exceptions=False)
    assert suggested == (nb_repo / "nb.ipynb").read_text(encoding="utf-8")
    _git(nb_repo, "checkout", "-q", "--", "nb.ipynb")  # back to the PR's version
    out = _review().output
    span = f"{item['start_line']}-{item['line']}" if item["start_line"] != item["line"] else str(item["line"])
    assert f"nb.ipynb:{span} (cell 3:2:1): CFX103" in out  # the suggestion also rewrites the line before (its comma)


def test_review_rdjson_for_a_notebook(nb_repo):
    text = (nb_repo / "nb.ipynb").read_text(encoding="utf-8")
    [diag] = json.loads(_review("--output-format", "rdjson").output)["diagnostics"]
    start, end = diag["location"]["range"]["start"], diag["location"]["range"]["end"]
    assert _at(text, start["line"], start["column"], end["line"], end["column"]) == "model.to('cuda')"


def test_review_puts_an_unmappable_notebook_finding_in_the_body(nb_repo, monkeypatch):
    from cfgfix.documents import notebook as nbmod

    monkeypatch.setattr(nbmod, "_cell_file_offsets", lambda notebook: {})
    result = _review("--output-format", "github-review")
    body = json.loads(result.output)
    assert body["comments"] == []
    assert "Findings in changed notebooks that no line of the diff shows" in body["body"]
    assert "`nb.ipynb` cell 3:2:1: [CFX103]" in body["body"]
