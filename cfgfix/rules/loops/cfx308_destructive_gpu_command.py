"""CFX308 destructive-gpu-command."""

from __future__ import annotations

import re
from collections.abc import Iterable

from cfgfix.analysis.shell_helpers import unwrap as _unwrap
from cfgfix.core import Finding, Related, Severity
from cfgfix.records import replace
from cfgfix.rules.base import Example, Rule, register

# pkill/killall options that take a value, and those that narrow the match to one run.
_PKILL_VALUE = {"-u", "-U", "-g", "-G", "-s", "-t", "--signal", "--ns", "--nslist", "--euid", "--uid",
                "--pgroup", "--group", "--session", "--terminal", "-F", "--pidfile", "-P", "--parent"}
_PKILL_NARROWING = {"-P", "--parent", "-F", "--pidfile", "-s", "--session", "-g", "--pgroup"}
_KILLALL_VALUE = {"-s", "--signal", "-u", "--user", "-o", "--older-than", "-y", "--younger-than", "-n", "--ns"}
# A pattern that matches every Python process: `python`, `python3`, `^python3.11$`, `[p]ython`.
_PYTHON_PATTERN = re.compile(r"\^?(?:\[p\]|p)ython[0-9.]*(?:\.\*)?\$?")
# Inside `$(...)` or a pipeline: a list of every GPU process or every Python process.
_MASS_SOURCE = re.compile(
    r"nvidia-smi|/dev/nvidia|\b(?:pgrep|pidof|grep)\b(?:\s+-[-\w]+)*\s+['\"]?(?:\^?(?:\[p\]|p)ython[0-9.]*)['\"]?"
    r"(?=\s*(?:\||\)|`|$))"
)
_GREP = re.compile(r"\bgrep\b((?:\s+-[-\w]+)*)\s+(['\"]?)([^\s|)'\"`]+)\2")
_PIPE_BETWEEN = re.compile(r"(?:\s|\\\r?\n)*\|&?(?:\s|\\\r?\n)*")


