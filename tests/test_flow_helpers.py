"""Flow through helper objects, methods and a project's own modules (issue 25, item 3):
a step run by a method of a helper object (CFX301), a model passed from method to method
of a class (CFX101), trained parameters made by a project's own LoRA class (CFX205). Each
shape with near misses that vary it (other names, nesting, another module, package
re-exports, conditional aliases, base classes) and near misses that must stay silent."""

from __future__ import annotations

import textwrap

import pytest
from conftest import lint_project, write_project


def _found(tmp_path, files: dict[str, str], codes) -> list[tuple[str, str, int]]:
    write_project(tmp_path, {name: textwrap.dedent(text) for name, text in files.items()})
    _, _, result = lint_project(tmp_path)
    return sorted((f.code, f.span.path, f.span.line) for f in result.findings if f.code in codes)


# -- CFX301: the step is a method of a helper object -----------------------------------------
TRAINER = """\
import torch


class DPOTrainer:
    def __init__(self, engine, args):
        self.model = engine
        self.args = args

    def train_dpo(self, batch):
        loss = self.model(**batch).loss
        self.model.backward(loss)
        self.model.step()
        return loss

    def evaluate(self, batch):
        return self.model(**batch).loss.item()


class DPOTrainerUnsupervised(DPOTrainer):
    def train_unsupervised(self, batch, coef):
        loss = self.model(**batch).loss
        self.model.backward(coef * loss)
        self.model.step()
"""

LOOP = """\
import torch
{imports}


def main(args, engine, train_loader, unsup_loader):
{build}
    for epoch in range(args.epochs):
        for step, (batch, unsup) in enumerate(zip(train_loader, unsup_loader)):
            torch.cuda.empty_cache()
            loss = trainer.{method}(batch)
"""

