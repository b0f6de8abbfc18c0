"""Values DeepSpeed refuses when it reads its config, as data: each check with the release
that began to make it, read from that release's code (git history of deepspeedai/DeepSpeed
and the 0.19.6/0.19.7/0.19.8 sdists; facts.md C12).

- `fp16.loss_scale` (`DeepSpeedFP16Config._validate_loss_scale`, #7889, 0.18.8): a number
  (a numeric string passes `float()`), not bool, finite, >= 0.
- `fp16.loss_scale_window`, `fp16.min_loss_scale` (`_reject_non_integer_scale_params` and
  `_validate_dynamic_loss_scale_params`, #8050, 0.19.3): an integer (not bool, not inf/nan,
  `int()` must accept it, and pydantic's int field refuses a fraction), and > 0 when fp16 is
  enabled with dynamic scaling (`loss_scale` 0).
- `gradient_allreduce_op` (`get_gradient_allreduce_op` and `DeepSpeedConfig._do_error_check`,
  #8232, 0.19.6; earlier releases do not read the key): "mean" or "sum" (any case), and
  "sum" neither under ZeRO-3 nor with ZenFlow or DeepCompile.
A value of "auto" is dropped by `DeepSpeedConfigModel.__init__` (the default is used), except
for `gradient_allreduce_op`, which is read as a plain scalar."""

from __future__ import annotations

import math

LOSS_SCALE_SINCE = "0.18.8"
SCALE_PARAMS_SINCE = "0.19.3"
ALLREDUCE_OP_SINCE = "0.19.6"
ALLREDUCE_OPS = ("mean", "sum")


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def loss_scale_problem(value) -> str | None:
    """Why DeepSpeed refuses this `fp16.loss_scale`, or None."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return "must be a number, not bool"
    number = _number(value)
    if number is None:
        return "must be a number"
    if not math.isfinite(number):
        return "must be a finite number (not inf/-inf/nan)"
    if number < 0:
        return "must be >= 0 (0 enables dynamic loss scaling)"
    return None


def scale_param_type_problem(value) -> str | None:
    """Why DeepSpeed refuses this `fp16.loss_scale_window` / `fp16.min_loss_scale` as a value."""
    if value == "auto":
        return None
    if isinstance(value, bool):
        return "must be an integer, not bool"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number (not inf/-inf/nan)"
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        return "must be an integer"
    if isinstance(value, float) and value != whole:
        return "must be an integer (pydantic refuses a fraction)"
    if isinstance(value, str) and _number(value) != whole:
        return "must be an integer"
    return None


def scale_param_value(value) -> int | None:
    """The integer DeepSpeed takes from a value `scale_param_type_problem` accepts."""
    if value == "auto" or isinstance(value, bool):
        return None
    try:
        return int(float(value)) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def allreduce_op_problem(value, stage: int | None, zenflow: bool, deepcompile: bool) -> str | None:
    """Why DeepSpeed refuses this `gradient_allreduce_op`, or None."""
    op = value.lower() if isinstance(value, str) else value
    if op not in ALLREDUCE_OPS:
        return f"must be one of {list(ALLREDUCE_OPS)} (got {value!r})"
    if op == "sum":
        if stage == 3:
            return "'sum' is not supported with ZeRO stage 3"
        if zenflow:
            return "'sum' is not supported with ZenFlow"
        if deepcompile:
            return "'sum' is not supported with DeepCompile"
    return None
