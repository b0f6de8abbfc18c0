"""The output formats, on hand-built findings over a small training script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity, Span
from cfgfix.documents.text import SourceText
from cfgfix.report import FORMATS, ReportContext, render
from cfgfix.report.github import escape_data, escape_property
from cfgfix.rules.base import Rule

# the public OASIS schema, shipped with the tests so that a fresh clone runs them
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

TRAIN = (
    "import torch\n"
    "from transformers import AutoModel\n"
    "\n"
    'model = AutoModel.from_pretrained("gpt2", device_map="auto")\n'
    'model.to("cuda")\n'
    'print("héllo 日本")\n'
    "x = foo(\n"
    "    1,\n"
    ")\n"
)


class MoveRule(Rule):
    """## What it does
    Flags `.to()` on a model loaded with `device_map`. It breaks dispatch.

    ## Why is this bad?
    accelerate placed the weights already.
    """

    code = "CFX103"
    name = "move-dispatched-model"
    severity = Severity.WARNING
    fix_availability = "safe"


class AutocastRule(Rule):
    """## What it does
    Flags fp16 autocast without a GradScaler.
    """

    code = "CFX201"
    name = "fp16-autocast-without-grad-scaler"
    severity = Severity.ERROR
    fix_availability = "unsafe"


class NoisyRule(Rule):
    code = "CFX301"
    name = "empty-cache-in-loop"
    severity = Severity.INFO


RULES = [MoveRule, AutocastRule, NoisyRule]


def span_of(source: SourceText, needle: str, occurrence: int = 0):
    start = -1
    for _ in range(occurrence + 1):
        start = source.text.index(needle, start + 1)
    return source.span(start, start + len(needle))


@pytest.fixture
def source() -> SourceText:
    return SourceText(path="train.py", text=TRAIN)


@pytest.fixture
def findings(source):
    move = span_of(source, 'model.to("cuda")')
    # Safe fix: delete the whole line (the offsets of line 5 and line 6).
    delete = Edit("train.py", source.line_starts[4], source.line_starts[5], "")
    load = span_of(source, 'device_map="auto"')
    unicode_span = span_of(source, '"héllo 日本"')
    swap = Edit("train.py", unicode_span.start, unicode_span.end, '"hello"')
    multi = span_of(source, "foo(\n    1,\n)")
    return [
        # Deliberately out of order: every format sorts.
        Finding("CFX301", "empty-cache-in-loop", "a multi-line call", Severity.INFO, multi),
        Finding(
            "CFX201",
            "fp16-autocast-without-grad-scaler",
            "non-ASCII literal",
            Severity.ERROR,
            unicode_span,
            fix=Fix((swap,), "Use an ASCII literal", Applicability.UNSAFE),
        ),
        Finding(
            "CFX103",
            "move-dispatched-model",
            "`.to()` on a dispatched model",
            Severity.WARNING,
            move,
            related=(Related(load, "loaded with `device_map` here"),),
            fix=Fix((delete,), "Remove the `.to()` call"),
        ),
    ]


@pytest.fixture
def ctx(source) -> ReportContext:
    return ReportContext(sources={"train.py": source}, rules=RULES, tool_version="0.1.0")


# -- text ----------------------------------------------------------------------------------
def test_text_full_output(findings, ctx):
    out = render("text", findings, ctx)
    assert out == (
        "train.py:5:1: CFX103 [*] `.to()` on a dispatched model\n"
        "  |\n"
        '5 | model.to("cuda")\n'
        "  | ^^^^^^^^^^^^^^^^\n"
        "  |\n"
        "  help: Remove the `.to()` call\n"
        "  note: train.py:4:43: loaded with `device_map` here\n"
        "\n"
        "train.py:6:7: CFX201 non-ASCII literal\n"
        "  |\n"
        '6 | print("héllo 日本")\n'
        # `print(` is 6 cells; the literal is 10 characters but 12 cells (two wide chars).
        "  |       ^^^^^^^^^^^^\n"
        "  |\n"
        "  help: Use an ASCII literal\n"
        "\n"
        "train.py:7:5: CFX301 a multi-line call\n"
        "  |\n"
        "7 | x = foo(\n"
        "  |     ^^^^\n"
        "8 |     1,\n"
        "9 | )\n"
        "  |\n"
        "\n"
        "Found 3 findings (1 fixable with cfgfix fix).\n"
    )


def test_text_caret_under_span_column(findings, ctx):
    lines = render("text", findings, ctx).splitlines()
    source_line = lines.index("train.py:5:1: CFX103 [*] `.to()` on a dispatched model") + 2
    assert lines[source_line + 1].index("^") == lines[source_line].index("m")


def test_text_without_source_skips_frame(findings, ctx):
    ctx.sources = {}
    ctx.show_fixes = False
    out = render("text", findings[2:], ctx)
    assert out == (
        "train.py:5:1: CFX103 [*] `.to()` on a dispatched model\n"
        "  note: train.py:4:43: loaded with `device_map` here\n"
        "\n"
        "Found 1 finding (1 fixable with cfgfix fix).\n"
    )


def test_text_gutter_widens_for_long_line_numbers():
    text = "\n" * 11 + "abc\n"
    source = SourceText("t.py", text)
    finding = Finding("CFX301", "empty-cache-in-loop", "m", Severity.INFO, source.span(11, 12))
    out = render("text", [finding], ReportContext({"t.py": source}, RULES))
    assert "12 | abc\n   | ^\n" in out


@pytest.mark.parametrize(
    ("fixed", "unsafe_hidden", "count", "expected"),
    [
        (0, 0, 0, ["All checks passed!"]),
        (0, 0, 1, ["Found 1 finding."]),
        (3, 0, 1, ["Found 4 findings (3 fixed, 1 remaining)."]),
        (2, 0, 0, ["Found 2 findings (2 fixed, 0 remaining)."]),
        (
            0,
            1,
            1,
            ["Found 1 finding.", "1 hidden fix can be enabled with the --unsafe-fixes option."],
        ),
        (
            0,
            2,
            1,
            ["Found 1 finding.", "2 hidden fixes can be enabled with the --unsafe-fixes option."],
        ),
    ],
)
def test_text_summary_variants(findings, ctx, fixed, unsafe_hidden, count, expected):
    ctx.fixed, ctx.unsafe_hidden = fixed, unsafe_hidden
    chosen = [f for f in findings if f.fix is None][:count]
    lines = render("text", chosen, ctx).splitlines()
    assert lines[-len(expected) :] == expected


def test_text_colour_only_when_asked(findings, ctx):
    plain = render("text", findings, ctx)
    assert "\x1b[" not in plain
    ctx.color = True
    coloured = render("text", findings, ctx)
    assert "\x1b[" in coloured
    assert ANSI.sub("", coloured) == plain  # colour changes nothing else


def test_text_statistics(findings, ctx, source):
    extra = Finding(
        "CFX103", "move-dispatched-model", "again", Severity.WARNING, span_of(source, "model", 1)
    )
    ctx.statistics = True
    out = render("text", findings + [extra], ctx)
    assert out == (
        "   2\tCFX103\t[*] move-dispatched-model\n"
        "   1\tCFX201\t[ ] fp16-autocast-without-grad-scaler\n"
        "   1\tCFX301\t[ ] empty-cache-in-loop\n"
    )


# -- json ----------------------------------------------------------------------------------
def test_json_fields_and_edit_positions(findings, ctx):
    data = json.loads(render("json", findings, ctx))
    assert [(d["filename"], d["location"]["row"], d["code"]) for d in data] == [
        ("train.py", 5, "CFX103"),
        ("train.py", 6, "CFX201"),
        ("train.py", 7, "CFX301"),
    ]
    move, literal, multi = data
    assert move == {
        "code": "CFX103",
        "name": "move-dispatched-model",
        "message": "`.to()` on a dispatched model",
        "severity": "warning",
        "cell": None,
        "filename": "train.py",
        "location": {"row": 5, "column": 1},
        "end_location": {"row": 5, "column": 17},
        "fix": {
            "applicability": "safe",
            "message": "Remove the `.to()` call",
            "edits": [
                {
                    "filename": "train.py",
                    "content": "",
                    "location": {"row": 5, "column": 1},
                    "end_location": {"row": 6, "column": 1},
                }
            ],
        },
        "url": MoveRule.url(),
        "related": [
            {
                "filename": "train.py",
                "location": {"row": 4, "column": 43},
                "end_location": {"row": 4, "column": 60},
                "message": "loaded with `device_map` here",
            }
        ],
    }
    # Character columns, not bytes: `é` and `日本` count one each.
    assert literal["fix"]["applicability"] == "unsafe"
    assert literal["fix"]["edits"][0]["location"] == {"row": 6, "column": 7}
    assert literal["fix"]["edits"][0]["end_location"] == {"row": 6, "column": 17}
    assert multi["fix"] is None
    assert multi["end_location"] == {"row": 9, "column": 2}


def test_json_is_indented(findings, ctx):
    out = render("json", findings, ctx)
    assert out.startswith("[\n  {\n")
    assert '\n    "location": {\n      "row": 5,' in out
    assert json.loads(render("json", [], ctx)) == []


def test_json_edit_in_unknown_file_has_no_position(findings, ctx):
    ctx.sources = {}
    data = json.loads(render("json", findings, ctx))
    assert data[0]["fix"]["edits"][0]["location"] is None


# -- sarif ---------------------------------------------------------------------------------
def sarif(findings, ctx) -> dict:
    return json.loads(render("sarif", findings, ctx))


def test_sarif_validates_against_schema(findings, ctx):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator_cls = jsonschema.validators.validator_for(schema)  # the schema says draft-04
    validator_cls.check_schema(schema)
    for log in (sarif(findings, ctx), sarif([], ctx)):
        errors = sorted(validator_cls(schema).iter_errors(log), key=str)
        assert not errors, errors[0]


def test_sarif_rules_and_results(findings, ctx):
    log = sarif(findings, ctx)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "cfgfix" and driver["version"] == "0.1.0"
    assert [r["id"] for r in driver["rules"]] == ["CFX103", "CFX201", "CFX301"]
    move_rule = driver["rules"][0]
    assert (
        move_rule["shortDescription"]["text"]
        == "Flags `.to()` on a model loaded with `device_map`."
    )
    assert move_rule["help"]["markdown"] == MoveRule.doc()
    assert move_rule["helpUri"] == MoveRule.url()
    assert [r["defaultConfiguration"]["level"] for r in driver["rules"]] == [
        "warning",
        "error",
        "note",
    ]
    assert driver["rules"][2]["shortDescription"]["text"] == "empty-cache-in-loop"  # no docstring

    move, literal, multi = run["results"]
    assert (move["ruleId"], move["ruleIndex"], move["level"]) == ("CFX103", 0, "warning")
    assert multi["level"] == "note"
    location = move["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 5, "startColumn": 1, "endLine": 5, "endColumn": 17}
    assert multi["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 7,
        "startColumn": 5,
        "endLine": 9,
        "endColumn": 2,
    }
    related = move["relatedLocations"][0]
    assert related["message"]["text"] == "loaded with `device_map` here"
    assert related["physicalLocation"]["region"]["startColumn"] == 43
    assert isinstance(related["id"], int)

    fix = move["fixes"][0]
    assert fix["description"]["text"] == "Remove the `.to()` call"
    replacement = fix["artifactChanges"][0]["replacements"][0]
    assert replacement == {
        "deletedRegion": {"startLine": 5, "startColumn": 1, "endLine": 6, "endColumn": 1},
        "insertedContent": {"text": ""},
    }
    # a SARIF viewer may apply a fix in one click: the unsafe one only with --unsafe-fixes
    assert "fixes" not in literal
    assert "fixes" not in multi
    ctx.unsafe_fixes = True
    _, literal, _ = sarif(findings, ctx)["runs"][0]["results"]
    assert literal["fixes"][0]["artifactChanges"][0]["replacements"][0]["deletedRegion"] == {
        "startLine": 6,
        "startColumn": 7,
        "endLine": 6,
        "endColumn": 17,
    }
    assert literal["fixes"][0]["properties"] == {"applicability": "unsafe"}


def test_sarif_fingerprint_survives_line_shift(findings, ctx, source):
    before = [r["partialFingerprints"] for r in sarif(findings, ctx)["runs"][0]["results"]]
    shifted = SourceText("train.py", "# a new comment\n" + source.text)
    moved = [
        Finding(
            f.code, f.name, f.message, f.severity, shifted.span(f.span.start + 16, f.span.end + 16)
        )
        for f in findings
    ]
    ctx.sources = {"train.py": shifted}
    after = [r["partialFingerprints"] for r in sarif(moved, ctx)["runs"][0]["results"]]
    assert before == after
    assert len({next(iter(p.values())) for p in before}) == 3


def test_sarif_unknown_rule_and_absolute_path(ctx, source):
    span = Span("/abs/dir with space/t.py", 1, 1, 1, 7, 0, 6)
    odd = Finding("CFX999", "mystery", "m", Severity.ERROR, span)
    log = sarif([odd], ctx)
    result = log["runs"][0]["results"][0]
    assert log["runs"][0]["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "CFX999"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "file:///abs/dir%20with%20space/t.py"
    }


# -- github --------------------------------------------------------------------------------
def test_github_commands(findings, ctx):
    lines = render("github", findings, ctx).splitlines()
    assert lines == [
        "::warning file=train.py,line=5,col=1,endLine=5,endColumn=17,"
        "title=CFX103 move-dispatched-model::`.to()` on a dispatched model",
        "::error file=train.py,line=6,col=7,endLine=6,endColumn=17,"
        "title=CFX201 fp16-autocast-without-grad-scaler::non-ASCII literal",
        "::notice file=train.py,line=7,col=5,endLine=9,endColumn=2,"
        "title=CFX301 empty-cache-in-loop::a multi-line call",
    ]
    assert render("github", [], ctx) == ""


def test_github_escaping(source, ctx):
    span = Span("dir,x/a:b.py", 1, 1, 1, 7, 0, 6)
    finding = Finding(
        "CFX301", "empty-cache-in-loop", "100% sure: a, b\r\nnext", Severity.INFO, span
    )
    out = render("github", [finding], ctx)
    assert out == (
        "::notice file=dir%2Cx/a%3Ab.py,line=1,col=1,endLine=1,endColumn=7,"
        "title=CFX301 empty-cache-in-loop::100%25 sure: a, b%0D%0Anext\n"
    )
    assert escape_data("%0A") == "%250A"  # `%` goes first, so escapes are not re-escaped
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"


# -- concise -------------------------------------------------------------------------------
def test_concise_one_line_per_finding(findings, ctx):
    ctx.unsafe_hidden = 1
    assert render("concise", findings, ctx) == (
        "train.py:5:1: CFX103 [*] `.to()` on a dispatched model\n"
        "train.py:6:7: CFX201 non-ASCII literal\n"
        "train.py:7:5: CFX301 a multi-line call\n"
        "Found 3 findings (1 fixable with cfgfix fix).\n"
        "1 hidden fix can be enabled with the --unsafe-fixes option.\n"
    )
    ctx.unsafe_hidden = 0
    assert render("concise", [], ctx) == "All checks passed!\n"


def test_concise_marks_unsafe_fixes_with_unsafe_fixes(findings, ctx):
    ctx.unsafe_fixes = True
    lines = render("concise", findings, ctx).splitlines()
    assert lines[1] == "train.py:6:7: CFX201 [*] non-ASCII literal"
    assert lines[3] == "Found 3 findings (2 fixable with cfgfix fix --unsafe-fixes)."
    # the full format's marker follows the same fix safety
    assert "train.py:6:7: CFX201 [*] non-ASCII literal" in render("text", findings, ctx)


def test_concise_statistics_and_color(findings, ctx):
    ctx.statistics = True
    assert render("concise", findings, ctx) == render("text", findings, ctx)
    ctx.statistics, ctx.color = False, True
    first = render("concise", findings, ctx).splitlines()[0]
    assert "\x1b[" in first and re.sub(r"\x1b\[[0-9;]*m", "", first) == "train.py:5:1: CFX103 [*] `.to()` on a dispatched model"


# -- dispatch ------------------------------------------------------------------------------
def test_every_format_renders_and_unknown_fails(findings, ctx):
    for fmt in FORMATS:
        assert render(fmt, findings, ctx).endswith("\n")
    with pytest.raises(ValueError, match="unknown output format"):
        render("xml", findings, ctx)


def test_text_long_span_is_cut_and_tabs_line_up():
    source = SourceText("t.py", "if x:\n\tcall(a,\n1,\n2,\n3,\n4)\n")
    start = source.text.index("call")
    span = source.span(start, source.text.index("4)") + 2)
    finding = Finding("CFX301", "empty-cache-in-loop", "m", Severity.INFO, span)
    out = render("text", [finding], ReportContext({"t.py": source}, RULES))
    # The tab shows as four spaces and the carets follow it; three more lines, then `:`.
    assert "  |\n2 |     call(a,\n  |     ^^^^^^^\n3 | 1,\n4 | 2,\n5 | 3,\n  :\n  |\n" in out
