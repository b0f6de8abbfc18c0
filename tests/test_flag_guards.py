"""CFX105 and the flags a branch needs off: a `device_map="auto"` load in the `else` of
`if args.deepspeed:` (or `if training_args.use_deepspeed:`, an HfArgumentParser field)
is not reached by a launch that turns that flag on; the project stage keeps only the
multi-process launches that leave it off (analysis/flag_guards.py, project.turns_on)."""

from __future__ import annotations

import ast

import pytest

from cfgfix.analysis.flag_guards import falsy_flags
from cfgfix.core import Span
from cfgfix.project import turns_on
from conftest import lint_project, write_project


def _load(tree):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "from_pretrained"
                and any(k.arg == "device_map" for k in n.keywords))


@pytest.mark.parametrize("code,expected", [
    ("if args.deepspeed:\n    pass\nelse:\n    LOAD\n", [("args", "deepspeed")]),
    ("if not args.deepspeed:\n    LOAD\n", [("args", "deepspeed")]),
    ("if args.deepspeed or args.fsdp:\n    pass\nelif args.x == 1:\n    LOAD\n", [("args", "deepspeed"), ("args", "fsdp")]),
    ("if not args.deepspeed and not args.fsdp:\n    for i in range(2):\n        LOAD\n", [("args", "deepspeed"), ("args", "fsdp")]),
    # near misses: the load in the body of the test, an `and` in an `else`, a comparison,
    # an attribute of a name that does not hold the flags, a load after the `if`
    ("if args.deepspeed:\n    LOAD\n", []),
    ("if args.deepspeed and args.zero3:\n    pass\nelse:\n    LOAD\n", []),
    ("if args.stage == 3:\n    pass\nelse:\n    LOAD\n", []),
    ("if config.deepspeed:\n    pass\nelse:\n    LOAD\n", []),
    ("if args.deepspeed:\n    pass\nLOAD\n", []),
])
def test_falsy_flags(code, expected):
    tree = ast.parse(code.replace("LOAD", "m = AutoModel.from_pretrained('m', device_map='auto')"))
    assert falsy_flags(tree, _load(tree), {"args"}) == expected


def _args(text):
    return tuple((word, Span("run.sh", 1, 1, 1, 1)) for word in text.split())


@pytest.mark.parametrize("text,on", [
    ("--use_deepspeed true --bf16 true", True),
    ("--use_deepspeed", True),
    ("--use_deepspeed --bf16", True),
    ("--deepspeed ds.json", True),
    ("--deepspeed=ds.json", True),
    ("--use_deepspeed false", False),  # off
    ("--use_deepspeed 0", False),
    ("--use_deepspeed $USE_DS", False),  # unknown
    ("--use_deepspeed true --use_deepspeed False", False),  # the last one wins
    ("--bf16 true", False),  # not passed
])
def test_turns_on(text, on):
    assert turns_on(_args(text), ["--use_deepspeed", "--use-deepspeed", "--deepspeed"]) is on


SCRIPT = (
    "import argparse\nfrom transformers import AutoModelForCausalLM, Trainer\n"
    "def parse_args():\n    parser = argparse.ArgumentParser()\n"
    "    parser.add_argument('--ds', '--deepspeed', dest='deepspeed', default=None)\n"
    "    return parser.parse_args()\n"
    "def main(cfg):\n"
    "    if cfg.deepspeed:\n"
    "        model = AutoModelForCausalLM.from_pretrained('m')\n"
    "    else:\n"
    "        model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "    Trainer(model=model).train()\n"
    "main(parse_args())\n"
)


def _cfx105(tmp_path, launches):
    write_project(tmp_path, {"train.py": SCRIPT, "run.sh": launches})
    _, _, result = lint_project(tmp_path)
    return [f for f in result.findings if f.code == "CFX105"]


def test_only_the_launches_that_leave_the_flag_off_count(tmp_path):
    """Two launches: the one passing `--ds ds.json` (the flag's other option string) never
    reaches the auto map; the one without it does, and only it is named."""
    [finding] = _cfx105(tmp_path, "deepspeed --num_gpus 2 train.py --ds ds.json\ntorchrun --nproc_per_node 4 train.py\n")
    assert finding.span.line == 11
    assert [r.message for r in finding.related] == ["launched here with 4 processes"]
    assert [r.span.line for r in finding.related] == [2]


def test_every_launch_turns_the_flag_on(tmp_path):
    assert _cfx105(tmp_path, "deepspeed --num_gpus 2 train.py --deepspeed ds.json\n"
                             "deepspeed --num_gpus 8 train.py --ds=ds.json\n") == []
