"""CFX510 duplicate-key."""

from __future__ import annotations

from cfgfix.core import Related, Severity
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class DuplicateKey(DeepSpeedRule):
    """## What it does
    Flags a key written twice in one object of a DeepSpeed config.

    ## Why is this bad?
    DeepSpeed refuses the file ("Duplicate keys in DeepSpeed config: [...]"), and other
    readers (the HF Trainer, `json.load`, PyYAML) keep the last value silently, so the
    author's tools and DeepSpeed disagree about what the config says.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "train_micro_batch_size_per_gpu": 8}
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 8}
    ```

    ## Fix safety
    No fix: which of the two values was meant is the author's call.

    ## References
    - facts.md C12
    """

    code = "CFX510"
    name = "duplicate-key"
    severity = Severity.ERROR

    def check_config(self, ctx, root):
        for node in root.walk():
            if node.kind != "mapping":
                continue
            for name, nodes in node.duplicates():
                for again in nodes[1:]:
                    yield self.finding(
                        ctx.span(again),
                        f"{name} is set twice in this object (first on line "
                        f"{ctx.span(nodes[0]).line}): DeepSpeed refuses duplicate keys, other readers keep "
                        f"the last one",
                        related=[Related(ctx.span(nodes[0]), "first set here")],
                    )

    VALID = [
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 2}, "fp16": {"enabled": true}}',
                "the same key name in different objects is fine", path=DS),
    ]
    INVALID = [
        Example('{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2},\n'
                '  "train_micro_batch_size_per_gpu": 8\n}\n', "top level", path=DS, line=4),
        Example('{\n  // DeepSpeed reads this file with hjson\n  "zero_optimization": {"stage": 2},\n'
                '  "train_batch_size": 24,\n  "train_batch_size": 24,\n}\n',
                "a comment and a trailing comma, as DeepSpeed's own loader reads them (its test_config_duplicate_key)",
                path=DS, line=5),
    ]
