"""Versions without pins (docs/versions.md): where evidence comes from, the code's idioms as
lower bounds, and each version-gated rule's policy when nothing says which version."""

import ast
import re

import pytest

from cfgfix.analysis.version_idioms import code_bounds
from cfgfix.analysis.versions import CURRENT, Versions
from cfgfix.rules.base import all_rules, doc_sections
from conftest import REPO, lint_project, write_project
from test_notebook import notebook

TRAINS = (
    "import torch\nfrom transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m')\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "model(**batch).loss.backward()\noptimizer.step()\n"
)


def _bounds(code):
    return {package: {op: version for op, (version, _) in found.items()}
            for package, found in code_bounds(ast.parse(code), code).items()}


# ----------------------------------------------------------------------------- idioms

def test_idioms_date_transformers():
    code = (
        "from transformers import AutoModelForCausalLM, Trainer\n"
        "m = AutoModelForCausalLM.from_pretrained('m', attn_implementation='sdpa')\n"
        "Trainer(model=m, processing_class=tok)\n"
    )
    assert _bounds(code) == {"transformers": {">=": "4.46.0"}}
    assert "line 3" in code_bounds(ast.parse(code), code)["transformers"][">="][1]
    assert _bounds("import transformers\nm = transformers.AutoModel.from_pretrained('m', dtype='auto')\n") == {
        "transformers": {">=": "4.56.0"}}
    removed = ("from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments as A\n"
               "args = A('out', evaluation_strategy='steps')\nSeq2SeqTrainer(model=m, args=args, tokenizer=tok)\n")
    assert _bounds(removed) == {"transformers": {"<": "4.51.0"}}


def test_a_local_trainer_subclass_without_its_own_init_dates_like_the_trainer():
    # ChatGLM3's finetune_hf.py: `class Seq2SeqTrainer(_Seq2SeqTrainer)` overrides only
    # `prediction_step`, so `Seq2SeqTrainer(..., tokenizer=tokenizer)` reaches transformers'
    # own __init__, which 5.0 no longer takes it in
    code = ("from transformers import Seq2SeqTrainer as _Seq2SeqTrainer, TrainingArguments\n"
            "class Seq2SeqTrainer(_Seq2SeqTrainer):\n    def prediction_step(self, model, inputs, *a, **k):\n"
            "        return super().prediction_step(model, inputs, *a, **k)\n"
            "trainer = Seq2SeqTrainer(model=m, args=args, tokenizer=tok)\n")
    assert _bounds(code) == {"transformers": {"<": "5.0.0"}}
    assert _bounds("import transformers\nclass T(transformers.Trainer):\n    x = 1\nT(model=m, tokenizer=tok)\n") == {
        "transformers": {"<": "5.0.0"}}
    args = ("from transformers import TrainingArguments\nclass Args(TrainingArguments):\n    pass\n"
            "Args('out', evaluation_strategy='steps')\n")
    assert _bounds(args) == {"transformers": {"<": "4.51.0"}}


