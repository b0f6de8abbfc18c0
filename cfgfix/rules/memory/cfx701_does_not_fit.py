"""CFX701 does-not-fit."""

from __future__ import annotations

from cfgfix.core import Severity
from cfgfix.rules.base import Example, ProjectRule, register


@register
class DoesNotFit(ProjectRule):
    """## What it does
    Estimates the peak memory per GPU of each launch's training setup (model size from the
    model catalog or a local `config.json`, or, for the script's own `nn.Module` class, the
    sum of its parts: pretrained backbones and torch layers sized from the launch's config,
    with `[tool.cfgfix.model]` for what cannot be read; precision, optimizer, ZeRO/FSDP sharding and
    offload, LoRA, micro batch, sequence length, gradient checkpointing) and flags a launch
    whose memory answer (the one `cfgfix estimate`, `fix --fit` and `explain` show) does not
    fit the target GPU. The target GPU comes from `gpu` in `[tool.cfgfix]` (or `--gpu`); with
    none set, nothing is reported.

    An input the files leave open (the sequence length, the weights' dtype, the optimizer, the
    micro batch) is a range, and the answer is estimated at both ends. CFX701 speaks when
    even the least-memory end is over the GPU over its whole error band ("does not fit"). For
    a conditional answer ("fits only if the sequence length is ≤ 1,536 tokens") it speaks when
    the most-memory end is over even at the bottom of its band, and the message names the
    condition: state the value in the files to settle it. A conditional answer whose
    most-memory end might still fit (a tight band), or whose only doubt is a part of the
    model that could not be sized, is left to `cfgfix estimate` (exit code 1), not reported.

    The message carries the breakdown (weights, gradients, optimizer states, master weights,
    activations, temporaries, the CUDA context) and corrects the beliefs that usually lead
    there: mixed precision keeps fp32 weights and states; gradient checkpointing shrinks
    activations only; a repeated `.to()` copies nothing.

    ## Why is this bad?
    The run will stop with CUDA out-of-memory, usually after minutes of loading, and the
    usual remedies (`empty_cache()`, `expandable_segments`, a second cast) do not touch the
    model states that do not fit.

    ## Example
    FLAN-T5-XL (2.85B) with bf16 weights and AdamW, batch 8 x 512, no checkpointing, on one
    RTX 5090 (`gpu = "RTX 5090"`): about 21 GiB of model states plus tens of GiB of
    activations.

    ## Use instead
    `cfgfix fix --fit` walks the cheapest changes first (mixed precision, checkpointing, a
    smaller micro batch with more accumulation, an 8-bit optimizer, ZeRO-2, optimizer
    offload, ZeRO-3, parameter offload), keeps the effective batch, and writes the first
    setup that fits into the configs. `cfgfix estimate` shows the numbers.

    ## Fix safety
    No fix on the finding itself: `cfgfix fix --fit` writes the plan (its changes alter
    speed and sometimes numerics; each is explained).

    ## References
    - facts.md C14 (ZeRO and DeepSpeed estimator formulas, HF memory anatomy, activations),
      C15 (the myths)
    """

    code = "CFX701"
    name = "does-not-fit"
    severity = Severity.ERROR

    def check_project(self, project):
        from cfgfix.training.memory_answer import judged, related, reported

        for found in judged(project):
            if reported(found) != self.code:
                continue
            from cfgfix.training.fit import breakdown, gib, myths

            setup, result, gpu, plan = found.training, found.high, found.gpu, found.plan
            casts = "weights_cast" in setup.sources.get("script", {})
            corrections = myths(result.setup, result, casts)
            if plan.fits and plan.rungs:
                after = found.plan_verdict[2] if found.plan_verdict else "fits"
                steps = (f". Cheapest setup: {' -> '.join(r.name for r in plan.rungs)} (`cfgfix fix --fit`; after it: {after})"
                         + (f", with {gib(plan.after.cpu_bytes)} of host RAM for the offloaded states"
                            if plan.after.cpu_bytes else ""))
            else:
                steps = ". No config change surely makes it fit (`cfgfix fix --fit` shows how far the ladder gets)"
            text = (
                f"{setup.get('model')} ({result.shape.params / 1e9:.3g}B parameters) {found.text}. It needs about "
                f"{gib(result.peak)} per GPU (range {found.range_text()} over the estimate's band and what the files "
                f"leave open) against the {gpu.name}'s {gib(gpu.usable_bytes)}: {breakdown(result)}"
                + (f"; a simulated step (FakeTensor, --simulate) peaks at {gib(found.simulated[0])}"
                   if found.simulated else "")
                + (f". Note: {'; '.join(corrections)}" if corrections else "")
                + steps
                + (f" [{'; '.join([o.words for o in found.open] + found.notes)}]" if found.open or found.notes else "")
            )
            yield self.finding(setup.launch.span, text, related=related(setup))

    _SCRIPT = ("import torch\nfrom transformers import AutoModelForSeq2SeqLM\n\n"
               "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16)\n"
               "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
               "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n")
    _CONFIG = "per_device_train_batch_size: {micro}\ngradient_accumulation_steps: 4\nmax_source_length: 512\n" \
              "gradient_checkpointing: false\nlearning_rate: 1.0e-4\n"
    VALID = [
        Example("python infer.py --config train.yaml\n", "a script that never trains (no backward, no Trainer)",
                path="run.sh", files={"infer.py": _SCRIPT.split("optimizer =")[0] + "model.generate(**inputs)\n",
                                      "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
        Example("python train.py --config train.yaml\n", "no target GPU: silent", path="run.sh",
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8)}),
        Example("python train.py --config train.yaml\n", "fits an H100 80GB", path="run.sh",
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "H100 SXM"\n'}),
        Example("python train.py --config train.yaml\n", "a model nobody knows: silent", path="run.sh",
                files={"train.py": _SCRIPT.replace("google/flan-t5-xl", "acme/secret-model"),
                       "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
    ]
    INVALID = [
        Example("python train.py --config train.yaml\n", "FLAN-T5-XL, AdamW, batch 8 x 512 on an RTX 5090",
                path="run.sh", line=1,
                files={"train.py": _SCRIPT, "train.yaml": _CONFIG.format(micro=8), "cfgfix.toml": 'gpu = "RTX 5090"\n'}),
    ]
