"""CFX304 alloc-conf-after-cuda-init."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from cfgfix.analysis.alloc_conf import CudaOrder, Setting, python_settings
from cfgfix.analysis.names import iter_statements
from cfgfix.core import Applicability, Edit, Finding, Fix, Related, Severity
from cfgfix.rules.base import Example, Rule, register
from cfgfix.rules.loops.common import VARIABLE_TRIGGERS

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
    counted. One test is an exception: the block of `if torch.cuda.is_available():` (or the
    `else` of `if not torch.cuda.is_available():`) runs on every GPU run, and the allocator
    setting matters only on those, so a use there counts, and so does a device
    `"cuda" if torch.cuda.is_available() else "cpu"` (or `torch.device(...)` of it). A file that also starts child
    processes (`subprocess`, `mp.spawn`) is left alone, since the value may be meant for them (a process started by module-level code
    that ended before the first assignment, such as a notebook's `pip` cell, cannot be).

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
            "if torch.cuda.is_available() and args.gpu:\n"
            "    print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a GPU run may still skip the branch (`and args.gpu`)",
        ),
        Example(
            "import os\nimport torch\n"
            "if not torch.cuda.is_available():\n"
            "    print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="the branch a GPU run does not take",
        ),
        Example(
            "import os\nimport torch\n"
            "device = torch.device('cuda' if args.gpu else 'cpu')\n"
            "x = torch.zeros(4).to(device)\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a device cfgfix cannot resolve to CUDA (a GPU run may still pick the CPU)",
        ),
        Example(
            "import os\nimport subprocess\nimport torch\n"
            "print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "subprocess.run(['torchrun', '--nproc_per_node', '2', 'train.py'], check=True)\n",
            why="a launcher that sets the value for the child processes it starts",
        ),
        Example(
            "import os\nimport subprocess\nimport torch\n"
            "subprocess.run(['nvidia-smi'], check=False)\n"
            "print(torch.cuda.get_device_name(0))\n"
            "def launch():\n"
            "    subprocess.run(['torchrun', 'train.py'], check=True)\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n"
            "launch()\n",
            why="a function that starts a child process may run after the setting",
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
            "import os\nimport torch\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "x = torch.zeros(4).to(device)\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="the GPU idiom is CUDA on every GPU run, the runs the setting is for",
            line=5,
            fixed="import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "import torch\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "x = torch.zeros(4).to(device)\n",
        ),
        Example(
            "import os\nimport subprocess\nimport sys\nimport torch\n"
            "subprocess.run([sys.executable, '-m', 'pip', 'show', 'peft'], check=False)\n"
            "print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="a child process that ran and ended before the setting cannot be what it is for",
            line=7,
            fixed="import os\nimport subprocess\nimport sys\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "import torch\n"
            "subprocess.run([sys.executable, '-m', 'pip', 'show', 'peft'], check=False)\n"
            "print(torch.cuda.get_device_name(0))\n",
        ),
        Example(
            "import os\nimport torch\n"
            "if torch.cuda.is_available():\n"
            "    print(torch.cuda.get_device_name(0))\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n",
            why="the `torch.cuda.is_available()` branch runs on every GPU run, where the setting matters",
            line=5,
            fixed="import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n\n"
            "import torch\n"
            "if torch.cuda.is_available():\n"
            "    print(torch.cuda.get_device_name(0))\n",
        ),
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
        if order.spawns(before=min(setting.stmt.lineno for setting in settings)):
            return  # the value may be meant for a child process started after it
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
