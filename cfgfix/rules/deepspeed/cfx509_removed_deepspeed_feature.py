"""CFX509 removed-deepspeed-feature."""

from __future__ import annotations

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.analysis.deepspeed_config import zero_block
from cfgfix.core import Severity
from cfgfix.rules.base import Example, register
from cfgfix.rules.deepspeed.common import DS, DeepSpeedRule


@register
class RemovedDeepSpeedFeature(DeepSpeedRule):
    """## What it does
    Flags config blocks that DeepSpeed 0.19 removed (`amp`, `elasticity`, `nebula`,
    `compression_training`, `quantize_training`, `sparse_gradients`, `eigenvalue`,
    `sparse_attention`, `graph_harvesting`, `curriculum_learning`,
    `progressive_layer_drop`, and `mics_*` / `zeropp_loco_param` under
    `zero_optimization`) when the project uses DeepSpeed 0.19 or newer.

    ## Why is this bad?
    DeepSpeed 0.19 raises `DeepSpeedConfigError` for them ("NVIDIA Apex AMP integration has
    been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' instead."). Older
    versions accept them (see Versions).

    ## Example
    ```json
    {"amp": {"enabled": true, "opt_level": "O1"}, "train_batch_size": 8}
    ```
    with `deepspeed>=0.19` in requirements.txt.

    ## Use instead
    ```json
    {"bf16": {"enabled": true}, "train_batch_size": 8}
    ```

    ## Fix safety
    No fix: the replacement (bf16, fp16, torch_autocast, the new data-efficiency library)
    is a choice.

    ## Versions
    Speaks when the project's pinned or installed DeepSpeed is 0.19 or newer; silent on
    0.18 and older and on a pin that admits them (`deepspeed>=0.14`): 0.14.4 and 0.16.9
    read these blocks. Where the project pins nothing and no DeepSpeed is installed, it
    assumes the current release (0.19.8, what an install without a pin gets) and says so in
    the message: on it the run stops at start.

    ## References
    - facts.md C12; DeepSpeed 0.19 `runtime/config.py` (removed features)
    """

    code = "CFX509"
    name = "removed-deepspeed-feature"
    severity = Severity.ERROR
    triggers = DeepSpeedRule.triggers + ((b"amp", b"elasticity", b"nebula", b"compression_training",
                                          b"quantize_training", b"sparse_", b"eigenvalue", b"graph_harvesting",
                                          b"curriculum_learning", b"progressive_layer_drop", b"mics_",
                                          b"zeropp_loco_param"),)

    def check_config(self, ctx, root):
        deepspeed = ctx.versions.resolve("deepspeed")
        if deepspeed.at_least("0.19") is not True:
            return  # older, or a pin that admits older versions: these keys still work there
        hits = [(key, keys.REMOVED_IN_019[key.value]) for key, _ in root.entries if key.value in keys.REMOVED_IN_019]
        zero = zero_block(root)
        if zero is not None:
            hits += [(key, f"{key.value} (MiCS / ZeRO++ LoCo) has been removed") for key, _ in zero.entries
                     if isinstance(key.value, str)
                     and (key.value.startswith(keys.REMOVED_ZERO_PREFIXES) or key.value in keys.REMOVED_ZERO_KEYS)]
        for key, why in hits:
            yield self.finding(ctx.span(key), f"{key.value}: {why} in DeepSpeed 0.19, which raises "
                                              f"DeepSpeedConfigError for it; this project uses {deepspeed.describe()}")

    _REQ = {"requirements.txt": "deepspeed==0.19.8\n"}
    VALID = [
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "DeepSpeed 0.16: still supported",
                path=DS, files={"requirements.txt": "deepspeed==0.16.9\n"}),
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "a pin that admits 0.18 and older: silent",
                path=DS, files={"requirements.txt": "deepspeed>=0.14\n"}),
        Example('{"bf16": {"enabled": true}, "train_batch_size": 8}', "the replacement", path=DS, files=_REQ),
    ]
    INVALID = [
        Example('{\n  "amp": {"enabled": true},\n  "train_batch_size": 8\n}\n', "apex amp", path=DS, line=2,
                files=_REQ),
        Example('{\n  "amp": {"enabled": true},\n  "train_batch_size": 8\n}\n',
                "no DeepSpeed pinned or installed: the current release is assumed and the message says so",
                path=DS, line=2),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "mics_shard_size": 8\n  }\n}\n', "MiCS", path=DS, line=5, files=_REQ),
    ]
