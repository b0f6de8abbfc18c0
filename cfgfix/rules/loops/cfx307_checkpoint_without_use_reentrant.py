"""CFX307 checkpoint-without-use-reentrant."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from cfgfix.analysis.checkpointing import (
    GC_METHODS,
    TRAINING_FLAGS,
    kwargs_argument,
    may_break_peft,
    set_reentrant_false,
    trainer_drops,
    use_reentrant_of,
)
from cfgfix.analysis.names import LEAVES, child_nodes, dotted, module_statements, walk_scope
from cfgfix.analysis.word_lines import calls_on_lines, word_lines
from cfgfix.core import Applicability, Finding, Fix, LazyRegex, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

TORCH_CHECKPOINT = "torch.utils.checkpoint.checkpoint"
TORCH_SEQUENTIAL = "torch.utils.checkpoint.checkpoint_sequential"


def _named_calls(ctx) -> list[tuple[str | None, ast.Call]]:
    """The calls this rule may report, with their qualified names, in source order (with
    others it ignores). Only the statements spanning a line that names such a callee are
    walked (analysis/word_lines.py): a trainer module that mentions
    `gradient_checkpointing_kwargs` in a message passes the prefilter, and walking all its
    calls cost ~5 ms (issue 15). Not the shared index's `calls` even when another rule
    built it: the index walks a function body only when a query needs it, and `calls`
    needs them all (~10 ms on a 2,000-line module)."""
    if "cfx307-calls" not in ctx.notes:
        tree = ctx.document.tree
        imports = ctx.imports
        words = {"checkpoint", "checkpoint_sequential", *GC_METHODS}
        words.update(alias for alias, target in imports.aliases.items()
                     if target in (TORCH_CHECKPOINT, TORCH_SEQUENTIAL) or target.endswith("TrainingArguments"))
        lines = word_lines(ctx.source.text, sorted(words), suffixes=("TrainingArguments",))
        if lines is None:
            found = _all_calls(tree)
        else:
            found = calls_on_lines(tree, lines) if lines else []
        calls = []
        for node in found:
            func = node.func
            name = imports.qualify(func) or (dotted(func) if isinstance(func, ast.Attribute) else None)
            calls.append((name, node))
        ctx.notes["cfx307-calls"] = calls
    return ctx.notes["cfx307-calls"]


def _all_calls(tree: ast.Module) -> list[ast.Call]:
    """Every call, as the shared index has them (not into lambdas), in source order."""
    calls = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        stack.extend(child for child in child_nodes(node) if not isinstance(child, LEAVES))  # no call below
        if isinstance(node, ast.Call):
            calls.append(node)
    calls.sort(key=lambda call: (call.lineno, call.col_offset))
    return calls


# Patterns tried only where `bytes.find` puts their literal start: `re.search` of the
# call's (rb"\bcheckpoint(?:_sequential)?\s*\(", starting with `\b`) tried every position
# of the file, ~1 ms per 100 kB (issue 15).
_CHECKPOINT_CALL_TAIL = LazyRegex(rb"(?:_sequential)?\s*\(")
_INLINE_KWARGS = re.compile(rb"checkpointing_kwargs\s*=\s*(?:\{|dict\()|checkpointing_enable\(\s*(?:\{|dict\()")
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _calls_checkpoint(data: bytes) -> bool:
    """`checkpoint(` or `checkpoint_sequential(` as a word (spaces allowed before `(`)."""
    at = data.find(b"checkpoint")
    while at >= 0:
        if (at == 0 or data[at - 1] not in _WORD_BYTES) and _CHECKPOINT_CALL_TAIL.match(data, at + 10):
            return True
        at = data.find(b"checkpoint", at + 1)
    return False


def _inline_kwargs(data: bytes) -> bool:
    """`_INLINE_KWARGS.search(data)`: every match starts with `checkpointing_`."""
    at = data.find(b"checkpointing_")
    while at >= 0:
        if _INLINE_KWARGS.match(data, at):
            return True
        at = data.find(b"checkpointing_", at + 1)
    return False


def _may_checkpoint(data: bytes) -> bool:
    """A kwargs dict written inline, or a call of torch's checkpoint in a file importing it."""
    if _inline_kwargs(data):
        return True
    imports = b"utils.checkpoint" in data or (b"torch.utils import" in data and b"checkpoint" in data)
    return imports and _calls_checkpoint(data)


