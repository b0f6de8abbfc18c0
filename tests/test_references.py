"""Values a training script takes from its own flags (argparse defaults) and its own config
file (`cfg = yaml.safe_load(open(args.config))`), resolved per launch with their origins, and
used by every rule that reads TrainingArguments (CFX511): one resolved setup, no guesses."""

import ast
import json

import pytest

from cfgfix.training.references import Ref, read_refs
from conftest import lint_project, write_project


def _setups(root):
    engine, _, result = lint_project(root)
    from cfgfix.training.resolve import training_setups

    return training_setups(engine.project), result


# -- reading the script -----------------------------------------------------------------------
def test_refs_follow_argparse_configs_and_their_parts():
    tree = ast.parse(
        "import argparse, yaml\n"
        "def main():\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--config', default='configs/a.yaml')\n"
        "    p.add_argument('--base-model', dest='model', default='Qwen/Qwen2.5-7B')\n"
        "    p.add_argument('--bf16', action='store_true')\n"
        "    args = p.parse_args()\n"
        "    with open(args.config) as f:\n"
        "        cfg = yaml.safe_load(f)\n"
        "    tcfg = cfg['training']\n"
        "    base = cfg.get('model')['pretrained']\n"
        "    fixed = json.load(open('static.json'))\n"
    )
    refs = read_refs(tree)
    assert refs.defaults["model"].value == "Qwen/Qwen2.5-7B" and refs.defaults["bf16"].value is False
    assert refs.options["--base-model"] == "model"
    assert refs.configs["cfg"] == Ref("config", ())
    assert refs.configs["tcfg"] == Ref("config", ("training",))
    expr = ast.parse("tcfg['batch_size_per_gpu']", mode="eval").body
    assert refs.ref(expr) == Ref("config", ("training", "batch_size_per_gpu"))
    assert refs.ref(ast.parse("base", mode="eval").body) == Ref("config", ("model", "pretrained"))
    assert refs.ref(ast.parse("args.model", mode="eval").body) == Ref("model")
    assert refs.configs["fixed"] == Ref(None, (), "static.json")


def test_refs_near_misses():
    """A dict that is not a loaded config, a name assigned twice, an attribute of an object
    that is not the parsed flags: no reference."""
    tree = ast.parse(
        "import yaml\n"
        "cfg = {'training': {'bf16': True}}\n"
        "x = yaml.safe_load(open(path))\n"  # a path we cannot name
        "y = yaml.safe_load(open('a.yaml'))\n"
        "y = {}\n"
        "model.config\n"
    )
    refs = read_refs(tree)
    assert refs.configs == {}
    assert refs.ref(ast.parse("model.config", mode="eval").body) is None


def _namespaces(text):
    return read_refs(ast.parse(text)).namespaces


_PARSER_FN = ("import argparse\n"
              "def parse_args():\n"
              "    parser = argparse.ArgumentParser()\n"
              "    parser.add_argument('--model', default='gpt2')\n"
              "    {ret}\n")


@pytest.mark.parametrize("ret", ["return parser.parse_args()", "args = parser.parse_args()\n    return args"])
def test_the_scripts_own_parse_function_gives_the_flags(ret):
    """`args = parse_args()` with `def parse_args(): ... return parser.parse_args()` in the
    script itself (before: only an imported one, or a parameter named `args`)."""
    refs = read_refs(ast.parse(_PARSER_FN.format(ret=ret) + "def main():\n    config = parse_args()\n"
                               "    load(config.model)\n"))
    assert "config" in refs.namespaces
    assert refs.ref(ast.parse("config.model", mode="eval").body) == Ref("model")


@pytest.mark.parametrize("call", ["main(parse_args())", "main(cfg=parse_args())", "cfg = parse_args()\nmain(cfg)",
                                  "main(parser.parse_args())", "main(parser.parse_known_args()[0])",
                                  "cfg, _ = parser.parse_known_args()\nmain(cfg)"])