@pytest.mark.parametrize("files, dated", [
    ({"trainers/__init__.py": "", "trainers/seq2seq.py": "from transformers import Seq2SeqTrainer as Base\n"
      "class MyTrainer(Base):\n    def compute_loss(self, model, inputs, **kw):\n        return model(**inputs).loss\n",
      "train.py": "from trainers.seq2seq import MyTrainer\nMyTrainer(model=m, args=a, tokenizer=tok).train()\n"}, True),
    ({"pkg/__init__.py": "", "pkg/trainer.py": "import transformers\nclass T(transformers.Trainer):\n    pass\n",
      "pkg/run.py": "from .trainer import T as Runner\nRunner(model=m, tokenizer=tok)\n"}, True),
    # near misses: the subclass takes `tokenizer` in its own __init__; a trl base; a class of
    # the same name the caller defines itself; an import from a library, not the project
    ({"trainers.py": "from transformers import Trainer\nclass MyTrainer(Trainer):\n"
      "    def __init__(self, tokenizer=None, **kw):\n        super().__init__(processing_class=tokenizer, **kw)\n",
      "train.py": "from trainers import MyTrainer\nMyTrainer(model=m, tokenizer=tok)\n"}, False),
    ({"trainers.py": "from trl import SFTTrainer\nclass MyTrainer(SFTTrainer):\n    pass\n",
      "train.py": "from trainers import MyTrainer\nMyTrainer(model=m, tokenizer=tok)\n"}, False),
    ({"trainers.py": "from transformers import Trainer\nclass MyTrainer(Trainer):\n    pass\n",
      "train.py": "class MyTrainer:\n    def __init__(self, **kw):\n        pass\nMyTrainer(model=m, tokenizer=tok)\n"}, False),
    ({"trainers.py": "from transformers import Trainer\nclass MyTrainer(Trainer):\n    pass\n",
      "train.py": "from otherlib.trainers import MyTrainer\nMyTrainer(model=m, tokenizer=tok)\n"}, False),
])
def test_a_trainer_subclass_from_another_module_dates_the_project(tmp_path, files, dated):
    from cfgfix.analysis.version_idioms import project_bounds

    write_project(tmp_path, files)
    bounds = project_bounds(tmp_path)
    assert (bounds.get("transformers", {}).get("<", ("",))[0] == "5.0.0") is dated


def test_idiom_near_misses_date_nothing():
    # diffusers' own loaders; a local class or Trainer subclass; an unimported name; the
    # keyword on another call; trl's SFTTrainer (its own `tokenizer=` history); a comment
    assert _bounds("from diffusers import UNet2DConditionModel\nu = UNet2DConditionModel.from_pretrained('m', dtype=x)\n") == {}
    assert _bounds("class M:\n    pass\nm = M.from_pretrained('m', dtype=x)\n") == {}
    assert _bounds("m = AutoModel.from_pretrained('m', dtype=x)\n") == {}
    assert _bounds("from transformers import Trainer\nclass MyTrainer(Trainer):\n    def __init__(self, tokenizer=None, **kw):\n"
                   "        super().__init__(processing_class=tokenizer, **kw)\nMyTrainer(tokenizer=tok)\n") == {}
    assert _bounds("from trl import SFTTrainer\nclass MyTrainer(SFTTrainer):\n    pass\nMyTrainer(tokenizer=tok)\n") == {}
    assert _bounds("class Trainer:\n    pass\nclass MyTrainer(Trainer):\n    pass\nMyTrainer(tokenizer=tok)\n") == {}
    assert _bounds("from transformers import AutoTokenizer\nf(processing_class=tok)  # dtype=\n") == {}
    assert _bounds("from trl import SFTTrainer\nSFTTrainer(model=m, tokenizer=tok)\n") == {}


def test_code_bounds_narrow_a_pin_and_replace_an_installed_copy_outside_them(monkeypatch):
    from cfgfix.analysis import versions as module

    pinned = Versions({"transformers": module.VersionInfo("transformers", ">=4.40,<5", "requirements.txt", "pin")})
    narrowed = pinned.with_code_bounds({"transformers": {">=": ("4.56.0", "`dtype=` ... line 3")}}).get("transformers")
    assert narrowed.specifier == ">=4.40,<5,>=4.56.0" and narrowed.at_least("4.56") is True and narrowed.below("5") is True
    exact = Versions({"transformers": module.VersionInfo("transformers", "==4.46.3", "requirements.txt", "pin")})
    assert exact.with_code_bounds({"transformers": {">=": ("4.56.0", "x")}}).get("transformers").specifier == "==4.46.3"
    monkeypatch.setattr(module, "_installed", lambda name: module.VersionInfo(name, "==4.30.0", "installed", "installed"))
    floor = Versions({}).with_code_bounds({"transformers": {">=": ("4.56.0", "x")}}).get("transformers")
    assert (floor.specifier, floor.evidence) == (">=4.56.0", "code")
    monkeypatch.setattr(module, "_installed", lambda name: module.VersionInfo(name, "==5.24.0", "installed", "installed"))
    old_code = Versions({}).with_code_bounds({"transformers": {"<": ("5.0.0", "`tokenizer=`")}})
    assert old_code.get("transformers").specifier == "<5.0.0"  # 5.24 cannot run `Trainer(tokenizer=...)`
    assert old_code.resolve("transformers").below("5") is True  # an upper bound stops the assumption
    assert Versions({}).with_code_bounds({"transformers": {">=": ("4.56.0", "x")}}).get("transformers").specifier == "==5.24.0"


