"""What transformers does by default, per model family and transformers version, where it
changes the memory: the attention kernel a load gets without `attn_implementation=`, and
whether T5's output head is tied to its embedding.

Every entry is read from a released wheel's source (pip download transformers==X), not
inferred: transformers >= 4.36 picks SDPA for a class with `_supports_sdpa = True` (torch
>= 2.1.1) and eager attention otherwise (modeling_utils.py `_autoset_attn_implementation` /
`_check_and_enable_sdpa` in 4.36; `get_correct_attn_implementation`, "Sdpa is the default",
in 5.x); 4.35 has no SDPA path at all. Between two checked versions that disagree the default
is unknown (None), and the estimator keeps its cautious reading. bench/README.md,
"transformers' defaults by release", lists the same table with the file each value comes from.
"""

from __future__ import annotations

import re
from itertools import pairwise

# (checked version, default kernel) per family, oldest first: "sdpa" or "eager".
# Source per family: transformers/models/<family>/modeling_<family>.py of each wheel.
ATTENTION_DEFAULTS: dict[str, tuple[tuple[str, str], ...]] = {
    # `_supports_sdpa = True` from 4.36.0 (absent in 4.35.2)
    "llama": (("4.35.2", "eager"), ("4.36.0", "sdpa"), ("5.24.0", "sdpa")),
    # absent in 4.36.0, True in 4.41.0
    "mistral": (("4.36.0", "eager"), ("4.41.0", "sdpa"), ("5.24.0", "sdpa")),
    "qwen2": (("4.41.0", "sdpa"), ("5.24.0", "sdpa")),
    "qwen3": (("5.0.0", "sdpa"), ("5.24.0", "sdpa")),
    "gemma": (("4.41.0", "sdpa"), ("5.24.0", "sdpa")),
    # absent in 4.36.0, True in 4.41.0
    "phi": (("4.36.0", "eager"), ("4.41.0", "sdpa"), ("5.24.0", "sdpa")),
    "bert": (("4.36.0", "eager"), ("4.41.0", "sdpa"), ("5.24.0", "sdpa")),
    # absent in 4.41.0, True from 4.42.0
    "gpt2": (("4.41.0", "eager"), ("4.42.0", "sdpa"), ("5.24.0", "sdpa")),
    "gpt_neox": (("4.41.0", "eager"), ("4.42.0", "sdpa"), ("5.24.0", "sdpa")),
    # `_supports_sdpa = False` in 4.41.0 and 4.42.0, True in 4.45.0
    "phi3": (("4.42.0", "eager"), ("4.45.0", "sdpa"), ("5.24.0", "sdpa")),
    # 4.42.0: SDPA (a warning recommends eager for training); 4.45.0: Gemma2PreTrainedModel.
    # _check_and_enable_sdpa "DISABLE[s] torch SDPA by default"; 4.48.0 .. 5.20.0: SDPA;
    # 5.21.0 on: `_supports_sdpa = False  # sdpa does not support softcapping`
    "gemma2": (("4.42.0", "sdpa"), ("4.45.0", "eager"), ("4.48.0", "sdpa"), ("5.20.0", "sdpa"),
               ("5.21.0", "eager"), ("5.24.0", "eager")),
    # T5Attention computes its own scores through 5.14.0; `_supports_sdpa = True` from 5.17.0
    "t5": (("5.14.0", "eager"), ("5.17.0", "sdpa"), ("5.24.0", "sdpa")),
    "mt5": (("5.14.0", "eager"), ("5.17.0", "sdpa"), ("5.24.0", "sdpa")),
}
FIRST_SDPA_RELEASE = "4.36.0"  # 4.35.2 has no `_supports_sdpa` anywhere: every model runs eager

# T5Config forces `tie_word_embeddings = True` from 5.0.0 (configuration_t5.py: "we tie weights
# always and force it to be `True`"; the old flag only says whether to scale the decoder
# output, `scale_decoder_outputs`); 4.57.1 ties only when the config says so, and T5 v1.1 /
# FLAN-T5 configs say `false`: an untied lm_head.
T5_ALWAYS_TIED_FROM = "5.0.0"

_PLAIN = re.compile(r"(\d+(?:\.\d+){0,3})")


def release(version: str) -> tuple[int, ...] | None:
    match = _PLAIN.fullmatch(version.strip()) if isinstance(version, str) else None
    return tuple(int(x) for x in match.group(1).split(".")) if match else None


def _cmp(a: str, b: str) -> int:
    ra, rb = release(a), release(b)
    width = max(len(ra), len(rb))
    ra, rb = ra + (0,) * (width - len(ra)), rb + (0,) * (width - len(rb))
    return (ra > rb) - (ra < rb)


def default_attention(family: str, version: str | None) -> str | None:
    """"sdpa" or "eager" for a load of `family` without attn_implementation on transformers
    `version` (an exact release), or None when no checked wheel settles it."""
    if version is None or release(version) is None:
        return None
    if _cmp(version, FIRST_SDPA_RELEASE) < 0:
        return "eager"
    points = ATTENTION_DEFAULTS.get(family)
    if not points:
        return None
    if _cmp(version, points[0][0]) < 0:
        return points[0][1] if points[0][1] == "eager" else None
    if _cmp(version, points[-1][0]) >= 0:
        return points[-1][1]
    for (lo, lo_kernel), (hi, hi_kernel) in pairwise(points):
        if _cmp(version, lo) == 0:
            return lo_kernel
        if _cmp(lo, version) < 0 < _cmp(hi, version):
            return lo_kernel if lo_kernel == hi_kernel else None
        if _cmp(version, hi) == 0:
            return hi_kernel
    return None


def t5_head_tied(version: str | None) -> bool | None:
    """True when this transformers ties T5's lm_head whatever the config says; False when it
    follows the config; None when unknown."""
    if version is None or release(version) is None:
        return None
    return _cmp(version, T5_ALWAYS_TIED_FROM) >= 0


def exact_version(specifier: str) -> str | None:
    """`==4.46.3` (a pin or the installed version) -> "4.46.3"; a range gives None."""
    match = re.fullmatch(r"\s*===?\s*(\d+(?:\.\d+){0,3})\s*", specifier or "")
    return match.group(1) if match else None
