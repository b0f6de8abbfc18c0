"""CFX207 deprecated-cuda-amp-api."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from cfgfix.analysis.amp import AUTOCAST_CUDA, LEGACY_PARAMS, SCALER_CUDA, bind, parent_of, scope_resolver
from cfgfix.analysis.feature_checks import fallback_import_names, fallback_nodes
from cfgfix.core import Applicability, Edit, Finding, Fix, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register


@register
class DeprecatedCudaAmpApi(Rule):
    """## What it does
    Flags `torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)` (also as
    decorators, under aliases, and imported with `from torch.cuda.amp import autocast,
    GradScaler`) on torch 2.4 or newer (see Versions).

    ## Why is this bad?
    Since torch 2.4 both are deprecated and emit a `FutureWarning` on every construction:
    "`torch.cuda.amp.autocast(args...)` is deprecated. Please use
    `torch.amp.autocast('cuda', args...)` instead." They are thin subclasses of the
    device-generic `torch.amp` classes, which are the supported spelling.

    cfgfix reports this only on torch 2.4 or newer (see Versions), and not in a fallback
    that runs only where the new API is missing (`if hasattr(torch.amp, "GradScaler"): …
    else: torch.cuda.amp.GradScaler()`).

    ## Example
    ```python
    scaler = torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast(dtype=torch.float16):
        loss = model(x).loss
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.amp.autocast("cuda", dtype=torch.float16):
        loss = model(x).loss
    ```

    ## Fix safety
    Safe on a known torch 2.4+ (unsafe on an assumed version, see Versions): the old
    classes only forward to the new ones with `"cuda"`. Two details keep it
    exact. `torch.cuda.amp.autocast`'s positional parameters are `(enabled, dtype,
    cache_enabled)`, unlike `torch.amp.autocast("cuda", dtype, enabled, ...)`, so the fix
    writes positional arguments as keywords. And the old class pins `dtype=torch.float16`
    when none is given, while the new one takes the current autocast dtype (float16 unless
    an enclosing region or `torch.set_autocast_dtype` changed it), so the fix writes
    `dtype=torch.float16` explicitly. With `from torch.cuda.amp import ...` the import and
    every call are rewritten together, and no fix is offered when that import brings other
    names or the imported name is used other than by calling it. `isinstance(x,
    torch.cuda.amp.GradScaler)` elsewhere would stop matching the new object: the fix is
    withheld when the file refers to the old class without calling it.

    `torch.cuda.amp.custom_fwd` / `custom_bwd` (deprecated the same way, now
    `torch.amp.custom_fwd(device_type="cuda")`) and `torch.cpu.amp.*` are not covered yet.

    ## Versions
    Speaks when the project's torch (its pin, else the installed one) is 2.4 or newer.
    Below 2.4 the old API is not deprecated; when a pin straddles 2.4 (`torch>=2.0`) the
    finding would be wrong for some of the admitted versions and its fix could break an
    older torch, so cfgfix stays silent. Where the project pins nothing and no torch is
    installed, it assumes the current release (2.13, what an install without a pin gets)
    and says so in the message; the fix is then unsafe, as the new spelling may not exist
    on an older torch (the issue reports date the warning to 2.4; `torch.amp.GradScaler`
    may exist from 2.3, which is unverified, so 2.4 gates both).

    ## References
    - facts A5: `torch/cuda/amp/autocast_mode.py` L13-17 and `grad_scaler.py` L18-22 (torch
      2.13), the `@deprecated(..., category=FutureWarning)` messages; deprecation first
      reported with torch 2.4.0 (mit-han-lab/efficientvit#127, WenjieDu/PyPOTS#520).
    """

    code = "CFX207"
    name = "deprecated-cuda-amp-api"
    severity = Severity.INFO
    fix_availability = "sometimes"
    triggers = ((b"cuda.amp", b"cuda import amp"), (b"autocast", b"GradScaler"))

    _PIN = {"requirements.txt": "torch==2.4.1\n"}

    VALID = [
        Example(
            "import torch\n"
            "with torch.cuda.amp.autocast():\n"
            "    loss = model(x).loss\n",
            why="torch 2.3 does not deprecate it",
            files={"requirements.txt": "torch==2.3.1\n"},
        ),
        Example(
            "import torch\n"
            "scaler = torch.cuda.amp.GradScaler()\n",
            why="a pin that admits versions before 2.4",
            files={"requirements.txt": "torch>=2.0\n"},
        ),
        Example(
            "import torch\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.amp.autocast('cuda', dtype=torch.float16):\n"
            "    loss = model(x).loss\n",
            why="already the current API",
            files=_PIN,
        ),
        Example(
            "import torch\n"
            "with torch.cpu.amp.autocast():\n"
            "    out = model(x)\n",
            why="`torch.cpu.amp` is not this rule's",
            files=_PIN,
        ),
        Example(
            "import torch\n"
            "if hasattr(torch.amp, 'GradScaler'):\n"
            "    scaler = torch.amp.GradScaler('cuda')\n"
            "else:\n"
            "    scaler = torch.cuda.amp.GradScaler()\n",
            why="a fallback that runs only where `torch.amp.GradScaler` is missing",
            files=_PIN,
        ),
        Example(
            "try:\n"
            "    from torch.amp import autocast\n"
            "except ImportError:\n"
            "    from torch.cuda.amp import autocast\n"
            "with autocast():\n"
            "    out = model(x)\n",
            why="an import fallback: where the new import works, the old one never runs",
            files=_PIN,
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "scaler = torch.cuda.amp.GradScaler()\n",
            why="no torch pin and none installed: the current release is assumed and said; the fix is unsafe",
            line=2,
            fixed="import torch\n"
            "scaler = torch.amp.GradScaler(\"cuda\")\n",
        ),
        Example(
            "import torch\n"
            "with torch.no_grad(), torch.cuda.amp.autocast(dtype=weight_dtype):\n"
            "    latents = vae.encode(pixels).latent_dist.sample()\n",
            why="the sdxl story: an explicit dtype is kept",
            line=2,
            files=_PIN,
            fixed="import torch\n"
            "with torch.no_grad(), torch.amp.autocast(\"cuda\", dtype=weight_dtype):\n"
            "    latents = vae.encode(pixels).latent_dist.sample()\n",
        ),
        Example(
            "import torch as th\n"
            "scaler = th.cuda.amp.GradScaler(2.0**10, enabled=True)\n",
            why="an alias; GradScaler's positional arguments line up after the device",
            line=2,
            files={"requirements.txt": "torch>=2.4,<3\n"},
            fixed="import torch as th\n"
            "scaler = th.amp.GradScaler(\"cuda\", 2.0**10, enabled=True)\n",
        ),
        Example(
            "import torch\n"
            "with torch.cuda.amp.autocast(True):\n"
            "    loss = model(x).loss\n",
            why="a positional `enabled` becomes a keyword; the float16 default is written out",
            line=2,
            files=_PIN,
            fixed="import torch\n"
            "with torch.amp.autocast(\"cuda\", enabled=True, dtype=torch.float16):\n"
            "    loss = model(x).loss\n",
        ),
        Example(
            "import torch\n"
            "class Block(torch.nn.Module):\n"
            "    @torch.cuda.amp.autocast(enabled=False)\n"
            "    def forward(self, x):\n"
            "        return self.proj(x.float())\n",
            why="the decorator form; a disabled region needs no dtype",
            line=3,
            files=_PIN,
            fixed="import torch\n"
            "class Block(torch.nn.Module):\n"
            "    @torch.amp.autocast(\"cuda\", enabled=False)\n"
            "    def forward(self, x):\n"
            "        return self.proj(x.float())\n",
        ),
        Example(
            "from torch.cuda.amp import autocast\n"
            "def step(model, x):\n"
            "    with autocast():\n"
            "        return model(x)\n",
            why="`from torch.cuda.amp import`: the import and the call change together",
            line=3,
            files=_PIN,
            fixed="from torch.amp import autocast\n"
            "import torch\n"
            "def step(model, x):\n"
            "    with autocast(\"cuda\", dtype=torch.float16):\n"
            "        return model(x)\n",
        ),
        Example(
            "from torch.cuda.amp import autocast, custom_fwd\n"
            "with autocast():\n"
            "    out = model(x)\n",
            why="the import also brings a name that `torch.amp` spells differently: no fix",
            line=2,
            files=_PIN,
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        torch_version = ctx.versions.resolve("torch")
        if torch_version.at_least("2.4") is not True:
            return
        sites = ctx.index.calls_named(*AUTOCAST_CUDA, *SCALER_CUDA)
        if not sites:
            return
        src = ctx.source
        # Calls through `from torch.cuda.amp import ...` share one all-or-nothing fix.
        group_fix = _ImportRewrite(ctx).edits()
        if _refers_without_call(ctx, SCALER_CUDA) or _refers_without_call(ctx, AUTOCAST_CUDA):
            group_fix = None
        pinned = torch_version.describe()
        # On an assumed version the new spelling may not exist yet (torch.amp.GradScaler is
        # unverified before 2.3): the fix is then the user's call.
        applicability = Applicability.UNSAFE if torch_version.evidence == "assumed" else Applicability.SAFE
        # `if hasattr(torch.amp, "GradScaler"): ... else: <old spelling>`: the old spelling runs
        # only where the new API is missing, where it is not deprecated
        features = ("torch.amp.GradScaler", "torch.amp.autocast", "torch.amp")
        fallbacks = fallback_nodes(ctx.document.tree, features)
        fallback_names = fallback_import_names(ctx.document.tree, features) if fallbacks else set()
        for site in sites:
            call = site.node
            func = call.func.func if isinstance(call.func, ast.Call) else call.func
            if id(call) in fallbacks or isinstance(func, ast.Name) and func.id in fallback_names:
                continue
            scaler = site.name in SCALER_CUDA
            new_name = "GradScaler" if scaler else "autocast"
            old_text = site.name.replace(".autocast_mode.", ".").replace(".grad_scaler.", ".")
            if isinstance(call.func, ast.Name):
                edits = group_fix
            else:
                func_text = _attribute_func(ctx, call.func, new_name)
                edits = _call_edits(ctx, call, scaler, func_text, site.context.function)
                if _refers_without_call(ctx, SCALER_CUDA if scaler else AUTOCAST_CUDA):
                    edits = None  # `isinstance(x, torch.cuda.amp.GradScaler)` would stop matching
            yield self.finding(
                src.span_of_node(call),
                f"`{old_text}(...)` is deprecated since torch 2.4 and warns (FutureWarning) every "
                f"time it is built; this project uses {pinned}. Use "
                f"`torch.amp.{new_name}(\"cuda\", ...)`: the old class only forwards to it.",
                fix=Fix(tuple(edits), f"Use `torch.amp.{new_name}(\"cuda\", ...)`", applicability) if edits else None,
            )


