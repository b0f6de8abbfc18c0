"""CFX201 beyond the embedded examples: what counts as the HF Trainer scaling the loss
(a Trainer, not its arguments), the `else` of an autocast `if`, and the GPU side of the
`"cuda" if torch.cuda.is_available() else "cpu"` idiom."""

import pytest

from conftest import lint_project, write_project

LOOP = (
    "optimizer = torch.optim.Adam(model.parameters())\n"
    "for x, y in loader:\n"
    "    with torch.autocast('cuda'):\n"
    "        loss = criterion(model(x), y)\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
)


def _lines(tmp_path, code, files=None):
    write_project(tmp_path, {"train.py": code, **(files or {})})
    _, _, result = lint_project(tmp_path, select=["CFX201"])
    return [(f.path, f.span.line) for f in result.findings]


FLAGGED = {
    "a local dataclass named TrainingArguments (not HF's)": (
        "import torch\nfrom dataclasses import dataclass\n"
        "@dataclass\nclass TrainingArguments:\n    fp16: bool = True\n" + LOOP, 8),
    "HF TrainingArguments imported only to parse options": (
        "import torch\nfrom transformers import HfArgumentParser, TrainingArguments\n"
        "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n" + LOOP, 6),
    "trl's SFTConfig without a trainer": (
        "import torch\nfrom trl import SFTConfig\nconfig = SFTConfig(output_dir='out', fp16=True)\n" + LOOP, 6),
    "a TrainerCallback is not a Trainer": (
        "import torch\nfrom transformers import TrainerCallback\n" + LOOP, 5),
    "a region in the try, a fallback forward in its except": (
        "import torch\noptimizer = torch.optim.Adam(model.parameters())\n"
        "for x in loader:\n"
        "    try:\n"
        "        with torch.autocast('cuda'):\n"
        "            loss = model(x).mean()\n"
        "    except RuntimeError:\n"
        "        loss = model(x).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n", 5),
    "the GPU side of the is_available idiom, negated": (
        "import torch\noptimizer = torch.optim.Adam(model.parameters())\n"
        "device = 'cpu' if not torch.cuda.is_available() else 'cuda'\n"
        "for x in loader:\n"
        "    with torch.autocast(device_type=device):\n"
        "        loss = model(x).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n", 5),
}

SILENT = {
    "transformers.Trainer built through the module": (
        "import torch\nimport transformers\n"
        "trainer = transformers.Trainer(model=model, args=args)\n" + LOOP),
    "a Trainer subclass defined in this file": (
        "import torch\nfrom transformers import Trainer as HfTrainer\n"
        "class MyTrainer(HfTrainer):\n"
        "    def training_step(self, model, inputs):\n"
        "        with torch.autocast('cuda'):\n"
        "            loss = self.compute_loss(model, inputs)\n"
        "        loss.backward()\n"
        "        self.optimizer.step()\n"
        "        return loss.detach()\n"),
    "the loss rebound after the if, outside autocast": (
        "import torch\noptimizer = torch.optim.Adam(model.parameters())\n"
        "for x in loader:\n"
        "    if amp:\n"
        "        with torch.autocast('cuda'):\n"
        "            loss = model(x).mean()\n"
        "    loss = model(x).float().mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"),
    "a device chosen by an option, not by is_available": (
        "import torch\noptimizer = torch.optim.Adam(model.parameters())\n"
        "device = 'cuda' if args.gpu else 'cpu'\n"
        "for x in loader:\n"
        "    with torch.autocast(device_type=device):\n"
        "        loss = model(x).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"),
}


@pytest.mark.parametrize("why", sorted(FLAGGED))
def test_flagged(tmp_path, why):
    code, line = FLAGGED[why]
    assert _lines(tmp_path, code) == [("train.py", line)], why


@pytest.mark.parametrize("why", sorted(SILENT))
def test_silent(tmp_path, why):
    assert _lines(tmp_path, SILENT[why]) == [], why


def test_a_trainer_base_class_two_project_modules_away(tmp_path):
    files = {
        "lib/base.py": "from transformers import Seq2SeqTrainer\nclass Base(Seq2SeqTrainer):\n"
                       "    def compute_loss(self, model, inputs, return_outputs=False):\n"
                       "        return model(**inputs).loss\n",
        "lib/__init__.py": "",
        "lib/mine.py": "from lib.base import Base\nclass Mine(Base):\n    def loss_of(self, x):\n        return x\n",
    }
    code = (
        "import torch\nfrom lib.mine import Mine\n"
        "class Tuned(Mine):\n"
        "    def training_step(self, model, inputs):\n"
        "        with torch.autocast('cuda'):\n"
        "            loss = self.compute_loss(model, inputs)\n"
        "        loss.backward()\n"
        "        self.optimizer.step()\n"
        "        return loss\n"
    )
    assert _lines(tmp_path, code, files) == []
    # the same class over a project base that is not a Trainer is the project's own loop
    files["lib/base.py"] = "class Base:\n    def compute_loss(self, model, inputs):\n        return model(**inputs).loss\n"
    assert _lines(tmp_path / "b", code, files) == [("train.py", 5)]


@pytest.mark.parametrize("base,flagged", [
    # a Trainer base in a module that holds no load, loss or backward: followed all the same
    ("from transformers import Trainer\n\nclass BaseTrainer(Trainer):\n    def log_metrics(self, m):\n        print(m)\n",
     False),
    # near miss: the same module, but the base is the project's own class, not a Trainer
    ("class BaseTrainer:\n    def log_metrics(self, m):\n        print(m)\n", True),
])
def test_a_trainer_base_in_a_module_without_the_parse_words(tmp_path, base, flagged):
    code = (
        "import torch\nfrom trainers.base import BaseTrainer\n"
        "class MyTrainer(BaseTrainer):\n"
        "    def training_step(self, model, inputs):\n"
        "        with torch.autocast('cuda', dtype=torch.float16):\n"
        "            out = model(**inputs)\n"
        "        out.sum().backward()\n"
        "        self.optimizer.step()\n"
        "        return out\n"
    )
    found = _lines(tmp_path, code, {"trainers/__init__.py": "", "trainers/base.py": base})
    assert found == ([("train.py", 5)] if flagged else [])
