"""The position-keeping config reader, its limits, and the engine's handling of configs."""

import json

import pytest
import yaml

from cfgfix.analysis.config_kinds import config_kinds
from cfgfix.documents.config import ConfigError, parse_config
from cfgfix.documents.config_edits import change_is_local, delete_entry, insert_entry
from cfgfix.documents.text import SourceText
from conftest import lint_project, write_project


def parse(text, fmt="json"):
    return parse_config(SourceText("x." + fmt, text), fmt)


def test_json_spans_and_duplicates():
    text = '{\n  "a": 1,\n  "b": {"c": "x"},\n  "a": 2\n}\n'
    doc = parse(text)
    root = doc.root
    assert root.get("a").value == 2 and doc.span(root.get("b").get("c")).line == 3
    assert [(k, [doc.span(n).line for n in ns]) for k, ns in root.duplicates()] == [("a", [2, 4])]
    assert root.to_python() == json.loads(text)


def test_yaml_spans_and_kinds():
    doc = parse("compute_environment: LOCAL_MACHINE\ndistributed_type: 'DEEPSPEED'\n", "yaml")
    node = doc.root.get("distributed_type")
    assert doc.source.text[node.start:node.end] == "'DEEPSPEED'" and node.style == "'"
    assert config_kinds(doc) == {"accelerate"}


def test_hostile_input_is_refused():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
    with pytest.raises(ConfigError, match="aliases"):
        parse(bomb, "yaml")
    with pytest.raises(ConfigError, match="nested"):
        parse("[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match="nested"):
        parse("a: " + "[" * 5000 + "]" * 5000, "yaml")
    with pytest.raises(ConfigError, match="MB"):
        parse('{"a": "' + "x" * (11 * 1024 * 1024) + '"}')


@pytest.mark.parametrize("text", ['{"a": 1, "b": 2, "c": 3}', '{\n  "a": 1,\n  "b": 2,\n  "c": 3\n}\n'])
def test_delete_entry_keeps_json_valid(text):
    for name in "abc":
        doc = parse(text)
        key, value = doc.root.entry(name)
        edit = delete_entry(doc, doc.root, key, value)
        new = text[:edit.start] + edit.content + text[edit.end:]
        expected = {k: v for k, v in json.loads(text).items() if k != name}
        assert json.loads(new) == expected


def test_delete_entry_yaml_line():
    text = "a: 1  # keep\nb: 2\nc: 3\n"
    doc = parse(text, "yaml")
    key, value = doc.root.entry("b")
    edit = delete_entry(doc, doc.root, key, value)
    new = text[:edit.start] + edit.content + text[edit.end:]
    assert new == "a: 1  # keep\nc: 3\n" and yaml.safe_load(new) == {"a": 1, "c": 3}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_insert_block_in_the_files_own_style(newline):
    """A mapping added to a YAML block mapping (what `fix --fit` adds) is a block at the
    file's indentation step; every other byte, comments and odd spacing included, stays."""
    text = ("train:\n    lr: 1.0e-4   # keep this column\n    bf16: 'true'\n"
            "model:   x\ngpu_ids: [0,1]\n").replace("\n", newline)
    doc = parse(text, "yaml")
    block = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    edit = insert_entry(doc, doc.root, "zero_optimization", block)
    new = text[:edit.start] + edit.content + text[edit.end:]
    assert new == text + ("zero_optimization:\n    stage: 2\n    offload_optimizer:\n"
                          "        device: cpu\n        pin_memory: true\n").replace("\n", newline)
    assert yaml.safe_load(new)["zero_optimization"] == block
    assert change_is_local("yaml", text, new, [edit])
    nested = insert_entry(doc, doc.root.get("train"), "deepspeed", {"stage": 3})
    new = text[:nested.start] + nested.content + text[nested.end:]
    assert new.startswith(("train:\n    lr: 1.0e-4   # keep this column\n    bf16: 'true'\n"
                           "    deepspeed:\n        stage: 3\nmodel:   x\n").replace("\n", newline))
    flat = parse("a: 1\nb: 2\n", "yaml")  # nothing nested: two spaces, YAML's usual step
    edit = insert_entry(flat, flat.root, "c", {"d": True})
    assert edit.content == "\nc:\n  d: true"


def test_engine_reports_broken_config_but_never_unrecognised_files(tmp_path):
    write_project(tmp_path, {
        "ds_config.json": '{"train_micro_batch_size_per_gpu": 2,\n "zero_optimization": {"stage": 2,}}\n',
        "templates/deploy.yaml": "replicas: {{ .Values.replicas }}\n  bad: [\n",
        "data.json": '{"train_batch_size": [1, 2\n',
        "bomb.yaml": "distributed_type: &a [x, x]\n" + "b: &b [" + ", ".join(["*a"] * 9) + "]\n",
    })
    _, _, result = lint_project(tmp_path)
    got = {(f.code, f.path, f.span.line) for f in result.findings}
    assert ("CFX901", "ds_config.json", 2) in got
    assert not [f for f in result.findings if f.path.startswith("templates/")]
    assert not result.errors


def test_yaml_without_final_newline_is_read():
    """libyaml puts the end mark of such a file on the line after the last (half of
    accelerate's own example configs end that way)."""
    doc = parse('distributed_type: "MULTI_GPU"\nmixed_precision: "bf16"', "yaml")
    assert doc.root.get("mixed_precision").value == "bf16"
    assert doc.root.end == len('distributed_type: "MULTI_GPU"\nmixed_precision: "bf16"')


def test_json_with_comments_is_a_warning_that_says_who_reads_it(tmp_path):
    from conftest import lint_project, write_project

    write_project(tmp_path, {"ds.json": '{\n  // micro batch\n  "train_micro_batch_size_per_gpu": 2,\n'
                                        '  "zero_optimization": {"stage": 2} /* ZeRO-2 */\n}\n',
                             "comma.json": '{\n  "train_micro_batch_size_per_gpu": 2,\n  "zero_optimization": {"stage": 2},\n}\n',
                             "bad.json": '{\n  "train_micro_batch_size_per_gpu": 2,\n  "zero_optimization": {"stage": 2}\n'})
    _, _, result = lint_project(tmp_path)
    by_file = {f.path: f for f in result.findings if f.code == "CFX901"}
    assert by_file["ds.json"].severity.value == "warning" and "hjson" in by_file["ds.json"].message
    assert by_file["comma.json"].severity.value == "warning"  # a trailing comma: hjson reads it too
    assert by_file["bad.json"].severity.value == "error"  # an unclosed object: no loader reads it
