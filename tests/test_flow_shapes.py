"""Flow shapes of issue 25 (item 3) the shared analyses follow, each with near misses that
must stay silent: written for the shape (other names, nesting, another module), never for
one file."""

from __future__ import annotations

import textwrap

import pytest
from conftest import lint_project, write_project


def _found(tmp_path, files: dict[str, str], codes=None) -> list[tuple[str, str, int]]:
    write_project(tmp_path, {name: textwrap.dedent(text) for name, text in files.items()})
    _, _, result = lint_project(tmp_path)
    return sorted((f.code, f.span.path, f.span.line) for f in result.findings
                  if codes is None or f.code in codes)


# -- device guards after dispatch (CFX103, CFX104) ------------------------------------------
GUARDS = [
    "if model.device.type != 'cuda':",
    "if str(model.device) == 'cpu':",
    "if not next(model.parameters()).is_cuda:",
    "if next(model.parameters()).device.type == 'cpu':",
    "if not hasattr(model, 'hf_device_map'):",
    "if getattr(model, 'hf_device_map', None) is None:",
]


@pytest.mark.parametrize("guard", GUARDS)
@pytest.mark.parametrize("load,move", [
    ("device_map='auto'", "model.to('cuda')"),
    ("device_map='auto', torch_dtype=torch.float16", "model.cuda()"),
    ("device_map='auto', load_in_8bit=True", "model.cuda()"),
])
def test_a_move_under_a_test_of_the_placement_is_silent(tmp_path, guard, load, move):
    code = f"""\
        import torch
        from transformers import AutoModelForCausalLM

        device = torch.device("cuda")
        model = AutoModelForCausalLM.from_pretrained("m", {load})
        {guard}
            {move}
        """
    assert _found(tmp_path, {"infer.py": code}, {"CFX103", "CFX104"}) == []
    unguarded = code.replace(f"{guard}\n    ", "if True:\n    ")
    assert len(_found(tmp_path, {"infer.py": unguarded}, {"CFX103", "CFX104"})) == 1


def test_a_guard_in_a_method_on_self_model_and_in_the_else_branch(tmp_path):
    code = """\
        from transformers import AutoModelForCausalLM


        class Runner:
            def __init__(self, name):
                self.model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
                if self.model.device.type == "cuda":
                    print("placed")
                else:
                    self.model.to("cuda")
        """
    assert _found(tmp_path, {"runner.py": code}, {"CFX103"}) == []


def test_near_misses_of_the_guard_still_speak(tmp_path):
    code = """\
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
        other = AutoModelForCausalLM.from_pretrained("n", device_map="auto")
        if model.device.type != "cuda":
            other.to("cuda")
        if torch.cuda.is_available():
            model.to("cuda")
        q = AutoModelForCausalLM.from_pretrained("m", device_map="auto", load_in_4bit=True)
        if q.device.type != "cuda":
            q.half()
        """
    # the guard reads another name's placement; a test of the machine, not the model; a cast
    # of a quantized model fails wherever the model is
    assert _found(tmp_path, {"infer.py": code}, {"CFX103", "CFX104"}) == [
        ("CFX103", "infer.py", 7), ("CFX103", "infer.py", 9), ("CFX104", "infer.py", 12)]


