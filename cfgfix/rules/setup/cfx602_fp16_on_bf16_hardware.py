"""CFX602 fp16-on-bf16-hardware."""

from __future__ import annotations

import re

from cfgfix.core import Applicability, Edit, Fix, Related, Severity
from cfgfix.rules.base import Example, ProjectRule, register
from cfgfix.rules.decisions import Decisions, also, listed
from cfgfix.rules.setup.common import flip_edit, gpu_bf16


@register
class Fp16OnBf16Hardware(ProjectRule):
    """## What it does
    Flags fp16 mixed precision (`mixed_precision: fp16`, `fp16: true`, `--fp16`, a DeepSpeed
    `fp16` block enabled) in a launch whose target GPU supports bf16: the `gpu` setting
    (`[tool.cfgfix] gpu = "A100 80GB"`, or `--gpu`) names a card of the catalog with bf16
    (Ampere and newer). Silent when no target GPU is set or the catalog does not know it,
    and for quantized models (an 8-bit load, a GPTQ / AWQ / Int4 checkpoint), whose kernels
    often need fp16.

    ## Why is this bad?
    fp16 has 5 exponent bits: gradients underflow and activations overflow unless a loss
    scaler hunts for a scale, skipping steps that overflowed and sometimes diverging to
    NaN. bf16 has fp32's range, needs no scaler, and on these GPUs runs at the same speed
    with the same memory.

    ## Example
    ```yaml
    # pyproject.toml: [tool.cfgfix] gpu = "A100 80GB"
    mixed_precision: fp16
    ```

    ## Use instead
    ```yaml
    mixed_precision: bf16
    ```

    ## Fix safety
    Unsafe: numerics change (bf16 has fewer mantissa bits than fp16), and a model trained
    or released in fp16 may want to stay there. Fixed only where one file decides
    (`mixed_precision`, or `fp16: true` next to an explicit `bf16: false`).

    A launch that chooses fp16 in several files (the accelerate config, the DeepSpeed JSON,
    the training config, a `--fp16` flag) gets one finding, at the place that decides (the
    DeepSpeed JSON's value, then flags, then the training config, the accelerate config
    last), with the others as related locations; it has no fix, since the files must change
    together.

    ## References
    - facts.md A5 (GradScaler and bf16); the GPU catalog (`cfgfix/memory/data/gpus.json`)
    """

    code = "CFX602"
    name = "fp16-on-bf16-hardware"
    severity = Severity.INFO
    fix_availability = "unsafe"

    def check_project(self, project):
        from cfgfix.training.resolve import training_setups

        decisions = Decisions(self)
        for setup in training_setups(project):
            gpu = setup.values.get("gpu")
            if gpu is None or gpu_bf16(gpu.value) is not True:
                continue
            precision, mixed = setup.get("precision"), setup.get("mixed_precision")
            if precision not in ("amp-fp16", "deepspeed-fp16", "fp16") or mixed == "bf16":
                continue  # the launch does not train in fp16, or its files disagree (CFX402/CFX501/CFX511)
            if setup.get("quantization") or _QUANTIZED_NAME.search(str(setup.get("model") or "")):
                continue  # int8 / GPTQ / AWQ kernels often want fp16: the choice may be forced
            places = [(source, found, chosen) for source, found in setup.sources.items()
                      if (chosen := _fp16_choice(source, found)) is not None and chosen.span is not None]
            if not places:
                continue
            # one choice, stated in several files: one finding where it is decided
            places.sort(key=lambda place: _deciding_first(setup, place))
            chosen, others = places[0][2], [place[2] for place in places[1:]]
            so_do = f" (so do {listed(others)})" if others else ""
            decisions.add(
                chosen.span,
                f"{chosen.origin} chooses fp16{so_do} while the target GPU ({gpu.value}) computes in bf16 at the "
                f"same speed: fp16 needs loss scaling and can overflow to inf/NaN, bf16 has fp32's range and needs "
                f"no scaler",
                fix=self._fixes(project, places),
                related=[*also(others, "chooses fp16"), Related(setup.launch.span, "launched here")],
            )
        yield from decisions.findings()

    def _fixes(self, project, places):
        """One fix for every place that states the choice, when each has one and all lie in
        one file (a fix edits the file of its finding); else none."""
        fixes = [self._fix(project, *place) for place in places]
        if None in fixes or len({e.path for f in fixes for e in f.edits}) != 1:
            return None
        if len(fixes) == 1:
            return fixes[0]
        return Fix(tuple(e for f in fixes for e in f.edits), "Use bf16 everywhere this launch chooses fp16",
                   Applicability.UNSAFE)

    @staticmethod
    def _fix(project, source, found, chosen):
        if source in ("deepspeed config", "script"):
            return None
        if chosen.setting == "mixed_precision":
            if source == "flags" or chosen.name.startswith("--"):  # also accelerate's `--mixed_precision fp16`
                edit = Edit(chosen.span.path, chosen.span.start, chosen.span.end, "bf16")
            else:
                edit = flip_edit(project, chosen, "bf16")
            return Fix((edit,), "Use bf16", Applicability.UNSAFE) if edit is not None else None
        bf16 = found.get("bf16")
        if source == "flags" or bf16 is None or bf16.value is not False:
            return None
        edits = (flip_edit(project, chosen, False), flip_edit(project, bf16, True))
        if None in edits:
            return None
        return Fix(edits, "Use bf16 instead of fp16", Applicability.UNSAFE)

    _GPU = '[tool.cfgfix]\ngpu = "{gpu}"\n'
    _CONFIG = "per_device_train_batch_size: 4\nfp16: true\nbf16: false\n"
    _FILES = {"train.sh": "torchrun --nproc_per_node 2 train.py --config train.yaml\n", "train.py": "print(1)\n"}
    VALID = [
        Example(_CONFIG, "no target GPU set", path="train.yaml", files=_FILES),
        Example(_CONFIG, "a V100 has no bf16", path="train.yaml", files={**_FILES, "pyproject.toml": _GPU.format(gpu="V100")}),
        Example(_CONFIG.replace("fp16: true\nbf16: false", "fp16: false\nbf16: true"), "bf16 already",
                path="train.yaml", files={**_FILES, "pyproject.toml": _GPU.format(gpu="A100 80GB")}),
        Example(_CONFIG, "a GPTQ Int4 checkpoint: its kernels want fp16", path="train.yaml",
                files={"train.sh": "torchrun --nproc_per_node 2 train.py --config train.yaml "
                                   "--model_name_or_path Qwen/Qwen-7B-Chat-Int4\n",
                       "train.py": "print(1)\n", "pyproject.toml": _GPU.format(gpu="A100 80GB")}),
    ]
    INVALID = [
        Example(_CONFIG, "fp16 on an A100", path="train.yaml", line=2,
                files={**_FILES, "pyproject.toml": _GPU.format(gpu="A100 80GB")},
                fixed=_CONFIG.replace("fp16: true\nbf16: false", "fp16: false\nbf16: true")),
        Example("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: fp16\nnum_processes: 2\n",
                "accelerate's mixed_precision fp16 on an RTX 4090", path="acc.yaml", line=3,
                files={"train.sh": "accelerate launch --config_file acc.yaml train.py\n", "train.py": "print(1)\n",
                       "pyproject.toml": _GPU.format(gpu="RTX 4090")},
                fixed="compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n"),
    ]


_QUANTIZED_NAME = re.compile(r"int4|int8|gptq|awq|4bit|8bit", re.IGNORECASE)
# Which place decides when several state the precision: a DeepSpeed value that is not
# "auto", then flags, training configs, the script, and the accelerate config last
# (training/resolve.py `_precision`).
_SOURCE_ORDER = ("deepspeed config", "flags", "training config", "config module", "script", "argument defaults",
                 "accelerate config")


def _deciding_first(setup, place) -> tuple:
    source, _, chosen = place
    decided = {v.span for v in (setup.values.get("precision"), setup.values.get("mixed_precision")) if v is not None}
    order = _SOURCE_ORDER.index(source) if source in _SOURCE_ORDER else len(_SOURCE_ORDER)
    return (chosen.span not in decided, order)


def _fp16_choice(source: str, found: dict):
    """The value in one source that chooses fp16 mixed precision, or None."""
    value = found.get("mixed_precision")
    if value is not None and value.value == "fp16":
        return value
    value = found.get("fp16")
    if value is not None and value.value is True:
        return value
    return None