BUILDS = {
    "plain": "    trainer = DPOTrainer(engine, args)",
    "alias": "    cls = DPOTrainerUnsupervised if args.unsup else DPOTrainer\n    trainer = cls(engine, args)",
    "or": "    cls = (args.unsup and DPOTrainerUnsupervised) or DPOTrainer\n    trainer = cls(engine, args)",
    "subclass": "    trainer = DPOTrainerUnsupervised(engine, args)",
}
LAYOUTS = {
    "module": ({"dpo_trainer.py": TRAINER}, "from dpo_trainer import DPOTrainer, DPOTrainerUnsupervised"),
    "package": ({"rl/__init__.py": "from .trainer import DPOTrainer, DPOTrainerUnsupervised\n",
                 "rl/trainer.py": TRAINER}, "from rl import DPOTrainer, DPOTrainerUnsupervised"),
    "nested": ({"rl/__init__.py": "", "rl/dpo/__init__.py": "", "rl/dpo/trainer.py": TRAINER},
               "from rl.dpo.trainer import DPOTrainer, DPOTrainerUnsupervised"),
    "same": ({}, ""),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_empty_cache_in_a_loop_whose_step_is_a_helper_objects_method(tmp_path, build, layout):
    files, imports = LAYOUTS[layout]
    loop = LOOP.format(imports=imports, build=BUILDS[build], method="train_dpo")
    if layout == "same":
        loop = TRAINER + "\n\n" + loop.replace("import torch\n", "", 1)
    line = next(n for n, text in enumerate(loop.splitlines(), 1) if "empty_cache" in text)
    assert _found(tmp_path, {**files, "main.py": loop}, {"CFX301"}) == [("CFX301", "main.py", line)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_helper_object_held_on_self_whose_method_steps(tmp_path, layout):
    files, imports = LAYOUTS[layout]
    runner = f"""\
        import torch
        {imports}


        class Runner:
            def __init__(self, engine, args):
                self.trainer = DPOTrainerUnsupervised(engine, args)

            def fit(self, loader):
                for batch in loader:
                    self.trainer.train_unsupervised(batch, 0.5)
                    torch.cuda.empty_cache()
        """
    runner = textwrap.dedent(runner)
    if layout == "same":
        runner = TRAINER + "\n\n" + runner.replace("import torch\n", "", 1)
    line = next(n for n, text in enumerate(runner.splitlines(), 1) if "empty_cache" in text)
    assert _found(tmp_path, {**files, "runner.py": runner}, {"CFX301"}) == [("CFX301", "runner.py", line)]


@pytest.mark.parametrize("loop,why", [
    (LOOP.format(imports="from dpo_trainer import DPOTrainer, DPOTrainerUnsupervised",
                 build=BUILDS["plain"], method="evaluate").replace("train_loader, unsup_loader", "models, names"),
     "the method only evaluates, over a loop that names no batches"),
    (LOOP.format(imports="from dpo_trainer import DPOTrainer\nfrom factory import make_trainer",
                 build="    trainer = make_trainer(engine, args)", method="train_dpo"),
     "a receiver built by a function: its class is not known"),
    (LOOP.format(imports="from dpo_trainer import DPOTrainer", build=BUILDS["plain"], method="fit_epoch"),
     "a method the class does not define"),
])
def test_helper_object_near_misses_stay_silent(tmp_path, loop, why):
    files = {"dpo_trainer.py": TRAINER, "factory.py": "def make_trainer(e, a):\n    return None\n", "main.py": loop}
    assert _found(tmp_path, files, {"CFX301"}) == [], why


def test_a_method_with_a_loop_of_its_own_is_an_epoch_not_a_step(tmp_path):
    trainer = TRAINER + textwrap.dedent("""\

        class EpochTrainer(DPOTrainer):
            def train_epoch(self, loader):
                for batch in loader:
                    self.train_dpo(batch)
        """)
    main = textwrap.dedent("""\
        import torch
        from dpo_trainer import EpochTrainer


        def main(engine, args, loaders):
            trainer = EpochTrainer(engine, args)
            for loader in loaders:
                trainer.train_epoch(loader)
                torch.cuda.empty_cache()
        """)
    assert _found(tmp_path, {"dpo_trainer.py": trainer, "main.py": main}, {"CFX301"}) == []


# -- CFX101: a model passed from method to method of a class --------------------------------
DEMO = """\
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


class Exporter:
    def load(self, path, adapter=None):
        base = AutoModelForCausalLM.from_pretrained(path, torch_dtype={dtype}, device_map="auto")
        if adapter:
            lora = PeftModel.from_pretrained(base, adapter, torch_dtype={dtype})
            merged = lora.merge_and_unload()
            return merged, None
        return base, None

    def export_all(self, model, out):
        for fmt in ["fp16", "int8"]:
            try:
                self._export(model, out, fmt)
            except Exception as error:
                print(error)

    def _export(self, model, out, fmt):
        try:
            if fmt == "fp16":
                half = model.half()
                half.save_pretrained(out)
        except Exception:
            return {{"ok": False}}
        return {{"ok": True}}

    def run(self, path, adapter):
        try:
            model, tokenizer = self.load(path, adapter)
            self.export_all(model, "out")
        except Exception as error:
            print(error)


def main():
    Exporter().run("m", "adapter")
"""


def test_a_cast_in_a_method_the_class_hands_its_model_to(tmp_path):
    code = DEMO.format(dtype="torch.float16")
    line = next(n for n, text in enumerate(code.splitlines(), 1) if ".half()" in text)
    assert _found(tmp_path, {"export.py": code}, {"CFX101"}) == [("CFX101", "export.py", line)]


def test_a_method_given_two_dtypes_or_a_float32_load_stays_silent(tmp_path):
    assert _found(tmp_path, {"export.py": DEMO.format(dtype="torch.float32")}, {"CFX101"}) == []
    other = DEMO.format(dtype="torch.float16").replace(
        '            self.export_all(model, "out")\n',
        '            self.export_all(model, "out")\n'
        '            self.export_all(AutoModelForCausalLM.from_pretrained(path), "out32")\n')
    assert _found(tmp_path, {"export.py": other}, {"CFX101"}) == []


def test_adapters_kept_on_the_model_stay_silent(tmp_path):
    # no merge: the PeftModel's adapters may be float32, the cast changes them
    code = DEMO.format(dtype="torch.float16").replace("            merged = lora.merge_and_unload()\n"
                                                      "            return merged, None\n",
                                                      "            return lora, None\n")
    assert _found(tmp_path, {"export.py": code}, {"CFX101"}) == []


def test_a_cast_inside_a_try_sees_the_model_before_the_try(tmp_path):
    code = """\
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
        try:
            model = model.to(torch.bfloat16)
        except RuntimeError:
            model = model.float()
        """
    assert _found(tmp_path, {"cast.py": code}, {"CFX101"}) == [("CFX101", "cast.py", 6)]


# -- CFX205: trained parameters made by a project's own LoRA class --------------------------
LORA = """\
import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM


class LoRALinear(nn.Module):
    def __init__(self, original_layer, r=16, alpha=32):
        super().__init__()
        self.original_layer = original_layer
        self.lora_A = nn.Linear(original_layer.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, original_layer.out_features, bias=False)
        {cast}
        for param in original_layer.parameters():
            param.requires_grad = False

    def forward(self, x):
        return self.original_layer(x) + self.lora_B(self.lora_A(x))


def setup_lora_model(model_id, device="cuda", r=16):
    model = AutoModelForCausalLM.from_pretrained(
        model_id, torch_dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    for param in model.parameters():
        param.requires_grad = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.endswith("q_proj"):
            *parent_path, child_name = name.split(".")
            parent = model.get_submodule(".".join(parent_path)) if parent_path else model
            {replace}
    model = model.to(device)
    return model


def save_lora_weights(model, path):
    torch.save({{k: v for k, v in model.state_dict().items() if "lora" in k}}, path)
"""
CASTS = {
    "to-dtype-name": "dtype = original_layer.weight.dtype\n        self.lora_A = self.lora_A.to(dtype)\n"
                     "        self.lora_B = self.lora_B.to(dtype)",
    "to-attribute": "self.lora_A = self.lora_A.to(original_layer.weight.dtype)\n"
                    "        self.lora_B = self.lora_B.to(dtype=original_layer.weight.dtype)",
}
REPLACES = {
    "setattr": "setattr(parent, child_name, LoRALinear(module, r))",
    "attribute": "parent.q_proj = LoRALinear(module, r)",
}
TRAIN = """\
import torch
from {module} import setup_lora_model, save_lora_weights


def main(loader):
    model = setup_lora_model("Qwen/Qwen1.5-0.5B")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
    save_lora_weights(model, "lora.pt")
"""
MODULE_LEVEL = """\
import torch
from {module} import setup_lora_model as make_policy

policy_model = make_policy("Qwen/Qwen1.5-0.5B")
policy_optimizer = torch.optim.AdamW(
    [p for p in policy_model.parameters() if p.requires_grad],
    lr=1e-5,
)
for batch in loader:
    policy_model(**batch).loss.backward()
    policy_optimizer.step()
"""


@pytest.mark.parametrize("cast", sorted(CASTS))
@pytest.mark.parametrize("replace", sorted(REPLACES))
@pytest.mark.parametrize("layout", ["module", "package"])
def test_adamw_over_adapters_a_project_lora_class_casts_to_the_bf16_base(tmp_path, cast, replace, layout):
    lora = LORA.format(cast=CASTS[cast], replace=REPLACES[replace])
    files = {"model.py": lora} if layout == "module" else {"lora/__init__.py": "from .model import setup_lora_model, save_lora_weights\n",
                                                           "lora/model.py": lora}
    module = "model" if layout == "module" else "lora"
    files["train.py"] = TRAIN.format(module=module)
    files["ppo.py"] = MODULE_LEVEL.format(module=module)
    found = _found(tmp_path, files, {"CFX205"})
    assert found == [("CFX205", "ppo.py", 5), ("CFX205", "train.py", 7)]


@pytest.mark.parametrize("cast,why", [
    ("pass", "adapters left in torch's float32"),
    ("self.lora_A = self.lora_A.to(torch.float32)", "adapters cast to float32, not the base's dtype"),
    ("self.lora_A = self.lora_A.to(original_layer.weight.dtype)", "one adapter of two left in float32"),
])
def test_a_lora_class_that_keeps_float32_adapters_stays_silent(tmp_path, cast, why):
    files = {"model.py": LORA.format(cast=cast, replace=REPLACES["setattr"]), "train.py": TRAIN.format(module="model")}
    assert _found(tmp_path, files, {"CFX205"}) == [], why


def test_a_layer_from_torch_replacing_a_part_makes_the_dtype_unknown(tmp_path):
    lora = LORA.format(cast="pass", replace="setattr(parent, child_name, nn.Linear(4, 4))")
    files = {"model.py": lora, "train.py": TRAIN.format(module="model")}
    assert _found(tmp_path, files, {"CFX205"}) == []


def test_the_cpu_side_of_a_cuda_test_is_not_what_the_gpu_trains(tmp_path):
    lora = LORA.format(cast=CASTS["to-attribute"], replace=REPLACES["setattr"]).replace(
        "torch.bfloat16 if torch.cuda.is_available() else torch.float32",
        "torch.bfloat16 if not torch.cuda.is_available() else torch.float32")
    files = {"model.py": lora, "train.py": TRAIN.format(module="model")}
    assert _found(tmp_path, files, {"CFX205"}) == []


def test_a_project_helper_named_lora_that_wraps_with_peft_stays_silent(tmp_path):
    helper = """\
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM


        def add_lora(model):
            return get_peft_model(model, LoraConfig(r=8))


        def load():
            return AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
        """
    train = """\
        import torch
        from helpers import add_lora, load

        model = load()
        add_lora(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
        """
    assert _found(tmp_path, {"helpers.py": helper, "train.py": train}, {"CFX205"}) == []


# -- LoRA adapters in the base's dtype on the pinned peft (CFX204, CFX205) ------------------
PEFT_TRAINER = """\
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def load(name):
    return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.{dtype}, device_map="auto")


def apply_lora(model):
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    return get_peft_model(model, cfg{extra})


def build(model, dataset):
    args = TrainingArguments(
        output_dir="out",
        fp16=True,
    )
    return Trainer(model=model, args=args, train_dataset=dataset)


model = apply_lora(load("Qwen/Qwen2-0.5B"))
build(model, None).train()
"""
PEFT_LOOP = """\
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8){extra})
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
for batch in loader:
    model(**batch).loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("pin,extra,speaks", [
    ("peft==0.8.2", "", True),
    ("peft>=0.7.0,<0.12", "", True),
    ("peft==0.11.1", "", True),
    ("peft==0.13.0", ", autocast_adapter_dtype=False", True),
    ("peft==0.6.2", "", False),  # LoRA Linear adapters still float32
    ("peft==0.12.0", "", False),  # upcast to float32 by default
    ("peft>=0.7.0", "", False),  # admits releases that upcast
    ("", "", False),  # unpinned: the current peft upcasts
    ("peft==0.13.0", ", autocast_adapter_dtype=True", False),
])
def test_lora_adapters_in_the_base_dtype_on_the_pinned_peft(tmp_path, pin, extra, speaks):
    files = {"requirements.txt": f"transformers==4.41.0\ntorch==2.1.0\n{pin}\n",
             "train.py": PEFT_TRAINER.format(dtype="float16", extra=extra),
             "loop.py": PEFT_LOOP.format(extra=extra)}
    found = _found(tmp_path, files, {"CFX204", "CFX205"})
    assert found == ([("CFX204", "train.py", 16), ("CFX205", "loop.py", 7)] if speaks else [])


def test_a_peft_config_that_is_not_lora_stays_silent(tmp_path):
    code = PEFT_LOOP.format(extra="").replace("LoraConfig(r=8)", "IA3Config()").replace("LoraConfig", "IA3Config")
    files = {"requirements.txt": "peft==0.8.2\ntorch==2.1.0\n", "loop.py": code}
    assert _found(tmp_path, files, {"CFX205"}) == []


def test_a_bfloat16_trainer_model_on_that_peft_is_not_cfx204(tmp_path):
    files = {"requirements.txt": "peft==0.8.2\ntransformers==4.41.0\ntorch==2.1.0\n",
             "train.py": PEFT_TRAINER.format(dtype="bfloat16", extra="")}
    assert _found(tmp_path, files, {"CFX204"}) == []


# -- CFX201: a conditional autocast alias -----------------------------------------------------
ALIAS_LOOP = """\
import contextlib
from contextlib import nullcontext
import torch


def train(model, loader, optimizer, args):
    {alias}
    for batch in loader:
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("alias", [
    "autocast = torch.cuda.amp.autocast if args.amp else contextlib.suppress",
    "autocast = contextlib.nullcontext if not args.amp else torch.cuda.amp.autocast",
    "autocast = (args.amp and torch.cuda.amp.autocast) or nullcontext",
])
def test_a_conditional_autocast_alias_is_an_autocast_when_on(tmp_path, alias):
    assert _found(tmp_path, {"train.py": ALIAS_LOOP.format(alias=alias)}, {"CFX201"}) == [("CFX201", "train.py", 9)]


@pytest.mark.parametrize("alias,why", [
    ("autocast = torch.cuda.amp.autocast if args.amp else torch.cpu.amp.autocast", "no no-op side"),
    ("autocast = my_autocast if args.amp else contextlib.suppress", "not torch's autocast"),
    ("autocast = torch.autocast if args.amp else contextlib.suppress", "`torch.autocast()` needs a device"),
])
def test_near_misses_of_the_autocast_alias_stay_silent(tmp_path, alias, why):
    assert _found(tmp_path, {"train.py": ALIAS_LOOP.format(alias=alias)}, {"CFX201"}) == [], why


def test_a_scaler_beside_the_alias_stays_silent(tmp_path):
    code = ALIAS_LOOP.format(alias="autocast = torch.cuda.amp.autocast if args.amp else contextlib.suppress")
    code = code.replace("        loss.backward()\n        optimizer.step()\n",
                        "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n")
    code = code.replace("    for batch", "    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)\n    for batch")
    assert _found(tmp_path, {"train.py": code}, {"CFX201"}) == []


# -- dtype-tied branches: a load per side of a conditional dtype (CFX101, CFX102) ------------
TIED = """\
import torch
from transformers import AutoModelForCausalLM


def main(args):
    {dtype}
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype)
    {test}
        model = model.{cast}
    return model
"""


@pytest.mark.parametrize("dtype,test,cast,expected", [
    ("dtype = torch.float16 if args.fp16 else None", "if args.fp16:", "half()", "CFX101"),
    ("dtype = torch.float16 if args.fp16 else (torch.bfloat16 if args.bf16 else None)", "if args.fp16:",
     "half()", "CFX101"),
    ("dtype = torch.float16 if args.fp16 else (torch.bfloat16 if args.bf16 else None)", "elif_bf16",
     "to(torch.bfloat16)", "CFX101"),
    ("dtype = torch.bfloat16 if args.bf16 else None", "if not args.bf16:", "half()", "CFX102"),
    ("dtype = None if not args.bf16 else torch.bfloat16", "if args.bf16:", "bfloat16()", "CFX101"),
])
def test_a_cast_in_a_branch_tied_to_the_load_dtype(tmp_path, dtype, test, cast, expected):
    if test == "elif_bf16":
        test = "if args.fp16:\n        pass\n    elif args.bf16:"
    code = TIED.format(dtype=dtype, test=test, cast=cast)
    line = next(n for n, text in enumerate(code.splitlines(), 1) if f"model.{cast}" in text)
    files = {"requirements.txt": "transformers==4.44.0\n", "main.py": code}
    assert _found(tmp_path, files, {"CFX101", "CFX102"}) == [(expected, "main.py", line)]


@pytest.mark.parametrize("dtype,test,cast,why", [
    ("dtype = torch.bfloat16 if args.bf16 else None", "if args.fp16:", "half()",
     "another flag: how it relates to the dtype's is not known"),
    ("dtype = torch.float16 if args.fp16 else None", "if args.fp16 or args.cast:", "half()",
     "the branch also runs where the load is float32 (a cast that matters there)"),
    ("dtype = torch.float16 if args.fp16 else args.dtype", "if not args.fp16:", "half()",
     "the other side's dtype is not known"),
])
def test_a_cast_the_dtype_does_not_decide_stays_silent(tmp_path, dtype, test, cast, why):
    code = TIED.format(dtype=dtype, test=test, cast=cast)
    files = {"requirements.txt": "transformers==4.44.0\n", "main.py": code}
    assert _found(tmp_path, files, {"CFX101", "CFX102"}) == [], why


def test_the_cast_after_a_conditional_dtype_load_has_no_fix(tmp_path):
    code = TIED.format(dtype="dtype = torch.bfloat16 if args.bf16 else None", test="if not args.bf16:",
                       cast="half()")
    write_project(tmp_path, {"requirements.txt": "transformers==4.44.0\n", "main.py": textwrap.dedent(code)})
    _, _, result = lint_project(tmp_path)
    found = [f for f in result.findings if f.code == "CFX102"]
    assert len(found) == 1 and found[0].fix is None  # `dtype` also serves the bfloat16 side
