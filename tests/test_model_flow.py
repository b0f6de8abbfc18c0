"""The shared model analysis follows a model through real code structures: local and
imported loader functions, wrappers, branches, trainer classes and call sites."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from cfgfix.analysis.models import MAX_OPTIONS, analyze_models
from cfgfix.analysis.names import ImportMap
from cfgfix.analysis.project_modules import ProjectModules


def analyze(tmp_path: Path, files: dict[str, str], main: str = "train.py"):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    path = tmp_path / main
    text = path.read_text()
    return analyze_models(ast.parse(text), text, None, ProjectModules(tmp_path), path)


def calls(analysis):
    """(line, method, receiver key, dtype before the call, device_map kind, load's origin)."""
    out = []
    for mc in sorted(analysis.calls, key=lambda c: c.call.lineno):
        device_map = mc.state.load.device_map.kind if mc.state.load.device_map else None
        out.append((mc.call.lineno, mc.method, mc.key, mc.state.dtype, device_map, mc.state.load.where))
    return out


def test_loader_function_in_another_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths are shown relative to the current folder, as findings show them
    analysis = analyze(tmp_path, {
        "models/build.py": """
            import torch
            from transformers import AutoModelForCausalLM

            def build_model(name):
                model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="auto")
                return model
        """,
        "train.py": """
            import torch
            from models.build import build_model
            model = build_model("m")
            model.to("cuda")
        """,
    })
    assert calls(analysis) == [(5, "to", "model", "bfloat16", "multi", "models/build.py:6")]  # cwd: tmp_path
    assert [Path(p).name for p in analysis.deps] == ["build.py"]


def test_relative_import_and_tuple_return(tmp_path):
    analysis = analyze(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/loader.py": """
            from transformers import AutoModel, AutoTokenizer
            def load(name):
                return AutoModel.from_pretrained(name, device_map="auto"), AutoTokenizer.from_pretrained(name)
        """,
        "pkg/train.py": """
            from .loader import load
            def main():
                model, tokenizer = load("m")
                model.cuda()
        """,
    }, main="pkg/train.py")
    assert [c[:5] for c in calls(analysis)] == [(5, "cuda", "model", "default", "multi")]


def test_library_imports_are_not_followed(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel
        from mylib.models import build_model
        model = build_model()
        model.to("cuda")
    """})
    assert calls(analysis) == []


def test_wrappers_keep_the_load_and_peft_makes_the_dtype_unknown(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import torch
        from peft import get_peft_model
        from transformers import AutoModel
        model = AutoModel.from_pretrained("m", torch_dtype=torch.bfloat16, device_map="auto")
        model = get_peft_model(model, config)
        model.to(torch.bfloat16)
        model = torch.compile(model)
        model.to("cuda")
    """})
    assert [c[:5] for c in calls(analysis)] == [
        (7, "to", "model", None, "multi"),  # float32 adapters: the cast is not a no-op
        (9, "to", "model", "bfloat16", "multi"),
    ]


def test_accelerator_prepare_unpacks(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel
        model = AutoModel.from_pretrained("m", device_map="auto")
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        model.to(device)
    """})
    assert [c[:3] for c in calls(analysis)] == [(5, "to", "model")]


def test_branch_that_casts_keeps_the_placement(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained("m", device_map="auto")
        if args.bf16:
            model = model.to(torch.bfloat16)
        model.to("cuda")
    """})
    assert [c[:5] for c in calls(analysis)] == [(6, "to", "model", "default", "multi"), (7, "to", "model", None, "multi")]


def test_trainer_class_init_state_reaches_other_methods(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import torch
        from transformers import AutoModelForSeq2SeqLM

        class T5Trainer:
            def __init__(self, cfg):
                self.model = AutoModelForSeq2SeqLM.from_pretrained(cfg.model, torch_dtype=torch.bfloat16, device_map="auto")
                self.model = self.model.to(dtype=torch.bfloat16)
                self.setup()

            def setup(self):
                self.optimizer = torch.optim.AdamW(self.model.parameters())

            def train(self):
                self.model.to(self.device)
    """})
    assert [c[:5] for c in calls(analysis)] == [
        (8, "to", "self.model", "bfloat16", "multi"),
        (15, "to", "self.model", "bfloat16", "multi"),
    ]


