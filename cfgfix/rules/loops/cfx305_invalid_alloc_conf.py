"""CFX305 invalid-alloc-conf."""

from __future__ import annotations

from collections.abc import Iterable

from cfgfix.analysis.alloc_conf import VARIABLES, Problem, check, literal_base, python_settings
from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.loops.common import VARIABLE_TRIGGERS


@register
class InvalidAllocConf(Rule):
    """## What it does
    Flags allocator settings that torch rejects or silently ignores, wherever
    `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` is set. It reads Python
    (`os.environ[...] =`, `setdefault`, `update`, `os.putenv`), shell `export` and
    `VAR=value cmd`, Makefile recipes and exports, Dockerfile `ENV` and `.env` files.
    Errors: an unknown key (`expandeable_segments`), a boolean that is not exactly
    `True`/`False` (`expandable_segments:true`), `max_split_size_mb` below 20,
    `garbage_collection_threshold` outside (0, 1), `roundup_power2_divisions` that is not a
    power of two (also inside its `[256:1,512:2,>:1]` list form), an unknown `backend`, a
    value that is not a number.
    Warnings: `max_split_size_mb` together with `expandable_segments:True`; options that
    `backend:cudaMallocAsync` ignores; a number followed by other text
    (`max_split_size_mb:128MB`, which torch reads as 128, dropping the rest); both variable
    names set to different values.

    ## Why is this bad?
    torch parses the string at the first CUDA allocation, on the GPU machine, and raises
    there: `expandable_segments:true` fails with `Expected 'True' or 'False'`. A CPU-only
    build accepts unknown keys silently, so CI never sees a typo. The warnings are settings
    that run but do not do what the forum post promised: with expandable segments the
    allocator ignores `max_split_size_mb` when splitting, and the pair has crashed the
    allocator (pytorch/pytorch#119452); `cudaMallocAsync` ignores the native allocator's
    options. With both names set, which one wins has changed between torch releases.

    ## Example
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true,max_split_size_mb:128
    ```

    ## Use instead
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ```

    ## Fix safety
    Safe, and offered only where the intent is certain: a boolean in the wrong case
    (`true` -> `True`), a key with a single close match (`expandeable_segments` ->
    `expandable_segments`), `key=value` written for `key:value`, and a backend in the wrong
    case. These strings would raise at the first CUDA allocation, so no run that worked
    before changes. Everything else has no fix. An f-string is read in its literal parts
    and the constants its `{name}`s are bound to; an option with a part computed at run
    time (`max_split_size_mb:{mb}`) is not judged alone, but still counts beside the others
    (with `expandable_segments:True`). Values cfgfix cannot read (a variable,
    `${VAR:-...}`) are not checked. A heredoc body counts as a script when it
    goes to `sbatch`/`qsub`/a shell, or is written to a file the script then runs
    (`cat > "$JOB" <<EOF` ... `sbatch "$JOB"`). An unknown key with no close match is
    reported only in `PYTORCH_CUDA_ALLOC_CONF` (other accelerators share
    `PYTORCH_ALLOC_CONF`) and only when the project's torch is not newer than the key
    table (torch 2.13).

    ## Versions
    Wrong-case booleans, `key=value`, values out of range and a wrong backend are errors on
    every torch version the facts cover. Unknown keys are checked against torch 2.13's key
    table, so they are reported unless the project's torch is known to be 2.14 or newer (a
    newer torch may have added the key). Where nothing says which torch, the current
    release (2.13, the table's own) is assumed, and unknown keys are reported.

    ## References
    - facts A8, D3: torch 2.13 `c10/core/AllocatorConfig.h` (`ConfigTokenizer::toBool`
      accepts only `True`/`False`), `AllocatorConfig.cpp` (`max_split_size_mb` >= 20,
      `garbage_collection_threshold` in (0, 1), power-of-two roundups),
      `c10/cuda/CUDAAllocatorConfig.cpp` (CUDA keys, `Unrecognized key`).
    - pytorch/pytorch#119452 (`expandable_segments` with `max_split_size_mb`);
      pytorch/pytorch#183387 (`PYTORCH_ALLOC_CONF` ignored on CUDA in 2.9.1).
    """

    code = "CFX305"
    name = "invalid-alloc-conf"
    severity = Severity.ERROR
    fix_availability = "sometimes"
    kinds = ("python", "shell", "dockerfile", "env", "makefile")
    triggers = (VARIABLE_TRIGGERS,)

    VALID = [
        Example(
            "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = (\n"
            "    'garbage_collection_threshold:0.6,max_split_size_mb:512,'\n"
            "    'roundup_power2_divisions:[256:1,512:2,>:4]'\n)\n",
            why="a valid string, with the list form of `roundup_power2_divisions`",
        ),
        Example(
            "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = f'expandable_segments:{flag}'\n"
            "os.environ['PYTORCH_ALLOC_CONF'] = args.alloc_conf\n",
            why="values from an f-string or a variable cfgfix cannot resolve",
        ),
        Example(
            "import os\nmb = 512\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = f'max_split_size_mb:{mb},garbage_collection_threshold:{t}'\n",
            why="an f-string whose parts are valid, or computed when it runs",
        ),
        Example(
            "#!/bin/bash\n"
            "export PYTORCH_CUDA_ALLOC_CONF=\"${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:true}\"\n"
            "# export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\n"
            "echo \"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\"\n",
            path="train.sh",
            why="an expansion, a comment and an echo string",
        ),
        Example(
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
            "export PYTORCH_ALLOC_CONF=expandable_segments:True\n",
            path="env.sh",
            why="both names set to the same value (the usual way to cover old and new torch)",
        ),
        Example(
            "ENV PYTORCH_ALLOC_CONF=xpu_specific_option:1\n",
            path="Dockerfile",
            why="an unknown key with no close match in the variable other accelerators share",
        ),
        Example(
            "export PYTORCH_CUDA_ALLOC_CONF=brand_new_option:True\n",
            path="run.sh",
            files={"requirements.txt": "torch>=2.15\n"},
            why="an unknown key on a torch newer than cfgfix's key table",
        ),
        Example(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False,max_split_size_mb:256\n",
            path=".env",
            why="`max_split_size_mb` without expandable segments",
        ),
        Example(
            "import os\nconf = os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:true')\n",
            why="reading the variable is not setting it",
        ),
        Example(
            "cat > notes.txt <<'EOF'\n"
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true\n"
            "EOF\n",
            path="run.sh",
            why="a heredoc written to a file that this script never runs is data",
        ),
        Example(
            "import os\nCONF = 'expandable_segments:True'\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = CONF\nos.environ['PYTORCH_ALLOC_CONF'] = CONF\n",
            why="both names from one constant",
        ),
    ]
    INVALID = [
        Example(
            "import os\nmb = 128\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = f'expandable_segments:True,max_split_size_mb:{mb}'\n",
            why="an f-string holding both settings (its `{mb}` bound to a constant)",
            line=3,
        ),
        Example(
            "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:true'\nimport torch\n",
            why="a lower-case boolean",
            line=2,
            fixed="import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\nimport torch\n",
        ),
        Example(
            "import os\nos.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandeable_segments:True')\n",
            why="a key with one close match (the typo llm-foundry shipped)",
            line=2,
            fixed="import os\nos.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')\n",
        ),
        Example(
            "import os\nALLOC = 'max_split_size_mb:10'\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = ALLOC\n",
            why="`max_split_size_mb` below 20, through a constant",
            line=2,
        ),
        Example(
            "#!/usr/bin/env bash\n"
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128\n"
            "accelerate launch train.py\n",
            path="train.sh",
            why="`max_split_size_mb` with `expandable_segments:True` (warning)",
            line=2,
        ),
        Example(
            "#!/bin/bash\n"
            "JOB=$(mktemp /tmp/job_XXXX.sh)\n"
            "cat > \"$JOB\" << 'EOF'\n"
            "#!/bin/bash\n"
            "#SBATCH --gres=gpu:4\n"
            "export PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True,max_split_size_mb:512\"\n"
            "torchrun --nproc_per_node 4 train.py\n"
            "EOF\n"
            "sbatch \"$JOB\"\n",
            path="submit.sh",
            why="in the job script a heredoc writes and `sbatch` submits (warning)",
            line=6,
        ),
        Example(
            "FROM pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime\n"
            "ENV PYTORCH_CUDA_ALLOC_CONF=\"garbage_collection_threshold:1.5\"\n",
            path="Dockerfile",
            why="a threshold outside (0, 1) in a Dockerfile `ENV`",
            line=2,
        ),
        Example(
            "WANDB_PROJECT=demo\nPYTORCH_ALLOC_CONF='expandable_segments:false'\n",
            path=".env",
            why="a lower-case boolean in a quoted `.env` value",
            line=2,
            fixed="WANDB_PROJECT=demo\nPYTORCH_ALLOC_CONF='expandable_segments:False'\n",
        ),
        Example(
            "train:\n\tPYTORCH_CUDA_ALLOC_CONF=expandable_segments=True torchrun --nproc_per_node 8 train.py\n",
            path="Makefile",
            why="`key=value` for `key:value` in a command prefix",
            line=2,
            fixed="train:\n\tPYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nproc_per_node 8 train.py\n",
        ),
        Example(
            "export PYTORCH_CUDA_ALLOC_CONF='roundup_power2_divisions:[256:1,500:2,>:4]'\n",
            path="run.sh",
            why="a size that is not a power of two inside the list form",
            line=1,
        ),
        Example(
            "export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,garbage_collection_threshold:0.6\n",
            path="run.sh",
            why="an option the asynchronous backend ignores (warning)",
            line=1,
        ),
        Example(
            "import os\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "os.environ['PYTORCH_ALLOC_CONF'] = 'max_split_size_mb:256'\n",
            why="both variable names, set to different values (warning)",
            line=3,
        ),
        Example(
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,fragmentation_fix:True\n",
            path="run.sh",
            why="an unknown key with no close match",
            line=1,
        ),
        Example(
            "import os\n"
            "os.environ.update(PYTORCH_CUDA_ALLOC_CONF='garbage_collection_threshold:0.8,max_split_size_mb:512MB')\n",
            why="a number with a unit torch silently drops, through `os.environ.update(...)` (warning)",
            line=2,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        torch = ctx.versions.get("torch")
        report_unknown = torch.at_least("2.14") is not True
        if getattr(ctx, "kind", "python") == "python":
            values = list(_python_values(ctx))
        else:
            values = list(_shell_values(ctx))
        for variable, value, base, span, order, unknown in values:
            for problem in check(value, variable, report_unknown, unknown):
                yield self._report(ctx, problem, base, span)
        yield from self._both_names(ctx, values)

    def _report(self, ctx, problem: Problem, base: int | None, whole) -> Finding:
        fix = None
        if base is None:
            span = whole
        else:
            span = ctx.source.span(base + problem.start, base + problem.end)
            if problem.replacement is not None:
                start, end, text = problem.replacement
                edit = Edit(ctx.source.path, base + start, base + end, text)
                fix = Fix((edit,), f"Write `{text}`", Applicability.SAFE)
        severity = Severity.ERROR if problem.severity == "error" else Severity.WARNING
        return self.finding(span, problem.message, fix=fix, severity=severity)

    def _both_names(self, ctx, values) -> Iterable[Finding]:
        """Both names with different values: report the later one, once."""
        by_name: dict[str, list] = {}
        for entry in values:
            if entry[5]:
                return  # an f-string computed when it runs: equal or not is not known here
            by_name.setdefault(entry[0], []).append(entry)
        if len(by_name) < 2:
            return
        cuda, generic = by_name[VARIABLES[0]], by_name[VARIABLES[1]]
        if {e[1] for e in cuda} == {e[1] for e in generic} and len({e[1] for e in cuda}) == 1:
            return
        later = max(cuda[0], generic[0], key=lambda e: e[4])
        earlier = min(cuda[0], generic[0], key=lambda e: e[4])
        yield self.finding(
            later[3],
            f"Both `PYTORCH_CUDA_ALLOC_CONF` and `PYTORCH_ALLOC_CONF` are set, to different values "
            f"(`{earlier[0]}` on line {earlier[3].line}): which one the CUDA allocator uses has changed "
            "between torch releases (2.9.1 ignored `PYTORCH_ALLOC_CONF` on CUDA; 2.13 reads "
            "`PYTORCH_CUDA_ALLOC_CONF` first). Set one of them, or both to the same value.",
            severity=Severity.WARNING,
            related=[Related(earlier[3], f"`{earlier[0]}` is set here")],
        )


def _python_values(ctx):
    """(variable, value, base offset or None, span of the value, order, unknown ranges) for
    each Python setting whose value is a string cfgfix can read, or an f-string (read in its
    literal parts and the constants its `{name}`s are bound to; no fix offered there)."""
    seen: set[int] = set()
    for setting in python_settings(ctx):
        literal = setting.literal
        if literal is None and setting.template is not None:
            text, unknown, node = setting.template
            if id(node) in seen:
                continue
            seen.add(id(node))
            span = ctx.source.span_of_node(node)
            yield setting.variable, text, None, span, span.start, unknown
            continue
        if literal is None or id(literal) in seen:
            continue  # unresolvable, or one constant given to both names: report it once
        seen.add(id(literal))
        span = ctx.source.span_of_node(literal)
        yield setting.variable, literal.value, literal_base(ctx.source, literal), span, span.start, ()


def _shell_values(ctx):
    for assignment in ctx.document.assignments:
        if assignment.name not in VARIABLES:
            continue
        word = assignment.value
        if "$" in word.text or "`" in word.text:
            continue  # an expansion: the value is not known here
        raw, text = word.raw, word.text
        if raw == text:
            base = word.span.start
        elif len(raw) >= 2 and raw[0] in "'\"" and raw[-1] == raw[0] and raw[1:-1] == text:
            base = word.span.start + 1
        else:
            base = None
        yield assignment.name, text, base, word.span, word.span.start, ()