def test_resolve_assumes_the_current_release_only_without_evidence(tmp_path):
    write_project(tmp_path, {"requirements.txt": "transformers\ntorch==2.3.1\n"})
    versions = Versions.from_project(tmp_path)
    tf = versions.resolve("transformers")
    assert tf.evidence == "assumed" and tf.specifier == f">={CURRENT['transformers']}"
    assert "unpinned in requirements.txt" in tf.describe() and "pin a version to confirm" in tf.describe()
    assert versions.resolve("torch").specifier == "==2.3.1"  # a pin is never overridden
    assert versions.resolve("bitsandbytes").known is False  # no current release read: nothing assumed
    floored = versions.with_code_bounds({"transformers": {">=": ("4.56.0", "x")}}).resolve("transformers")
    assert floored.evidence == "assumed"  # a lower bound alone does not say which release


@pytest.mark.parametrize("files, below", [
    ({"requirements.txt": "torch==1.13.1\ntransformers==4.30.0\n"}, True),  # ymcui/Chinese-LLaMA-Alpaca
    ({"requirements.txt": "torch>=1.10,<2\n"}, True),
    ({"environment.yml": "dependencies:\n  - pytorch=1.12.1\n  - pip\n"}, True),  # conda's name for torch
    ({"requirements.txt": "torch>=1.13\n"}, None),  # admits torch 2.x: the current deepspeed installs
    ({"requirements.txt": "torch==2.1.0\n"}, None),
    ({"requirements.txt": "transformers==4.30.0\n"}, None),  # no torch pin: nothing excludes the current release
    ({"requirements.txt": "torch==1.13.1\ndeepspeed==0.19.8\n"}, False),  # the project's own deepspeed pin wins
])
def test_a_torch_pin_below_2_excludes_the_deepspeed_releases_that_need_torch_2(tmp_path, files, below):
    write_project(tmp_path, files)
    ds = Versions.from_project(tmp_path).resolve("deepspeed")
    if below is None:
        assert ds.evidence == "assumed" and ds.specifier == f">={CURRENT['deepspeed']}"
    else:
        assert ds.below("0.19.3") is below
    if below:
        assert "require torch>=2.0.0" in ds.describe()


def test_cfx512_silent_where_the_torch_pin_dates_deepspeed(tmp_path):
    ds = '{"fp16": {"enabled": "auto", "loss_scale": 0, "min_loss_scale": 1e-10}, "train_batch_size": "auto"}\n'
    launch = "deepspeed train.py --deepspeed ds_zero2.json --fp16\n"
    old = {"requirements.txt": "torch==1.13.1\ntransformers==4.30.0\n", "ds_zero2.json": ds, "run.sh": launch}
    assert _codes(tmp_path / "old", old, "CFX512") == []
    new = {**old, "requirements.txt": "torch>=2.1\ntransformers==4.30.0\n"}
    assert [f.span.line for f in _codes(tmp_path / "new", new, "CFX512")] == [1]


# ------------------------------------------------------------------------ the rules

def _codes(tmp_path, files, select):
    write_project(tmp_path, files)
    _, _, findings = lint_project(tmp_path, select=[select])
    return [f for f in findings.findings if f.code == select]


def test_cfx206_states_the_assumed_version(tmp_path):
    found = _codes(tmp_path, {"train.py": TRAINS}, "CFX206")
    assert len(found) == 1
    assert "assumed: the current release: no version of transformers is pinned or installed" in found[0].message


