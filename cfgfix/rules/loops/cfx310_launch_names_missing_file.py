"""CFX310 launch-names-missing-file."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.core import Finding, Severity
from cfgfix.rules.base import Example, ProjectRule, register


@register
class LaunchNamesMissingFile(ProjectRule):
    """## What it does
    Flags a launch in a launch script (shell, Makefile) whose training script, accelerate
    config (`--config_file`), DeepSpeed config (`--deepspeed`, `--deepspeed_config`,
    `--deepspeed_config_file`) or training config (`--config x.yaml`) does not exist,
    looked up from every folder the launch may run from. When a file of that name, or of
    that stem, exists elsewhere in the project, the message names it: it may have moved
    (`configs/archive/ds_config_zero3.json`), or been committed under another suffix.

    ## Why is this bad?
    The run fails at start ("can't open file", "Expected a string path to an existing
    deepspeed config"), or worse, cfgfix and the reader see a setup that never runs: every
    check of that launch's DeepSpeed or accelerate settings is silent for want of the file.

    ## Example
    ```bash
    deepspeed train.py --deepspeed configs/ds_config_zero3.json
    ```
    with the file moved to `configs/archive/`.

    ## Use instead
    ```bash
    deepspeed train.py --deepspeed configs/archive/ds_config_zero3.json
    ```

    ## Fix safety
    No fix: where the file went, or whether it should be restored, is the author's call.

    ## References
    - Near misses, silent: a path with a variable (`$CONFIG_DIR/ds.json`), `~` or a glob; an
      absolute path (a mount of the machine that runs it); a file the script names before
      the launch (it may make, copy or download it); a launch after a `cd` to a computed
      folder, to an absolute one (a folder of the machine that runs it) or to one the
      repository does not hold; README blocks, notebooks and
      Dockerfiles.
    """

    code = "CFX310"
    name = "launch-names-missing-file"
    severity = Severity.ERROR
    kinds = ("shell", "makefile")

    def check_project(self, project) -> Iterable[Finding]:
        from cfgfix.project_references import missing_references

        for missing in missing_references(project):
            where = ""
            if missing.elsewhere:
                shown = ", ".join(f"`{p}`" for p in missing.elsewhere)
                where = f"; the project has {shown}: it may have moved"
            yield self.finding(
                missing.span,
                f"the {missing.what} `{missing.written}` does not exist (looked for from the launch script's "
                f"folder, the folders above it and the project root): the launch fails at start{where}")

    _TRAIN = "import torch\n"
    VALID = [
        Example("#!/bin/bash\ndeepspeed train.py --deepspeed ds.json\n", path="run.sh",
                files={"train.py": _TRAIN, "ds.json": '{"train_batch_size": 8}\n'}, why="both files exist"),
        Example("#!/bin/bash\ndeepspeed train.py --deepspeed \"$CONFIG_DIR/ds.json\"\n", path="run.sh",
                files={"train.py": _TRAIN}, why="a path with a variable"),
        Example("#!/bin/bash\ncat > ds.json <<'EOF'\n{\"train_batch_size\": 8}\nEOF\n"
                "deepspeed train.py --deepspeed ds.json\n", path="run.sh", files={"train.py": _TRAIN},
                why="the script writes the file before the launch"),
        Example("#!/bin/bash\ndeepspeed /workspace/train.py --deepspeed /mnt/configs/ds.json\n", path="run.sh",
                why="absolute paths: the machine that runs it"),
        Example("#!/bin/bash\ncd \"$WORKDIR\"\npython train.py --config cfg.yaml\n", path="run.sh",
                why="after a cd to a computed folder"),
        Example("#!/bin/bash\ncd examples/sft\npython train.py --config cfg.yaml\n", path="scripts/run.sh",
                files={"examples/sft/train.py": _TRAIN, "examples/sft/cfg.yaml": "lr: 1\n"},
                why="after a literal cd, from the project root"),
        Example("#!/bin/bash\npython -m pkg.train --config base\n", path="run.sh",
                why="a module launch, and a --config that is a name, not a file"),
        Example("#!/bin/bash\ncd ./playground/data/eval/MME\npython convert_answer_to_mme.py\n", path="eval.sh",
                why="after a cd into a folder the repository does not hold (data downloaded later)"),
        Example("#!/bin/bash\ncd /root/autodl-tmp\nexport PATH=/opt/bin:$PATH\nCUDA_VISIBLE_DEVICES=0 python scripts/eval.py\n",
                path="scripts/night.sh", files={"scripts_cloud/eval.py": _TRAIN},
                why="after a cd to an absolute folder: the machine's copy there is unknown"),
        Example("#!/bin/bash\ncd examples\npushd /mnt/work && deepspeed train.py --deepspeed ds.json\n",
                path="run.sh", files={"examples/other.py": _TRAIN},
                why="a pushd to an absolute folder after a literal cd, on the launch's own line"),
    ]
    INVALID = [
        Example("#!/bin/bash\ndeepspeed train.py \\\n    --deepspeed configs/ds_config_zero3.json\n", path="run.sh",
                files={"train.py": _TRAIN, "configs/archive/ds_config_zero3.json": '{"train_batch_size": 8}\n'},
                line=3, why="a DeepSpeed config that moved to an archive folder"),
        Example("#!/bin/bash\ntorchrun --nproc_per_node 2 train.py --deepspeed ds_config.json\n", path="train.sh",
                files={"train.py": _TRAIN, "ds_config.sh": '{"train_batch_size": 8}\n'},
                line=2, why="committed under another suffix"),
        Example("#!/bin/bash\ncd configs\ndeepspeed ../train.py --deepspeed ds_zero3.json\n", path="run.sh",
                files={"train.py": _TRAIN, "configs/ds_zero2.json": '{"train_batch_size": 8}\n'},
                line=3, why="after a literal cd into a folder the project holds, the config is not there"),
        Example("#!/bin/bash\naccelerate launch --config_file accelerate.yaml finetune.py\n", path="launch.sh",
                files={"accelerate.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"},
                line=2, why="the training script is missing"),
    ]
