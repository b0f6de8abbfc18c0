"""CFX105 device-map-in-distributed-training."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.model_calls import LOAD_TRIGGERS, may_load_model
from cfgfix.core import Applicability, Finding, Fix, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Conditioned, Example, Rule, register
from cfgfix.rules.launch_flags import flag_qualifiers

_LAUNCH_2 = {"launch.sh": "torchrun --nproc_per_node 2 train.py\n"}
_DS_BRANCH = (
    "import argparse\nfrom transformers import AutoModelForCausalLM, Trainer\n"
    "parser = argparse.ArgumentParser()\nparser.add_argument('--deepspeed', default=None)\n"
    "args = parser.parse_args()\n"
    "if args.deepspeed:\n"
    "    model = AutoModelForCausalLM.from_pretrained('m')\n"
    "else:\n"
    "    model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "Trainer(model=model).train()\n"
)
_MP_BRANCH = (
    "import argparse\nfrom transformers import AutoModelForCausalLM, Trainer\n"
    "parser = argparse.ArgumentParser()\nparser.add_argument('--model_parallel', action='store_true')\n"
    "args = parser.parse_args()\n"
    "if args.model_parallel:\n"
    "    model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "else:\n"
    "    model = AutoModelForCausalLM.from_pretrained('m')\n"
    "Trainer(model=model).train()\n"
)


def _one_per_process(text: str) -> str:
    """An example's text after the fix: PartialState imported after the transformers line."""
    head, _, rest = text.partition("Trainer")
    line_end = rest.index("\n") + 1
    fixed = head + "Trainer" + rest[:line_end] + "from accelerate import PartialState\n" + rest[line_end:]
    return fixed.replace("device_map='auto'", 'device_map={"": PartialState().local_process_index}')


_HF_BRANCH = (
    "from dataclasses import dataclass, field\n"
    "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n"
    "@dataclass\nclass Args(TrainingArguments):\n    use_deepspeed: bool = field(default=False)\n"
    "def load(training_args):\n"
    "    if training_args.use_deepspeed:\n"
    "        return AutoModelForCausalLM.from_pretrained('m')\n"
    "    else:\n"
    "        return AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
    "def train():\n"
    "    (training_args,) = HfArgumentParser((Args,)).parse_args_into_dataclasses()\n"
    "    Trainer(model=load(training_args), args=training_args).train()\n"
)