def test_cfx206_silent_where_the_code_only_runs_on_4x(tmp_path):
    code = TRAINS.replace("model(**batch).loss.backward()\noptimizer.step()\n",
                          "from transformers import Trainer\nTrainer(model=model, tokenizer=tok).train()\n")
    assert _codes(tmp_path, {"train.py": code}, "CFX206") == []
    # near miss: the same script with `processing_class=` (4.46+) still assumes 5.x
    assert len(_codes(tmp_path / "b", {"train.py": code.replace("tokenizer=", "processing_class=")}, "CFX206")) == 1


def _only_train_py(root):
    """CFX206 when only train.py is named, as a pre-commit run names the changed files."""
    import os
    from pathlib import Path

    from cfgfix.engine import Engine
    from cfgfix.settings import load_settings, with_overrides
    from cfgfix.workspace import discover

    cwd = os.getcwd()
    os.chdir(root)
    try:
        settings = with_overrides(load_settings(root), select=["CFX206"])
        files, _ = discover([Path("train.py")], settings)
        return [f for f in Engine(settings, use_cache=False).run(files).findings if f.code == "CFX206"]
    finally:
        os.chdir(cwd)


def test_cfx206_silent_where_another_module_of_the_project_dates_4x(tmp_path):
    """The project runs one transformers: `Trainer(tokenizer=...)` in any of its files dates
    it, for every file (issue 25), also when only the training script is checked."""
    sibling = "from transformers import Trainer\ntrainer = Trainer(model=m, tokenizer=tok)\n"
    for where in ("eval.py", "tools/evaluate/run.py", "pkg/sub/__init__.py"):
        root = tmp_path / where.replace("/", "_")
        assert _codes(root, {"train.py": TRAINS, where: sibling}, "CFX206") == [], where
        assert _only_train_py(root) == [], where
    # near misses: an API that does not date it below 5, a Trainer that is not transformers',
    # a commented-out call, a file that does not parse, a virtualenv's copy of transformers
    for name, text in (("eval.py", sibling.replace("tokenizer=", "processing_class=")),
                       ("eval.py", "from trl import SFTTrainer as Trainer\nTrainer(model=m, tokenizer=tok)\n"),
                       ("eval.py", "# Trainer(model=m, tokenizer=tok)\n"),
                       ("eval.py", sibling + "def broken(:\n"),
                       (".venv/lib/site-packages/x.py", sibling)):
        root = tmp_path / ("near" + str(abs(hash((name, text)))))
        assert len(_codes(root, {"train.py": TRAINS, name: text}, "CFX206")) == 1, (name, text)
    # a pin that says 5 wins over the code
    pinned = tmp_path / "pinned"
    assert len(_codes(pinned, {"train.py": TRAINS, "eval.py": sibling, "requirements.txt": "transformers>=5\n"},
                      "CFX206")) == 1


def test_cfx206_silent_on_a_pin_admitting_4x(tmp_path):
    assert _codes(tmp_path, {"train.py": TRAINS, "requirements.txt": "transformers>=4.40\n"}, "CFX206") == []


def test_cfx206_in_a_notebook_names_its_unpinned_install(tmp_path):
    nb = notebook("!pip install -q transformers peft\n", TRAINS)
    found = _codes(tmp_path, {"train.ipynb": nb}, "CFX206")
    assert len(found) == 1 and "unpinned in train.ipynb (pip install)" in found[0].message
    pinned = notebook("%pip install -q transformers==4.44.2 peft\n", TRAINS)
    assert _codes(tmp_path / "p", {"train.ipynb": pinned}, "CFX206") == []  # the notebook's own pin: 4.x


