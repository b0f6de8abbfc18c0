"""CFX508 offload-with-torch-optimizer."""

from __future__ import annotations

from cfgfix.analysis.deepspeed_config import ast_name, checked_docs, offload_device, script_uses, zero_block
from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register


@register
class OffloadWithTorchOptimizer(ProjectRule):
    """## What it does
    Flags optimizer offload (`zero_optimization.offload_optimizer.device` `cpu` or `nvme`, or
    the deprecated `cpu_offload: true` DeepSpeed maps to it)
    in a DeepSpeed config whose training script builds a torch optimizer
    (`torch.optim.AdamW(...)`) and passes it to `deepspeed.initialize(optimizer=...)`,
    while the config has no `optimizer` block and does not set
    `"zero_force_ds_cpu_optimizer": false`.

    ## Why is this bad?
    ZeRO-Offload steps the optimizer on the CPU; a torch optimizer there is slow, so
    DeepSpeed refuses it: `ZeRORuntimeException` "You are using ZeRO-Offload with a client
    provided optimizer (...) which in most cases will yield poor performance". The run
    stops during `deepspeed.initialize`, after the model was loaded. Not reported when
    accelerate or the HF Trainer runs the script (accelerate swaps in `DeepSpeedCPUAdam`
    for a torch Adam), or when the config has its own `optimizer` block.

    ## Example
    ```json
    {"train_batch_size": 16, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```
    with `optimizer = torch.optim.AdamW(model.parameters())` and
    `deepspeed.initialize(model=model, optimizer=optimizer, ...)`.

    ## Use instead
    `deepspeed.ops.adam.DeepSpeedCPUAdam(model.parameters())` in the script, or an
    `"optimizer": {"type": "AdamW", "params": {...}}` block in the config (and no
    `optimizer=`), or `"zero_force_ds_cpu_optimizer": false` to accept the slow step.

    ## Fix safety
    No fix: the choice between DeepSpeed's CPU Adam, a config optimizer and the slow torch
    step is the author's.

    ## References
    - facts.md C12 (Runtime-only checks); DeepSpeed `runtime/engine.py` (`_configure_optimizer`)
    """

    code = "CFX508"
    name = "offload-with-torch-optimizer"
    severity = Severity.ERROR

    def check_project(self, project):
        for path, uses, doc in checked_docs(project):
            root = doc.root
            zero = zero_block(root)
            # offload_optimizer.device, or the deprecated cpu_offload: true DeepSpeed maps to it
            where, device = offload_device(zero, "offload_optimizer") if zero is not None else (None, None)
            if where not in ("cpu", "nvme") or "optimizer" in root:
                continue
            force = root.get("zero_force_ds_cpu_optimizer")
            if force is not None and force.truthy() is not True:
                continue  # false (the documented opt-out) or not known
            for use, source, facts in script_uses(project, uses):
                if use.via_accelerate is not None or facts.integrated:
                    continue  # accelerate swaps in DeepSpeedCPUAdam
                hit = next(((call, opt) for call in facts.initialize
                            if (opt := facts.torch_optimizer_passed(call)) is not None), None)
                if hit is None:
                    continue
                call, optimizer = hit
                kind = ast_name(optimizer).removesuffix("(...)")
                yield self.finding(
                    doc.span(device),
                    f"optimizer offload to {where} with the torch optimizer {kind} built at "
                    f"{source.path}:{optimizer.lineno} and passed to deepspeed.initialize: DeepSpeed raises "
                    f"ZeRORuntimeException 'You are using ZeRO-Offload with a client provided optimizer'; use "
                    f"deepspeed.ops.adam.DeepSpeedCPUAdam, an \"optimizer\" block in the config, or "
                    f"\"zero_force_ds_cpu_optimizer\": false",
                    related=[Related(source.span_of_node(optimizer), "torch optimizer built here"),
                             Related(source.span_of_node(call), "passed to deepspeed.initialize here")]
                    + use.related,
                )
                break

    _DS = ('{\n  "train_batch_size": 16,\n  "zero_optimization": {\n    "stage": 2,\n'
           '    "offload_optimizer": {"device": "cpu"}\n  }%s\n}\n')
    _SCRIPT = ("import torch\nimport deepspeed\n\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
               "engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)\n")
    _LAUNCH = {"train.sh": "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json\n"}
    VALID = [
        Example(_DS % ',\n  "zero_force_ds_cpu_optimizer": false', "the documented opt-out", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % ',\n  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}', "the config has an optimizer",
                path="ds.json", files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % "", "DeepSpeedCPUAdam passed", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT.replace("torch.optim.AdamW", "deepspeed.ops.adam.DeepSpeedCPUAdam")}),
        Example(_DS % "", "accelerate swaps in DeepSpeedCPUAdam for a torch AdamW", path="ds.json",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                          "deepspeed_config:\n  deepspeed_config_file: ds.json\nnum_processes: 2\n",
                       "train.sh": "accelerate launch --config_file accelerate.yaml train.py\n",
                       "train.py": "import torch\nfrom accelerate import Accelerator\n\naccelerator = Accelerator()\n"
                                   "optimizer = torch.optim.AdamW(model.parameters())\n"
                                   "model, optimizer = accelerator.prepare(model, optimizer)\n"}),
        Example(_DS.replace('"cpu"', '"none"') % "", "offload device none", path="ds.json",
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS % "", "no optimizer passed: DeepSpeed builds none, nothing to refuse here", path="ds.json",
                files={**_LAUNCH, "train.py": "import deepspeed\n\nengine, *_ = deepspeed.initialize(args=args, model=model)\n"}),
    ]
    INVALID = [
        Example(_DS % "", "torch AdamW passed to deepspeed.initialize with CPU offload", path="ds.json", line=5,
                files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS.replace('"offload_optimizer": {"device": "cpu"}', '"cpu_offload": true') % "",
                "the deprecated cpu_offload: true, which DeepSpeed maps to offload_optimizer on cpu", path="ds.json",
                line=5, files={**_LAUNCH, "train.py": _SCRIPT}),
        Example(_DS.replace('"cpu"', '"nvme"') % "", "from torch.optim import, passed inline", path="ds.json", line=5,
                files={**_LAUNCH, "train.py": "from torch.optim import SGD\nimport deepspeed\n\n"
                                               "engine, *_ = deepspeed.initialize(model=model, optimizer=SGD(model.parameters(), lr=0.1))\n"}),
    ]