def test_loader_method_and_helper_that_rebinds_other_attributes(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel

        class Runner:
            def __init__(self, name):
                self.model = self.build(name)
                self.setup_optim()
                self.model.cuda()

            def build(self, name):
                return AutoModel.from_pretrained(name, device_map="auto")

            def setup_optim(self):
                self.opt = make(self.model.parameters())
    """})
    assert [c[:3] for c in calls(analysis)] == [(8, "cuda", "self.model")]


def test_a_method_that_may_rebind_the_model_forgets_it(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel

        class Runner:
            def __init__(self, name):
                self.model = AutoModel.from_pretrained(name, device_map="auto")
                self.reload()
                self.model.cuda()

            def reload(self):
                self.model = make_model()
    """})
    assert calls(analysis) == []


def test_a_method_of_another_attribute_keeps_the_model(tmp_path):
    # `self.criterion.cuda()`, `self.scheduler.step()`, `self.logger.info()`: objects that
    # cannot hold the model (nothing whole of it, nor `self`, went into them).
    analysis = analyze(tmp_path, {"train.py": """
        import logging
        import torch
        from transformers import AutoModel

        class Trainer:
            def __init__(self, name, model_name):
                self.model = AutoModel.from_pretrained(model_name, device_map="auto")
                self.criterion = torch.nn.CrossEntropyLoss()
                self.optimizer = torch.optim.AdamW(self.model.parameters())
                self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, 10)
                self.logger = logging.getLogger(name)
                self.tokenizer = AutoTokenizer.from_pretrained(model_name)
                self.criterion.cuda()
                self.scheduler.step()
                self.logger.info("loaded")
                self.tokenizer.save_pretrained("out")
                self.model.cuda()
    """})
    assert [c[:3] for c in calls(analysis)] == [(18, "cuda", "self.model")]


def test_a_method_of_an_attribute_that_may_hold_the_model_forgets_it(tmp_path):
    # Near misses: the object was given `self`, the model whole, an alias of it, a bound
    # method of it, or is a property / never assigned here: its methods may change the model.
    for setup in (
        "self.helper = Reloader(self)",
        "self.helper = Wrapper(self.model)",
        "self.helper = Wrapper(model)",
        "self.helper = functools.partial(self.model.half)",
        "self.helper = Hooks(lambda: self.model)",
        "pass",  # inherited or set from outside: unknown
    ):
        analysis = analyze(tmp_path, {"train.py": f"""
            from transformers import AutoModel

            class Trainer:
                def __init__(self, name):
                    model = AutoModel.from_pretrained(name, device_map="auto")
                    self.model = model
                    {setup}
                    self.helper.run()
                    self.model.cuda()
        """})
        assert calls(analysis) == [], setup
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel

        class Trainer:
            def __init__(self, name):
                self.model = AutoModel.from_pretrained(name, device_map="auto")
                self.helper.run()
                self.model.cuda()

            @property
            def helper(self):
                return self.model
    """})
    assert calls(analysis) == []


def test_call_sites_bind_parameters(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel

        def train(model, loader):
            model.to("cuda")

        class Trainer:
            def __init__(self, model):
                self.model = model

            def fit(self):
                self.model.cuda()

        def main():
            model = AutoModel.from_pretrained("m", device_map="auto")
            train(model, [])
            Trainer(model).fit()
    """})
    assert [c[:3] for c in calls(analysis)] == [(5, "to", "model"), (12, "cuda", "self.model")]


def test_a_model_handed_to_a_function_keeps_its_placement(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained("m", torch_dtype=torch.bfloat16, device_map="auto")
        report(model)
        model.to(torch.bfloat16)
        model.to("cuda")
    """})
    # `report` may cast it in place: the dtype is unknown, the dispatch is not
    assert [c[:5] for c in calls(analysis)] == [(6, "to", "model", None, "multi"), (7, "to", "model", "bfloat16", "multi")]


def test_call_sites_that_disagree_bind_nothing(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModel

        def train(model):
            model.to("cuda")

        train(AutoModel.from_pretrained("m", device_map="auto"))
        train(build_other())
    """})
    assert calls(analysis) == []


def test_local_alias_of_an_api(tmp_path):
    imports = ImportMap(ast.parse("import torch\nautocast = torch.cuda.amp.autocast\ndtype = torch.float16\n"))
    assert imports.qualify(ast.parse("autocast", mode="eval").body) == "torch.cuda.amp.autocast"
    # a value (not an API path) is not an alias: a parameter named `dtype` may shadow it
    assert imports.qualify(ast.parse("dtype", mode="eval").body) == "dtype"


