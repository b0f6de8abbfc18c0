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
    # an earlier `if` that returns on one side: what follows runs on the other
    ("def f(args):\n    if args.deepspeed:\n        return 1\n    LOAD\n", [("args", "deepspeed")]),
    ("def f(args):\n    if not args.fsdp:\n        x = 1\n    else:\n        raise ValueError\n    LOAD\n", [("args", "fsdp")]),
    ("def f(args):\n    if args.deepspeed:\n        x = 1\n    LOAD\n", []),  # near miss: falls through
    ("def f(args):\n    if args.deepspeed:\n        return 1\n    else:\n        return 2\n    LOAD\n", []),
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


@pytest.mark.parametrize("code,expected", [
    ("if args.model_parallel:\n    LOAD\n", [(("args", "model_parallel"), True)]),
    ("if args.a and not args.b:\n    LOAD\n", [(("args", "a"), True), (("args", "b"), False)]),
    ("if args.a or args.b:\n    LOAD\n", []),  # either may be the one that is on
])
def test_flag_needs(code, expected):
    from cfgfix.analysis.flag_guards import flag_needs

    tree = ast.parse(code.replace("LOAD", "m = AutoModel.from_pretrained('m', device_map='auto')"))
    assert flag_needs(tree, _load(tree), {"args"}) == expected


@pytest.mark.parametrize("text,off", [
    ("--bf16 true", True),  # not passed: the default
    ("", True),
    ("--model_parallel false", True),
    ("--model_parallel", False),
    ("--model_parallel true", False),
    ("--model_parallel $MP", False),
    ("$EXTRA_ARGS", False),  # a variable may hold the flag
    ('"$@"', False),
])
def test_turns_off(text, off):
    from cfgfix.project import turns_off

    assert turns_off(_args(text), ["--model_parallel"]) is off


@pytest.mark.parametrize("declaration,off", [
    ("parser.add_argument('--mp', action='store_true')", True),
    ("parser.add_argument('--mp')", True),
    ("parser.add_argument('--mp', default=None)", True),
    ("parser.add_argument('--mp', default=0)", True),
    ("parser.add_argument('--mp', action='store_false')", False),
    ("parser.add_argument('--mp', default=True)", False),
    ("parser.add_argument('--mp', default=os.environ.get('MP'))", False),  # computed
    ("parser.add_argument('--mp')\nparser.add_argument('--mp', default=1)", False),  # declared twice
    ("@dataclass\nclass A:\n    mp: bool = field(default=False)", True),
    ("@dataclass\nclass A:\n    mp: bool = False", True),
    ("@dataclass\nclass A:\n    mp: bool = True", False),
    ("class A:\n    mp: bool = False", False),  # not a dataclass
    ("", False),  # not seen (a TrainingArguments field, say)
])
def test_default_off(declaration, off):
    from cfgfix.rules.launch_flags import default_off as _default_off
    from cfgfix.training.references import read_refs

    tree = ast.parse("import argparse, os\nparser = argparse.ArgumentParser()\n" + declaration + "\n")
    assert _default_off(read_refs(tree), tree, "mp") is off


HF_ON = (
    "from dataclasses import dataclass, field\n"
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n"
    "@dataclass\nclass ModelArguments:\n    model_parallel: bool = field(default=False)\n"
    "def main():\n"
    "    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()\n"
    "    if model_args.model_parallel:\n"
    "        model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "    else:\n"
    "        model = AutoModelForCausalLM.from_pretrained('m')\n"
    "    Trainer(model=model, args=training_args).train()\n"
)


@pytest.mark.parametrize("launch,fires", [
    ("deepspeed --num_gpus 2 train.py --output_dir out", False),  # the field's default False
    ("deepspeed --num_gpus 2 train.py --model_parallel true", True),
    ("deepspeed --num_gpus 2 train.py --model-parallel", True),  # HfArgumentParser's dashed alias
])
def test_a_dataclass_flag_needed_on(tmp_path, launch, fires):
    write_project(tmp_path, {"train.py": HF_ON, "run.sh": launch + "\n"})
    _, _, result = lint_project(tmp_path)
    assert bool([f for f in result.findings if f.code == "CFX105"]) is fires