def test_the_parameter_the_parsed_flags_are_passed_to(call):
    """`main(parse_args())`, `main(parser.parse_args())`: the parameter of the script's own
    function holds the flags, also down further calls (`train(cfg)` -> `def train(hp):`,
    which passes `hp` on to `def tokenize(x, hp):`)."""
    text = (_PARSER_FN.format(ret="return parser.parse_args()") + "parser = argparse.ArgumentParser()\n"
            "def train(hp):\n    load(hp.model)\n    data = [tokenize(x, hp) for x in 'ab']\n"
            "def tokenize(x, hp):\n    return x[:hp.max_length]\n"
            "def main(cfg):\n    train(cfg)\n" + call + "\n")
    assert {"cfg", "hp"} <= _namespaces(text)


@pytest.mark.parametrize("text", [
    # a function that returns the flags on one path only
    _PARSER_FN.format(ret="if x:\n        return parser.parse_args()\n    return {}") + "config = parse_args()\n",
    # one call passes the flags, another passes something else
    _PARSER_FN.format(ret="return parser.parse_args()") + "def main(config):\n    pass\n"
    "main(parse_args())\nmain(load_yaml('a.yaml'))\n",
    # another function's parameter of the same name gets something else (the names are file-wide)
    _PARSER_FN.format(ret="return parser.parse_args()") + "def main(config):\n    build(config.model)\n"
    "def build(config):\n    pass\nmain(parse_args())\n",
    # a parameter of a function no call passes the flags to
    _PARSER_FN.format(ret="return parser.parse_args()") + "def main(config):\n    pass\n"
    "def helper(config):\n    pass\nmain(parse_args())\n",
    # the name is assigned somewhere else in the file
    _PARSER_FN.format(ret="return parser.parse_args()") + "def main(config):\n    pass\n"
    "def other():\n    config = {}\nmain(parse_args())\n",
    # parse_known_args() itself is a pair, not the flags
    "import argparse\ndef main(config):\n    pass\nmain(argparse.ArgumentParser().parse_known_args())\n",
])
def test_parsed_flags_near_misses(text):
    assert "config" not in _namespaces(text)


# -- resolving per launch ------------------------------------------------------------------------
SDXL = (
    "import argparse\nimport yaml\nimport torch\n"
    "from diffusers import UNet2DConditionModel\n"
    "from accelerate import Accelerator\n\n"
    "def main():\n"
    "    parser = argparse.ArgumentParser()\n"
    "    parser.add_argument('--config', default='configs/sdxl.yaml')\n"
    "    args = parser.parse_args()\n"
    "    cfg = yaml.safe_load(open(args.config))\n"
    "    base = cfg['model']['pretrained']\n"
    "    tcfg = cfg['training']\n"
    "    unet = UNet2DConditionModel.from_pretrained(base, subfolder='unet')\n"
    "    accelerator = Accelerator(mixed_precision=tcfg['mixed_precision'])\n"
    "    opt = torch.optim.AdamW(unet.parameters())\n"
    "    unet, opt = accelerator.prepare(unet, opt)\n"
    "    loss = unet(1).sum()\n"
    "    accelerator.backward(loss)\n\n"
    "main()\n"
)
SDXL_YAML = "model:\n  pretrained: stabilityai/stable-diffusion-xl-base-1.0\ntraining:\n  mixed_precision: bf16\n  batch_size_per_gpu: 2\n"


def test_values_from_the_scripts_own_config_enter_the_setup(tmp_path):
    write_project(tmp_path, {"train.py": SDXL, "configs/sdxl.yaml": SDXL_YAML,
                             "configs/other.yaml": SDXL_YAML.replace("stabilityai/stable-diffusion-xl-base-1.0", "org/other"),
                             "run.sh": "accelerate launch --num_processes 1 train.py\n"
                                       "accelerate launch --num_processes 1 train.py --config configs/other.yaml\n"})
    default, other = _setups(tmp_path)[0]
    assert default.values["model"].value == "stabilityai/stable-diffusion-xl-base-1.0"
    assert default.values["model"].span.path == "configs/sdxl.yaml"
    assert "model.pretrained in configs/sdxl.yaml" in default.values["model"].origin
    assert "the default of --config" in default.values["model"].origin
    assert default.values["mixed_precision"].value == "bf16"
    assert other.values["model"].value == "org/other"  # each launch reads its own --config