@register
class DestructiveGpuCommand(Rule):
    """## What it does
    Flags commands in a training launch script that kill or reset far more than the
    previous run. That is `pkill -9 -f python`, `killall python3`, `kill -9` of a list of
    every GPU or Python process (`$(nvidia-smi ...)`, or piped into `xargs kill`),
    `fuser -k /dev/nvidia*`, `nvidia-smi --gpu-reset` / `-r`, and `reboot`. A script counts
    as a launch script by what it runs, not by its name: it starts training (`torchrun`,
    `accelerate launch`, `deepspeed`, `python -m torch.distributed.run`, `python train.py`,
    `srun python ...`) on a command line, inside the script string of `bash -c '...'` /
    `sh -c "..."` (also behind `srun`, `timeout`, `nohup`; a single-quoted script may splice
    in outer variables, `'... --out '"$OUT"' ...'`), or in a heredoc handed to `sbatch` or to a shell (`srun bash <<EOF`).
    A script named on the command line (`cfgfix check OPTIMIZE_MEMORY.sh`, or a file a
    pre-commit hook passes) is checked whatever it runs: its user asked about that file. One
    found by walking a folder that starts no training (a `cleanup.sh` kept as a tool) is not.
    Comments, `echo`/`printf` text and shell blocks in a README are not commands and are
    never flagged. What a launch script runs elsewhere counts as its own lines: a project
    script it runs (`bash kill_all.sh`, `sh`, `source`, `.`, `./x.sh`, also in a function;
    up to three deep; a path with a variable is not guessed), a `trap` action, and the
    command of `ssh host "..."`; the finding sits on the line that runs it.

    ## Why is this bad?
    They do not free memory that anything still needs: a process's GPU memory is released
    when that process exits, so "clearing the GPU" before a run is either unnecessary or
    kills something that was running on purpose. `pkill -f python` matches every Python
    process this user can signal: other experiments, notebooks, editors' language servers,
    the ranks of a run sharing the node. `nvidia-smi --gpu-reset` needs root, is meant for
    recovering a GPU after ECC errors, and takes down every job on that GPU. As advice
    against OOMs ("just `pkill -9 python` and reset the GPU") both are wrong.

    ## Example
    ```bash
    # kill whatever is left of the last run so the GPUs are free
    pkill -9 -f python
    torchrun --nproc_per_node 2 train.py
    ```

    ## Use instead
    ```bash
    # stop only the previous run of this script
    if [ -f train.pid ]; then kill "$(cat train.pid)" 2>/dev/null || true; fi
    torchrun --nproc_per_node 2 train.py &
    echo $! > train.pid
    wait
    ```

    ## Fix safety
    No fix: which processes the script really means to stop is the author's decision.

    ## References
    - facts C15(h): the PyTorch FAQ ("My GPU memory isn't freed properly") says to find the
      leftover processes (`ps -elf | grep python`) and `kill -9 [pid]` those, not all of
      them; `nvidia-smi -h`: "-r --gpu-reset ... should be used with caution".
    """

    code = "CFX308"
    name = "destructive-gpu-command"
    severity = Severity.WARNING
    fix_availability = "none"
    kinds = ("shell", "makefile", "dockerfile")
    # Few, cheap tokens: the engine tests them on every file (`kill` covers pkill, killall
    # and `xargs kill`; every `fuser -k` of a GPU names `/dev/nvidia`).
    # `.sh`, `source`, `trap` and `ssh` let a script that runs a helper in (ctx.inner).
    triggers = ((b"kill", b"nvidia-smi", b"reboot", b"/dev/nvidia", b".sh", b"source", b"trap", b"ssh"),)

    VALID = [
        Example(
            "#!/bin/bash\npkill -9 -f python\n",
            path="cleanup.sh",
            why="a script that starts no training and is not named like a launch script",
        ),
        Example(
            "#!/bin/bash\nsudo killall -9 python3 || true\necho 'now run: torchrun --nproc_per_node 2 train.py'\n"
            "# srun bash -c 'python train.py'\n",
            path="train_lora.sh",
            why="named like a training script, but it starts none: the launch is only echoed and commented",
        ),
        Example(
            "#!/bin/bash\nnvidia-smi --gpu-reset\nsrun bash -c 'echo python train.py; hostname'\n",
            path="reset_nodes.sh",
            why="the `srun bash -c` script only echoes a training command",
        ),
        Example(
            "#!/bin/bash\npkill -9 -f python\nbash -c \"$CMD\"\n",
            path="run.sh",
            why="the inline script is a variable whose text is not in the file",
        ),
        Example(
            "#!/bin/bash\n"
            "# kill leftovers first: pkill -9 -f python\n"
            "echo \"GPUs busy? run: pkill -9 -f python; nvidia-smi --gpu-reset\"\n"
            "printf 'or: killall python3\\n'\n"
            "torchrun --nproc_per_node 2 train.py\n",
            path="start.sh",
            why="a comment, an echo string and a printf string",
        ),
        Example(
            "#!/bin/bash\n"
            "pkill -f \"python train.py --run-name $RUN\"\n"
            "[ -f train.pid ] && kill \"$(cat train.pid)\"\n"
            "pkill -P $$ python\n"
            "kill $(pgrep -f \"python train.py\")\n"
            "torchrun --nproc_per_node 2 train.py\n",
            path="start.sh",
            why="kills narrowed to this run (its command line, its pid file, its children)",
        ),
        Example(
            "#!/bin/bash\n"
            "nvidia-smi\n"
            "nvidia-smi --query-gpu=memory.used --format=csv\n"
            "nvidia-smi -rac\n"
            "accelerate launch train.py\n",
            path="train.sh",
            why="nvidia-smi queries (and resetting clocks) are not a GPU reset",
        ),
        Example(
            "#!/bin/bash\n"
            "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader"
            " | grep my_server | cut -d, -f1 | xargs -r kill\n"
            "python train.py --config configs/a.yaml\n",
            path="start.sh",
            why="a GPU process list narrowed by `grep` to one program",
        ),
        Example(
            "#!/bin/bash\nbash stop_previous.sh\ntrap 'echo done; rm -f train.pid' EXIT\nssh node2\n"
            "torchrun --nproc_per_node 2 train.py\n",
            path="run.sh",
            files={"stop_previous.sh": "#!/bin/bash\n[ -f train.pid ] && kill \"$(cat train.pid)\"\n"},
            why="a helper, a trap and an ssh login that kill nothing beyond this run",
        ),
        Example(
            "#!/bin/bash\nbash \"$SCRIPTS/kill_all.sh\"\nbash missing.sh\ntorchrun --nproc_per_node 2 train.py\n",
            path="run.sh",
            files={"kill_all.sh": "pkill -9 -f python\n"},
            why="a helper path with a variable is not guessed; a helper that is not there is not read",
        ),
    ]
    INVALID = [
        Example(
            "#!/bin/bash\ncd \"$(dirname \"$0\")\"\n\n"
            "# kill whatever is left of the last run so the GPUs are free\n"
            "pkill -9 -f python\nsleep 5\n\n"
            "torchrun --nproc_per_node 2 train.py\n",
            path="start.sh",
            why="the classic, before a torchrun launch",
            line=5,
        ),
        Example(
            "#!/bin/bash\nsudo killall -9 python3 || true\npython -m torch.distributed.run --nproc_per_node 2 train.py\n",
            path="setup_env.sh",
            why="`killall` behind `sudo`, in a script not named like a launch script that starts training",
            line=2,
        ),
        Example(
            "#!/usr/bin/env bash\n#SBATCH -N 1\ncleanup() {\n    nvidia-smi --gpu-reset || true\n}\n"
            "trap cleanup EXIT\nOUT=./out\n"
            "timeout 10800 srun bash -c '  # 3 hours\n  export RANK=$SLURM_PROCID\n"
            "  echo \"out = '\"$OUT\"'\"\n"
            "  python src/finetune.py \\\n        --output_dir '\"$OUT\"' \\\n        --bf16 true\n'\n",
            path="chexinstruct_gemma3_onenode.sh",
            why="training starts inside `srun bash -c '...'` with outer variables spliced in (SLURM)",
            line=4,
        ),
        Example(
            "#!/bin/bash\nkillall python\nsh -c \"torchrun --nproc_per_node 4 train.py --out $OUT\"\n",
            path="job.sh",
            why="training inside `sh -c \"...\"`",
            line=2,
        ),
        Example(
            "#!/bin/bash\n"
            "kill -9 $(nvidia-smi --query-compute-apps=pid --format=csv,noheader) 2>/dev/null\n"
            "accelerate launch --num_processes 4 train.py\n",
            path="launch.sh",
            why="a kill of every process on the GPUs",
            line=2,
        ),
        Example(
            "train:\n"
            "\tps aux | grep python | grep -v grep | awk '{print $$2}' | xargs kill -9\n"
            "\tdeepspeed --num_gpus 8 train.py --deepspeed ds.json\n",
            path="Makefile",
            why="a pipeline into `xargs kill` in a Makefile recipe",
            line=2,
        ),
        Example(
            "#!/bin/bash\nsudo nvidia-smi --gpu-reset -i 0\npython train.py --config cfg.yaml\n",
            path="run.sh",
            why="a GPU reset",
            line=2,
        ),
        Example(
            "#!/bin/bash\nif ! python -c 'import torch; torch.zeros(1).cuda()'; then\n"
            "    sudo reboot\nfi\ntorchrun --nproc_per_node 8 train.py\n",
            path="start.sh",
            why="a reboot inside a branch",
            line=3,
        ),
        Example(
            "FROM pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime\n"
            "CMD fuser -k /dev/nvidia* ; torchrun --nproc_per_node 8 train.py\n",
            path="Dockerfile",
            why="`fuser -k` on the GPU device files, in a Dockerfile `CMD`",
            line=2,
        ),
        Example(
            "#!/bin/bash\nbash scripts/kill_all.sh\ntorchrun --nproc_per_node 2 train.py\n",
            path="run.sh",
            files={"scripts/kill_all.sh": "#!/bin/bash\npkill -f python\n"},
            why="a helper script the launch runs",
            line=2,
        ),
        Example(
            "#!/bin/bash\nfree_gpus() {\n  source ./free_gpu.sh\n}\nfree_gpus\ndeepspeed train.py\n",
            path="launch.sh",
            files={"free_gpu.sh": "nvidia-smi --gpu-reset\n"},
            why="a helper sourced in a function",
            line=3,
        ),
        Example(
            "#!/bin/bash\ntrap 'pkill -9 -f python' EXIT\naccelerate launch train.py\n",
            path="run.sh",
            why="a trap action",
            line=2,
        ),
        Example(
            "#!/bin/bash\nssh worker1 \"pkill -9 -f python\"\ntorchrun --nnodes 2 --nproc_per_node 8 train.py\n",
            path="multinode.sh",
            why="a remote command over ssh",
            line=2,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        if not _starts_training(ctx):
            return
        commands = ctx.document.commands
        for index, command in enumerate(commands):
            argv = _unwrap([w.text for w in command.words])
            if not argv:
                continue
            message = _destructive(argv, commands, index, ctx.source.text)
            if message:
                yield self.finding(command.span, message)
        # what the script runs elsewhere: a helper script, a trap action, an ssh command
        for inner in ctx.inner:
            inner_commands = inner.document.commands
            for index, command in enumerate(inner_commands):
                argv = _unwrap([w.text for w in command.words])
                message = _destructive(argv, inner_commands, index, inner.document.source.text) if argv else None
                if not message:
                    continue
                if inner.how == "script":
                    where = f"runs {inner.label}, whose line {command.span.line} does this: "
                    related = [Related(replace(command.span, path=inner.label), f"in {inner.label}")]
                else:
                    where = f"{inner.label}: "
                    related = []
                yield self.finding(inner.command.span, where + message, related=related)


def _starts_training(ctx) -> bool:
    """The file runs a training launch itself, wherever it stands: a command line, an
    inline `bash -c '...'` / `srun bash -c '...'` script, a heredoc handed to sbatch. Its
    name says nothing: `cleanup.sh` may launch a run, `train_utils.sh` may only clean up.
    A script named on the command line (`cfgfix check OPTIMIZE_MEMORY.sh`, the files a
    pre-commit hook passes) is checked whatever it runs: its user asked about it."""
    return ctx.named or bool(ctx.launches)


def _program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _patterns(args: list[str], takes_value: set[str]) -> tuple[list[str], set[str]]:
    """(non-option arguments, options) of a pkill/killall command line."""
    patterns, options = [], set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            name = arg.split("=", 1)[0]
            options.add(name)
            i += 2 if name in takes_value and "=" not in arg else 1
            continue
        patterns.append(arg)
        i += 1
    return patterns, options


def _destructive(argv: list[str], commands, index: int, text: str) -> str | None:
    program, args = _program(argv[0]), argv[1:]
    shown = " ".join(argv)
    if program in ("pkill", "killall"):
        patterns, options = _patterns(args, _PKILL_VALUE if program == "pkill" else _KILLALL_VALUE)
        if options & _PKILL_NARROWING or not any(_PYTHON_PATTERN.fullmatch(p) for p in patterns):
            return None
        return (
            f"`{shown}` kills every Python process this user can signal on the machine, not just the "
            "last run: other experiments, notebooks, language servers, the ranks of another run on "
            "this node. It frees no memory a live process still needs (a process's GPU memory is "
            "released when it exits). Stop only the previous run: save its PID (`echo $! > train.pid`) "
            "or process group and kill that."
        )
    if program == "nvidia-smi" and any(a in ("-r", "--gpu-reset") for a in args):
        return (
            f"`{shown}` resets the GPU: it needs root, is meant for recovering from ECC errors, is not "
            "guaranteed to work, and takes down every job on that GPU. It is never a memory "
            "optimisation: a process's GPU memory is released when the process exits."
        )
    if program == "reboot" or (program == "systemctl" and "reboot" in args):
        return (
            f"`{shown}` in a training launch script reboots the machine under every other user and "
            "job on it; leftover GPU memory is freed by ending the processes that hold it."
        )
    if program == "kill" and any(("$(" in a or "`" in a) and _mass_source(a) for a in args):
        return _mass_message(shown)
    if program == "fuser" and any(a.startswith("-") and not a.startswith("--") and "k" in a for a in args) \
            and any(a.startswith("/dev/nvidia") for a in args):
        return _mass_message(shown)
    if program == "xargs" and any(_program(a) == "kill" for a in args):
        source = _pipeline_text(commands, index, text)
        if source and _mass_source(source):
            return _mass_message(source.rstrip(" |\\\n") + " | " + shown)
    return None


def _mass_source(text: str) -> bool:
    """A command text that lists every GPU process or every Python process (and is not
    narrowed by a `grep` for something more specific)."""
    if not _MASS_SOURCE.search(text):
        return False
    for options, _, pattern in _GREP.findall(text):
        if "-v" in options.split() or "--invert-match" in options.split():
            continue
        if not _PYTHON_PATTERN.fullmatch(pattern):
            return False
    return True


def _pipeline_text(commands, index: int, text: str) -> str:
    """The source of the commands piped into `commands[index]`."""
    first = index
    while first > 0:
        previous, current = commands[first - 1], commands[first]
        if not _PIPE_BETWEEN.fullmatch(text[previous.span.end:current.span.start]):
            break
        first -= 1
    if first == index:
        return ""
    return text[commands[first].span.start:commands[index].span.start]


def _mass_message(shown: str) -> str:
    return (
        f"`{shown}` kills every process on the GPUs (or every Python process), not just the last run: "
        "other users' jobs and other experiments go with it. It frees no memory that a live process "
        "still needs; GPU memory is released when its process exits. Kill the PIDs of the previous run "
        "only (save them in a pid file)."
    )