def _kwargs_without_reentrant(ctx) -> dict[int, str]:
    """`**kwargs` uses (id of the Name node -> the function's name) that cannot hold
    `use_reentrant`: the function's own `**kwargs` when `use_reentrant` is one of its
    named parameters (so a caller's `use_reentrant=` binds that, never the dict), and the
    function neither rebinds nor fills the dict (`kwargs[...] =`, `kwargs.update(...)`)."""
    found = ctx.notes.get("cfx307-kwargs")
    if found is None:
        found = ctx.notes["cfx307-kwargs"] = {}
        for func in module_statements(ctx.document.tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.args.kwarg is None:
                continue
            named = {a.arg for a in func.args.args + func.args.kwonlyargs}  # not positional-only
            if "use_reentrant" not in named:
                continue
            kwargs = func.args.kwarg.arg
            uses, changed = [], False
            for node in walk_scope(func):
                if isinstance(node, ast.Name) and node.id == kwargs and isinstance(node.ctx, ast.Load):
                    uses.append(node)
                elif _changes(node, kwargs):
                    changed = True
            if not changed:
                found.update((id(use), func.name) for use in uses)
    return found


def _changes(node: ast.AST, name: str) -> bool:
    """`kwargs = ...`, `del kwargs`, `kwargs[k] = v`, `kwargs.update(...)`, `global kwargs`."""
    if isinstance(node, ast.Name):
        return node.id == name  # a store or a delete (loads are uses)
    if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.value, ast.Name) and node.value.id == name:
        return not isinstance(node.ctx, ast.Load) or (
            isinstance(node, ast.Attribute) and node.attr in ("update", "setdefault", "__setitem__", "pop", "clear"))
    return isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names


