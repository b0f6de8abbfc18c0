"""CFX304, CFX305: PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF (Python, shell, Dockerfile, .env)."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cfgfix.analysis.alloc_conf import (
    VARIABLES,
    CudaOrder,
    Problem,
    Setting,
    check,
    literal_base,
    python_settings,
)
from cfgfix.analysis.names import iter_statements
from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.rules.base import Example, Rule, register

VARIABLE_TRIGGERS = (b"PYTORCH_CUDA_ALLOC_CONF", b"PYTORCH_ALLOC_CONF")
# Importing any of these imports torch: the moved assignment goes above the first one.
TORCH_IMPORTERS = frozenset({
    "torch", "transformers", "accelerate", "diffusers", "peft", "trl", "deepspeed", "torchvision",
    "torchaudio", "lightning", "pytorch_lightning", "bitsandbytes", "timm", "sentence_transformers",
    "vllm", "xformers", "flash_attn", "torchtune", "torchao", "unsloth",
})


@register
class AllocConfAfterCudaInit(Rule):
    """## What it does
    Flags a Python assignment of `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` that runs
    after the script has already initialised CUDA. That is `os.environ[...] = ...`,
    `os.environ.setdefault`, `os.environ.update` or `os.putenv` after `.cuda()`,
    `.to("cuda")` (or a device known to be CUDA), a torch call with `device="cuda"`
    (`torch.empty(..., device="cuda")`, `torch.load(..., map_location="cuda")`),
    `torch.cuda` calls that initialise the device (`set_device`, `synchronize`,
    `get_device_name`, `mem_get_info`, ...), `from_pretrained(..., device_map=...)`,
    `Accelerator()` / `PartialState()`, `deepspeed.initialize()`, or a call of a function
    of the same file that certainly does one of these.

    ## Why is this bad?
    The caching allocator reads its settings once, when CUDA first needs it; a value set
    afterwards is silently ignored for the rest of the process. So the
    `expandable_segments:True` that was meant to stop fragmentation OOMs never takes
    effect, and the OOM it was added for keeps coming. Setting it after `import torch` is
    fine as long as nothing has touched the GPU yet; above `import torch` is safest.
    `torch.cuda.is_available()` and `torch.cuda.device_count()` do not initialise the
    allocator, so they may come first.

    cfgfix only reports uses that certainly ran before the assignment: a use inside an
    `if`, a loop body, a `try` body or a lambda, or a device it cannot resolve, is not
    counted. A file that also starts child processes (`subprocess`, `mp.spawn`) is left
    alone, since the value may be meant for them.

    ## Example
    ```python
    import os
    import torch

    def main():
        accelerator = Accelerator()
        model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    ```

    ## Use instead
    ```python
    import os
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

    import torch
    ```

    Or export it in the launch script: `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

    ## Fix safety
    Unsafe: the fix moves the assignment (with the comment lines right above it) to module
    level, above the first import of torch or of a library that imports torch, adding
    `import os` there when `os` is not imported yet. That changes when it runs: it now
    applies to everything in the process, also when the file is imported as a module.
    No fix when the statement uses anything but `os` (a value from a variable, a config),
    or shares its line with other code.

    ## References
    - facts A8: `c10/cuda/CUDAAllocatorConfig.h` reads the variable in a function-static
      `instance()` at allocator init; a value set after the first CUDA use is ignored.
    - PyTorch docs, "CUDA semantics: Optimizing memory usage with `PYTORCH_CUDA_ALLOC_CONF`".
    """

    code = "CFX304"
    name = "alloc-conf-after-cuda-init"
    severity = Severity.ERROR
    fix_availability = "unsafe"
    triggers = (VARIABLE_TRIGGERS, (b"environ", b"putenv"))

    VALID = [
        Example(
            "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "import torch\nmodel = torch.nn.Linear(4, 4).cuda()\n",
            why="set before `import torch`",
        ),
        Example(
            "import os\nimport torch\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "model = torch.nn.Linear(4, 4).cuda()\n",
            why="set after `import torch` but before the first CUDA use: still honoured",
        ),
        Example(
            "import os\nimport torch\n\n"
            "def setup_env():\n"
            "    os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "def main():\n"
            "    setup_env()\n"
            "    model = torch.nn.Linear(4, 4).cuda()\n",
            why="set in a function that runs before any CUDA use",
        ),
        Example(
            "import os\nimport torch\n"
            "if not torch.cuda.is_available() or torch.cuda.device_count() < 2:\n"
            "    raise SystemExit('needs two GPUs')\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="`is_available()` and `device_count()` query the driver without creating the allocator",
        ),
        Example(
            "import os\nimport torch\n"
            "model = torch.nn.Linear(4, 4)\n"
            "if args.gpu:\n"
            "    model = model.cuda()\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a CUDA use behind a branch may not have run",
        ),
        Example(
            "import os\nimport torch\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "x = torch.zeros(4).to(device)\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a device cfgfix cannot resolve to CUDA",
        ),
        Example(
            "import os\nimport subprocess\nimport torch\n"
            "print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "subprocess.run(['torchrun', '--nproc_per_node', '2', 'train.py'], check=True)\n",
            why="a launcher that sets the value for the child processes it starts",
        ),
        Example(
            "import os\nimport torch\n"
            "x = torch.zeros(4).cuda()\n"
            "env = os.environ.copy()\n"
            "env['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a copy of the environment (for a child process) is not this process's environment",
        ),
        Example(
            "import os\nimport torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained('m', device_map='cpu')\n"
            "to_gpu = lambda m: m.cuda()\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a `device_map='cpu'` load and a lambda that has not run",
        ),
    ]
    INVALID = [
        Example(
            "import math\nimport os\n\nimport torch\nfrom accelerate import Accelerator\n\n\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = build_model()\n\n"
            "    # avoid fragmentation OOMs\n"
            "    os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "    train(model, accelerator)\n",
            why="set after `Accelerator()` in the same function; the comment moves with it",
            line=13,
            fixed="import math\nimport os\n\n"
            "# avoid fragmentation OOMs\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = build_model()\n\n"
            "    train(model, accelerator)\n",
        ),
        Example(
            "import torch\nimport os\n"
            "device = torch.device('cuda')\n"
            "weights = torch.randn(1024, 1024).to(device)\n"
            "os.environ.setdefault('PYTORCH_ALLOC_CONF', 'expandable_segments:True')\n",
            why="`.to(device)` with a device known to be CUDA; `os` is imported after torch, "
            "so the fix imports it",
            line=5,
            fixed="import os\nos.environ.setdefault('PYTORCH_ALLOC_CONF', 'expandable_segments:True')\n\n"
            "import torch\nimport os\n"
            "device = torch.device('cuda')\n"
            "weights = torch.randn(1024, 1024).to(device)\n",
        ),
        Example(
            "import os\nimport torch\n"
            "buffer = torch.empty(1 << 20, device='cuda')\n\n"
            "def main():\n"
            "    os.putenv('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')\n"
            "    run()\n",
            why="a module-level CUDA tensor runs before any function defined after it",
            line=6,
            fixed="import os\nos.putenv('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')\n\n"
            "import torch\n"
            "buffer = torch.empty(1 << 20, device='cuda')\n\n"
            "def main():\n"
            "    run()\n",
        ),
        Example(
            "import os\nimport torch\nfrom transformers import AutoModelForCausalLM\n\n"
            "def load():\n"
            "    return AutoModelForCausalLM.from_pretrained('m', device_map='auto')\n\n"
            "def main(args):\n"
            "    model = load()\n"
            "    os.environ['PYTORCH_CUDA_ALLOC_CONF'] = args.alloc_conf\n",
            why="through a helper of the same file that loads with `device_map`; "
            "the value comes from a variable, so there is no fix",
            line=10,
        ),
        Example(
            "import os\nimport torch\n"
            "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
            "os.environ.update({'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'})\n",
            why="`torch.cuda.set_device()` initialises CUDA",
            line=4,
            fixed="import os\nos.environ.update({'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'})\n\n"
            "import torch\n"
            "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        settings = python_settings(ctx)
        if not settings:
            return
        order = CudaOrder(ctx)
        if order.spawns():
            return
        src = ctx.source
        seen: set[int] = set()
        for setting in settings:
            if id(setting.stmt) in seen:
                continue
            seen.add(id(setting.stmt))
            use = order.first_use_before(setting.stmt)
            if use is None:
                continue
            related = [Related(src.span_of_node(use.call), "CUDA is initialised here")]
            if use.via is not None:
                line = f"`{_one_line(src.node_text(use.via))}` on line {use.via.lineno}, which runs {use.what}"
                related.insert(0, Related(src.span_of_node(use.via), "this call initialises CUDA"))
            else:
                line = f"{use.what} on line {use.call.lineno}"
            yield self.finding(
                src.span_of_node(setting.stmt),
                f"`{setting.variable}` is set after {line} has already initialised CUDA: the "
                "caching allocator read its settings at that first CUDA use, so this value is "
                "silently ignored for the rest of the process. Set it before any CUDA use: above "
                "`import torch`, or exported in the launch script.",
                fix=_move_above_torch(ctx, setting, order),
                related=related,
            )


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _move_above_torch(ctx, setting: Setting, order: CudaOrder) -> Fix | None:
    """Move the statement (and the comment lines right above it) above the first top-level
    import of torch or of a library that imports it; import `os` there if needed."""
    src, tree, imports = ctx.source, ctx.document.tree, ctx.index.imports
    stmt, root = setting.stmt, setting.root
    if stmt.lineno != stmt.end_lineno or not order.unconditional(stmt):
        return None  # moving it out of a branch or loop would make it unconditional
    if {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)} != {root}:
        return None  # it reads something besides `os`: moving it could break
    target = imports.aliases.get(root)
    if target not in ("os", "os.environ", "os.putenv"):
        return None
    anchor_index = next(
        (i for i, top in enumerate(tree.body) if _imports_torch(top)), None
    )
    if anchor_index is None:
        return None
    anchor = tree.body[anchor_index]
    if stmt.lineno <= (anchor.end_lineno or anchor.lineno):
        return None
    start = src.span_of_node(stmt).start
    line_start = src.line_starts[stmt.lineno - 1]
    indent = src.text[line_start:start]
    line = src.line_text(stmt.lineno)
    end_col = src.span_of_node(stmt).end - line_start
    if indent.strip() or (line[end_col:].strip() and not line[end_col:].strip().startswith("#")):
        return None  # shares its line with other code
    first = stmt.lineno
    while first > 1:
        above = src.line_text(first - 1)
        if not above.lstrip().startswith("#") or above[:len(above) - len(above.lstrip())] != indent:
            break
        first -= 1
    context = ctx.index.context_of_stmt(stmt)
    nl = src.newline
    if context.sole_in_block:
        first = stmt.lineno  # the comments stay with the `pass` that keeps the block
        removal = Edit(src.path, start, src.span_of_node(stmt).end, "pass")
    else:
        begin = src.line_starts[first - 1]
        end = _line_end(src, stmt.lineno)
        previous_blank = first == 1 or not src.line_text(first - 1).strip()
        if previous_blank and stmt.lineno < len(src.line_starts) and not src.line_text(stmt.lineno + 1).strip():
            end = _line_end(src, stmt.lineno + 1)  # do not leave two blank lines behind
        removal = Edit(src.path, begin, end, "")
    moved = [src.line_text(n)[len(indent):] for n in range(first, stmt.lineno)] + [line[len(indent):]]
    if not _bound_before(tree.body[:anchor_index], root, target):
        moved.insert(0, _import_line(root, target))
    at = src.line_starts[anchor.lineno - 1]
    insertion = Edit(src.path, at, at, nl.join(moved) + nl + nl)
    return Fix(
        (insertion, removal),
        f"Move the `{setting.variable}` assignment above the first torch import",
        Applicability.UNSAFE,
    )


def _line_end(src, line: int) -> int:
    return src.line_starts[line] if line < len(src.line_starts) else len(src.text)


def _imports_torch(stmt: ast.stmt) -> bool:
    for node in iter_statements([stmt]):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in TORCH_IMPORTERS for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in TORCH_IMPORTERS:
            return True
    return False


def _bound_before(body: list[ast.stmt], root: str, target: str) -> bool:
    """A top-level import among `body` binds `root` to `target` (`os`, `os.environ`)."""
    for stmt in body:
        if isinstance(stmt, ast.Import):
            names = [(a.name, a.asname or a.name) for a in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "os" and not stmt.level:
            names = [(f"os.{a.name}", a.asname or a.name) for a in stmt.names]
        else:
            continue
        if (target, root) in names:
            return True
    return False


def _import_line(root: str, target: str) -> str:
    if target == "os":
        return "import os" if root == "os" else f"import os as {root}"
    name = target.split(".", 1)[1]
    return f"from os import {name}" if root == name else f"from os import {name} as {root}"


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
    before changes. Everything else has no fix. Values cfgfix cannot read (an f-string, a
    variable, `${VAR:-...}`) are not checked. An unknown key with no close match is
    reported only in `PYTORCH_CUDA_ALLOC_CONF` (other accelerators share
    `PYTORCH_ALLOC_CONF`) and only when the project's torch is not newer than the key
    table (torch 2.13).

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
            "import os\nCONF = 'expandable_segments:True'\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = CONF\nos.environ['PYTORCH_ALLOC_CONF'] = CONF\n",
            why="both names from one constant",
        ),
    ]
    INVALID = [
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
        for variable, value, base, span, order in values:
            for problem in check(value, variable, report_unknown):
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
    """(variable, value, base offset or None, span of the value, order) for each Python
    setting whose value is a string cfgfix can read."""
    seen: set[int] = set()
    for setting in python_settings(ctx):
        literal = setting.literal
        if literal is None or id(literal) in seen:
            continue  # unresolvable, or one constant given to both names: report it once
        seen.add(id(literal))
        span = ctx.source.span_of_node(literal)
        yield setting.variable, literal.value, literal_base(ctx.source, literal), span, span.start


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
        yield assignment.name, text, base, word.span, word.span.start