# -- f-strings whose literal parts hold allocator settings (CFX305) ---------------------------
@pytest.mark.parametrize("setter", [
    "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = {value}",
    "os.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', {value})",
    "os.environ['PYTORCH_ALLOC_CONF'] = conf\nconf = None",  # replaced below: a name bound once
])
@pytest.mark.parametrize("value,expected", [
    ("f'expandable_segments:True,max_split_size_mb:{mb}'", "with `expandable_segments:True`"),
    ("f'expandable_segments:True,max_split_size_mb:{args.split}'", "with `expandable_segments:True`"),
    ("f'expandable_segments:true,max_split_size_mb:{args.split}'", "case-sensitive"),
    ("f'garbage_collection_threshold:{t},max_split_size_mb:{small}'", "too small"),
])
def test_an_fstring_is_read_in_its_literal_parts(tmp_path, setter, value, expected):
    if setter.startswith("os.environ['PYTORCH_ALLOC_CONF'] = conf"):
        line = f"conf = {value}\nos.environ['PYTORCH_ALLOC_CONF'] = conf"
    else:
        line = setter.format(value=value)
    code = f"import os\nmb = 512\nsmall = 8\n{line}\nimport torch\n"
    write_project(tmp_path, {"train.py": code})
    _, _, result = lint_project(tmp_path)
    found = [f for f in result.findings if f.code == "CFX305"]
    assert len(found) == 1 and expected in found[0].message, [f.message for f in found]
    assert found[0].fix is None  # the text is not the string the program builds
    assert found[0].span.line == 4  # on the f-string, also when a name carries it


@pytest.mark.parametrize("value", [
    "f'expandable_segments:{flag},max_split_size_mb:{mb}'",  # the boolean is computed: no pair
    "f'max_split_size_mb:{mb}'",
    "f'max_split_size_mb:{split}'",  # computed, not judged alone
    "f'{key}:True,max_split_size_mb:128'",  # the key is computed
    "f'expandable_segments:True,{extra}'",
    "f'backend:{backend},max_split_size_mb:256'",
])
def test_an_fstring_whose_computed_parts_may_be_right_is_silent(tmp_path, value):
    code = f"import os\nmb = 512\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = {value}\nimport torch\n"
    write_project(tmp_path, {"train.py": code})
    _, _, result = lint_project(tmp_path)
    assert [f.message for f in result.findings if f.code == "CFX305"] == []


def test_two_names_with_a_computed_value_are_not_called_different(tmp_path):
    code = ("import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = f'expandable_segments:{flag}'\n"
            "os.environ['PYTORCH_ALLOC_CONF'] = 'expandable_segments:True'\n")
    write_project(tmp_path, {"train.py": code})
    _, _, result = lint_project(tmp_path)
    assert [f.message for f in result.findings if f.code == "CFX305"] == []


# -- CFX205: the optimizer stepped by the project's engine loop in another module -------------
ENGINE = """\
    import torch


    def run_epoch(model, loader, optim, scaler=None):
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            {step}
            optim.zero_grad()
    """
TRAIN = """\
    import torch
    from transformers import AutoModelForCausalLM
    {imports}

    model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    {call}
    """
