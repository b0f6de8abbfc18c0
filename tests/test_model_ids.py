"""CFX206 follows a model id through the code that hands it over (issue 25): a constructor's
or function's parameter passed by its callers, in this module or another, and a config
object's default field. Silent only when every id the load may get is stored in float32;
one unknown path (the command line, `*args`, an argument that sets the field) and it speaks."""

from __future__ import annotations

import ast

import pytest
from conftest import lint_project, write_project

from cfgfix.analysis.model_ids import ModelIds

V5 = {"requirements.txt": "transformers==5.5.4\n"}

# The model module: a class whose constructor loads the id it is given and trains it.
MODEL = (
    "from transformers import AutoModelForSequenceClassification, Trainer\n"
    "class {cls}:\n"
    "    def __init__(self, {param}, dataset, training_args):\n"
    "        self.name = {param}\n"
    "        self.model = AutoModelForSequenceClassification.from_pretrained({param})\n"
    "        self.trainer = Trainer(model=self.model, args=training_args, train_dataset=dataset)\n"
    "    def train(self):\n"
    "        self.trainer.train()\n"
)
CONFIG = (
    "from dataclasses import dataclass\n"
    "@dataclass\n"
    "class ModelConfig:\n"
    "    model_name: str = {model_id!r}\n"
    "    seed: int = 42\n"
)
TRAIN = (
    "from transformers import TrainingArguments\n"
    "{imports}\n"
    "def train():\n"
    "    cfg = ModelConfig()\n"
    "    model_name = cfg.model_name\n"
    "    runner = {cls}({argument}, dataset, TrainingArguments('out', fp16=True))\n"
    "    runner.train()\n"
)


def _project(tmp_path, model_id, *, cls="BERTfinetuning", param="model_name", argument="model_name",
             imports=None, layout="src"):
    files = dict(V5)
    if layout == "src":
        files["src/__init__.py"] = ""
        files["src/models/__init__.py"] = ""
        files["src/models/bert.py"] = MODEL.format(cls=cls, param=param)
        files["src/config_bert.py"] = CONFIG.format(model_id=model_id)
        files["src/training/__init__.py"] = ""
        files["src/training/train_bert.py"] = TRAIN.format(
            imports=imports or f"from src.models.bert import {cls}\nfrom src.config_bert import ModelConfig",
            cls=cls, argument=argument)
        model_file = "src/models/bert.py"
    else:  # relative imports inside one package
        files["pkg/__init__.py"] = ""
        files["pkg/model.py"] = MODEL.format(cls=cls, param=param)
        files["pkg/settings.py"] = CONFIG.format(model_id=model_id)
        files["pkg/run.py"] = TRAIN.format(
            imports=imports or f"from .model import {cls}\nfrom .settings import ModelConfig", cls=cls, argument=argument)
        model_file = "pkg/model.py"
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    return [(f.code, f.path.replace("\\", "/") if isinstance(f.path, str) else str(f.path), f.span.line)
            for f in result.findings], model_file


@pytest.mark.parametrize("model_id", [
    "distilbert-base-uncased-finetuned-sst-2-english", "bert-base-uncased", "google-bert/bert-base-cased",
    "roberta-base", "gpt2",
])
def test_a_float32_checkpoint_through_another_modules_constructor_and_a_config_default(tmp_path, model_id):
    findings, _ = _project(tmp_path, model_id)
    assert findings == []


def test_a_half_precision_checkpoint_through_the_same_path_is_flagged(tmp_path):
    findings, model_file = _project(tmp_path, "Qwen/Qwen2.5-0.5B")
    assert [(code, line) for code, _, line in findings] == [("CFX206", 5)]
    assert findings[0][1].endswith(model_file)


@pytest.mark.parametrize("cls, param", [("Finetuner", "checkpoint"), ("SentimentModel", "pretrained")])
def test_other_names_and_a_package_with_relative_imports(tmp_path, cls, param):
    assert _project(tmp_path, "roberta-base", cls=cls, param=param, layout="pkg")[0] == []
    assert len(_project(tmp_path, "meta-llama/Llama-3.2-1B", cls=cls, param=param, layout="pkg")[0]) == 1