def _torch_name(ctx) -> tuple[str, list]:
    """How to spell `torch` here, and the edit that imports it when nothing binds it."""
    local = ctx.index.imports.local_name_for("torch")
    if local is not None:
        return local, []
    tree = ctx.document.tree
    last_line = len(ctx.source.line_starts) + 1
    return "torch", [python_edits.insert_import(ctx.source, tree, "import torch", last_line)]


def _attribute_func(ctx, func: ast.expr, new_name: str) -> tuple[str, list] | None:
    """`torch.cuda.amp.autocast` -> `torch.amp.autocast` (keeping `th` for `import torch as
    th`); `amp.autocast` after `from torch.cuda import amp` -> `torch.amp.autocast`."""
    root = func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return None
    if ctx.index.imports.aliases.get(root.id) == "torch":
        return f"{root.id}.amp.{new_name}", []
    torch, edits = _torch_name(ctx)
    return f"{torch}.amp.{new_name}", edits


def _call_edits(ctx, call: ast.Call, scaler: bool, func_text: tuple[str, list] | None, function=None) -> list | None:
    """Edits that turn one old-API call into the new one, or None when that is not exact."""
    if func_text is None:
        return None
    src = ctx.source
    text, edits = func_text
    edits = list(edits)
    if any(isinstance(a, ast.Starred) for a in call.args) and not scaler:
        return None  # positional arguments that cannot be named
    items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    func_end = python_edits.node_range(src, call.func)[1]
    paren = src.text.find("(", func_end)
    if paren < 0:
        return None
    extra = ""
    if not scaler:
        args, hidden = bind(call, LEGACY_PARAMS)
        if len(call.args) > len(LEGACY_PARAMS):
            return None
        enabled = scope_resolver(ctx, function).boolean(args["enabled"]) if "enabled" in args else True
        if "dtype" not in args and enabled is not False:
            if hidden:
                return None  # `**kwargs` may or may not carry a dtype
            torch, more = _torch_name(ctx)
            edits.extend(more)
            extra = f"dtype={torch}.float16"
    if src.node_text(call.func) != text:
        edits.append(python_edits.replace_node(src, call.func, text))
    # Insertions by offset, so two at one point keep their order: `("cuda", enabled=True`.
    inserts: dict[int, str] = {paren + 1: '"cuda"' + (", " if items else "")}
    if not scaler:
        for param, arg in zip(LEGACY_PARAMS, call.args):
            start = python_edits.node_range(src, arg)[0]
            inserts[start] = inserts.get(start, "") + f"{param}="
    if extra:
        end = python_edits.node_range(src, items[-1])[1] if items else paren + 1
        inserts[end] = inserts.get(end, "") + f", {extra}"
    edits.extend(Edit(src.path, offset, offset, content) for offset, content in sorted(inserts.items()))
    return edits