LAYOUTS = {
    "module": ({"engine.py": ENGINE}, "from engine import run_epoch", "run_epoch(model, [], optimizer)"),
    "module-attribute": ({"engine.py": ENGINE}, "import engine", "engine.run_epoch(model, [], optim=optimizer)"),
    "package-re-export": ({"engine/__init__.py": "from .loop import run_epoch\n", "engine/loop.py": ENGINE},
                          "from engine import run_epoch", "run_epoch(model, [], optimizer)"),
    "package-attribute": ({"engine/__init__.py": "from .loop import *\nfrom .loop import run_epoch\n",
                           "engine/loop.py": ENGINE}, "import engine", "engine.run_epoch(model, [], optimizer)"),
    "nested-package": ({"src/__init__.py": "", "src/engine/__init__.py": "from .loop import run_epoch\n",
                        "src/engine/loop.py": ENGINE}, "from src.engine import run_epoch",
                       "for epoch in range(3):\n        run_epoch(model, [], optimizer)"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_bf16_weights_stepped_by_an_engine_loop_in_another_module(tmp_path, layout):
    files, imports, call = LAYOUTS[layout]
    files = {name: text.replace("{step}", "optim.step()") for name, text in files.items()}
    files["train.py"] = TRAIN.replace("{imports}", imports).replace("{call}", call)
    assert _found(tmp_path, files, {"CFX205"}) == [("CFX205", "train.py", 6)]


@pytest.mark.parametrize("step", [
    "pass",  # the engine never steps the optimizer it is given
    "accelerator.prepare(optim)",  # something that owns the precision takes it there
    "deepspeed.initialize(model=model, optimizer=optim)",
])
def test_an_engine_that_does_not_step_it_itself_is_silent(tmp_path, step):
    files = {"engine.py": ENGINE.replace("{step}", step),
             "train.py": TRAIN.replace("{imports}", "from engine import run_epoch")
             .replace("{call}", "run_epoch(model, [], optimizer)")}
    assert _found(tmp_path, files, {"CFX205"}) == []


def test_a_scaler_step_in_the_engine_counts(tmp_path):
    files = {"engine.py": ENGINE.replace("{step}", "scaler.step(optim)"),
             "train.py": TRAIN.replace("{imports}", "from engine import run_epoch")
             .replace("{call}", "run_epoch(model, [], optimizer, scaler=torch.amp.GradScaler())")}
    assert _found(tmp_path, files, {"CFX205"}) == [("CFX205", "train.py", 6)]


def test_a_library_loop_is_not_followed(tmp_path):
    files = {"train.py": TRAIN.replace("{imports}", "from somelib.engine import run_epoch")
             .replace("{call}", "run_epoch(model, [], optimizer)")}
    assert _found(tmp_path, files, {"CFX205"}) == []


# -- PEFT round trips: merge_and_unload() gives the base model back (CFX101) -------------------
@pytest.mark.parametrize("wrap", [
    "model = PeftModel.from_pretrained(base, path).merge_and_unload()",
    "model = PeftModel.from_pretrained(base, path)\n    model = model.merge_and_unload()",
    "peft = get_peft_model(base, config)\n    model = peft.merge_and_unload()",
    "model = PeftModel.from_pretrained(base, path).unload()",
])
@pytest.mark.parametrize("load,cast", [
    ("torch_dtype=torch.float16", "model.half()"),
    ("torch_dtype=torch.bfloat16", "model = model.to(torch.bfloat16)"),
])
def test_a_merged_model_keeps_the_base_dtype(tmp_path, wrap, load, cast):
    code = f"""\
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM


def export(path, config):
    base = AutoModelForCausalLM.from_pretrained("m", {load})
    {wrap}
    {cast}
    return model
"""
    found = _found(tmp_path, {"export.py": code}, {"CFX101"})
    assert found == [("CFX101", "export.py", code.splitlines().index(f"    {cast}") + 1)]


@pytest.mark.parametrize("between,cast", [
    ("model = PeftModel.from_pretrained(base, path)\n    model = model.get_base_model()", "model.half()"),
    ("model = PeftModel.from_pretrained(base, path)", "model.half()"),  # adapters still in: float32
    ("model = PeftModel.from_pretrained(base, path)\n    model.float()\n    model = model.merge_and_unload()",
     "model.half()"),  # cast to float32 before the merge: the merged weights are float32
    ("model = PeftModel.from_pretrained(base, path)\n    tune(model)\n    model = model.merge_and_unload()",
     "model.half()"),  # handed to code that may cast it
])
def test_near_misses_of_the_round_trip_are_silent(tmp_path, between, cast):
    code = f"""\
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def export(path):
    base = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.float16)
    {between}
    {cast}
"""
    assert _found(tmp_path, {"export.py": code}, {"CFX101"}) == []


def test_a_cast_of_the_peft_model_reaches_the_merged_base(tmp_path):
    code = """\
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
model = PeftModel.from_pretrained(base, "adapter")
model.half()
merged = model.merge_and_unload()
merged.half()
"""
    assert _found(tmp_path, {"export.py": code}, {"CFX101"}) == [("CFX101", "export.py", 9)]


# -- CFX301 through helper objects the module builds ----------------------------------------
HELPER = """\
import gc
import torch
from transformers import TrainerCallback


class {helper}:
    def __init__(self, every=10):
        self.every = every
        self.count = 0

    def {method}(self):
        self.count += 1
        {body}
"""
PERIODIC = "if self.count % self.every == 0:\n            torch.cuda.empty_cache()\n            gc.collect()"
EVERY = "torch.cuda.empty_cache()"


@pytest.mark.parametrize("helper,method", [("MemoryManager", "after_batch"), ("MemoryOptimizer", "cleanup_gpu_memory")])
@pytest.mark.parametrize("body", [PERIODIC, EVERY])
@pytest.mark.parametrize("user", [
    # a callback's per-step hook, through an attribute set in __init__
    ("class Cleanup(TrainerCallback):\n    def __init__(self):\n        self.mem = {helper}()\n\n"
    "    def on_step_end(self, args, state, control, **kwargs):\n        self.mem.{method}()\n"),
    # a trainer class's own loop, through an attribute
    ("class Runner:\n    def __init__(self, model, loader, opt):\n        self.model, self.loader, self.opt = model, loader, opt\n"
    "        self.memory_manager = {helper}(every=10)\n\n    def train_epoch(self):\n"
    "        for batch in self.loader:\n            self.model(**batch).loss.backward()\n"
    "            self.opt.step()\n            self.memory_manager.{method}()\n"),
    # a function's loop, through a local name
    ("def train(model, loader, opt):\n    memory = {helper}()\n    for step, batch in enumerate(loader):\n"
    "        model(**batch).loss.backward()\n        opt.step()\n        memory.{method}()\n"),
])
def test_empty_cache_in_a_helper_object_called_per_step(tmp_path, helper, method, body, user):
    code = HELPER.format(helper=helper, method=method, body=body) + "\n\n" + user.format(helper=helper, method=method)
    found = _found(tmp_path, {"train.py": code}, {"CFX301"})
    line = next(i for i, text in enumerate(code.splitlines(), 1) if "empty_cache" in text)
    assert found == [("CFX301", "train.py", line)]


@pytest.mark.parametrize("user", [
    # a hook that runs once per evaluation, not per step
    ("class Cleanup(TrainerCallback):\n    def __init__(self):\n        self.mem = MemoryManager()\n\n"
    "    def on_evaluate(self, args, state, control, **kwargs):\n        self.mem.after_batch()\n"),
    # the attribute holds another class's object, with a method of the same name
    ("class Other:\n    def after_batch(self):\n        pass\n\n\n"
    "class Cleanup(TrainerCallback):\n    def __init__(self):\n        self.mem = Other()\n\n"
    "    def on_step_end(self, args, state, control, **kwargs):\n        self.mem.after_batch()\n"),
    # the attribute is bound twice: which object it holds is not known
    ("class Cleanup(TrainerCallback):\n    def __init__(self):\n        self.mem = MemoryManager()\n\n"
    "    def reset(self, other):\n        self.mem = other\n\n"
    "    def on_step_end(self, args, state, control, **kwargs):\n        self.mem.after_batch()\n"),
    # called after training, not in the loop
    ("def train(model, loader, opt):\n    memory = MemoryManager()\n    for batch in loader:\n"
    "        model(**batch).loss.backward()\n        opt.step()\n    memory.after_batch()\n"),
    # a loop over checkpoints, not steps
    ("def evaluate_all(checkpoints):\n    memory = MemoryManager()\n    for ckpt in checkpoints:\n"
    "        model = load(ckpt)\n        model(x)\n        memory.after_batch()\n"),
])
def test_near_misses_of_the_helper_object_are_silent(tmp_path, user):
    code = HELPER.format(helper="MemoryManager", method="after_batch", body=EVERY) + "\n\n" + user
    assert _found(tmp_path, {"train.py": code}, {"CFX301"}) == []


# -- CFX302: an accumulator the training function returns ---------------------------------------
EPOCH = """\
import torch


def train_epoch(model, loader, optimizer):
    total = 0.0
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        total += loss
    return {returned}


{caller}
"""


@pytest.mark.parametrize("returned", ["total / len(loader)", "total"])
@pytest.mark.parametrize("caller", [
    ("def main(model, loader, optimizer):\n    for epoch in range(3):\n        avg = train_epoch(model, loader, optimizer)\n"
    "        print(f'epoch {epoch}: {avg:.4f}')\n"),
    ("def main(model, loader, optimizer):\n    history = []\n    for epoch in range(3):\n"
    "        history.append(float(train_epoch(model, loader, optimizer)))\n"),
    "if __name__ == '__main__':\n    print('loss', train_epoch(None, [], None).item())\n",
])
def test_a_returned_accumulator_read_as_a_number_by_its_callers(tmp_path, returned, caller):
    code = EPOCH.format(returned=returned, caller=caller)
    assert _found(tmp_path, {"train.py": code}, {"CFX302"}) == [("CFX302", "train.py", 10)]


@pytest.mark.parametrize("caller", [
    "",  # no caller here: another module may differentiate it
    "def main(model, loader, optimizer):\n    avg = train_epoch(model, loader, optimizer)\n    avg.backward()\n",
    "def main(model, loader, optimizer, scheduler):\n    scheduler.step(train_epoch(model, loader, optimizer))\n",
    "def main(model, loader, optimizer):\n    return train_epoch(model, loader, optimizer)\n",  # returned on, no caller
    ("def main(model, loader, optimizer):\n    avg = train_epoch(model, loader, optimizer)\n"
    "    print(avg)\n    extra(avg)\n"),  # one use escapes
])
def test_a_returned_accumulator_whose_use_is_unknown_is_silent(tmp_path, caller):
    code = EPOCH.format(returned="total / len(loader)", caller=caller)
    assert _found(tmp_path, {"train.py": code}, {"CFX302"}) == []


# -- CFX201: an autocast device that is a parameter, bound from the module's call sites ---------
STEP = """\
import torch


{define}
    with torch.autocast({args}):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()


{calls}
"""


@pytest.mark.parametrize("define,args,calls", [
    ("def train_step(model, batch, optimizer, device):", "device",
     "for batch in loader:\n    train_step(model, batch, optimizer, 'cuda')"),
    ("def train_step(model, batch, optimizer, device_type='cuda'):", "device_type=device_type",
     "for batch in loader:\n    train_step(model, batch, optimizer)"),
    ("def train_step(model, batch, optimizer, *, dev):", "dev",
     "DEVICE = 'cuda:0'\nfor batch in loader:\n    train_step(model, batch, optimizer, dev=DEVICE)"),
    ("def train_step(model, batch, optimizer, device):", "device",
     ("device = 'cuda' if torch.cuda.is_available() else 'cpu'\nfor batch in loader:\n"
     "    train_step(model, batch, optimizer, device)")),
])
def test_an_autocast_device_bound_from_call_sites(tmp_path, define, args, calls):
    code = STEP.format(define=define, args=args, calls=calls)
    assert _found(tmp_path, {"train.py": code}, {"CFX201"}) == [("CFX201", "train.py", 5)]


@pytest.mark.parametrize("calls", [
    "",  # no caller here: the device is not known
    "train_step(model, batch, optimizer, 'cuda')\ntrain_step(model, batch, optimizer, 'cpu')",  # callers disagree
    "train_step(model, batch, optimizer, args.device)",
    "train_step(model, batch, optimizer, *rest)",
    "train_step(model, batch, optimizer, 'cpu')",  # bfloat16 on the CPU: nothing to scale
])
def test_an_autocast_device_the_callers_do_not_settle_is_silent(tmp_path, calls):
    code = STEP.format(define="def train_step(model, batch, optimizer, device):", args="device", calls=calls)
    assert _found(tmp_path, {"train.py": code}, {"CFX201"}) == []


# -- CFX204: a float16 UNet or transformer trained in a function the script calls ---------------
DIFFUSERS = """\
import torch
from accelerate import Accelerator
from diffusers import {cls}


def train(net, accelerator, loader):
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-5)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(net):
            loss = net(batch).sample.mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def main():
    accelerator = Accelerator({precision})
    net = {cls}.from_pretrained("base", subfolder="unet"{load})
    {cast}
    train(net, accelerator, [])
"""


@pytest.mark.parametrize("cls", ["UNet2DConditionModel", "SD3Transformer2DModel", "FluxTransformer2DModel"])
@pytest.mark.parametrize("load,cast", [
    (", torch_dtype=torch.float16", "pass"),
    ("", "net.to(accelerator.device, dtype=torch.float16)"),
    ("", "net = net.half()"),
])
def test_a_float16_diffusers_model_trained_under_fp16_in_a_function(tmp_path, cls, load, cast):
    code = DIFFUSERS.format(cls=cls, precision="mixed_precision='fp16'", load=load, cast=cast)
    assert _found(tmp_path, {"train.py": code}, {"CFX204"}) == [("CFX204", "train.py", 13)]


@pytest.mark.parametrize("precision,load,cast", [
    ("mixed_precision='bf16'", ", torch_dtype=torch.float16", "pass"),  # no GradScaler under bf16
    ("mixed_precision=args.precision", ", torch_dtype=torch.float16", "pass"),  # not known here
    ("mixed_precision='fp16'", "", "pass"),  # float32 weights: the documented setup
    ("mixed_precision='fp16'", ", torch_dtype=torch.float16", "net.float()"),  # upcast before training
])
def test_near_misses_of_the_fp16_diffusers_model_are_silent(tmp_path, precision, load, cast):
    code = DIFFUSERS.format(cls="UNet2DConditionModel", precision=precision, load=load, cast=cast)
    assert _found(tmp_path, {"train.py": code}, {"CFX204"}) == []


def test_an_accelerator_the_callers_disagree_on_is_silent(tmp_path):
    code = DIFFUSERS.format(cls="UNet2DConditionModel", precision="mixed_precision='fp16'",
                            load=", torch_dtype=torch.float16", cast="pass")
    code += "\n\ndef other(net):\n    train(net, Accelerator(mixed_precision='no'), [])\n"
    assert _found(tmp_path, {"train.py": code}, {"CFX204"}) == []


# -- CFX205: bfloat16 weights given to a training function of the same module ------------------
def test_bf16_weights_given_to_a_training_function(tmp_path):
    code = """\
import torch
from transformers import AutoModelForCausalLM


def train(model, loader, lr):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()


def main():
    model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
    train(model, [], 1e-5)
"""
    assert _found(tmp_path, {"train.py": code}, {"CFX205"}) == [("CFX205", "train.py", 6)]
    both = code + "\n\ndef again():\n    train(AutoModelForCausalLM.from_pretrained('m'), [], 1e-5)\n"
    assert _found(tmp_path, {"train.py": both}, {"CFX205"}) == []  # the calls disagree on the dtype


# -- CFX301 in a helper module whose per-step caller is another module -------------------------
MANAGER = """\
import gc
import torch


class MemoryManager:
    def __init__(self, every=10):
        self.every = every
        self.count = 0

    def after_batch(self):
        self.count += 1
        if self.count % self.every == 0:
            torch.cuda.empty_cache()
            gc.collect()


def clear_memory():
    torch.cuda.empty_cache()
"""
LOOP = """\
{imports}


def train(model, loader, optimizer):
    {setup}
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
        {call}
"""


@pytest.mark.parametrize("imports,setup,call,line", [
    ("from utils.memory import MemoryManager", "memory = MemoryManager()", "memory.after_batch()", 13),
    ("from utils.memory import MemoryManager as MM", "mm = MM(every=5)", "mm.after_batch()", 13),
    ("from .memory import MemoryManager", "memory = MemoryManager()", "memory.after_batch()", 13),
    ("from utils.memory import clear_memory", "pass", "clear_memory()", 18),
])
def test_a_helper_module_called_every_step_from_another_module(tmp_path, imports, setup, call, line):
    trainer = "utils/trainer.py" if imports.startswith("from .") else "train.py"
    files = {"utils/__init__.py": "", "utils/memory.py": MANAGER,
             trainer: LOOP.format(imports=imports, setup=setup, call=call)}
    assert _found(tmp_path, files, {"CFX301"}) == [("CFX301", "utils/memory.py", line)]


def test_a_helper_module_called_from_a_hook_of_another_module(tmp_path):
    hook = """\
from transformers import TrainerCallback
from utils.memory import MemoryManager


class Cleanup(TrainerCallback):
    def __init__(self):
        self.memory = MemoryManager()

    def on_step_end(self, args, state, control, **kwargs):
        self.memory.after_batch()
"""
    files = {"utils/__init__.py": "", "utils/memory.py": MANAGER, "callbacks.py": hook}
    assert _found(tmp_path, files, {"CFX301"}) == [("CFX301", "utils/memory.py", 13)]


@pytest.mark.parametrize("imports,setup,call", [
    ("from utils.memory import MemoryManager", "memory = MemoryManager()", "pass\n    memory.after_batch()"),
    ("from other.memory import MemoryManager", "memory = MemoryManager()", "memory.after_batch()"),  # another class
    ("from utils.memory import MemoryManager", "memory = make_manager()", "memory.after_batch()"),  # built elsewhere
    ("from utils.memory import clear_memory", "pass", "pass\n    clear_memory()"),  # after training
    # a periodic sampling or evaluation branch of the other module's loop: a phase there
    ("from utils.memory import MemoryManager", "memory = MemoryManager()",
     "if step % 500 == 0:\n            memory.after_batch()"),
    ("from utils.memory import clear_memory", "pass", ("try:\n            clear_memory()\n        except RuntimeError:\n"
     "            pass")),
])
def test_near_misses_of_the_helper_module_are_silent(tmp_path, imports, setup, call):
    other = MANAGER.replace("torch.cuda.empty_cache()", "pass")
    files = {"utils/__init__.py": "", "utils/memory.py": MANAGER, "other/__init__.py": "",
             "other/memory.py": other, "train.py": LOOP.format(imports=imports, setup=setup, call=call)}
    assert _found(tmp_path, files, {"CFX301"}) == []


def test_the_helper_module_is_recomputed_when_its_caller_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside = LOOP.format(imports="from utils.memory import MemoryManager", setup="memory = MemoryManager()",
                         call="memory.after_batch()")
    write_project(tmp_path, {"utils/__init__.py": "", "utils/memory.py": MANAGER, "train.py": inside})
    _, _, first = lint_project(tmp_path, use_cache=True)
    assert [(f.code, f.span.path) for f in first.findings] == [("CFX301", "utils/memory.py")]
    after = inside.replace("        memory.after_batch()", "    memory.after_batch()")
    write_project(tmp_path, {"train.py": after + "# changed\n"})
    _, _, second = lint_project(tmp_path, use_cache=True)
    assert [f.code for f in second.findings if f.code == "CFX301"] == []


# -- a project class's constructor given a model in another module (CFX101, CFX103, CFX205) -----
TRAINER = """\
import torch


class CompleteOptimizedTrainer:
    def __init__(self, model, tokenizer, train_loader=None, learning_rate=5e-5):
        self.model = model
        self.tokenizer = tokenizer
        {prepare}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)

    def train(self):
        for batch in self.train_loader:
            self.model(**batch).loss.backward()
            self.optimizer.step()
"""
MAIN = """\
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
{imports}


def main():
    model = AutoModelForSeq2SeqLM.from_pretrained("google/flan-t5-xl", {load})
    tokenizer = AutoTokenizer.from_pretrained("google/flan-t5-xl")
    trainer = {build}
    trainer.train()
"""
BUILDS = {
    "positional": "CompleteOptimizedTrainer(model, tokenizer)",
    "keywords": "CompleteOptimizedTrainer(model=model, tokenizer=tokenizer, learning_rate=1e-4)",
}


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("layout", ["module", "package", "alias"])
@pytest.mark.parametrize("load,prepare,expected", [
    ("torch_dtype=torch.bfloat16", "self.model = self.model.to(dtype=torch.bfloat16)", {"CFX101", "CFX205"}),
    # the bf16 load in train.py reaches the plain AdamW of trainer.py (a file that never says bfloat16)
    ("torch_dtype=torch.bfloat16, device_map='auto'", "self.model.to('cuda')", {"CFX103", "CFX205"}),
])
def test_a_trainer_class_built_with_a_model_in_another_module(tmp_path, build, layout, load, prepare, expected):
    where = {"module": "trainer.py", "package": "training/trainer.py", "alias": "trainer.py"}[layout]
    imports = {"module": "from trainer import CompleteOptimizedTrainer",
               "package": "from training.trainer import CompleteOptimizedTrainer",
               "alias": "from trainer import CompleteOptimizedTrainer as Runner"}[layout]
    call = BUILDS[build].replace("CompleteOptimizedTrainer", "Runner") if layout == "alias" else BUILDS[build]
    files = {where: TRAINER.format(prepare=prepare), "train.py": MAIN.format(imports=imports, load=load, build=call)}
    if layout == "package":
        files["training/__init__.py"] = ""
    found = _found(tmp_path, files, {"CFX101", "CFX103", "CFX205"})
    assert {code for code, path, _ in found} == expected and {path for _, path, _ in found} == {where}


@pytest.mark.parametrize("main,prepare", [
    # the two constructions pass different loads
    (MAIN.format(imports="from trainer import CompleteOptimizedTrainer", load="torch_dtype=torch.bfloat16",
                 build="CompleteOptimizedTrainer(model, tokenizer)")
     + "\n\ndef other():\n    CompleteOptimizedTrainer(AutoModelForSeq2SeqLM.from_pretrained('t5-small'), None)\n",
     "self.model = self.model.to(dtype=torch.bfloat16)"),
    # the model goes through code that may cast it first
    (MAIN.format(imports="from trainer import CompleteOptimizedTrainer", load="torch_dtype=torch.bfloat16",
                 build="CompleteOptimizedTrainer(prepare(model), tokenizer)"),
     "self.model = self.model.to(dtype=torch.bfloat16)"),
    # the cast checks the dtype first
    (MAIN.format(imports="from trainer import CompleteOptimizedTrainer", load="torch_dtype=torch.bfloat16",
                 build="CompleteOptimizedTrainer(model, tokenizer)"),
     "if self.model.dtype != torch.bfloat16:\n            self.model = self.model.to(dtype=torch.bfloat16)"),
    # another class of the same name
    (MAIN.format(imports="from other import CompleteOptimizedTrainer", load="torch_dtype=torch.bfloat16",
                 build="CompleteOptimizedTrainer(model, tokenizer)"),
     "self.model = self.model.to(dtype=torch.bfloat16)"),
])
def test_near_misses_of_the_trainer_built_elsewhere_are_silent(tmp_path, main, prepare):
    files = {"trainer.py": TRAINER.format(prepare=prepare), "train.py": main,
             "other.py": TRAINER.format(prepare="pass")}
    assert _found(tmp_path, files, {"CFX101"}) == []


@pytest.mark.parametrize("test", ["if model.dtype != torch.bfloat16:", "if model.dtype == torch.float32:",
                                  "if getattr(model, 'dtype', None) is not torch.bfloat16:"])
def test_a_cast_under_a_test_of_the_dtype_is_silent(tmp_path, test):
    code = f"""\
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
{test}
    model = model.to(torch.bfloat16)
other = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
{test}
    other = other.to(torch.bfloat16)
"""
    # the second test reads `model`'s dtype, not `other`'s
    assert _found(tmp_path, {"load.py": code}, {"CFX101"}) == [("CFX101", "load.py", 9)]