@register
class CheckpointWithoutUseReentrant(Rule):
    """## What it does
    Flags `torch.utils.checkpoint.checkpoint(...)` and `checkpoint_sequential(...)` calls
    (however imported: `from torch.utils.checkpoint import checkpoint`,
    `import torch.utils.checkpoint as cp`) that do not pass `use_reentrant`, and
    `gradient_checkpointing_kwargs` dicts (of `gradient_checkpointing_enable` or
    `TrainingArguments`) that do not set it either: transformers hands those dicts to
    torch's `checkpoint` as they are.

    ## Why is this bad?
    Without it torch picks the *reentrant* variant and warns: "torch.utils.
    checkpoint: the use_reentrant parameter should be passed explicitly ... use_reentrant=False
    is recommended". The docs announced an exception for a missing `use_reentrant` (for 2.4,
    then 2.9); torch 2.13 still only warns, so nothing forces the choice. The reentrant
    variant drops gradients when no *input* of the checkpointed block requires grad (frozen
    embeddings, LoRA, a frozen backbone), does not support `torch.autograd.grad`, and rejects
    keyword arguments for the checkpointed function. Saying which variant you want makes the behaviour explicit and
    survives the day the default changes.

    ## Example
    ```python
    from torch.utils.checkpoint import checkpoint
    hidden = checkpoint(layer, hidden, attention_mask)
    ```

    ## Use instead
    ```python
    hidden = checkpoint(layer, hidden, attention_mask, use_reentrant=False)
    ```

    ## Fix safety
    Unsafe: it switches to the non-reentrant variant, whose gradients are the same but
    whose memory profile, RNG handling and hooks differ slightly (and which, unlike the
    reentrant one, does produce gradients for blocks whose inputs are frozen). Pass
    `use_reentrant=True` instead to keep the current behaviour and silence the warning.
    Calls with `**kwargs` that may carry `use_reentrant` and kwargs dicts held in
    variables are left alone (a function's own `**kwargs` cannot carry it when
    `use_reentrant` is one of the function's named parameters and the dict is not filled); on torch < 1.11 (`checkpoint`) or < 2.0
    (`checkpoint_sequential`), which have no such parameter, nothing is flagged, and neither is
    a call that only such a torch reaches: the `else` of `if is_torch_version(">=", "1.11.0"):`
    (or of `version.parse(torch.__version__) >= ...`, `is_torch_greater_or_equal(...)`), the
    shared analysis's version guards (`analysis/version_guards.py`).

    ## Versions
    `torch.utils.checkpoint.checkpoint` without `use_reentrant` is flagged unless the
    project's torch is known to be older than 1.11 (2.0 for `checkpoint_sequential`),
    where the parameter did not exist; every torch still in use has it, so no pin is
    needed. A `TrainingArguments(gradient_checkpointing_kwargs=...)` dict without the key is
    flagged only when transformers is known to be 4.x: transformers 5's Trainer passes such
    a dict on as `use_reentrant=False`, and that current release is what cfgfix assumes
    where nothing is pinned.

    ## References
    - facts A4: torch 2.13 `checkpoint.py` L486-496 (the warning; default still True).
    - PyTorch docs, `torch.utils.checkpoint.checkpoint`: "The `use_reentrant` parameter should
      be passed explicitly." (pytorch/pytorch#116710).
    """

    code = "CFX307"
    name = "checkpoint-without-use-reentrant"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    triggers = ((b"checkpoint(", b"checkpoint_sequential(", b"checkpointing_kwargs"),)
    trigger_check = staticmethod(_may_checkpoint)

    VALID = [
        Example(
            "from torch.utils.checkpoint import checkpoint\n"
            "def forward(self, x):\n"
            "    return checkpoint(self.block, x, use_reentrant=False)\n",
            why="an explicit use_reentrant",
        ),
        Example(
            "from torch.utils import checkpoint as ckpt\n"
            "out = ckpt.checkpoint(block, x, use_reentrant=True)\n",
            why="an explicit use_reentrant=True keeps today's behaviour on purpose",
        ),
        Example(
            "import torch\n"
            "def forward(self, x):\n"
            "    return torch.utils.checkpoint.checkpoint(self.block, x, **self.ckpt_kwargs)\n",
            why="`**kwargs` may carry use_reentrant (the diffusers pattern)",
        ),
        Example(
            "from torch.utils.checkpoint import checkpoint\n"
            "def ckpt(fn, *args, use_reentrant=True, **kwargs):\n"
            "    kwargs['use_reentrant'] = use_reentrant\n"
            "    return checkpoint(fn, *args, **kwargs)\n",
            why="the function puts its parameter into the `**kwargs` it passes on",
        ),
        Example(
            "def run(fn, *args, **kwargs):\n"
            "    from torch.utils.checkpoint import checkpoint\n"
            "    return checkpoint(fn, *args, **kwargs)\n",
            why="a caller's `use_reentrant=` lands in `**kwargs` (imported inside the function)",
        ),
        Example(
            "import deepspeed\n"
            "def forward(self, x):\n"
            "    return deepspeed.checkpointing.checkpoint(self.block, x)\n",
            why="another library's checkpoint function",
        ),
        Example(
            "from torch.utils.checkpoint import checkpoint_sequential\n"
            "out = checkpoint_sequential(model, 4, x, False)\n",
            why="use_reentrant passed positionally to checkpoint_sequential",
        ),
        Example(
            "from torch.utils.checkpoint import checkpoint\n"
            "out = checkpoint(block, x)\n",
            why="torch 1.10 has no use_reentrant parameter",
            files={"requirements.txt": "torch==1.10.2\n"},
        ),
        Example(
            "import torch\n"
            "from diffusers.utils import is_torch_version\n"
            "def forward(self, x):\n"
            "    if is_torch_version('>=', '1.11.0'):\n"
            "        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)\n"
            "    else:\n"
            "        return torch.utils.checkpoint.checkpoint(self.block, x)\n",
            why="the else branch of a torch-version test runs only on torch < 1.11, which has no use_reentrant",
        ),
        Example(
            "import torch\n"
            "from packaging import version\n"
            "from torch.utils.checkpoint import checkpoint\n"
            "def forward(self, x):\n"
            "    if version.parse(torch.__version__) < version.parse('1.11'):\n"
            "        return checkpoint(self.block, x)\n"
            "    return checkpoint(self.block, x, use_reentrant=False)\n",
            why="a parsed `torch.__version__` compared with an older release",
        ),
        Example(
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)\n",
            why="a kwargs dict held in a variable",
        ),
        Example(
            "model.gradient_checkpointing_enable()\n",
            why="no kwargs: transformers passes use_reentrant itself",
        ),
        Example(
            "from transformers import TrainingArguments\n"
            "args = TrainingArguments('out', gradient_checkpointing_kwargs={'preserve_rng_state': False})\n",
            why="kwargs without checkpointing turned on are never used",
        ),
        Example(
            "from torch.utils.checkpoint import checkpoint\n"
            "layer_fn = checkpoint\n"
            "self._gradient_checkpointing_func = checkpoint\n",
            why="references to the function, not calls",
        ),
    ]
    INVALID = [
        Example(
            "from torch.utils.checkpoint import checkpoint\n"
            "def forward(self, x):\n"
            "    for block in self.blocks:\n"
            "        x = checkpoint(block, x)\n"
            "    return x\n",
            why="the plain call",
            line=4,
            fixed="from torch.utils.checkpoint import checkpoint\n"
            "def forward(self, x):\n"
            "    for block in self.blocks:\n"
            "        x = checkpoint(block, x, use_reentrant=False)\n"
            "    return x\n",
        ),
        Example(
            "import torch.utils.checkpoint as cp\n"
            "out = cp.checkpoint_sequential(layers, 2, x)\n",
            why="a module alias and checkpoint_sequential",
            line=2,
            fixed="import torch.utils.checkpoint as cp\n"
            "out = cp.checkpoint_sequential(layers, 2, x, use_reentrant=False)\n",
        ),
        Example(
            "import torch\n"
            "h = torch.utils.checkpoint.checkpoint(self.mlp, *inputs, preserve_rng_state=False)\n",
            why="the fully qualified spelling with other keywords and *args",
            line=2,
            fixed="import torch\n"
            "h = torch.utils.checkpoint.checkpoint(self.mlp, *inputs, preserve_rng_state=False, use_reentrant=False)\n",
        ),
        Example(
            "def gradient_checkpointing(func, *args, use_reentrant: bool = True, **kwargs):\n"
            "    from torch.utils.checkpoint import checkpoint\n"
            "    if use_reentrant:\n"
            "        return checkpoint(func, *args, **kwargs)\n"
            "    return checkpoint(func, *args, use_reentrant=False, **kwargs)\n",
            why="`use_reentrant` is the function's own parameter, so its `**kwargs` never holds it "
            "(and `checkpoint` is imported inside the function)",
            line=4,
            fixed="def gradient_checkpointing(func, *args, use_reentrant: bool = True, **kwargs):\n"
            "    from torch.utils.checkpoint import checkpoint\n"
            "    if use_reentrant:\n"
            "        return checkpoint(func, *args, **kwargs, use_reentrant=False)\n"
            "    return checkpoint(func, *args, use_reentrant=False, **kwargs)\n",
        ),
        Example(
            "import torch\n"
            "from diffusers.utils import is_torch_version\n"
            "def forward(self, x):\n"
            "    if is_torch_version('>=', '2.0'):\n"
            "        return self.fast(x)\n"
            "    else:\n"
            "        return torch.utils.checkpoint.checkpoint(self.block, x)\n",
            why="the else of a torch >= 2.0 test still runs on torch 1.11-1.13, which has use_reentrant",
            line=7,
            fixed="import torch\n"
            "from diffusers.utils import is_torch_version\n"
            "def forward(self, x):\n"
            "    if is_torch_version('>=', '2.0'):\n"
            "        return self.fast(x)\n"
            "    else:\n"
            "        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)\n",
        ),
        Example(
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False})\n",
            why="a kwargs dict without use_reentrant reaches torch's checkpoint as it is",
            line=1,
            fixed="model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False, \"use_reentrant\": False})\n",
        ),
        Example(
            "from transformers import TrainingArguments\n"
            "args = TrainingArguments('out', gradient_checkpointing=True, gradient_checkpointing_kwargs={})\n",
            why="TrainingArguments with an empty kwargs dict on transformers 4",
            line=2,
            files={"requirements.txt": "transformers==4.46.3\n"},
            fixed="from transformers import TrainingArguments\n"
            "args = TrainingArguments('out', gradient_checkpointing=True, gradient_checkpointing_kwargs={\"use_reentrant\": False})\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        src = ctx.source
        flagged = set()
        if may_break_peft(src.text):  # what CFX306 reports, CFX307 leaves alone
            from cfgfix.analysis.peft_checkpointing import peft_analysis

            flagged = {id(hit.flagged_call) for hit in peft_analysis(ctx).hits}
        calls = _named_calls(ctx)
        torch = guards = None  # asked only about a checkpoint call (~4 ms on a large module)
        for name, call in calls:
            if name not in (TORCH_CHECKPOINT, TORCH_SEQUENTIAL):
                continue
            if torch is None:
                from cfgfix.analysis.version_guards import version_guards  # ~1 ms to import

                torch, guards = ctx.versions.get("torch"), version_guards(ctx)
            sequential = name == TORCH_SEQUENTIAL
            since = "2.0" if sequential else "1.11"
            if torch.below(since) is True:
                continue  # no such parameter yet
            if guards is not None and guards.runs_only_below(call, "torch", since):
                continue  # the branch of a torch-version test that only older torch takes
            if any(k.arg == "use_reentrant" for k in call.keywords):
                continue
            spread = [k for k in call.keywords if k.arg is None]
            if spread and not all(id(k.value) in _kwargs_without_reentrant(ctx) for k in spread):
                continue  # `**kwargs` may carry use_reentrant
            if sequential and len(call.args) >= 4:
                continue  # checkpoint_sequential(functions, segments, input, use_reentrant)
            spelled = src.node_text(call.func)
            edit = python_edits.add_keyword(src, call, "use_reentrant=False")
            owner = _kwargs_without_reentrant(ctx).get(id(spread[0].value)) if spread else None
            yield self.finding(
                src.span_of_node(call),
                f"`{spelled}(...)` does not pass `use_reentrant`"
                + (f" (`**{spread[0].value.id}` cannot carry it: `use_reentrant` is a parameter of `{owner}()` itself)"
                   if owner else "")
                + ": torch falls back to the reentrant "
                "variant and warns. That variant gives no gradient to a block whose "
                "inputs do not require grad (frozen embeddings, LoRA) and the docs announce an "
                "error for the missing argument. Pass `use_reentrant=False` (recommended) or `True` "
                "to keep today's behaviour.",
                fix=Fix((edit,), "Pass `use_reentrant=False`", Applicability.UNSAFE) if edit else None,
            )
        for name, call in calls:
            if id(call) in flagged:
                continue
            method = call.func.attr if isinstance(call.func, ast.Attribute) else None
            if method in GC_METHODS:
                value, _ = kwargs_argument(call, GC_METHODS[method])
                if isinstance(value, (ast.Dict, ast.Call)) and use_reentrant_of(value) == "missing":
                    yield self._dict_finding(src, value, f"`{method}`")
                continue
            if not (name and name.startswith("transformers.") and name.endswith("TrainingArguments")):
                continue
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            flag_on = any(
                k in keywords and not (isinstance(keywords[k], ast.Constant) and not keywords[k].value)
                for k in TRAINING_FLAGS
            )
            value = next((keywords[k] for k in TRAINING_FLAGS.values() if k in keywords), None)
            if not flag_on or not isinstance(value, (ast.Dict, ast.Call)) or use_reentrant_of(value) != "missing":
                continue
            if trainer_drops(value) and ctx.versions.get("transformers").below("5") is not True:
                continue  # transformers 5's Trainer turns such a dict into None (use_reentrant=False)
            yield self._dict_finding(src, value, "`TrainingArguments`")

    def _dict_finding(self, src, value, owner: str) -> Finding:
        edit = set_reentrant_false(src, value)
        return self.finding(
            src.span_of_node(value),
            f"The checkpointing kwargs given to {owner} do not set `use_reentrant`: transformers passes "
            "them to `torch.utils.checkpoint.checkpoint` as they are, so torch falls back to the "
            "reentrant variant and warns (the variant that gives frozen-input blocks, "
            "e.g. LoRA, no gradient). Add `\"use_reentrant\": False` (recommended) or `True`.",
            fix=Fix((edit,), "Set `use_reentrant` to False", Applicability.UNSAFE) if edit else None,
        )
