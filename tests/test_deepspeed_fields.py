"""DeepSpeed's config models as data (analysis/deepspeed_fields.py) and the checker that
reads them (analysis/deepspeed_validation.field_problem), held against pydantic itself: for
every type the table uses, a grid of values is validated by a pydantic model built the way
DeepSpeedConfigModel is (extra forbid, use_enum_values, lax mode) and by the checker. The
checker may stay silent where pydantic refuses (it errs toward silence), never the reverse."""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Optional, Union

import pytest

from cfgfix.analysis.deepspeed_fields import FIELDS, RELEASES
from cfgfix.analysis.deepspeed_validation import auto_is_default, field_problem, field_problems
from cfgfix.documents.config import ConfigError, parse_config
from cfgfix.documents.text import SourceText

GRID = [True, False, 0, 1, 2, -1, 0.0, 1.0, 1.5, 5e8, math.inf, math.nan, "true", "True", "yes", "off", "1", "0",
        "2", "1.0", "1e3", " 5 ", "abc", "cpu", "CPU", "none", "auto", None, [], ["a"], {}, {"device": "cpu"}]


def _python_type(spec: str):
    optional = spec.startswith("?")
    kinds = spec.lstrip("?").split("|")
    types = []
    for kind in kinds:
        if kind.startswith("enum:"):
            members = kind[len("enum:"):].split(",")
            if all(m.isdigit() for m in members):
                types.append(Enum("IntMembers", {f"m{m}": int(m) for m in members}, type=int))
            else:
                types.append(Enum("StrMembers", {m: m for m in members}, type=str))
        elif kind.startswith("model:"):
            types.append(dict)
        else:
            types.append({"bool": bool, "int": int, "float": float, "str": str, "path": Path, "dict": dict,
                          "list": list}[kind])
    annotation = types[0] if len(types) == 1 else Union[tuple(types)]
    return Optional[annotation] if optional else annotation


def _specs():
    seen = {}
    for block, fields in FIELDS.items():
        for name, entry in fields.items():
            key = (entry["type"], tuple(sorted((k, v) for k, v in entry.items() if k in ("gt", "ge", "lt", "le"))))
            seen.setdefault(key, (block, name, entry))
    return list(seen.values())


@pytest.mark.parametrize("block,name,entry", _specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_checker_never_refuses_what_pydantic_accepts(block, name, entry):
    pydantic = pytest.importorskip("pydantic")
    bounds = {k: entry[k] for k in ("gt", "ge", "lt", "le") if k in entry}
    field = pydantic.Field(**bounds) if bounds else ...
    model = pydantic.create_model(
        "M", __config__=pydantic.ConfigDict(use_enum_values=True, extra="forbid", arbitrary_types_allowed=True),
        value=(_python_type(entry["type"]), field))
    silent_misses = []
    for value in GRID:
        if value == "auto":
            continue  # DeepSpeedConfigModel drops "auto" before pydantic sees it
        try:
            model(value=value)
            accepted = True
        except pydantic.ValidationError:
            accepted = False
        refused_here = field_problem(entry, value) is not None
        assert not (accepted and refused_here), f"{block}.{name}={value!r}: pydantic accepts, the checker refuses"
        if not accepted and not refused_here:
            silent_misses.append(value)
    # the only values left to pydantic: exponent strings read as ints ("1e3"), 5e8 for an int is fine
    assert all(isinstance(v, str) and "e" in v for v in silent_misses), (block, name, silent_misses)


def test_the_table_holds_the_fields_the_deepspeed_tests_use():
    assert RELEASES[0] == "0.19.6"
    zero = FIELDS["zero_optimization"]
    assert zero["stage"]["type"] == "enum:0,1,2,3"
    assert zero["offload_optimizer"]["type"] == "?model:zero_optimization.offload_optimizer"
    assert zero["prefetch_bucket_size"]["alias"] == "stage3_prefetch_bucket_size"
    assert FIELDS["zero_optimization.offload_param"]["device"]["type"] == "enum:cpu,none,nvme"
    assert auto_is_default("zero_optimization.zenflow.select_strategy")
    assert not auto_is_default("zero_optimization.stage")


def _problems(text: str) -> list[str]:
    return [message for _, message in field_problems(parse_config(SourceText("ds.json", text), "json").root)]


def test_problems_are_found_under_aliases_and_nested_blocks():
    found = _problems('{"zero_optimization": {"stage3_max_live_parameters": -5, "offload_param": {"device": "gpu",'
                      ' "buffer_count": "many"}, "zenflow": {"topk_ratio": 1.5}}, "bfloat16": {"enabled": "maybe"}}')
    assert found == [
        "zero_optimization.stage3_max_live_parameters must be at least 0",
        "zero_optimization.offload_param.device must be one of cpu, none, nvme (got 'gpu')",
        "zero_optimization.offload_param.buffer_count must be an integer (got 'many')",
        "zero_optimization.zenflow.topk_ratio must be less than 1",
        "bfloat16.enabled must be a boolean (got 'maybe')",
    ]


def test_unknown_keys_and_auto_and_legacy_forms_are_left_alone():
    assert _problems('{"zero_optimization": {"stage": "auto", "overlap_com": "x", "offload_param": null}}') == []
    assert _problems('{"zero_optimization": false, "fp16": null}') == []
    assert _problems('{"fp16": true}') == ["fp16 must be a mapping"]


def test_lenient_json_reads_comments_and_trailing_commas_as_deepspeed_does():
    text = '{\n  // a comment\n  "a": 1, /* another */\n  "b": [1, 2,],\n}\n'
    with pytest.raises(ConfigError):
        parse_config(SourceText("x.json", text), "json")
    doc = parse_config(SourceText("x.json", text), "json", lenient=True)
    assert doc.lenient_error is not None and doc.lenient_error.line == 2
    assert doc.root.to_python() == {"a": 1, "b": [1, 2]}
    assert doc.source.text[doc.root.get("a").start:doc.root.get("a").end] == "1"
    strict = parse_config(SourceText("y.json", '{"a": 1}'), "json", lenient=True)
    assert strict.lenient_error is None
    with pytest.raises(ConfigError):  # not JSON even without comments: still an error
        parse_config(SourceText("z.json", '{"a": 1,, }'), "json", lenient=True)