def possible(analysis):
    """(line, method, receiver key, device_map kind, quantized, number of values) of the
    calls on a name that holds one of several values."""
    out = []
    for mc in sorted(analysis.possible_calls, key=lambda c: (c.call.lineno, c.state.load.line)):
        device_map = mc.state.load.device_map.kind if mc.state.load.device_map else None
        out.append((mc.call.lineno, mc.method, mc.key, device_map, mc.state.load.quantized, mc.alternatives))
    return sorted(out, key=lambda row: (row[0], str(row[3]), str(row[4])))


def test_branches_that_load_differently_leave_a_choice(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(args, device):
            if args.big:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            else:
                model = AutoModelForCausalLM.from_pretrained("m")
            model.to(device)
    """})
    assert calls(analysis) == []  # no one load: the definite queries stay silent
    assert possible(analysis) == [(8, "to", "model", None, None, 2), (8, "to", "model", "multi", None, 2)]


def test_a_branch_on_the_same_name_sees_only_its_own_load(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(args, device):
            if args.big:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            else:
                model = AutoModelForCausalLM.from_pretrained("m")
            if not args.big:
                model.to(device)
            if args.big:
                model.cuda()
    """})
    assert possible(analysis) == []
    assert [(line, method, dm) for line, method, _, _, dm, _ in calls(analysis)] == [(9, "to", None), (11, "cuda", "multi")]


def test_equality_tests_and_elif_chains_narrow_too(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(kind, device):
            if kind == "qwen":
                model = AutoModelForCausalLM.from_pretrained("q", device_map="auto")
            elif kind == "llama":
                model = AutoModelForCausalLM.from_pretrained("l")
            else:
                raise ValueError(kind)
            if kind != "qwen":
                model.to(device)
            if kind == "llama":
                model.half()
    """})
    assert possible(analysis) == []
    assert [(line, method, dm) for line, method, _, _, dm, _ in calls(analysis)] == [(11, "to", None), (13, "half", None)]


def test_rebinding_the_condition_forgets_what_it_said(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(big, device):
            if big:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            else:
                model = AutoModelForCausalLM.from_pretrained("m")
            big = torch.cuda.device_count() > 1
            if not big:
                model.to(device)
    """})
    # `big` no longer says which load `model` holds, and a call under a test the analysis
    # cannot relate to the branches is not reported either way
    assert possible(analysis) == [] and calls(analysis) == []


def test_a_call_under_an_unrelated_test_is_not_reported(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import torch
        from transformers import AutoModel, BitsAndBytesConfig
        def main(name, int4, device):
            model = AutoModel.from_pretrained(
                name, quantization_config=BitsAndBytesConfig(load_in_4bit=True) if int4 else None)
            if device == "cpu":
                model = model.float()
            model.half()
    """})
    assert [(line, q) for line, _, _, _, q, _ in possible(analysis)] == [(9, "4bit"), (9, None)]  # not line 8


def test_a_branch_that_returns_does_not_reach_what_follows(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        import sys
        from transformers import AutoModelForCausalLM
        def main(args, device):
            model = AutoModelForCausalLM.from_pretrained("m")
            if args.serve:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
                serve(model)
                sys.exit(0)
            model.to(device)
    """})
    assert possible(analysis) == []
    assert [(line, dm) for line, _, _, _, dm, _ in calls(analysis)] == [(10, None)]


def test_a_branch_that_binds_only_on_one_side_still_reaches(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(args, device):
            model = Net()
            if args.pretrained:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            model.to(device)
    """})
    assert possible(analysis) == [(7, "to", "model", "multi", None, 2)]


def test_a_conditional_keyword_makes_one_load_per_condition(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(args, device):
            model = AutoModelForCausalLM.from_pretrained(
                "m", load_in_8bit=args.int8, device_map="auto" if args.int8 else None)
            if not args.int8:
                model.to(device)
            model.cuda()
    """})
    # the two keywords share their condition: 8-bit and dispatched, or neither
    assert [(line, method, dm) for line, method, _, _, dm, _ in calls(analysis)] == [(7, "to", None)]
    assert possible(analysis) == [(8, "cuda", "model", None, None, 2), (8, "cuda", "model", "multi", "8bit", 2)]


