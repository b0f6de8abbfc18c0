"""What the CFX4xx rules share: the single-file accelerate rule base, the `deepspeed_config`
block, and the file names and header their examples use."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.core import Finding
from cfgfix.rules.base import Rule

ACC = "accelerate.yaml"
HEAD = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"


class AccelerateRule(Rule):
    kinds = ("yaml", "json")
    triggers = ((b"distributed_type", b"compute_environment"),)

    def check(self, ctx) -> Iterable[Finding]:
        if "accelerate" not in ctx.kinds:
            return ()
        return self.check_config(ctx, ctx.root)

    def check_config(self, ctx, root) -> Iterable[Finding]:  # pragma: no cover - interface
        raise NotImplementedError


def ds_block(root):
    block = root.get("deepspeed_config")
    return block if block is not None and block.kind == "mapping" else None
