"""The shared parameter flow (`analysis/parameters.py`): which optimizer holds which
module's Parameters, and in what dtype they are where it is stepped."""

from __future__ import annotations

import ast
import textwrap

from cfgfix.analysis.parameters import HALF_PART, parameter_flow
from cfgfix.analysis.versions import Versions
from cfgfix.documents.python import PythonDocument
from cfgfix.documents.text import SourceText
from cfgfix.rules.context import PythonContext


def flow_of(code: str):
    text = textwrap.dedent(code)
    source = SourceText.from_bytes("train.py", text.encode())
    ctx = PythonContext(PythonDocument.parse(source), Versions({}))
    return parameter_flow(ctx)


def only_step(flow):
    assert len(flow.steps) == 1, flow.steps
    return next(iter(flow.steps.values()))


def test_optimizer_holds_the_modules_whose_own_parameters_it_gets():
    flow = flow_of("""
        import itertools, torch
        groups = [{"params": model.encoder.parameters()}, {"params": head.parameters(), "lr": 1e-3}]
        a = torch.optim.AdamW(groups)
        b = torch.optim.SGD(itertools.chain(model.parameters(), extra.parameters()), lr=0.1)
        c = torch.optim.AdamW([p.float() for p in model.parameters()])
        d = torch.optim.AdamW(get_params(model))
    """)
    builds = sorted(flow.builds.values(), key=lambda b: b.call.lineno)
    assert [b.holds for b in builds] == [("model.encoder", "head"), ("model", "extra"), (), ()]
    assert [b.master for b in builds] == [False, False, True, True]
    assert builds[1].name == "torch.optim.SGD"


def test_submodule_cast_marks_part_of_the_model_float16():
    step = only_step(flow_of("""
        import torch
        model = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]).cuda()
        model[0].half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        scaler.step(optimizer)
    """))
    (held,) = step.held
    assert held.key == "model" and held.state.dtype == HALF_PART
    assert held.float16_cast.lineno == 4


def test_part_cast_speaks_only_for_the_part_it_touched():
    flow = flow_of("""
        import torch
        model = Net().cuda()
        model.encoder.half()
        enc = torch.optim.SGD(model.encoder.layers.parameters(), lr=0.1)
        dec = torch.optim.SGD(model.decoder.parameters(), lr=0.1)
        scaler.step(enc)
        scaler.step(dec)
    """)
    first, second = sorted(flow.steps.values(), key=lambda s: s.call.lineno)
    assert first.held[0].float16_cast is not None
    assert second.held[0].float16_cast is None


def test_in_place_cast_after_the_build_reaches_the_step():
    step = only_step(flow_of("""
        import torch
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to("cuda", dtype=torch.float16)
        scaler.step(optimizer)
    """))
    assert step.held[0].float16_cast.lineno == 5


def test_cast_back_rebinding_and_branches_make_it_unknown():
    for code in (
        """
        model = Net().half()
        model.head.float()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.step(optimizer)
        """,
        """
        model = Net().half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model = OtherNet()
        scaler.step(optimizer)
        """,
        """
        model = Net()
        if args.fp16:
            model.half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.step(optimizer)
        """,
        """
        model = Net().half()
        prepare_model_for_kbit_training(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.step(optimizer)
        """,
    ):
        step = only_step(flow_of("import torch\n" + textwrap.dedent(code)))
        assert step.held[0].float16_cast is None, code


def test_same_parameters_wrapper_and_scheduler_keep_the_optimizer():
    step = only_step(flow_of("""
        import torch
        model = Net().cuda().half()
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = get_linear_schedule_with_warmup(optimizer, 10, 100)
        for x in loader:
            scaler.step(optimizer)
    """))
    assert step.held[0].float16_cast is not None


def test_trainer_class_seeds_methods_from_init_and_from_the_method_that_builds():
    flow = flow_of("""
        import torch
        class Trainer:
            def __init__(self, net):
                self.model = net.cuda()
                self.model.encoder.half()
                self.optimizer = None
            def setup(self):
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
            def train_step(self, batch):
                self.optimizer.zero_grad()
                loss = self.model(batch)
                self.logger.log(loss)
                self.scaler.step(self.optimizer)
    """)
    step = only_step(flow)
    assert step.receiver == "self.scaler" and step.cls is not None
    assert step.held[0].key == "self.model" and step.held[0].float16_cast is not None


def test_parameter_sources_for_adam_rules():
    flow = flow_of("""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    """)
    (build,) = flow.builds.values()
    (source,) = build.sources
    assert source.key == "model" and source.dtype == "bfloat16"


def test_accelerate_prepare_marks_the_optimizer_and_keeps_the_model():
    flow = flow_of("""
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator(mixed_precision="fp16")
        model = Net().half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        plain = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).sum())
                optimizer.step()
                plain.step()
    """)
    step = only_step(flow)  # `plain` was never prepared: no GradScaler steps it
    assert step.prepared is not None and step.receiver == "accelerator"
    assert step.held[0].float16_cast is not None


def test_placeholders_and_tuple_targets_decide_which_method_owns_an_attribute():
    flow = flow_of("""
        import torch
        class T:
            def __init__(self, accelerator, net):
                self.optimizer = None
                self.model = net.half()
                opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self.model, self.optimizer = accelerator.prepare(self.model, opt)
            def step(self):
                self.optimizer.step()
    """)
    step = only_step(flow)
    assert step.held[0].key == "self.model" and step.held[0].float16_cast is not None


def test_library_trainer_records_the_model_a_helper_is_called_with():
    flow = flow_of("""
        import torch
        from transformers import AutoModelForCausalLM, Trainer
        from trl import SFTTrainer
        def make(model, args):
            return Trainer(model=model, args=args)
        def make_sft(m, cfg):
            return SFTTrainer(m, cfg)
        model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.float16)
        make(model, args)
        make_sft(model.half(), cfg)
        MyTrainer(model=model)
    """)
    uses = sorted(flow.trainers.values(), key=lambda u: u.call.lineno)
    assert [u.name for u in uses] == ["transformers.Trainer", "trl.SFTTrainer"]  # not the project's own
    assert all(u.model is not None and u.model.float16_cast is not None for u in uses)
    assert ast.unparse(uses[1].args) == "cfg"


SETUP_CLASS = """
    import torch
    from transformers import AutoModelForCausalLM
    class Tuner:
        def __init__(self, name):
            self.name = name
            {call}
        def model_init(self):
            self.model = AutoModelForCausalLM.from_pretrained(self.name, torch_dtype=torch.bfloat16)
        def train(self, loader):
            optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
            for batch in loader:
                self.model(**batch).loss.backward()
                optimizer.step()
        {extra}
"""


def _sources(call, extra=""):
    flow = flow_of(SETUP_CLASS.format(call=call, extra=extra))
    (build,) = flow.builds.values()
    return [(s.key, s.dtype) for s in build.sources]


def test_a_setup_method_init_calls_seeds_the_other_methods():
    assert _sources("self.model_init()") == [("self.model", "bfloat16")]
    # near misses: called under a condition, or another method also assigns the attribute
    assert _sources("if name:\n                self.model_init()") == []
    assert _sources("self.model_init()", "def reload(self):\n            self.model = None\n"
                    "            self.model = load(self.name)") == []