def test_model_init_branches_reach_the_other_methods(tmp_path):
    analysis = analyze(tmp_path, {"predictor.py": """
        from peft import PeftModel
        from transformers import AutoModel, AutoModelForCausalLM
        class Predictor:
            def __init__(self, path, peft_path=None):
                self.path, self.peft_path = path, peft_path
                self.model_init()
            def model_init(self):
                if self.kind == "glm":
                    self.model = AutoModel.from_pretrained(self.path, trust_remote_code=True)
                elif self.kind == "qwen":
                    self.model = AutoModelForCausalLM.from_pretrained(self.path, device_map="auto")
                if self.peft_path is not None:
                    self.model = PeftModel.from_pretrained(self.model, self.peft_path)
                self.model_to_device()
                self.model = self.model.eval()
            def model_to_device(self):
                self.model.cuda()
    """}, main="predictor.py")
    assert [(line, method, key, dm, n) for line, method, key, dm, _, n in possible(analysis)] == [
        (18, "cuda", "self.model", None, 2), (18, "cuda", "self.model", "multi", 2)]


def test_a_loader_whose_branches_return_different_loads(tmp_path):
    analysis = analyze(tmp_path, {
        "models.py": """
            from transformers import AutoModelForCausalLM
            def load_model(args):
                if args.multi_gpu:
                    return AutoModelForCausalLM.from_pretrained(args.name, device_map="auto")
                return AutoModelForCausalLM.from_pretrained(args.name)
        """,
        "train.py": """
            from models import load_model
            model = load_model(args)
            if not args.multi_gpu:
                model = model.to("cuda")
            model.train()
            model.cuda()
        """,
    })
    # the loader's condition crosses the call by its last name (`multi_gpu`)
    assert [(line, dm) for line, _, _, _, dm, _ in calls(analysis)] == [(5, None)]
    assert [(line, dm) for line, _, _, dm, _, _ in possible(analysis)] == [(7, None), (7, "multi")]


def test_init_branches_and_a_test_on_the_same_flag_in_another_method(tmp_path):
    analysis = analyze(tmp_path, {"trainer.py": """
        from transformers import AutoModelForCausalLM
        class Trainer:
            def __init__(self, args):
                self.args = args
                if args.multi_gpu:
                    self.model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
                else:
                    self.model = AutoModelForCausalLM.from_pretrained("m")
            def train(self):
                if not self.args.multi_gpu:
                    self.model.to(self.device)
            def evaluate(self):
                self.model.cuda()
    """}, main="trainer.py")
    # `multi_gpu` in `__init__` and in `train()` is taken for the same flag (by its last name)
    assert [(line, dm) for line, _, _, _, dm, _ in calls(analysis)] == [(12, None)]
    assert [(line, dm) for line, _, _, dm, _, _ in possible(analysis)] == [(14, None), (14, "multi")]


def test_a_choice_stays_small(tmp_path):
    loads = [f"{dm}{q}" for dm in ("device_map='auto', ", "device_map='cuda', ", "")
             for q in ("load_in_8bit=True", "load_in_4bit=True", "revision='x'")][:8]
    branches = "".join(
        f"    {'if' if i == 0 else 'elif'} kind == {i}:\n"
        f"        model = AutoModel.from_pretrained('m', {load})\n"
        for i, load in enumerate(loads)
    )
    analysis = analyze(tmp_path, {"train.py": (
        "from transformers import AutoModel\n"
        "def main(kind, device):\n" + branches + "    model.to(device)\n"
    )})
    # inner branches past the limit are forgotten (an untracked value); outer ones still reach
    rows = possible(analysis)
    assert rows and all(n <= MAX_OPTIONS for *_, n in rows) and calls(analysis) == []