@register
class DeviceMapInDistributedTraining(Rule):
    """## What it does
    Flags `device_map="auto"` (or `"balanced"`, `"sequential"`) in a training script that a
    launch script of the project starts with more than one process (`torchrun
    --nproc_per_node 2`, `accelerate launch --num_processes 4`, `deepspeed --num_gpus 8`, or
    an accelerate config with `num_processes: 4`).

    ## Why is this bad?
    Each process would spread its own copy of the model over all visible GPUs, and
    accelerate refuses to train it: `ValueError: You can't train a model that has been loaded
    with device_map='auto' in any distributed mode.` (raised by `accelerator.prepare`, which
    the HF `Trainer` calls too). Data-parallel training wants one whole model per process, on
    that process's GPU.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
    ```
    launched by `torchrun --nproc_per_node 2 train.py`.

    ## Use instead
    ```python
    from accelerate import PartialState
    model = AutoModelForCausalLM.from_pretrained(name, device_map={"": PartialState().local_process_index})
    ```

    ## Fix safety
    Unsafe: it changes where the model lives, and a model that only fits when split over
    several GPUs needs a sharding strategy (FSDP, DeepSpeed ZeRO-3) instead. The fix uses
    `local_process_index` rather than `process_index`, so it stays right on several nodes.
    The rule is silent for single-process launches, for scripts that no launch script
    starts, and for loads that never reach training: the loaded model (through wrappers
    such as `get_peft_model` and functions that return it) must be handed to a `*Trainer`,
    `accelerator.prepare` or `deepspeed.initialize`, or be loaded in a function that calls
    `backward()`. A model loaded after training to merge adapters is left alone, and so
    is a load that only a single-process run reaches: every launcher sets `LOCAL_RANK`,
    `RANK` and `WORLD_SIZE` in each process, so a load in a branch taken only when they are
    unset (`if int(os.environ.get("LOCAL_RANK", -1)) == -1:`, `if "LOCAL_RANK" not in
    os.environ:`, the `else` of `if local_rank != -1:`) or when `WORLD_SIZE` is 1 (`if
    world_size == 1:`, or `ddp = world_size != 1` then `if not ddp:`, reading the variables
    through names bound once) is a single-GPU fallback the launch never takes. A
    command-line `args.local_rank` does not count: `torchrun` does not pass it. A load in
    the branch a command-line flag turns off (the `else` of `if args.deepspeed:` or of `if
    training_args.use_deepspeed:`, an `HfArgumentParser` field, also where the parsed flags
    are passed to the loading function, or after `if args.deepspeed: return ...`) counts
    only the launches that leave that flag off:
    `--deepspeed ds.json`, `--use_deepspeed true` or a bare `--use_deepspeed` turn it on;
    `false`, `0` or a `$VARIABLE` may not. Likewise a load under `if args.model_parallel:`
    counts only the launches that may turn that flag on, when its default is off
    (`action="store_true"`, no default, `default=None`, a dataclass field `= False`).

    ## References
    - facts A3: accelerate `accelerator.py` `verify_device_map` and the ValueError in
      `prepare` (L1479, L1820); HF Trainer goes through `accelerator.prepare` under torchrun.
    """

    code = "CFX105"
    name = "device-map-in-distributed-training"
    severity = Severity.ERROR
    fix_availability = "unsafe"
    trigger_check = staticmethod(may_load_model)
    triggers = (LOAD_TRIGGERS, (b"device_map",))
    condition = "multi-process-launch"

    VALID = [
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="no launch script starts it with more than one process",
            files={"launch.sh": "python train.py --lr 1e-4\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="a single-process torchrun",
            files={"launch.sh": "torchrun --nproc_per_node 1 train.py\n"},
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "print(model.generate(**inputs))\n",
            why="inference only: nothing is trained",
            files=_LAUNCH_2,
        ),
        Example(
            "from accelerate import Accelerator\nfrom peft import AutoPeftModelForCausalLM\n"
            "from transformers import AutoModelForCausalLM\nfrom trl import SFTTrainer\n"
            "def main():\n"
            "    base = AutoModelForCausalLM.from_pretrained('m', device_map={'': Accelerator().local_process_index})\n"
            "    SFTTrainer(model=base).train()\n"
            "    model = AutoPeftModelForCausalLM.from_pretrained('out', device_map='auto')\n"
            "    model = model.merge_and_unload()\n"
            "    model.save_pretrained('merged')\n",
            why="a model loaded after training only to merge adapters is never prepared",
            files=_LAUNCH_2,
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={'': rank})\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="one device per process is the right map",
            files=_LAUNCH_2,
        ),
        Example(
            "from transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='auto')\n"
            "loss = model(**batch).loss\nloss.backward()\n",
            why="a world size from a variable the script cannot prove",
            files={"launch.sh": "torchrun --nproc_per_node ${NGPU:-2} train.py\n"},
        ),
        Example(
            "import os\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "def main():\n"
            "    local_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
            "    if local_rank != -1:\n"
            "        model = AutoModelForCausalLM.from_pretrained('m')\n"
            "    else:\n"
            "        model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "    Trainer(model=model).train()\n",
            why="`device_map='auto'` only where LOCAL_RANK is unset: torchrun sets it in every process",
            files=_LAUNCH_2,
        ),
        Example(
            "import os\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "world_size = int(os.environ.get('WORLD_SIZE', 1))\n"
            "ddp = world_size != 1\n"
            "if not ddp:\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "else:\n"
            "    model = AutoModelForCausalLM.from_pretrained('m', device_map={'': int(os.environ['LOCAL_RANK'])})\n"
            "Trainer(model=model).train()\n",
            why="a `ddp` flag bound once to `WORLD_SIZE != 1`: the auto map is the single-process branch",
            files=_LAUNCH_2,
        ),
        Example(
            _DS_BRANCH,
            why="`device_map='auto'` only in the `else` of `if args.deepspeed:`, and the launch passes `--deepspeed`",
            files={"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.json\n"},
        ),
        Example(
            _HF_BRANCH,
            why="the HfArgumentParser flag `use_deepspeed` (a dataclass field, passed to the loader) is turned on",
            files={"run.sh": "deepspeed --include localhost:0,1 train.py --use_deepspeed true --bf16 true\n"},
        ),
        Example(
            _MP_BRANCH,
            why="`device_map='auto'` only under `if args.model_parallel:`, a store_true flag this launch leaves off",
            files=_LAUNCH_2,
        ),
    ]
    INVALID = [
        Example(
            _MP_BRANCH,
            why="the same branch, and this launch passes `--model_parallel`",
            line=7,
            files={"launch.sh": "torchrun --nproc_per_node 2 train.py --model_parallel\n"},
            fixed=_one_per_process(_MP_BRANCH),
        ),
        Example(
            _DS_BRANCH,
            why="the same branch, but this launch leaves `--deepspeed` off: the `else` runs in both processes",
            line=9,
            files=_LAUNCH_2,
            fixed=_one_per_process(_DS_BRANCH),
        ),
        Example(
            _HF_BRANCH,
            why="`--use_deepspeed false` turns the flag off: the auto map is loaded",
            line=10,
            files={"run.sh": "deepspeed --include localhost:0,1 train.py --use_deepspeed false\n"},
            fixed=_one_per_process(_HF_BRANCH),
        ),
        Example(
            "import os\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "local_rank = int(os.environ.get('LOCAL_RANK', 0))\n"
            "if local_rank == 0:\n"
            "    print('main process')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n"
            "Trainer(model=model).train()\n",
            why="a load after a branch on the rank runs in every process",
            line=6,
            files=_LAUNCH_2,
            fixed="import os\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "from accelerate import PartialState\n"
            "local_rank = int(os.environ.get('LOCAL_RANK', 0))\n"
            "if local_rank == 0:\n"
            "    print('main process')\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map={\"\": PartialState().local_process_index})\n"
            "Trainer(model=model).train()\n",
        ),
        Example(
            "from transformers import AutoModelForCausalLM, Trainer\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', device_map='auto')\n"
            "Trainer(model=model, args=args).train()\n",
            why="torchrun with two processes",
            line=2,
            files=_LAUNCH_2,
            fixed="from transformers import AutoModelForCausalLM, Trainer\n"
            "from accelerate import PartialState\n"
            "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-7B', device_map={\"\": PartialState().local_process_index})\n"
            "Trainer(model=model, args=args).train()\n",
        ),
        Example(
            "from accelerate import (\n    Accelerator,\n)\nfrom transformers import AutoModel\n"
            "accelerator = Accelerator()\n"
            "model = AutoModel.from_pretrained('m', device_map='sequential')\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="deepspeed launcher with --num_gpus; the existing `from accelerate import` is extended",
            line=6,
            files={"train.sh": "deepspeed --num_gpus=8 train.py --deepspeed ds.json\n"},
            fixed="from accelerate import (\n    Accelerator, PartialState,\n)\nfrom transformers import AutoModel\n"
            "accelerator = Accelerator()\n"
            "model = AutoModel.from_pretrained('m', device_map={\"\": PartialState().local_process_index})\n"
            "accelerator.backward(model(**batch).loss)\n",
        ),
        Example(
            "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "def load(name):\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, device_map='auto')\n"
            "    return get_peft_model(model, config)\n"
            "def main():\n"
            "    model = load('m')\n"
            "    Trainer(model=model).train()\n",
            why="the model reaches the Trainer through a wrapper and a returning function",
            line=4,
            files=_LAUNCH_2,
            fixed="from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM, Trainer\n"
            "from accelerate import PartialState\n"
            "def load(name):\n"
            "    model = AutoModelForCausalLM.from_pretrained(name, device_map={\"\": PartialState().local_process_index})\n"
            "    return get_peft_model(model, config)\n"
            "def main():\n"
            "    model = load('m')\n"
            "    Trainer(model=model).train()\n",
        ),
        Example(
            "import accelerate\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map='balanced')\n"
            "accelerator.backward(model(**batch).loss)\n",
            why="accelerate launch with an accelerate config of 4 processes; accelerate already imported",
            line=3,
            files={
                "scripts/run.sh": "accelerate launch --config_file configs/acc.yaml train.py\n",
                "configs/acc.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 1\n",
            },
            fixed="import accelerate\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('m', device_map={\"\": accelerate.PartialState().local_process_index})\n"
            "accelerator.backward(model(**batch).loss)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        candidates = [
            load
            for load in ctx.models.loads
            if load.device_map is not None and load.device_map.kind == "multi" and load.library is not None
        ]
        if not candidates or not ctx.models.trains:
            return
        from cfgfix.analysis.training_flow import model_is_trained

        for load in candidates:
            if load.single_process:
                continue  # only a run without LOCAL_RANK / WORLD_SIZE > 1 reaches it: not the launch
            if not model_is_trained(ctx.index, load.call):
                continue  # loaded to merge adapters or to generate: accelerate never prepares it
            device_map = load.device_map
            keyword = next((k for k in load.call.keywords if k.arg == "device_map"), None)
            finding = self.finding(
                src.span_of_node(keyword if keyword is not None else device_map.node),
                f"`device_map={src.node_text(device_map.node)}` spreads the model over every GPU of "
                "each process, but this script is launched with more than one process: "
                "`accelerator.prepare` (and the HF Trainer) raise `ValueError: You can't train a "
                "model that has been loaded with device_map='auto' in any distributed mode.` Load "
                "one whole model per process instead.",
                fix=self._fix(ctx, keyword) if keyword is not None else None,  # set in a kwargs dict
            )
            qualifiers = flag_qualifiers(ctx, load.call) if load.path is None else ""
            # only the launches that set those flags so reach the load (project.py condition_holds)
            yield Conditioned(finding, self.condition + qualifiers) if qualifiers else finding

    def _fix(self, ctx, keyword) -> Fix:
        src, imports = ctx.source, ctx.models.imports
        edits = []
        local = imports.local_name_for("accelerate.PartialState")
        if local is None:
            module = imports.local_name_for("accelerate")
            if module is not None:
                local = f"{module}.PartialState"
            else:
                local = "PartialState"
                edits.append(
                    python_edits.import_name(src, ctx.document.tree, "accelerate", "PartialState", keyword.value.lineno)
                )
        edits.append(python_edits.replace_node(src, keyword.value, f'{{"": {local}().local_process_index}}'))
        return Fix(tuple(edits), "Load one whole model per process", Applicability.UNSAFE)
