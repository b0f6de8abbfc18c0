import ast

from cfgfix.analysis.optimizer_sites import flow_may_report, optimizer_sites
from cfgfix.analysis.versions import Versions
from cfgfix.documents.python import PythonDocument
from cfgfix.documents.text import SourceText
from cfgfix.rules.context import PythonContext


def _ctx(text: str) -> PythonContext:
    return PythonContext(PythonDocument.parse(SourceText("t.py", text)), Versions({}))


CASES = {
    "no step, no trainer": ("import torch\nopt = torch.optim.AdamW(m.parameters())\nclass GRPOTrainer(Base):\n"
                            "    '''>>> GRPOTrainer(model)'''\n    def f(self):\n        return super().__init__()\n", False),
    "a step split over lines": ("import torch\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\nscaler.\\\n    step(opt)\n", True),
    "a library trainer under an alias": ("from transformers import Trainer as T\nT(model=m, args=a)\n", True),
    "a trl trainer": ("import trl\nx = [\n    trl.SFTTrainer(model=m)]\n", True),
    "a step only in a lambda": ("import torch\nopt = torch.optim.SGD(p)\nf = lambda: scaler.step(opt)\n", False),
    "a local trainer class": ("class MyTrainer:\n    pass\nMyTrainer()\n", False),
}


def test_the_gate_says_no_only_where_the_flow_has_nothing_to_record():
    for name, (text, expected) in CASES.items():
        assert flow_may_report(_ctx(text)) is expected, name
        if expected is False:  # no step call and no library trainer among the index's calls
            ctx = _ctx(text)
            sites = ctx.index.calls
            assert not any(s.method in ("step", "unscale_") for s in sites), name
            assert not [s for s in optimizer_sites(ctx) if "Trainer" in (s.name or "")], name


def test_a_character_python_reads_as_ascii_falls_back_to_the_index():
    text = "from transformers import Trainer\nＴrainer(model=m)\n"  # NFKC: Trainer(model=m)
    assert ast.parse(text).body[1].value.func.id == "Trainer"
    assert flow_may_report(_ctx(text)) is True