def test_a_fallback_load_in_an_except_handler(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(device):
            try:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            except ImportError:
                model = AutoModelForCausalLM.from_pretrained("m")
            model.to(device)
            try:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            except ImportError:
                raise SystemExit("accelerate is needed")
            model.cuda()
    """})
    assert possible(analysis) == [(8, "to", "model", None, None, 2), (8, "to", "model", "multi", None, 2)]
    assert [(line, dm) for line, _, _, _, dm, _ in calls(analysis)] == [(13, "multi")]  # the handler re-raises


def test_a_name_bound_in_another_function_does_not_resolve_a_parameter(tmp_path):
    """`dtype` bound in `defaults()` is not the `dtype` parameter of `train()`: the cast's
    dtype is unknown there, so CFX101 is silent; bound once at module level, it resolves."""
    from conftest import lint_project, write_project

    body = """
        def defaults():
            dtype = torch.bfloat16
            return dtype


        def train(dtype):
            model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
            model = model.to(dtype)
            return model
    """
    head = "import torch\nfrom transformers import AutoModelForCausalLM\n"
    write_project(tmp_path / "a", {"train.py": head + textwrap.dedent(body)})
    assert [f.code for f in lint_project(tmp_path / "a", select=["CFX101"])[2].findings] == []
    module_level = head + "dtype = torch.bfloat16\n" + textwrap.dedent(body).replace("def train(dtype):", "def train():")
    write_project(tmp_path / "b", {"train.py": module_level})
    found = lint_project(tmp_path / "b", select=["CFX101"])[2].findings
    cast_line = module_level.splitlines().index("    model = model.to(dtype)") + 1
    assert [(f.code, f.span.line) for f in found] == [("CFX101", cast_line)]


def _quant(tmp_path, keywords: str, before: str = ""):
    analysis = analyze(tmp_path, {"train.py": f"""
        import torch
        from transformers import AutoModelForCausalLM
        {before}
        model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.float16, {keywords})
        model.half()
    """})
    return [(mc.state.load.quantized, mc.state.load.quant_keywords) for mc in analysis.calls]


def test_quantization_keywords_that_say_no_load_plain_weights(tmp_path):
    # a literal False / None, or a name bound once to one, is a plain load
    for keywords, before in [
        ("load_in_8bit=False", ""), ("load_in_4bit=False", ""), ("quantization_config=None", ""),
        ("load_in_8bit=None", ""), ("load_in_8bit=False, load_in_4bit=False", ""),
        ("load_in_8bit=INT8", "INT8 = False"), ("quantization_config=QUANT", "QUANT = None"),
    ]:
        assert _quant(tmp_path, keywords, before) == [(None, False)], keywords


def test_quantization_keywords_that_may_quantize_stay_possible(tmp_path):
    for keywords, before in [
        ("load_in_8bit=args.int8", ""), ("load_in_8bit=INT8", "INT8 = args.int8"),
        ("quantization_config=bnb", ""), ("quantization_config=False", ""),  # not None: unsure
        ("load_in_8bit=False, load_in_4bit=args.q", ""),
    ]:
        assert _quant(tmp_path, keywords, before) in ([(None, True)], []), keywords
    assert _quant(tmp_path, "load_in_8bit=True") == [("8bit", True)]
    assert _quant(tmp_path, "load_in_8bit=False, load_in_4bit=True") == [("4bit", True)]


def test_a_plain_keyword_beside_a_flag_still_splits_on_the_flag(tmp_path):
    analysis = analyze(tmp_path, {"train.py": """
        from transformers import AutoModelForCausalLM
        def main(args, device):
            model = AutoModelForCausalLM.from_pretrained("m", load_in_8bit=False, load_in_4bit=args.q)
            model.cuda()
    """})
    assert possible(analysis) == [(5, "cuda", "model", None, "4bit", 2), (5, "cuda", "model", None, None, 2)]


# -- statements the walker skips (models._Walker._inert) ---------------------------------

def _detail(analysis):
    loads = [(l.line, l.class_name, l.dtype, l.device_map and l.device_map.kind, l.quantized, l.library,
              l.single_process) for l in analysis.loads]
    moves = [(c.call.lineno, c.method, c.key, c.state.dtype, c.stmt.lineno, c.sole_in_block, c.target_dtype,
              c.moves_device, c.alternatives) for c in [*analysis.calls, *analysis.possible_calls]]
    return loads, moves, analysis.deps


def _gated_and_not(tmp_path, monkeypatch, files: dict[str, str]):
    """The analysis with the walker's gate and without it (they must agree), and how many
    statements the gate skipped."""
    from cfgfix.analysis import models

    skipped = []
    inert = models._Walker._inert

    def counting(self, stmt, env, words):
        found = inert(self, stmt, env, words)
        if found:
            skipped.append(stmt.lineno if self.returns is None else ("summary", stmt.lineno))
        return found

    monkeypatch.setattr(models._Walker, "_inert", counting)
    gated = _detail(analyze(tmp_path, files))
    monkeypatch.setattr(models.FunctionTable, "walk_words", lambda self, cls: None)
    plain = _detail(analyze(tmp_path, files))
    assert gated == plain
    return gated, skipped


def test_the_walker_skips_statements_that_can_change_nothing(tmp_path, monkeypatch):
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        class Trainer:
            def __init__(self, args):
                self.args = args
                self.steps = 0
                self.log = []
                print("starting", args.name)
                self.model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
                self.lr = args.lr * 2
                self.model.to(torch.bfloat16)
    """})
    assert [m[:4] for m in result[1]] == [(13, "to", "self.model", "bfloat16")]
    assert skipped == [2, 3, 7, 8, 9, 10]  # before the load; after it, `self` may reach the model