def test_argparse_defaults_and_flags(tmp_path):
    script = (
        "import argparse\nfrom transformers import AutoModelForCausalLM, Trainer\n"
        "p = argparse.ArgumentParser()\np.add_argument('--model_name', default='Qwen/Qwen2.5-7B')\n"
        "args = p.parse_args()\n"
        "model = AutoModelForCausalLM.from_pretrained(args.model_name)\nTrainer(model=model).train()\n"
    )
    write_project(tmp_path, {"train.py": script, "run.sh":
                             "torchrun --nproc_per_node 1 train.py\n"
                             "torchrun --nproc_per_node 1 train.py --model_name=meta-llama/Llama-3.1-8B\n"
                             "torchrun --nproc_per_node 1 train.py --model_name $MODEL\n"})
    default, flagged, unresolved = _setups(tmp_path)[0]
    assert default.values["model"].value == "Qwen/Qwen2.5-7B"
    assert "the default of --model_name in train.py" in default.values["model"].origin
    assert flagged.values["model"].value == "meta-llama/Llama-3.1-8B" and flagged.values["model"].span.path == "run.sh"
    assert "model" not in unresolved.values  # `$MODEL` is set, to a value we cannot know: no default


# -- CFX511 reads the same resolved values --------------------------------------------------
TRAINER = (
    "import yaml\nfrom transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
    "cfg = yaml.safe_load(open('train.yaml'))\n"
    "model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
    "args = TrainingArguments(output_dir='out', {kwargs})\n"
    "Trainer(model=model, args=args).train()\n"
)
DS = {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": True}}


def _cfx511(tmp_path, kwargs, yaml_text):
    write_project(tmp_path, {"train.py": TRAINER.replace("{kwargs}", kwargs), "train.yaml": yaml_text,
                             "ds.json": json.dumps(DS), "run.sh": "deepspeed --num_gpus 2 train.py\n"})
    _, _, result = lint_project(tmp_path)
    return [f for f in result.findings if f.code == "CFX511"]


def test_cfx511_takes_values_from_the_yaml_not_the_defaults(tmp_path):
    """Before: `bf16=cfg["bf16"]` was not a literal, so CFX511 claimed the default bf16=False
    against the JSON's bf16 true. The YAML says true: nothing to report."""
    assert _cfx511(tmp_path, "deepspeed='ds.json', bf16=cfg['bf16']", "bf16: true\n") == []


def test_cfx511_reports_the_yaml_value_with_its_origin(tmp_path):
    [finding] = _cfx511(tmp_path, "deepspeed='ds.json', bf16=cfg['bf16']", "bf16: false\n")
    assert "bf16=False" in finding.message and "train.yaml" in finding.message
    assert any(r.span.path == "train.yaml" for r in finding.related)


def test_cfx511_is_silent_on_a_computed_keyword(tmp_path):
    """Near miss: `bf16=torch.cuda.is_bf16_supported()` is decided at run time: no default claimed."""
    assert _cfx511(tmp_path, "deepspeed='ds.json', bf16=is_bf16()", "bf16: false\n") == []


def test_cfx511_reads_training_arguments_spread_from_the_yaml(tmp_path):
    found = _cfx511(tmp_path, "**cfg['training']",
                    "training:\n  deepspeed: ds.json\n  bf16: false\n  per_device_train_batch_size: 4\n")
    assert [f.message.split(" disagrees")[0] for f in found] == ["bf16.enabled=True"]
    # and a spread whose file is missing stays silent (near miss)
    assert _cfx511(tmp_path / "x", "**cfg['missing']", "training: {bf16: false}\n") == []


HF_YAML_SCRIPT = (
    "import sys\nfrom transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n"
    "parser = HfArgumentParser(TrainingArguments)\n"
    "if len(sys.argv) == 2 and sys.argv[1].endswith('.yaml'):\n"
    "    (args,) = parser.parse_yaml_file(sys.argv[1])\n"
    "else:\n"
    "    (args,) = parser.parse_args_into_dataclasses()\n"
    "model = AutoModelForCausalLM.from_pretrained('gpt2')\n"
    "Trainer(model=model, args=args).train()\n"
)


@pytest.mark.parametrize("yaml_text,expected", [
    ("output_dir: out\ndeepspeed: ds.json\nbf16: false\nper_device_train_batch_size: 2\n", ["bf16.enabled=True"]),
    ("output_dir: out\ndeepspeed: ds.json\nbf16: true\n", []),
])
def test_hf_argument_parser_yaml_file(tmp_path, yaml_text, expected):
    write_project(tmp_path, {"train.py": HF_YAML_SCRIPT, "args.yaml": yaml_text, "ds.json": json.dumps(DS),
                             "run.sh": "deepspeed --num_gpus 2 train.py args.yaml\n"})
    _, _, result = lint_project(tmp_path)
    found = [f.message.split(" disagrees")[0] for f in result.findings if f.code == "CFX511"]
    assert found == expected


# -- the parsed flags passed on as a call argument, read by the rules and the estimator ---------
_ACC_NO = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\nmixed_precision: 'no'\n"
_OPTIONS = ("import argparse\n\ndef parse_args():\n    parser = argparse.ArgumentParser()\n"
            "    parser.add_argument('--mixed_precision', default={default})\n"
            "    parser.add_argument('--model', default='Qwen/Qwen2.5-7B')\n"
            "    return parser.parse_args()\n")
_MAIN = ("from accelerate import Accelerator\nfrom transformers import AutoModelForCausalLM\n{imports}\n\n"
         "def main(cfg):\n    accelerator = Accelerator(mixed_precision=cfg.mixed_precision)\n"
         "    model = AutoModelForCausalLM.from_pretrained(cfg.model)\n"
         "    model = accelerator.prepare(model)\n\n"
         "if __name__ == '__main__':\n    main({call})\n")


@pytest.mark.parametrize("imports,call,options", [
    ("from options import parse_args", "parse_args()", True),  # imported from the project's module
    ("import argparse\n" + _OPTIONS.split("\n", 2)[2].replace("{default}", "None"), "parse_args()", False),
    (("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--mixed_precision', default=None)\n"
      "parser.add_argument('--model', default='Qwen/Qwen2.5-7B')"), "parser.parse_args()", False),
])
def test_cfx401_reads_flags_passed_to_main(tmp_path, imports, call, options):
    """`main(parse_args())` with `def main(cfg): Accelerator(mixed_precision=cfg.mixed_precision)`:
    the flag defaults to None and the launch leaves it out, so the config's 'no' decides
    (before: `cfg` was not known to hold the flags, and the rule stayed silent)."""
    files = {"acc.yaml": _ACC_NO, "train.sh": "accelerate launch --config_file acc.yaml train.py\n",
             "train.py": _MAIN.format(imports=imports, call=call)}
    if options:
        files["options.py"] = _OPTIONS.format(default="None")
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path)
    assert [(f.code, f.span.path) for f in result.findings if f.code == "CFX401"] == [("CFX401", "acc.yaml")]
    setup = _setups(tmp_path)[0][0]
    assert setup.values["model"].value == "Qwen/Qwen2.5-7B"  # the estimator sizes the flag's default model


@pytest.mark.parametrize("change", ["default", "launch"])
def test_cfx401_flags_passed_to_main_near_misses(tmp_path, change):
    """The same flow where the flag decides: its default is 'bf16', or the launch passes it."""
    launch = "accelerate launch --config_file acc.yaml train.py" + (" --mixed_precision bf16" if change == "launch" else "")
    write_project(tmp_path, {"acc.yaml": _ACC_NO, "train.sh": launch + "\n",
                             "train.py": _MAIN.format(imports="from options import parse_args", call="parse_args()"),
                             "options.py": _OPTIONS.format(default="'bf16'" if change == "default" else "None")})
    _, _, result = lint_project(tmp_path)
    assert [f for f in result.findings if f.code == "CFX401"] == []
