"""A trainer class that inherits its model from one of the project's base classes
(`class LoraTrainer(BaseTrainer)`, `BaseTrainer` in the same module or in the project's
`trainers/base.py`): what the base's `__init__` (or its other methods) leave in
`self.model` reaches the subclass's methods, so a cast or move there is judged against
that load. Before, the subclass's methods saw an unknown `self.model`, and a subclass in
its own module was not even analysed (no load in its text)."""

from __future__ import annotations

import textwrap

import pytest

from conftest import lint_project, write_project

BASE = """
import torch
from transformers import AutoModelForCausalLM


class BaseTrainer:
    def __init__(self, name):
        self.model = AutoModelForCausalLM.from_pretrained(name, {load})
        self.step = 0
"""

SUB = """
import torch
{imports}


class LoraTrainer(BaseTrainer):
{init}    def prepare(self):
        self.model{call}
"""


def _findings(tmp_path, load, call, *, same_module=False, init="", base=BASE, sub=SUB):
    base_text = textwrap.dedent(base).replace("{load}", load)
    if same_module:
        files = {"train.py": base_text + textwrap.dedent(sub).replace("{imports}", "").replace("{init}", init)
                 .replace("{call}", call).replace("import torch\n", "", 1)}
    else:
        files = {"trainers/__init__.py": "", "trainers/base.py": base_text,
                 "trainers/lora.py": textwrap.dedent(sub).replace("{imports}", "from trainers.base import BaseTrainer")
                 .replace("{init}", init).replace("{call}", call)}
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path)
    return sorted((f.code, f.span.path, f.span.line) for f in result.findings)


@pytest.mark.parametrize("same_module", [False, True])
@pytest.mark.parametrize("load,call,code", [
    ("torch_dtype=torch.bfloat16", ".to(torch.bfloat16)", "CFX101"),  # already bfloat16
    ("device_map='auto'", ".to('cuda')", "CFX103"),  # moves a dispatched model
    ("load_in_4bit=True", ".half()", "CFX104"),  # casts a 4-bit model
])
def test_the_subclass_method_sees_the_base_load(tmp_path, same_module, load, call, code):
    found = _findings(tmp_path, load, call, same_module=same_module)
    path = "train.py" if same_module else "trainers/lora.py"
    assert [f for f in found if f[0] == code and f[1] == path], found


def test_a_subclass_init_that_calls_super_keeps_the_base_load(tmp_path):
    init = "    def __init__(self, name):\n        super().__init__(name)\n        self.lr = 1e-4\n\n"
    found = _findings(tmp_path, "device_map='auto'", ".to('cuda')", init=init)
    assert ("CFX103", "trainers/lora.py", 12) in found


LOADER_BASE = """
import torch
from transformers import AutoModelForCausalLM


class BaseTrainer:
    def __init__(self, name):
        self.model = self.load(name)

    def load(self, name):
        return AutoModelForCausalLM.from_pretrained(name, {load})
"""


@pytest.mark.parametrize("base,init,why", [
    (BASE, "    def __init__(self, name):\n        self.lr = 1e-4\n\n", "the subclass's __init__ does not run the base's"),
    (BASE, "    def __init__(self, name):\n        super().__init__(name)\n        self.model = build(name)\n\n",
     "the subclass binds self.model itself"),
    (LOADER_BASE, "    def load(self, name):\n        return make_model(name)\n\n",
     "the base's __init__ calls a method the subclass overrides"),
])
def test_near_misses_stay_silent(tmp_path, base, init, why):
    found = _findings(tmp_path, "device_map='auto'", ".to('cuda')", init=init, base=base)
    assert not [f for f in found if f[0] == "CFX103"], why
    # and the same base without the override is followed (the positive beside the near miss)
    if base is LOADER_BASE:
        assert [f for f in _findings(tmp_path / "b", "device_map='auto'", ".to('cuda')", base=base) if f[0] == "CFX103"]


def test_a_super_method_may_rebind_the_model(tmp_path):
    """`super().reload()` runs the base's code, which may rebind `self.model`: forgotten."""
    sub = SUB.replace("    def prepare(self):\n", "    def prepare(self):\n        super().reload()\n")
    base = BASE + "\n    def reload(self):\n        self.model = other()\n"
    found = _findings(tmp_path, "device_map='auto'", ".to('cuda')", base=base, sub=sub)
    assert not [f for f in found if f[0] == "CFX103"]


def test_a_base_without_a_load_is_not_followed(tmp_path):
    """Near miss: the base class holds no model load: the subclass's `.to('cuda')` is silent."""
    base = BASE.replace("AutoModelForCausalLM.from_pretrained(name, {load})", "build(name)")
    assert _findings(tmp_path, "", ".to('cuda')", base=base) == []


def test_an_edit_of_the_base_reaches_a_cached_subclass(tmp_path):
    """The subclass's cached result depends on the base's module: editing only the base
    changes the finding on the next cached run."""
    _findings(tmp_path, "device_map='auto'", ".to('cuda')")
    assert [f.code for f in lint_project(tmp_path, use_cache=True)[2].findings] == ["CFX103"]
    base = tmp_path / "trainers" / "base.py"
    base.write_text(base.read_text().replace("device_map='auto'", "torch_dtype='auto'"))
    assert [f.code for f in lint_project(tmp_path, use_cache=True)[2].findings] == []


@pytest.mark.parametrize("text,expected", [
    ("from trainers.base import BaseTrainer\nclass T(BaseTrainer):\n    def f(self):\n        self.model.to('cuda')\n", True),
    ("from .base import Base\nclass T(Base):\n    def f(self):\n        self.policy_net.half()\n", True),
    # near misses: a library's class, an attribute not named like a model, no cast or move
    ("from transformers import Trainer\nclass T(Trainer):\n    def f(self):\n        self.model.to('cuda')\n", False),
    ("from .base import Base\nclass T(Base):\n    def f(self, x):\n        self.inv_freq.to(x.device)\n", False),
    ("from .base import Base\nclass T(Base):\n    def f(self):\n        return self.model\n", False),
])
def test_the_text_prefilter(text, expected):
    from cfgfix.analysis.model_calls import may_hold_model

    assert may_hold_model(text.encode()) is expected


def test_a_base_in_a_large_module_parsed_in_parts(tmp_path):
    """A base module over the size that is parsed in parts (analysis/module_parts.py): the
    base class's block is parsed when asked for, and its load still reaches the subclass."""
    pad = "".join(f"\n\ndef helper_{i}(x):\n    return [x + {i} * k for k in range(10)]\n" for i in range(400))
    base = BASE.replace("\n\nclass BaseTrainer", pad + "\n\nclass BaseTrainer") + pad
    assert len(base) > 20_000
    found = _findings(tmp_path, "device_map='auto'", ".to('cuda')", base=base)
    assert [f for f in found if f[:2] == ("CFX103", "trainers/lora.py")]


def test_the_text_prefilter_passes_a_class_that_binds_and_moves_its_model():
    from cfgfix.analysis.model_calls import may_hold_model

    built = "class T:\n    def __init__(self, model):\n        self.model = model\n        self.model.to('cuda')\n"
    assert may_hold_model(built.encode()) is True  # another module may build it with a model
    assert may_hold_model(built.replace("self.model = model", "self.m = model").encode()) is False