def _function_of(ctx, call: ast.Call):
    if "amp-call-functions" not in ctx.notes:
        ctx.notes["amp-call-functions"] = {id(site.node): site.context.function for site in ctx.index.calls}
    return ctx.notes["amp-call-functions"].get(id(call))


def _refers_without_call(ctx, names: frozenset[str]) -> bool:
    """The file names the old class other than by calling it (`isinstance(s, GradScaler)`)."""
    key = ("amp-refers", names)
    if key in ctx.notes:
        return ctx.notes[key]
    ctx.notes[key] = result = _scan_references(ctx, names)
    return result


def _scan_references(ctx, names: frozenset[str]) -> bool:
    called = {id(site.node.func) for site in ctx.index.calls_named(*names)}
    imports = ctx.index.imports
    for node in ast.walk(ctx.document.tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in called:
            if isinstance(node, ast.Attribute) and isinstance(parent_of(ctx, node), ast.Attribute):
                continue  # part of a longer chain
            if imports.qualify(node) in names and isinstance(getattr(node, "ctx", None), ast.Load):
                return True
    return False


class _ImportRewrite:
    """`from torch.cuda.amp import autocast, GradScaler` -> `from torch.amp import ...`, with
    every call of those names rewritten: all of it in one fix, or nothing."""

    _FROM = re.compile(r"from\s+torch\.cuda\.amp(?=\s+import\b)")

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def edits(self) -> list | None:
        ctx, src = self.ctx, self.ctx.source
        statements = [
            node for node in ast.walk(ctx.document.tree)
            if isinstance(node, ast.ImportFrom) and node.module == "torch.cuda.amp" and not node.level
        ]
        if not statements:
            return None
        edits = []
        locals_: dict[str, str] = {}
        for stmt in statements:
            for alias in stmt.names:
                if alias.name not in ("autocast", "GradScaler"):
                    return None  # custom_fwd & co. are spelled differently in torch.amp
                locals_[alias.asname or alias.name] = alias.name
            start, end = python_edits.node_range(src, stmt)
            match = self._FROM.match(src.text, start, end)
            if match is None:
                return None
            edits.append(Edit(src.path, match.start(), match.end(), "from torch.amp"))
        # Each local name is bound by these imports only, and only ever called.
        binders = 0
        for node in ast.walk(ctx.document.tree):
            if isinstance(node, ast.Name) and node.id in locals_:
                if not isinstance(node.ctx, ast.Load):
                    return None
                parent = parent_of(ctx, node)
                if not (isinstance(parent, ast.Call) and parent.func is node):
                    return None
                scaler = locals_[node.id] == "GradScaler"
                more = _call_edits(ctx, parent, scaler, (node.id, []), _function_of(ctx, parent))
                if more is None:
                    return None
                edits.extend(more)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in locals_:
                return None
            elif isinstance(node, ast.alias) and (node.asname or node.name).split(".")[0] in locals_:
                binders += 1
            elif isinstance(node, ast.arg) and node.arg in locals_:
                return None
        if binders != sum(len(s.names) for s in statements):
            return None
        return edits
