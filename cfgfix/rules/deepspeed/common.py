"""What the single-file CFX5xx rules share: their base class (a recognised DeepSpeed
config, its root) and the file name of their examples."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.core import Finding
from cfgfix.rules.base import Rule

DS = "ds_config.json"


class DeepSpeedRule(Rule):
    kinds = ("json", "yaml")
    triggers = ((b"zero_optimi", b"train_micro_batch_size_per_gpu", b"train_batch_size",
                 b"gradient_accumulation_steps"),)

    def check(self, ctx) -> Iterable[Finding]:
        if "deepspeed" not in ctx.kinds:
            return ()
        return self.check_config(ctx, ctx.root)

    def check_config(self, ctx, root) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError
