"""CFX103 move-dispatched-model."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.model_calls import (
    LOAD_OR_LOADER_TRIGGERS,
    announcing_line,
    call_text,
    drop_call_edits,
    load_related,
    load_text,
    may_hold_model_with,
    name_of,
)
from cfgfix.core import Finding, Fix, Severity
from cfgfix.rules.base import Example, Rule, register


@register
class MoveDispatchedModel(Rule):
    """## What it does
    Flags `.to(device)` or `.cuda()` on a model loaded with a `device_map` that can spread it
    over several devices: `"auto"`, `"balanced"`, `"balanced_low_0"`, `"sequential"`, or an
    explicit map naming more than one device. The `device_map` may be written in the call or
    put into a keyword dict that the call spreads (`kw = dict(...)`, `kw["device_map"] =
    "auto"`, `kw.update(device_map="auto")`, then `from_pretrained(name, **kw)`), also under
    a test that the move shares.

    ## Why is this bad?
    accelerate already placed every module and attached hooks that move activations between
    devices. Moving the model afterwards fights those hooks: accelerate warns "You shouldn't
    move a model that is dispatched using accelerate hooks.", and when some modules were
    offloaded to the CPU or disk (`"cpu"`/`"disk"` in the map, `max_memory=`,
    `offload_folder=`) it raises `RuntimeError: You can't move a model that has some modules
    offloaded to cpu or disk.` — that case is an error; the others are warnings, because the
    move either crowds everything onto one GPU or does nothing useful.

    ## Example
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, device_map="auto")
    model.to(device)
    ```

    ## Use instead
    ```python
    model = AutoModelForSeq2SeqLM.from_pretrained(name, device_map="auto")
    ```

    ## Fix safety
    Safe: the move is dropped; the model stays where `device_map` put it. Inputs go to
    `model.device` (the first device of the map). When only some branches reach the move
    with a dispatched model (`if args.multi_gpu:` loads with `device_map="auto"`, `else:`
    without), cfgfix reports it without a fix: the other branches need the move. A move
    under the opposite condition on the same name (`if not args.multi_gpu: model.to(d)`),
    or after the dispatched branch returned, is not reported. cfgfix stays silent for single-device maps
    (`device_map="cuda"`, `{"": rank}`), where a `.to()` is harmless, for maps it cannot
    resolve, and for a move under a test of the model's placement (`if model.device.type !=
    "cuda":`, `if not hasattr(model, "hf_device_map"):`): a dispatch that placed the model
    never reaches it. When one of the next two statements prints or logs the move ("Model moved to
    GPU"), the fix's note names its line: after the fix it would announce a move that no
    longer happens.

    ## References
    - facts A3: accelerate `big_modeling.py` wraps `.to`/`.cuda` of dispatched models
      (warning, and RuntimeError when a parameter is offloaded to `meta`).
    """

    code = "CFX103"
    name = "move-dispatched-model"
    severity = Severity.WARNING
    fix_availability = "safe"
    trigger_check = staticmethod(may_hold_model_with(b"device_map"))
    triggers = (LOAD_OR_LOADER_TRIGGERS, (b".to(", b".cuda("))

    VALID = [
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "class Trainer:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
            "        self.hooks = Hooks(self)\n"
            "        self.hooks.reload()\n"
            "        self.model.cuda()\n",
            why="`self.hooks` was given `self`: its method may rebind `self.model`",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(name):\n"
            "    kw = dict(trust_remote_code=True)\n"
            "    kw['device_map'] = 'auto'\n"
            "    patch(kw)\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **kw)\n"
            "    model.to('cuda')\n",
            why="the dict is handed to a function that may change it: its `device_map` is unknown",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(name, multi_gpu):\n"
            "    kw = {}\n"
            "    if multi_gpu:\n"
            "        kw['device_map'] = 'auto'\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **kw)\n"
            "    if not multi_gpu:\n"
            "        model.to('cuda')\n",
            why="the dict holds `device_map` only where the move does not run",
        ),
        Example(
            "from models.build import build_model\n"
            "model = build_model('m')\n"
            "model.to('cuda')\n",
            why="the project's loader does not dispatch the model",
            files={"models/build.py": "from transformers import AutoModelForCausalLM\n"
                   "def build_model(name):\n"
                   "    return AutoModelForCausalLM.from_pretrained(name)\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "def train(model):\n"
            "    model.to('cuda')\n"
            "train(AutoModel.from_pretrained('m', device_map='auto'))\n"
            "train(AutoModel.from_pretrained('m'))\n",
            why="call sites that pass different models bind nothing",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m')\n"
            "model.to(device)\n",
            why="`.to(device)` on a model built without `device_map`",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={'': accelerator.process_index})\n"
            "model.to(accelerator.device)\n",
            why="a single-device map attaches no hooks",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "if model.device.type != 'cuda':\n"
            "    model.to('cuda')\n",
            why="the move runs only where the dispatch did not place the model on the GPU",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map=args.device_map)\n"
            "model.to(device)\n",
            why="`device_map` from a value that cannot be resolved",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "for batch in loader:\n"
            "    batch = {k: v.to(model.device) for k, v in batch.items()}\n",
            why="moving the inputs to the model's device is right",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "moved = [model.to('cuda') for model in others]\n",
            why="a comprehension variable shadows the name",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto', load_in_8bit=True).cuda()\n",
            why="a quantized model: whether moving it works depends on bitsandbytes (CFX104's call)",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(args, device):\n"
            "    if args.multi_gpu:\n"
            "        model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "    else:\n"
            "        model = AutoModelForCausalLM.from_pretrained('m')\n"
            "    if not args.multi_gpu:\n"
            "        model.to(device)\n"
            "    return model\n",
            why="the move runs only where the condition says the model was not dispatched",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(args, device):\n"
            "    model = AutoModelForCausalLM.from_pretrained('m')\n"
            "    if args.serve:\n"
            "        model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "        return model\n"
            "    model.to(device)\n",
            why="the dispatched branch returns before the move",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto' if multi else None)\n"
            "if not multi:\n"
            "    model.to(device)\n",
            why="a conditional `device_map` and a move under the opposite condition",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto' if multi else None)\n"
            "if torch.cuda.is_available():\n"
            "    model.to('cuda')\n",
            why="a move under a test cfgfix cannot relate to the branch that dispatched",
        ),
    ]
    INVALID = [
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(name):\n"
            "    load_kwargs = dict(trust_remote_code=True)\n"
            "    load_kwargs['device_map'] = 'auto'\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **load_kwargs)\n"
            "    model.to('cuda')\n",
            why="`device_map` set in a keyword dict the load spreads",
            line=6,
            fixed="from transformers import AutoModelForCausalLM\n"
            "def load(name):\n"
            "    load_kwargs = dict(trust_remote_code=True)\n"
            "    load_kwargs['device_map'] = 'auto'\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **load_kwargs)\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "def load(name, use_cuda):\n"
            "    kw = {'low_cpu_mem_usage': True}\n"
            "    if use_cuda:\n"
            "        kw.update(device_map='auto')\n"
            "    else:\n"
            "        kw['device_map'] = None\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **kw)\n"
            "    if use_cuda:\n"
            "        model = model.to('cuda')\n"
            "    return model\n",
            why="set under the same test as the move (`update` and a subscript)",
            line=10,
            fixed="from transformers import AutoModelForCausalLM\n"
            "def load(name, use_cuda):\n"
            "    kw = {'low_cpu_mem_usage': True}\n"
            "    if use_cuda:\n"
            "        kw.update(device_map='auto')\n"
            "    else:\n"
            "        kw['device_map'] = None\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, **kw)\n"
            "    if use_cuda:\n"
            "        pass\n"
            "    return model\n",
        ),
        Example(
            "from peft import PeftModel\n"
            "from transformers import AutoModel, AutoModelForCausalLM\n"
            "class Predictor:\n"
            "    def model_init(self):\n"
            "        if self.model_type == 'chatglm':\n"
            "            self.model = AutoModel.from_pretrained(self.path, trust_remote_code=True)\n"
            "        elif self.model_type == 'qwen':\n"
            "            self.model = AutoModelForCausalLM.from_pretrained(self.path, device_map='auto')\n"
            "        if self.peft_path is not None:\n"
            "            self.model = PeftModel.from_pretrained(self.model, self.peft_path)\n"
            "        self.model_to_device()\n"
            "    def model_to_device(self):\n"
            "        self.model.cuda()\n",
            why="one branch of `model_init()` dispatches the model another method moves (no fix: "
            "the other branch needs the move)",
            line=13,
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto' if n_gpus > 1 else None)\n"
            "model.to(device)\n",
            why="a conditional `device_map` whose dispatched branch reaches the move",
            line=3,
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "try:\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "except ValueError:\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', trust_remote_code=True)\n"
            "model = model.to('cuda')\n",
            why="a fallback load in `except`: the dispatched load, when it works, reaches the move",
            line=6,
        ),
        Example(
            "from peft import get_peft_model\n"
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "model = get_peft_model(model, config)\n"
            "model.to(device)\n",
            why="a PEFT wrapper keeps the dispatched base model; its `.to` moves every weight",
            line=5,
            fixed="from peft import get_peft_model\n"
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "model = get_peft_model(model, config)\n",
        ),
        Example(
            "import torch\n"
            "from models.build import build_model\n"
            "model = build_model('Qwen/Qwen2.5-7B')\n"
            "model.to('cuda')\n",
            why="the loader lives in another module of the project",
            line=4,
            files={"models/build.py": "from transformers import AutoModelForCausalLM\n"
                   "def build_model(name):\n"
                   "    model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
                   "    return model\n"},
            fixed="import torch\n"
            "from models.build import build_model\n"
            "model = build_model('Qwen/Qwen2.5-7B')\n",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForSeq2SeqLM\n"
            "class T5Trainer:\n"
            "    def __init__(self, cfg):\n"
            "        self.model = AutoModelForSeq2SeqLM.from_pretrained(cfg.model, device_map='auto')\n"
            "        self.model = self.model.to(dtype=torch.bfloat16)\n"
            "    def train(self):\n"
            "        self.model.to(self.device)\n",
            why="`__init__` rebinds `self.model` with a cast that keeps the dispatch; another method moves it",
            line=8,
            fixed="import torch\n"
            "from transformers import AutoModelForSeq2SeqLM\n"
            "class T5Trainer:\n"
            "    def __init__(self, cfg):\n"
            "        self.model = AutoModelForSeq2SeqLM.from_pretrained(cfg.model, device_map='auto')\n"
            "        self.model = self.model.to(dtype=torch.bfloat16)\n"
            "    def train(self):\n"
            "        pass\n",
        ),
        Example(
            "import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "class Trainer:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
            "        self.criterion = torch.nn.CrossEntropyLoss()\n"
            "        self.criterion.cuda()\n"
            "        self.model.cuda()\n",
            why="a method of another attribute (`self.criterion.cuda()`) cannot change `self.model`: "
            "nothing of the model went into it",
            line=8,
            fixed="import torch\n"
            "from transformers import AutoModelForCausalLM\n"
            "class Trainer:\n"
            "    def __init__(self, name):\n"
            "        self.model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
            "        self.criterion = torch.nn.CrossEntropyLoss()\n"
            "        self.criterion.cuda()\n",
        ),
        Example(
            "from transformers import AutoModel\n"
            "def train(model, loader):\n"
            "    model.cuda()\n"
            "    for batch in loader:\n"
            "        model(**batch).loss.backward()\n"
            "def main():\n"
            "    model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "    train(model, loader)\n",
            why="the model reaches the training function through its call site",
            line=3,
            fixed="from transformers import AutoModel\n"
            "def train(model, loader):\n"
            "    for batch in loader:\n"
            "        model(**batch).loss.backward()\n"
            "def main():\n"
            "    model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "    train(model, loader)\n",
        ),
        Example(
            "from transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', device_map='auto')\n"
            "model.to(device)  # make sure it is on the GPU\n"
            "model.train()\n",
            why="the story's move after an auto map",
            line=3,
            fixed="from transformers import AutoModelForSeq2SeqLM\n"
            "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', device_map='auto')\n"
            "model.train()\n",
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto', max_memory={0: '20GiB', 'cpu': '60GiB'})\n"
            "model = model.cuda()\n",
            why="with offloading possible, accelerate raises: an error",
            line=3,
            fixed="from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto', max_memory={0: '20GiB', 'cpu': '60GiB'})\n",
        ),
        Example(
            "from transformers import AutoModel\n"
            "class Runner:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', device_map={'encoder': 0, 'decoder': 'cpu'})\n"
            "    def train(self):\n"
            "        self.model.to('cuda')\n",
            why="`self.model` across methods, and an explicit map with a CPU entry",
            line=6,
            fixed="from transformers import AutoModel\n"
            "class Runner:\n"
            "    def __init__(self):\n"
            "        self.model = AutoModel.from_pretrained('m', device_map={'encoder': 0, 'decoder': 'cpu'})\n"
            "    def train(self):\n"
            "        pass\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM\n"
            "model = (AutoModelForCausalLM.from_pretrained('m', device_map='auto')  # load\n"
            "         .to('cuda'))  # move\n",
            why="a chained move over two lines: only `.to('cuda')` goes, both comments stay",
            line=2,
            fixed="from transformers import AutoModelForCausalLM\n"
            "model = (AutoModelForCausalLM.from_pretrained('m', device_map='auto')  # load\n"
            "         )  # move\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        for mc in ctx.models.calls:
            if not _moves_dispatched(mc):
                continue
            device_map = mc.state.load.device_map
            pure_move = mc.method == "cuda" or mc.target_dtype is None
            edits = drop_call_edits(src, mc) if pure_move and mc.moves_device is not False else None
            description = f"Remove `{call_text(src, mc)}`; `device_map` already placed the model"
            announced = announcing_line(ctx.document.tree, mc.stmt) if edits else None
            if announced is not None:  # a fix never leaves a statement that now lies unmentioned
                description += f" (line {announced} still announces the move: reword or drop it)"
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} was dispatched with `device_map={load_text(src, mc.state.load, device_map.node)}` "
                f"({mc.state.load.where}); `{call_text(src, mc)}` moves it again: {_consequence(device_map)}.",
                fix=Fix(tuple(edits), description) if edits else None,
                related=[load_related(src, mc.state.load, "dispatched here")],
                severity=Severity.ERROR if device_map.offload else Severity.WARNING,
            )
        # A name that holds one of several loads (branches): speak when one that reaches the
        # call is dispatched. No fix: dropping the move would strand the other branches' model.
        reported: set[int] = set()
        for mc in sorted(ctx.models.possible_calls, key=lambda c: (c.call.lineno, c.state.load.line)):
            if id(mc.call) in reported or not _moves_dispatched(mc):
                continue
            reported.add(id(mc.call))
            device_map = mc.state.load.device_map
            yield self.finding(
                src.span_of_node(mc.call),
                f"{name_of(src, mc)} may hold the model dispatched with "
                f"`device_map={load_text(src, mc.state.load, device_map.node)}` ({mc.state.load.where}): "
                f"it is one of {mc.alternatives} values that reach this call on different paths; on that path "
                f"`{call_text(src, mc)}` moves it again: {_consequence(device_map)}. Move only the model "
                "loaded without `device_map`, in its own branch.",
                related=[load_related(src, mc.state.load, "dispatched here, on one branch")],
                severity=Severity.ERROR if device_map.offload else Severity.WARNING,
            )


def _moves_dispatched(mc) -> bool:
    """A device move of a model dispatched over several devices (or any `.to` of one with
    offloaded modules), by a library whose `device_map` attaches hooks; quantized loads
    are CFX104's."""
    load = mc.state.load
    device_map = load.device_map
    if device_map is None or device_map.kind != "multi" or load.library is None or load.quant_keywords:
        return False
    # A move under a test of the model's placement (`if model.device.type != "cuda":`) runs
    # only where the dispatch left it elsewhere, on one device: nothing to crowd.
    moves = (mc.method == "cuda" or (mc.method == "to" and mc.moves_device is True)) and not mc.device_guarded
    casts_offloaded = mc.method == "to" and mc.moves_device is False and device_map.offload
    return moves or casts_offloaded


def _consequence(device_map) -> str:
    if device_map.offload:
        return (
            "with modules offloaded to the CPU or disk, accelerate raises "
            "`RuntimeError: You can't move a model that has some modules offloaded to cpu or disk.`"
        )
    return (
        "accelerate warns \"You shouldn't move a model that is dispatched using accelerate hooks.\" "
        "and the move crowds the model onto one device"
    )
