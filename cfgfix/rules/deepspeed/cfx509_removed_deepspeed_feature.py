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
    Flags config blocks that DeepSpeed refuses at start because it removed their features,
    each from the release that began to refuse it: 0.19.7 refuses `nebula`,
    `compression_training`, `quantize_training`, `sparse_attention`, and `mics_shard_size` /
    `mics_hierarchical_params_gather` under `zero_optimization`; 0.19.8 also `amp`,
    `sparse_gradients`, `eigenvalue`, `elasticity`, `graph_harvesting`, `curriculum_learning`
    (top level), `progressive_layer_drop`, and `zeropp_loco_param` under `zero_optimization`.

    ## Why is this bad?
    DeepSpeed raises `DeepSpeedConfigError` for any of them, whatever the block holds
    ("NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or
    'torch_autocast' instead."): the run stops before its first step. 0.19.6 and older
    accept them (see Versions).

    ## Example
    ```json
    {"amp": {"enabled": true, "opt_level": "O1"}, "train_batch_size": 8}
    ```
    with `deepspeed==0.19.8` in requirements.txt.

    ## Use instead
    ```json
    {"bf16": {"enabled": true}, "train_batch_size": 8}
    ```

    ## Fix safety
    No fix: the replacement (bf16, fp16, torch_autocast, the data-efficiency library) is a
    choice.

    ## Versions
    Speaks for a key when the project's pinned or installed DeepSpeed is at least the
    release that refuses it; silent where the pin admits an older one (`deepspeed>=0.19`
    admits 0.19.0–0.19.6, which parse every one of these blocks; so do 0.14.4 and 0.16.9).
    Where the project pins nothing and no DeepSpeed is installed, it assumes the current
    release (0.19.8, what an install without a pin gets) and says so in the message,
    unless the project pins torch below 2.0 (0.19.3 and later require `torch>=2.0.0`).

    ## References
    - facts.md C12; `_reject_removed_config_keys` in `deepspeed/runtime/config.py` of the
      0.19.7 and 0.19.8 sdists (absent from 0.19.6), DeepSpeed issue #8489
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
        if deepspeed.at_least("0.19.7") is not True:
            return  # older, or a pin that admits older versions: these keys still work there
        hits = [(key, *keys.REMOVED_TOP_LEVEL[key.value]) for key, _ in root.entries
                if isinstance(key.value, str) and key.value in keys.REMOVED_TOP_LEVEL]
        zero = zero_block(root)
        if zero is not None:
            hits += [(key, *keys.REMOVED_ZERO[key.value]) for key, _ in zero.entries
                     if isinstance(key.value, str) and key.value in keys.REMOVED_ZERO]
        for key, why, since in hits:
            if deepspeed.at_least(since) is not True:
                continue  # refused only from `since` on, and the project may run an older release
            yield self.finding(ctx.span(key), f"{key.value}: {why}; DeepSpeed {since} and newer raise "
                                              f"DeepSpeedConfigError for it; this project uses {deepspeed.describe()}")

    _REQ = {"requirements.txt": "deepspeed==0.19.8\n"}
    VALID = [
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "DeepSpeed 0.16: still supported",
                path=DS, files={"requirements.txt": "deepspeed==0.16.9\n"}),
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "a pin that admits 0.18 and older: silent",
                path=DS, files={"requirements.txt": "deepspeed>=0.14\n"}),
        Example('{"bf16": {"enabled": true}, "train_batch_size": 8}', "the replacement", path=DS, files=_REQ),
        Example('{"eigenvalue": {"enabled": true}, "quantize_training": {"enabled": false}}',
                "0.19.6 parses both (its own tests do)", path=DS, files={"requirements.txt": "deepspeed==0.19.6\n"}),
        Example('{"amp": {"enabled": true}, "train_batch_size": 8}', "amp is refused from 0.19.8 only",
                path=DS, files={"requirements.txt": "deepspeed==0.19.7\n"}),
        Example('{"nebula": {"enabled": false}}', "a range that admits 0.19.6", path=DS,
                files={"requirements.txt": "deepspeed>=0.19,<0.20\n"}),
        Example('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 8}}',
                "MiCS on 0.19.6", path=DS, files={"requirements.txt": "deepspeed==0.19.6\n"}),
    ]
    INVALID = [
        Example('{\n  "amp": {"enabled": true},\n  "train_batch_size": 8\n}\n', "apex amp", path=DS, line=2,
                files=_REQ),
        Example('{\n  "amp": {"enabled": true},\n  "train_batch_size": 8\n}\n',
                "no DeepSpeed pinned or installed: the current release is assumed and the message says so",
                path=DS, line=2),
        Example('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 3,\n'
                '    "mics_shard_size": 8\n  }\n}\n', "MiCS", path=DS, line=5, files=_REQ),
        Example('{\n  "amp": {"enabled": true},\n  "nebula": {"enabled": false},\n  "train_batch_size": 8\n}\n',
                "0.19.7 refuses nebula (even disabled), not yet amp", path=DS, line=3,
                files={"requirements.txt": "deepspeed==0.19.7\n"}),
        Example('{\n  "zero_optimization": {"stage": 3, "zeropp_loco_param": {"err_beta": 0.8}}\n}\n',
                "LoCo under ZeRO on 0.19.8", path=DS, line=2, files=_REQ),
    ]