def test_a_call_site_that_passes_no_model_is_still_walked(tmp_path, monkeypatch):
    # `train(None)` passes no model, but it is a call site of `train`: with it the calls
    # disagree, and `train` is not analysed with the model
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        def train(net):
            net.to(torch.bfloat16)

        def main():
            model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
            train(model)
            size = 3
            train(None)
    """})
    assert result[1] == []
    assert skipped == [2, 3, 11]


def test_handing_self_on_forgets_what_self_holds(tmp_path, monkeypatch):
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        class Trainer:
            def __init__(self):
                self.model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
                register(self)
                self.model.to(torch.bfloat16)
    """})
    assert result[1] == []  # `register` may have replaced it: no longer tracked
    assert skipped == [2, 3, 9]  # then nothing is tracked: the cast is skipped too


def test_rebinding_a_branch_condition_is_walked(tmp_path, monkeypatch):
    # `args.q = True` names no model, but the choice's options are conditioned on it
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        def main(args):
            if args.q:
                model = AutoModelForCausalLM.from_pretrained("m", load_in_8bit=True)
            else:
                model = AutoModelForCausalLM.from_pretrained("n", device_map="auto")
            steps = 10
            args.q = True
            if not args.q:
                model.cuda()
    """})
    assert skipped == [2, 3, 10]
    assert result[1] == []  # the test no longer tells the options apart: the call is not reported


def test_a_method_that_loads_is_walked_where_it_is_called(tmp_path, monkeypatch):
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        class Trainer:
            def build(self):
                return AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.float32)

            def __init__(self):
                self.steps = 0
                self.net = self.build()
                self.net.half()
    """})
    assert [m[:4] for m in result[1]] == [(12, "half", "self.net", "float32")]
    assert skipped == [2, 3, 10]


def test_a_summary_keeps_every_return(tmp_path, monkeypatch):
    # returns that name nothing (`return None`) still decide what a function returns
    result, skipped = _gated_and_not(tmp_path, monkeypatch, {"train.py": """
        import torch
        from transformers import AutoModelForCausalLM

        def build(name, fallback):
            if fallback:
                return None
            return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)

        def main():
            model = build("m", False)
            model.half()
    """})
    assert [m[:4] for m in result[1]] == [(12, "half", "model", "float16")]
    assert ("summary", 7) not in skipped and 7 in skipped  # skipped only where returns are not collected


def test_loader_names_reads_only_the_statements_around_a_load(tmp_path):
    # the functions that load (nested ones and methods too) found without visiting the rest
    from cfgfix.analysis.models import FunctionTable
    from cfgfix.analysis.names import iter_statements

    text = textwrap.dedent("""
        from transformers import AutoModel

        def plain():
            return 1

        def outer():
            def inner():
                return AutoModel.from_pretrained("m")
            return inner

        class Holder:
            def build(self):
                try:
                    pass
                except ValueError:
                    def fallback():
                        return AutoModel.from_pretrained("n")
                return None

            def other(self):
                return "from_pretrained"
    """)
    tree = ast.parse(text)
    table = FunctionTable(tree, ImportMap(tree))
    table.text = text
    assert table.loader_names(text) == {"inner", "fallback"}  # their own code loads
    brute = FunctionTable(tree, ImportMap(tree))
    brute.text = text
    assert table.loader_names(text) == {n.name for n in iter_statements(tree.body)
                                        if isinstance(n, ast.FunctionDef) and brute.mentions_load(n)}
