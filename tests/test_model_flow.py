"""The shared model analysis follows a model through real code structures: local and
imported loader functions, wrappers, branches, trainer classes and call sites."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from cfgfix.analysis.models import analyze_models
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