@pytest.mark.parametrize("argument", [
    "args.model_name",  # the command line: unknown
    "*names",  # unpacked: unknown
    "ModelConfig(model_name=other).model_name",  # not a plain config object
])
def test_an_id_the_code_cannot_follow_keeps_the_finding(tmp_path, argument):
    findings, _ = _project(tmp_path, "bert-base-uncased", argument=argument)
    assert len(findings) == 1


@pytest.mark.parametrize("model_id, found", [("bert-base-uncased", 0), ("Qwen/Qwen2.5-0.5B", 1)])
def test_a_class_re_exported_by_its_package(tmp_path, model_id, found):
    # `from src.models import BERTfinetuning`, re-exported by src/models/__init__.py
    imports = "from src.models import BERTfinetuning\nfrom src.config_bert import ModelConfig"
    files = dict(V5)
    files.update({
        "src/__init__.py": "", "src/models/__init__.py": "from .bert import BERTfinetuning\n",
        "src/models/bert.py": MODEL.format(cls="BERTfinetuning", param="model_name"),
        "src/config_bert.py": CONFIG.format(model_id=model_id),
        "src/train.py": TRAIN.format(imports=imports, cls="BERTfinetuning", argument="model_name"),
    })
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert len(result.findings) == found


def test_a_config_built_with_arguments_is_not_its_default(tmp_path):
    imports = "from src.models.bert import BERTfinetuning\nfrom src.config_bert import ModelConfig"
    files = dict(V5)
    files.update({
        "src/__init__.py": "", "src/models/__init__.py": "",
        "src/models/bert.py": MODEL.format(cls="BERTfinetuning", param="model_name"),
        "src/config_bert.py": CONFIG.format(model_id="bert-base-uncased"),
        "src/train.py": TRAIN.format(imports=imports, cls="BERTfinetuning", argument="model_name").replace(
            "ModelConfig()", "ModelConfig(model_name=chosen)"),
    })
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert len(result.findings) == 1


def test_every_caller_must_pass_a_float32_checkpoint(tmp_path):
    model = MODEL.format(cls="Runner", param="name")
    files = dict(V5)
    files.update({
        "models.py": model,
        "a.py": "from models import Runner\nRunner('bert-base-uncased', ds, args).train()\n",
        "b.py": "from models import Runner\nNAME = 'mistralai/Mistral-7B-v0.1'\nRunner(NAME, ds, args).train()\n",
    })
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert len(result.findings) == 1
    files["b.py"] = "from models import Runner\nNAME = 'gpt2'\nRunner(name=NAME, dataset=ds, training_args=args).train()\n"
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert result.findings == []


def test_a_function_parameter_with_a_default_and_a_nested_call(tmp_path):
    files = dict(V5)
    files["train.py"] = (
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        "def load(name='gpt2', *, revision=None):\n"
        "    if revision:\n"
        "        print(revision)\n"
        "    model = AutoModelForCausalLM.from_pretrained(name, revision=revision)\n"
        "    return model\n"
        "def main(fast):\n"
        "    model = load()\n"
        "    other = load('distilgpt2')\n"
        "    optimizer = torch.optim.AdamW(model.parameters())\n"
        "    model(**batch).loss.backward()\n"
        "    optimizer.step()\n"
    )
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert result.findings == []
    files["train.py"] = files["train.py"].replace("load('distilgpt2')", "load('EleutherAI/pythia-160m')")
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    assert [f.span.line for f in result.findings] == [6]


def test_model_ids_of_the_call():
    tree = ast.parse(
        "NAME = 'gpt2'\nA.from_pretrained('roberta-base')\nA.from_pretrained(NAME)\n"
        "A.from_pretrained(pretrained_model_name_or_path='t5-small')\nA.from_pretrained(args.model)\n"
        "def f(x):\n    A.from_pretrained(x)\n"
        "for NAME2 in names:\n    A.from_pretrained(NAME2)\n"
    )
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "from_pretrained"),
                   key=lambda c: c.lineno)
    ids = ModelIds(tree)
    assert [ids.of(c) for c in calls] == [{"roberta-base"}, {"gpt2"}, {"t5-small"}, None, None, None]
