"""The module index walks function bodies only as queries need them (issue 15); its answers
must be those of the whole walk, in the same order. These tests compare the lazy index
(built with the text) against the eager one (built without) on tricky modules."""

from __future__ import annotations

import ast

import pytest

from cfgfix.analysis.call_text import CallText
from cfgfix.analysis.loops import LoopAnalysis
from cfgfix.analysis.names import ImportMap
from cfgfix.analysis.structure import ModuleIndex

SOURCES = [
    # methods, a nested class inside a function, loops, withs, handlers
    "import torch\n"
    "from torch.cuda import empty_cache as ec\n"
    "class Trainer(Base):\n"
    "    def __init__(self, model):\n"
    "        super().__init__()\n"
    "        for name, p in model.named_parameters():\n"
    "            p.requires_grad = False\n"
    "        class Inner:\n"
    "            def run(self):\n"
    "                return self.evaluate(1)\n"
    "    def evaluate(self, loader):\n"
    "        self.model.eval()\n"
    "        with torch.no_grad():\n"
    "            for batch in loader:\n"
    "                try:\n"
    "                    out = self.model(batch)\n"
    "                except ValueError:\n"
    "                    ec()\n"
    "        return out\n"
    "def train(model, loader):\n"
    "    model.train()\n"
    "    for batch in loader:\n"
    "        loss = model(batch).loss\n"
    "        loss.backward()\n"
    "    else:\n"
    "        torch.cuda.empty_cache()\n"
    "evaluate(model, loader)\n",
    # a call split over lines and a comment, a continuation, a non-NFKC identifier
    "def a(model):\n"
    "    x = (model  # the model\n"
    "         .eval\n"
    "         ())\n"
    "def b(model):\n"
    "    model.\\\n"
    "train()\n"
    "def c(model):\n"
    "    model.ｅval()\n"
    "def d():\n"
    "    pass\n",
]


def _key(site):
    c = site.context
    return (id(site.node), site.name, site.method, site.receiver, id(c.stmt), tuple(map(id, c.loops)),
            tuple(map(id, c.withs)), id(c.function), id(c.classdef))


def _both(source: str):
    tree = ast.parse(source)
    imports = ImportMap(tree)
    return tree, ModuleIndex.build(tree, imports), lambda: ModuleIndex.build(tree, imports, source)


@pytest.mark.parametrize("source", SOURCES)
def test_lazy_answers_are_the_whole_walks(source):
    tree, eager, lazy = _both(source)
    methods = sorted({s.method for s in eager.calls if s.method}) + ["nosuch"]
    names = sorted({s.name for s in eager.calls if s.name}) + ["torch.cuda.empty_cache"]
    for method in methods:
        assert [_key(s) for s in lazy().calls_to_method(method)] == [_key(s) for s in eager.calls_to_method(method)]
    for name in names:
        assert [_key(s) for s in lazy().calls_named(name)] == [_key(s) for s in eager.calls_named(name)]
    for stmt in (n for n in ast.walk(tree) if isinstance(n, ast.stmt)):
        index = lazy()
        assert index.context_of_stmt(stmt) == eager.context_of_stmt(stmt)
        assert [_key(s) for s in index.calls_within(stmt)] == [_key(s) for s in eager.calls_within(stmt)]
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        got = LoopAnalysis(lazy()).callers(func)
        assert [_key(s) for s in got] == [_key(s) for s in LoopAnalysis(eager).callers(func)]
    whole = lazy()
    assert [_key(s) for s in whole.calls] == [_key(s) for s in eager.calls]
    assert list(whole.contexts) == list(eager.contexts)
    assert whole.functions == eager.functions


def test_a_query_walks_only_the_bodies_that_can_answer():
    source = SOURCES[0]
    tree, eager, lazy = _both(source)
    index = lazy()
    assert index.calls_to_method("backward") == eager.calls_to_method("backward")
    walked = [p.function.name for p in index._pieces if hasattr(p, "function") and p.part is not None]
    assert walked == ["train"]
    # `super().__init__()` is no caller of `__init__`, and its `def` line no call
    analysis = LoopAnalysis(lazy())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert analysis.callers(init) == []
    assert all(p.part is None for p in analysis.index._pieces if hasattr(p, "function"))


def test_known_and_frozen_modules_by_receiver():
    tree, eager, lazy = _both(SOURCES[0])
    full = LoopAnalysis(eager)
    for name in ("model", "self.model", "loader", "p"):
        assert LoopAnalysis(lazy()).is_known_module(name) == (name in full.known_modules)
        assert LoopAnalysis(lazy()).is_frozen(name) == (name in full.frozen_modules)


def test_call_text():
    text = CallText("x = f (1)\ny = o.f(\n)\nz = o  .  f # c\\\n(2)\ndef f(a): pass\nff(3)\n")
    assert text.lines_calling("f") == [1, 2, 4, 6]  # a superset: the `def` line too
    assert text.lines_calling_on("f", "") == [1]  # not `o.f(`, nor the `def`
    assert text.lines_calling_on("f", "self.o") == [2, 4]
    assert text.lines_calling_on("f", "p") == []
    odd = CallText("a = 1\nmodel.ｅval()\n")  # `ast` reads `eval`
    assert odd.lines_calling("eval") == [2]
    assert odd.lines_defining(lambda name: True) == [2]


def test_call_text_answers_do_not_depend_on_the_order_of_questions():
    """One scan per name serves every receiver asked about: the answers are those of a
    fresh `CallText` per question."""
    code = ("model.eval()\nself.model.eval()\nevaluate(model)\nx.evaluate ()\ndef eval_(a): pass\n"
            "y = eval\n(1)\nteacher.eval() # c\nsuper().eval()\ntorch._set_grad_enabled(False)\n"
            "set_grad_enabled(True)\nx_set_grad_enabled(0)\n")
    # a name holding one asked before is found from that one's hits (`evaluate`, `_set_...`)
    questions = [("eval", None), ("eval", "model"), ("eval", "self.model"), ("eval", ""), ("eval", "teacher"),
                 ("evaluate", ""), ("evaluate", "x"), ("evaluate", None), ("eval", "super"),
                 ("set_grad_enabled", None), ("_set_grad_enabled", None), ("_set_grad_enabled", "torch"),
                 ("grad", None), ("set_grad_enabled", "")]
    shared = CallText(code)
    for method, receiver in questions + list(reversed(questions)):
        fresh = CallText(code)
        if receiver is None:
            assert shared.lines_calling(method) == fresh.lines_calling(method)
        else:
            assert shared.lines_calling_on(method, receiver) == fresh.lines_calling_on(method, receiver)
    assert shared.lines_calling_on("eval", "model") == [1, 2]
    assert shared.lines_calling_on("eval", "") == [6]
    assert shared.lines_calling("eval") == [1, 2, 6, 8, 9]
    assert shared.lines_calling("_set_grad_enabled") == [10]
    assert shared.lines_calling("set_grad_enabled") == [11]
