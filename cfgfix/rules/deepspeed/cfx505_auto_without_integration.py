"""CFX505 auto-without-integration."""

from __future__ import annotations

from cfgfix.analysis.deepspeed_config import checked_docs, script_uses
from cfgfix.analysis.deepspeed_validation import auto_is_default
from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_STRICT_BLOCKS = ("zero_optimization", "activation_checkpointing", "comms_logger", "flops_profiler",
                  "aio", "tensorboard", "wandb", "csv_monitor", "comet", "data_types", "checkpoint")


def _autos(node, where=""):
    """(dotted key, value node) for every "auto" value in a mapping, depth first."""
    for key, value in node.entries:
        name = f"{where}.{key.value}" if where else str(key.value)
        if value.kind == "scalar" and value.value == "auto":
            yield name, value
        elif value.kind == "mapping":
            yield from _autos(value, name)


def _auto_consequence(where: str) -> str:
    if where == "zero_optimization.stage":
        return ("DeepSpeed drops \"auto\" inside zero_optimization, so the stage falls back to 0: ZeRO is off "
                "and every GPU holds the whole model, gradients and optimizer states")
    if where in _BATCH_KEYS:
        return "DeepSpeed compares it with integers and stops at start-up with a TypeError"
    if where in ("fp16.enabled", "bf16.enabled", "bfloat16.enabled"):
        return ("DeepSpeed 0.19 drops it and the run trains without fp16/bf16; older versions read the "
                "string as enabled")
    if where.split(".")[0] in _STRICT_BLOCKS:
        return "DeepSpeed drops \"auto\" values in this block and silently uses its default"
    return "nothing replaces it: DeepSpeed drops the value or keeps the string \"auto\""


@register
class AutoWithoutIntegration(ProjectRule):
    """## What it does
    Flags `"auto"` values in a DeepSpeed config that a launch hands to a training script
    calling `deepspeed.initialize` itself (`deepspeed train.py --deepspeed_config ds.json`
    read by `deepspeed.add_config_arguments`, or `config=`), with neither the HF Trainer
    nor accelerate in the script.

    ## Why is this bad?
    `"auto"` is not a DeepSpeed value: the HF Trainer and accelerate replace it from their
    own arguments before DeepSpeed sees the config. A bare `deepspeed.initialize` does not.
    DeepSpeed drops `"auto"` inside its validated blocks and uses the default, so
    `"stage": "auto"` means ZeRO stage 0 (ZeRO off, every GPU holds everything) and
    `"enabled": "auto"` under `bf16` means no bf16 in DeepSpeed 0.19; `"auto"` batch sizes
    stop the run with a TypeError. Nothing is reported when the script mentions the string
    `"auto"` itself (it may fill the values), or when the config reaches the script through
    accelerate.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": "auto"}}
    ```
    with `deepspeed --num_gpus 8 train.py --deepspeed --deepspeed_config ds.json` and
    `deepspeed.initialize(args=args, model=model, ...)` in `train.py`.

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    ```

    ## Fix safety
    No fix: the right number (stage, batch size, precision) is the author's choice.

    ## Versions
    Flagged on every DeepSpeed version: what `"auto"` turns into differs (0.19 drops
    `fp16.enabled: "auto"` and trains without fp16; 0.16 and older read the string as
    enabled), and the message states each version's outcome instead of assuming one.

    ## References
    - facts.md C12 (`"auto"` outside HF/accelerate); DeepSpeed `runtime/config_utils.py`
      (`DeepSpeedConfigModel.__init__` drops "auto")
    """

    code = "CFX505"
    name = "auto-without-integration"
    severity = Severity.ERROR

    def check_project(self, project):
        for path, uses, doc in checked_docs(project):
            bare = [(use, source, facts) for use, source, facts in script_uses(project, uses)
                    if use.via_accelerate is None and facts.initialize and not facts.integrated
                    and not facts.fills_auto]
            if not bare:
                continue
            use, source, facts = bare[0]
            call = facts.initialize[0]
            related = [Related(source.span_of_node(call), "deepspeed.initialize reads the config here")]
            related += [r for use, _, _ in bare for r in use.related]
            for where, value in _autos(doc.root):
                if auto_is_default(where):
                    continue  # DeepSpeed's own default is "auto" (ZenFlow's select_strategy): nothing changes
                yield self.finding(
                    doc.span(value),
                    f'"{where}": "auto" is filled only by the HF Trainer or accelerate, but '
                    f"{source.path}:{call.lineno} passes this config to deepspeed.initialize directly: "
                    f"{_auto_consequence(where)}",
                    related=related,
                )

    _BARE = ("import deepspeed\n\nargs = parser.parse_args()\n"
             "engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model,"
             " model_parameters=model.parameters())\n")
    _LAUNCH = {"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed --deepspeed_config ds.json\n"}
    _DS = '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": %s\n  }\n}\n'
    VALID = [
        Example('{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "zenflow": '
                '{"select_strategy": "auto"}}}', "\"auto\" is DeepSpeed's own default there (ZenFlow)", path="ds.json",
                files={**_LAUNCH, "train.py": _BARE}),
        Example(_DS % '"auto"', "the HF Trainer fills \"auto\"", path="ds.json",
                files={"train.sh": "deepspeed --num_gpus 8 train.py --deepspeed ds.json\n",
                       "train.py": "from transformers import Trainer\n\ntrainer = Trainer(model=model, args=args)\n"}),
        Example(_DS % '"auto"', "accelerate fills \"auto\"", path="ds.json",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                          "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 8\n",
                       "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"}),
        Example(_DS % "2", "no \"auto\" values", path="ds.json", files={**_LAUNCH, "train.py": _BARE}),
        Example(_DS % '"auto"', "no launch links the config to a script", path="ds.json"),
        Example(_DS % '"auto"', "the script fills \"auto\" values itself", path="ds.json",
                files={**_LAUNCH, "train.py": _BARE.replace("args = parser.parse_args()\n",
                                                            "args = parser.parse_args()\nfill(cfg, 'auto')\n")}),
    ]
    INVALID = [
        Example(_DS % '"auto"', "stage \"auto\": ZeRO off", path="ds.json", line=4,
                files={**_LAUNCH, "train.py": _BARE}),
        Example('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {"stage": 2}\n}\n',
                "an \"auto\" batch size: TypeError", path="ds.json", line=2,
                files={"run.sh": "deepspeed train.py --deepspeed_config=ds.json\n",
                       "train.py": "import deepspeed as ds\n\nengine, *_ = ds.initialize(args=args, model=net)\n"}),
    ]
