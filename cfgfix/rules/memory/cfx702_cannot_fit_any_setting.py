"""CFX702 cannot-fit-any-setting."""

from __future__ import annotations

from cfgfix.core import Severity
from cfgfix.rules.base import Example, ProjectRule, register


@register
class CannotFitAnySetting(ProjectRule):
    """## What it does
    Flags a launch whose training setup does not fit the target GPU even at the end of
    `fix --fit`'s ladder: ZeRO-3 with optimizer and parameter offload, micro batch 1 and
    gradient checkpointing. The message says by how much, and what would fit instead: LoRA
    or QLoRA instead of a full fine-tune, or more GPUs.

    ## Why is this bad?
    No config change makes this run fit; tuning flags, clearing caches or changing the
    allocator only postpones the out-of-memory error.

    ## Example
    A full fine-tune of a 70B model on one 24 GB GPU.

    ## Use instead
    A parameter-efficient fine-tune (LoRA / QLoRA), or enough GPUs to shard the model.

    ## Fix safety
    No fix: what would fit changes what is trained or the hardware.

    ## References
    - facts.md C14 (DeepSpeed's ZeRO-3 offload estimate: 4L on the GPU, 18 Psi x 1.5 in RAM)
    """

    code = "CFX702"
    name = "cannot-fit-any-setting"
    severity = Severity.ERROR

    def check_project(self, project):
        from cfgfix.training.memory_answer import judged, related, reported

        for found in judged(project):
            if reported(found) != self.code:
                continue
            from cfgfix.training.fit import gib, what_would_fit

            floor, setup, gpu = found.plan.after, found.training, found.gpu
            ideas = what_would_fit(found.high.setup, found.high.shape, gpu)
            text = (
                f"{setup.get('model')} ({found.high.shape.params / 1e9:.3g}B parameters) does not fit the "
                f"{gpu.name} ({gib(gpu.usable_bytes)}) with any config change: even ZeRO-3 with optimizer and "
                f"parameter offload, micro batch 1 and gradient checkpointing needs about {gib(floor.peak)} per GPU "
                f"({gib(floor.peak - gpu.usable_bytes)} over)"
                + (f"; what would fit: {' or '.join(ideas)}" if ideas else "")
            )
            yield self.finding(setup.launch.span, text, related=related(setup))

    _SCRIPT = ("import torch\nfrom transformers import AutoModelForCausalLM\n\n"
               "model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.1-70B', torch_dtype=torch.bfloat16)\n"
               "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)\n"
               "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n")
    VALID = [
        Example("python train.py --max_seq_length 1024\n", "no target GPU: silent", path="run.sh",
                files={"train.py": _SCRIPT}),
        Example("python train.py --max_seq_length 1024\n",
                "70B on one RTX 4090 fits with ZeRO-3 parameter offload (CFX701's, with the host RAM it needs)",
                path="run.sh", files={"train.py": _SCRIPT, "cfgfix.toml": 'gpu = "RTX 4090"\n'}),
    ]
    INVALID = [
        Example("python train.py --max_seq_length 131072\n",
                "128k-token sequences: the checkpointed layer inputs alone outgrow an RTX 4090", path="run.sh", line=1,
                files={"train.py": _SCRIPT.replace("Llama-3.1-70B", "Llama-3.1-8B"), "cfgfix.toml": 'gpu = "RTX 4090"\n'}),
    ]