def test_cfx102_fix_keyword_from_the_files_own_dtype(tmp_path):
    code = ("import torch\nfrom transformers import AutoModel\n"
            "enc = AutoModel.from_pretrained('e', dtype=torch.float32)\n"
            "m = AutoModel.from_pretrained('m')\nm = m.half()\n")
    found = _codes(tmp_path, {"train.py": code, "requirements.txt": "transformers>=4.40,<5\n"}, "CFX102")
    assert len(found) == 1 and "dtype=torch.float16" in found[0].fix.edits[0].content
    # near miss: no `dtype=` anywhere, the same pin: `torch_dtype=`, which 4.40 accepts
    plain = code.replace("enc = AutoModel.from_pretrained('e', dtype=torch.float32)\n", "")
    found = _codes(tmp_path / "b", {"train.py": plain, "requirements.txt": "transformers>=4.40,<5\n"}, "CFX102")
    assert len(found) == 1 and "torch_dtype=torch.float16" in found[0].fix.edits[0].content


def test_cfx207_assumed_fix_is_unsafe(tmp_path):
    found = _codes(tmp_path, {"train.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n"}, "CFX207")
    assert len(found) == 1 and "assumed" in found[0].message
    assert found[0].fix.applicability.value == "unsafe"
    found = _codes(tmp_path / "p", {"train.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
                                    "requirements.txt": "torch==2.4.1\n"}, "CFX207")
    assert found[0].fix.applicability.value == "safe" and "assumed" not in found[0].message


# ------------------------------------------------------------------------- the docs

def _reads_versions(rule) -> bool:
    import inspect
    import sys

    text = inspect.getsource(sys.modules[type(rule).__module__] if not isinstance(rule, type) else sys.modules[rule.__module__])
    return bool(re.search(r"\.versions\.|peft_analysis|_auto_consequence", text))


def test_every_version_gated_rule_documents_its_policy():
    table = (REPO / "docs" / "versions.md").read_text(encoding="utf-8")
    gated = [r for r in all_rules() if _reads_versions(r)]
    assert {r.code for r in gated} >= {"CFX102", "CFX104", "CFX206", "CFX207", "CFX305", "CFX306", "CFX307", "CFX507", "CFX509"}
    for rule in gated:
        assert "Versions" in doc_sections(rule.doc()), rule.code
        assert f"[{rule.code}](../rules/{rule.code}.md)" in table, rule.code


_ORDER_HEAD = "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"


def test_cfx206_trained_means_the_load_the_training_reaches_in_statement_order(tmp_path):
    """A load that rebinds `model` after `trainer.train()` (for inference) is not the trained
    one; a rebinding under an `if` does not end the first load's reach; a loop may train a
    load written after the training on its next pass (issue 25)."""
    cases = {
        "after training, for inference": (
            "model = AutoModelForCausalLM.from_pretrained('org/base', dtype='float32')\n"
            "trainer = Trainer(model=model, args=TrainingArguments('out'))\ntrainer.train()\n"
            "model = AutoModelForCausalLM.from_pretrained('out')\nmodel.generate()\n", []),
        "in a function, then reloaded": (
            "def main():\n    model = AutoModelForCausalLM.from_pretrained('org/base')\n"
            "    Trainer(model=model, args=TrainingArguments('out')).train()\n"
            "    model = AutoModelForCausalLM.from_pretrained('out')\n    return model\n", [2]),
        "a rebinding under an if": (
            "model = AutoModelForCausalLM.from_pretrained('org/base')\nif eval_only:\n"
            "    model = AutoModelForCausalLM.from_pretrained('out', dtype='bfloat16')\n"
            "Trainer(model=model, args=TrainingArguments('out')).train()\n", [1]),
        "a loop trains the next pass's load": (
            "for stage in stages:\n    if stage:\n        Trainer(model=model, args=TrainingArguments('o')).train()\n"
            "    model = AutoModelForCausalLM.from_pretrained('org/base')\n", [4]),
        "an unrelated name trained earlier": (
            "other = AutoModelForCausalLM.from_pretrained('a', dtype='float32')\n"
            "Trainer(model=other, args=TrainingArguments('o')).train()\n"
            "model = AutoModelForCausalLM.from_pretrained('b')\nmodel.generate()\n", []),
    }
    for why, (body, lines) in cases.items():
        root = tmp_path / str(abs(hash(why)))
        found = _codes(root, {"train.py": _ORDER_HEAD + body}, "CFX206")
        assert [f.span.line - 1 for f in found] == lines, why
