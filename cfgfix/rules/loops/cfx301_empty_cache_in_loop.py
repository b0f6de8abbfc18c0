"""CFX301 empty-cache-in-loop."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from cfgfix.analysis.loop_text import header_span, in_loop_text
from cfgfix.analysis.loops import (
    MODEL_LOADS,
    identifiers,
    last_part,
    loop_analysis,
    module_like,
    over_spelled_out_collection,
)
from cfgfix.analysis.names import dotted, module_statements
from cfgfix.analysis.steps import STEP_HOOK_DEF, step_functions
from cfgfix.analysis.structure import Loop
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache")


_BOUNDARY_CALL = re.compile(
    r"^_*(?:evaluate|validate|validation|eval|val|test|save|log_validation|generate|sample|checkpoint|export|push_to_hub)"
    r"|(?:_eval|_evaluation|_validation|_validate|_save|_checkpoint|_test)$"
)
_PURE_CALLS = frozenset({"torch.cuda.is_available", "len"})

_TRAIN_LOOP = """\
import gc
import torch

for epoch in range(epochs):
    for step, batch in enumerate(train_loader):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


@register
class EmptyCacheInLoop(Rule):
    """## What it does
    Flags `torch.cuda.empty_cache()` inside a training or evaluation step loop: a loop whose
    body runs a backward pass, an optimizer step or a forward pass over the batches of a data
    loader, every iteration or every few (`if step % 10 == 0`, `if i % self.clear_every == 0`).
    Also in code a framework runs once per step, whose loop lives in the library: a
    `TrainerCallback`'s `on_step_end`/`on_substep_end`, a `Trainer` subclass's
    `training_step`/`compute_loss`, a Lightning `training_step`/`on_train_batch_end`; and
    the per-batch hooks of the frameworks' evaluation loops: a `Trainer` subclass's
    `prediction_step` and a callback's `on_prediction_step`, a Lightning module's
    `validation_step`/`test_step`/`predict_step`, and the `on_validation_batch_end`,
    `on_test_batch_end`, `on_predict_batch_end` hooks (and their `_start` twins) of a
    Lightning module or callback. A loop's step may be a method of a helper object the
    code builds from a project class (`trainer = DPOTrainer(engine, args)`, either class of
    `cls = A if unsup else B`, `self.trainer = ...`; the class in this module or another,
    the method its own or inherited from a project base) that runs the backward pass or the
    optimizer step itself: `for batch in loader: trainer.train_dpo(batch)`.
    And in a helper that a step loop or a per-step hook calls every iteration, also inside a
    loop of the helper's own over a collection the code spells out (`for key in ("chosen",
    "rejected"):`, the `.items()` of a dict literal): that loop runs a few times per step.
    The helper may be a method of an object the code builds from its class
    (`self.memory_manager = MemoryManager()`, then `self.memory_manager.after_batch()` in the
    loop), and the caller may be another module of the project that imports the helper or
    its class (`utils/memory.py` is reported, the loop in `train.py` is named).

    ## Why is this bad?
    It never lowers the peak. `empty_cache()` only hands back cached blocks that no tensor
    uses; the memory your tensors hold stays. It first synchronises the device, and the next
    step has to `cudaMalloc` every block again, so the loop gets slower. It does not prevent
    an out-of-memory error either: before raising one, the caching allocator already frees
    its cached blocks and retries by itself.

    ## Example
    ```python
    for step, batch in enumerate(train_loader):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        gc.collect()
        torch.cuda.empty_cache()
    ```

    ## Use instead
    ```python
    for step, batch in enumerate(train_loader):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    Call it at phase boundaries, where another process or library needs memory that this
    one will not use again: after training, between two models, after evaluation. cfgfix
    stays silent there: outside step loops, in loops over models or checkpoints (one
    loaded, or built by a factory such as `get_policy_model(...)` and deleted, every
    iteration; a factory call is not a forward pass), in an
    `except` handler (out-of-memory recovery), in a helper with a pass over data of its own
    (a loader, a dataset, `range(n)`), in a branch that also evaluates or saves,
    in a branch that runs once (`if step == 0 and epoch == 0`), in epoch-end hooks and
    hooks that run once per evaluation (`on_evaluate`, `on_validation_epoch_end`), in a
    callback that the module only builds into a name nothing reads (its `callbacks=[cb]`
    commented out: no trainer calls it), and
    behind an explicit option that can be off (`if args.empty_cache_steps and ...`).

    ## Fix safety
    Safe: the call changes no value and no result. The fix removes it, together with a
    `gc.collect()` right beside it in the same block and a comment right above them that
    talks about the cache; a block left empty becomes `pass`, and an `if` that only did
    this (`if step % 10 == 0: torch.cuda.empty_cache()`) goes as a whole.

    ## References
    - facts A7: `torch/cuda/memory.py` ("`empty_cache` doesn't increase the amount of GPU
      memory available for PyTorch"); `c10/cuda/CUDACachingAllocator.cpp`
      (`release_cached_blocks` synchronises, and a failed `cudaMalloc` frees cached blocks
      and retries before raising).
    - PyTorch docs, notes/cuda: "the occupied GPU memory by tensors will not be freed".
    """

    code = "CFX301"
    name = "empty-cache-in-loop"
    severity = Severity.WARNING
    fix_availability = "safe"
    triggers = ((b"empty_cache",),)
    trigger_check = staticmethod(
        lambda data: _word_in_loop_text(data, b"empty_cache") or STEP_HOOK_DEF.search(data) is not None
        or _helper_called_in_loop(data, b"empty_cache") or _in_a_def(data, b"empty_cache")
    )

    VALID = [
        Example(
            "import torch\n"
            "def evaluate(model, eval_loader):\n"
            "    for batch in eval_loader:\n"
            "        model(**batch)\n"
            "    torch.cuda.empty_cache()\n"
            "for step, batch in enumerate(loader):\n"
            "    model(**batch).loss.backward()\n"
            "    optimizer.step()\n"
            "    if step % 500 == 0:\n"
            "        evaluate(model, eval_loader)\n",
            why="a helper with a pass over data of its own is a phase: evaluation, then free",
        ),
        Example(
            "import torch\nfrom transformers import TrainerCallback\n"
            "class Cleanup(TrainerCallback):\n"
            "    def on_epoch_end(self, args, state, control, **kwargs):\n"
            "        torch.cuda.empty_cache()\n",
            why="an epoch-end hook is a phase boundary, not a step",
        ),
        Example(
            "import torch\nfrom transformers import TrainerCallback\n"
            "class Cleanup(TrainerCallback):\n"
            "    def on_evaluate(self, args, state, control, metrics=None, **kwargs):\n"
            "        torch.cuda.empty_cache()\n",
            why="`on_evaluate` runs once after a whole evaluation, not per evaluation batch",
        ),
        Example(
            "import torch\nimport lightning as L\n"
            "class Model(L.LightningModule):\n"
            "    def on_validation_epoch_end(self):\n"
            "        torch.cuda.empty_cache()\n",
            why="once per validation run: a phase boundary",
        ),
        Example(
            _TRAIN_LOOP.replace("        optimizer.zero_grad()\n",
                                "        optimizer.zero_grad()\n        if step == 0 and epoch == 0:\n"
                                "            torch.cuda.empty_cache()\n"),
            why="once, after the first step (`step == 0 and epoch == 0`), not per step",
        ),
        Example(
            _TRAIN_LOOP + "del optimizer\ngc.collect()\ntorch.cuda.empty_cache()\n",
            why="after the training loop: a phase boundary",
        ),
        Example(
            "import torch\nfrom transformers import AutoModel\n"
            "for name in ['a', 'b']:\n"
            "    model = AutoModel.from_pretrained(name).cuda()\n"
            "    for batch in loader:\n"
            "        scores.append(model(**batch).logits)\n"
            "    del model\n"
            "    torch.cuda.empty_cache()\n",
            why="a loop over models: one model per iteration",
        ),
        Example(
            "import torch\n"
            "for ckpt in checkpoints:\n"
            "    model.load_state_dict(torch.load(ckpt))\n"
            "    out = model(batch)\n"
            "    torch.cuda.empty_cache()\n",
            why="a loop over checkpoints",
        ),
        Example(
            _TRAIN_LOOP + "    model.eval()\n    evaluate(model)\n    torch.cuda.empty_cache()\n",
            why="once per epoch, after evaluation: not inside the step loop",
        ),
        Example(
            "import torch\n"
            "for step, batch in enumerate(loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    if step % eval_steps == 0:\n"
            "        evaluate(model, eval_loader)\n"
            "        torch.cuda.empty_cache()\n",
            why="in a branch that evaluates: a phase boundary inside the loop",
        ),
        Example(
            "import torch\n"
            "for batch in loader:\n"
            "    try:\n"
            "        loss = model(**batch).loss\n"
            "        loss.backward()\n"
            "        optimizer.step()\n"
            "    except torch.cuda.OutOfMemoryError:\n"
            "        optimizer.zero_grad()\n"
            "        torch.cuda.empty_cache()\n",
            why="out-of-memory recovery in an except handler",
        ),
        Example(
            "import torch\n"
            "for step, batch in enumerate(loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    if args.empty_cache_steps and step % args.empty_cache_steps == 0:\n"
            "        torch.cuda.empty_cache()\n",
            why="behind an explicit option the user turns on",
        ),
        Example(
            "import torch\n"
            "for path in image_paths:\n"
            "    image = pipe(prompt, image=load(path)).images[0]\n"
            "    torch.cuda.empty_cache()\n",
            why="a loop over files through a pipeline: no training or evaluation step",
        ),
        Example(
            "import gc\nimport torch\n"
            "candidates = generate_candidates(model, tickets)\n"
            "del model\ngc.collect()\ntorch.cuda.empty_cache()\n"
            "model = load_reranker()\n",
            why="between two models, not in a loop",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "for step, batch in enumerate(loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    if step % 10 == 0 and args.rank == 0:\n"
            "        torch.cuda.empty_cache()\n",
            why="every 10 steps on rank 0: periodic, not once (`rank == 0` says which process, not when)",
            line=7,
            fixed="import torch\n"
            "for step, batch in enumerate(loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
        ),
        Example(
            "import torch\n"
            "def forward_pair(model, batch):\n"
            "    logits = {}\n"
            "    for key in ('chosen', 'rejected'):\n"
            "        logits[key] = model(**batch[key]).logits\n"
            "        torch.cuda.empty_cache()\n"
            "    return logits\n"
            "for batch in loader:\n"
            "    loss = dpo_loss(forward_pair(model, batch))\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
            why="a helper's loop over a spelled-out pair runs twice per step, not a phase",
            line=6,
            fixed="import torch\n"
            "def forward_pair(model, batch):\n"
            "    logits = {}\n"
            "    for key in ('chosen', 'rejected'):\n"
            "        logits[key] = model(**batch[key]).logits\n"
            "    return logits\n"
            "for batch in loader:\n"
            "    loss = dpo_loss(forward_pair(model, batch))\n"
            "    loss.backward()\n"
            "    optimizer.step()\n",
        ),
        Example(
            "import torch\nfrom transformers import TrainerCallback\n"
            "class ClearCache(TrainerCallback):\n"
            "    def on_step_end(self, args, state, control, **kwargs):\n"
            "        torch.cuda.empty_cache()\n",
            why="a callback's `on_step_end` runs every step; its loop is in the Trainer",
            line=5,
            fixed="import torch\nfrom transformers import TrainerCallback\n"
            "class ClearCache(TrainerCallback):\n"
            "    def on_step_end(self, args, state, control, **kwargs):\n"
            "        pass\n",
        ),
        Example(
            "import torch\nfrom lightning.pytorch.callbacks import Callback\n"
            "class ClearMemory(Callback):\n"
            "    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):\n"
            "        torch.cuda.empty_cache()\n",
            why="Lightning's test loop calls `on_test_batch_end` after every test batch",
            line=5,
            fixed="import torch\nfrom lightning.pytorch.callbacks import Callback\n"
            "class ClearMemory(Callback):\n"
            "    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):\n"
            "        pass\n",
        ),
        Example(
            "import torch\nfrom transformers import Trainer\n"
            "class MyTrainer(Trainer):\n"
            "    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):\n"
            "        outputs = model(**inputs)\n"
            "        torch.cuda.empty_cache()\n"
            "        return outputs.loss\n",
            why="a Trainer subclass's `compute_loss` runs every step",
            line=6,
            fixed="import torch\nfrom transformers import Trainer\n"
            "class MyTrainer(Trainer):\n"
            "    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):\n"
            "        outputs = model(**inputs)\n"
            "        return outputs.loss\n",
        ),
        Example(
            "import torch\n"
            "class Runner:\n"
            "    def train(self, loader):\n"
            "        for batch_idx, batch in enumerate(loader):\n"
            "            self.model(**batch).loss.backward()\n"
            "            self.optimizer.step()\n"
            "            if batch_idx % self.cache_clear_frequency == 0:\n"
            "                torch.cuda.empty_cache()\n",
            why="a frequency named after the cache is not an option that can be off: it runs every N steps",
            line=8,
            fixed="import torch\n"
            "class Runner:\n"
            "    def train(self, loader):\n"
            "        for batch_idx, batch in enumerate(loader):\n"
            "            self.model(**batch).loss.backward()\n"
            "            self.optimizer.step()\n",
        ),
        Example(
            "import gc\nimport torch\n"
            "for step, batch in enumerate(train_loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    optimizer.zero_grad()\n"
            "    # free cached blocks so the next step does not OOM\n"
            "    gc.collect()\n"
            "    torch.cuda.empty_cache()\n"
            "\n"
            "    if step >= max_steps:\n"
            "        break\n",
            why="every step, with a `gc.collect()` beside it: both go, with the comment about them",
            line=10,
            fixed="import gc\nimport torch\n"
            "for step, batch in enumerate(train_loader):\n"
            "    loss = model(**batch).loss\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    optimizer.zero_grad()\n"
            "\n"
            "    if step >= max_steps:\n"
            "        break\n",
        ),
        Example(
            "import torch\n"
            "def train(model, loader, optimizer):\n"
            "    for step, batch in enumerate(loader):\n"
            "        model(**batch).loss.backward()\n"
            "        optimizer.step()\n"
            "        if step % 10 == 0:\n"
            "            torch.cuda.empty_cache()\n"
            "        optimizer.zero_grad()\n",
            why="every 10 steps: the whole `if` goes",
            line=7,
            fixed="import torch\n"
            "def train(model, loader, optimizer):\n"
            "    for step, batch in enumerate(loader):\n"
            "        model(**batch).loss.backward()\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n",
        ),
        Example(
            "import torch\n"
            "model.eval()\n"
            "with torch.no_grad():\n"
            "    for batch in eval_loader:\n"
            "        preds.append(model(**batch).logits.argmax(-1))\n"
            "        torch.cuda.empty_cache()\n",
            why="an evaluation step loop: a forward pass per batch",
            line=6,
            fixed="import torch\n"
            "model.eval()\n"
            "with torch.no_grad():\n"
            "    for batch in eval_loader:\n"
            "        preds.append(model(**batch).logits.argmax(-1))\n",
        ),
        Example(
            "from torch.cuda import empty_cache\n"
            "def train_step(batch):\n"
            "    loss = model(**batch).loss\n"
            "    accelerator.backward(loss)\n"
            "    optimizer.step()\n"
            "for batch in loader:\n"
            "    train_step(batch)\n"
            "    if clean:\n"
            "        empty_cache()\n"
            "    else:\n"
            "        log(batch)\n",
            why="an imported alias; the step in a function; a branch with an else keeps `pass`",
            line=9,
            fixed="from torch.cuda import empty_cache\n"
            "def train_step(batch):\n"
            "    loss = model(**batch).loss\n"
            "    accelerator.backward(loss)\n"
            "    optimizer.step()\n"
            "for batch in loader:\n"
            "    train_step(batch)\n"
            "    if clean:\n"
            "        pass\n"
            "    else:\n"
            "        log(batch)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        hooks = None
        remote_only = False
        if not _call_line_in_loop(ctx, "empty_cache"):
            hooks = step_functions(ctx.document.tree, ctx.imports)
            data = ctx.source.text.encode("utf-8")
            if not hooks and not _helper_called_in_loop(data, b"empty_cache"):
                if not (ctx.project is not None and _in_a_def(data, b"empty_cache")):
                    return  # most modules: no need for the module index
                remote_only = True  # only another module can call the helper per step
        analysis = loop_analysis(ctx)
        src = ctx.source
        for site in ctx.index.calls_named(*EMPTY_CACHE):
            context = site.context
            scope = context.function or ctx.document.tree
            # A loop over a spelled-out collection (`for key in ("chosen", "rejected"):`)
            # runs where it stands: the loop around it decides how often.
            loops = [loop for loop in context.loops if not over_spelled_out_collection(loop, scope)]
            if loops:
                loop = loops[-1]
                kind = analysis.is_step_loop(loop)
                if kind is None:
                    continue
                where, related = f"the {kind} loop on line {loop.lineno}", Related(header_span(src, loop), f"the {kind} loop")
                top = loop
            elif context.function is None:
                continue
            else:  # a framework's per-step hook, or a helper a step loop calls
                if hooks is None:
                    hooks = step_functions(ctx.document.tree, ctx.imports)
                hook = hooks.get(id(context.function))
                if hook is not None:
                    where = hook.description
                    related = Related(src.span(*_def_range(src, hook.function)), f"runs once per {hook.step}")
                else:
                    callers = [] if remote_only else analysis.step_callers(context.function)
                    if _runs_a_phase(ctx, analysis, context.function):
                        continue
                    elsewhere = None if callers else _caller_elsewhere(ctx, analysis, context.function)
                    if not callers and elsewhere is None:
                        continue
                    if elsewhere is not None:
                        where, related = elsewhere
                    elif callers[0][1] is None:  # called from a framework's per-step hook
                        caller, loop, kind = callers[0]
                        where = (f"`{context.function.name}()`, called on line {caller.node.lineno} by "
                                 f"{kind.description}")
                        related = Related(src.span_of_node(caller.node), f"called once per {kind.step}")
                    else:
                        caller, loop, kind = callers[0]
                        where = (f"`{context.function.name}()`, which the {kind} loop on line {loop.lineno} "
                                 f"calls every iteration (line {caller.node.lineno})")
                        related = Related(src.span_of_node(caller.node), f"called every iteration of the {kind} loop")
                top = context.function
            chain = analysis.chain(context.stmt, top)
            if any(isinstance(node, ast.ExceptHandler) for node in chain):
                continue  # out-of-memory recovery runs once, not every step
            branches = [node for node in chain if isinstance(node, ast.If)]
            if any(_cache_option(node.test) for node in branches):
                continue  # an explicit option that can be off: the user asked for it
            if any(_runs_once(node.test) for node in branches):
                continue  # `if step == 0 and epoch == 0`: once, not per step
            if branches and self._phase_boundary(ctx, analysis, branches[0], context.stmt):
                continue
            how_often = "in a branch of" if branches else ("every iteration of" if loops else "in")
            yield self.finding(
                src.span_of_node(site.node),
                f"`{src.node_text(site.node)}` runs {how_often} {where}: it "
                "synchronises the GPU and gives cached blocks back to the driver, which the next step "
                "must `cudaMalloc` again. It does not lower peak memory (tensors in use are not "
                "cache), and the allocator already empties its cache and retries before it raises "
                "out-of-memory. Keep it for phase boundaries (after training, between models).",
                fix=self._fix(ctx, analysis, site),
                related=[related],
            )

    @staticmethod
    def _phase_boundary(ctx, analysis, branch: ast.If, stmt: ast.stmt) -> bool:
        """The branch holding the call also evaluates, saves, generates or runs a loop."""
        body = branch.body if _inside(branch.body, stmt) else branch.orelse
        scope = ctx.index.context_of_stmt(branch).function or ctx.document.tree
        for node in body:
            if any(isinstance(sub, Loop) and not over_spelled_out_collection(sub, scope) for sub in ast.walk(node)):
                return True
            for site in ctx.index.calls_within(node):
                name = last_part(site.name or dotted(site.node.func) or "")
                if site.method == "eval" or _BOUNDARY_CALL.search(name):
                    return True
        return False

    @staticmethod
    def _fix(ctx, analysis, site) -> Fix | None:
        src = ctx.source
        stmt = site.context.stmt
        if not (isinstance(stmt, ast.Expr) and stmt.value is site.node):
            return None
        block = list(site.context.block)
        index = next(i for i, s in enumerate(block) if s is stmt)
        drop = [stmt] + [
            block[j] for j in (index - 1, index + 1) if 0 <= j < len(block) and _is_gc_collect(ctx, block[j])
        ]
        drop.sort(key=lambda s: s.lineno)
        remaining = [s for s in block if not any(s is d for d in drop)]
        owner = analysis.parents.get(id(stmt))
        if remaining:
            edits = [_delete_lines(src, drop)]
        elif isinstance(owner, ast.If) and owner.body and owner.body[0] is block[0] and not owner.orelse and _pure(ctx, owner.test):
            if ctx.index.context_of_stmt(owner).sole_in_block:
                edits = [python_edits.delete_statement(src, owner, True)]
            else:
                edits = [_delete_lines(src, [owner])]
        else:
            edits = [python_edits.delete_statement(src, drop[0], True)] + [
                python_edits.delete_statement(src, s, False) for s in drop[1:]
            ]
        if any(edit is None for edit in edits):
            return None
        what = "`torch.cuda.empty_cache()`" + (" and `gc.collect()`" if len(drop) > 1 else "")
        return Fix(tuple(edits), f"Remove {what} from the step loop", Applicability.SAFE)


_CACHE_COMMENT = re.compile(r"cache|memory|fragment|\boom\b|gc\b|\bfree", re.IGNORECASE)


def _delete_lines(src, stmts: list[ast.stmt]):
    """Delete adjacent whole-line statements as one edit, with a comment block right above
    them that talks about the cache (it would describe nothing now), and one of two blank
    lines that would end up next to each other. None when a statement shares its lines."""
    if any(python_edits.delete_statement(src, s, False) is None for s in stmts):
        return None
    first = min(s.lineno for s in stmts)
    last = max(s.end_lineno or s.lineno for s in stmts)
    indent = src.line_text(first)[: len(src.line_text(first)) - len(src.line_text(first).lstrip())]
    top = first
    while top > 1 and src.line_text(top - 1).startswith(indent + "#"):
        top -= 1
    if top < first and any(_CACHE_COMMENT.search(src.line_text(row)) for row in range(top, first)):
        first = top
    rows = len(src.line_starts)
    if 1 < first and last < rows and not src.line_text(first - 1).strip() and not src.line_text(last + 1).strip():
        last += 1
    start = src.line_starts[first - 1]
    end = src.line_starts[last] if last < rows else len(src.text)
    return python_edits.Edit(src.path, start, end, "")


_DEF = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.MULTILINE)


def _helper_called_in_loop(data: bytes, word: bytes) -> bool:
    """Text only: `word` inside a function whose name is called on a line inside a loop
    (`def _cleanup_memory(self): ... empty_cache()` and `while ...: self._cleanup_memory()`)."""
    pos = data.find(word)
    while pos >= 0:
        heads = [m for m in _DEF.finditer(data, 0, pos)]
        if heads:
            name = heads[-1].group(1) + b"("
            if _word_in_loop_text(data, name):
                return True
        pos = data.find(word, pos + 1)
    return False


def _caller_elsewhere(ctx, analysis, function):
    """(where, related) for a helper that another module of the project calls once per step
    (`self.memory = MemoryManager()` in the trainer's module, `self.memory.after_batch()` in
    its training loop); None when none does. The modules read are recorded as the file's
    dependencies (a change there recomputes this file's findings)."""
    found = analysis.project_step_callers(function, ctx.project, ctx.path)
    if not found:
        return None
    module, caller, loop, kind = found[0]
    ctx.functions.deps.add(str(module.path))
    span = module.source_text().span_of_node(caller.node)
    if loop is None:
        where = f"`{function.name}()`, called by {kind.description} ({module.display}:{caller.node.lineno})"
        return where, Related(span, f"called once per {kind.step}")
    where = (f"`{function.name}()`, which the {kind} loop in {module.display} (line {loop.lineno}) calls "
             f"every iteration (line {caller.node.lineno})")
    return where, Related(span, f"called every iteration of the {kind} loop")



def _in_a_def(data: bytes, word: bytes) -> bool:
    """Text only: `word` after a `def` (in a function or method another module may call)."""
    pos = data.find(word)
    return pos >= 0 and _DEF.search(data, 0, pos) is not None


def _runs_a_phase(ctx, analysis, function) -> bool:
    """A helper with a loop of its own, or one that loads or deletes a model, is a whole
    phase (evaluate a checkpoint, then free it): its `empty_cache()` is a boundary. A loop
    over a spelled-out collection (`for key in ("chosen", "rejected"):`) is not a phase:
    it runs a few times, per step when the helper runs per step."""
    for node in ast.walk(function):
        if isinstance(node, Loop) and not over_spelled_out_collection(node, function):
            return True
        if isinstance(node, ast.Delete) and any(module_like(dotted(t)) for t in node.targets):
            return True
    return any(site.method in MODEL_LOADS for site in ctx.index.calls_within(function))


def _def_range(src, function) -> tuple[int, int]:
    """From `def` to the end of its name: where a hook is shown."""
    start = src.offset(function.lineno, function.col_offset)
    line = src.line_text(function.lineno)
    name_at = line.find(function.name, function.col_offset)
    end = src.offset(function.lineno, name_at + len(function.name)) if name_at >= 0 else start
    return start, end


def _truth_operands(test: ast.expr) -> list[ast.expr]:
    """The operands whose truth the condition tests: `a and not b` -> [a, b]."""
    if isinstance(test, ast.BoolOp):
        return [o for value in test.values for o in _truth_operands(value)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _truth_operands(test.operand)
    return [test]


def _cache_option(test: ast.expr) -> bool:
    """An option that switches the call on or off (`if args.empty_cache:`, `if
    self.clear_cache and step % n == 0:`). A frequency alone (`if step % self.cache_every
    == 0`) is always on: it does not count."""
    for operand in _truth_operands(test):
        if isinstance(operand, (ast.Name, ast.Attribute)) and any("cache" in w for w in identifiers(operand)):
            return True
        if isinstance(operand, ast.Compare) and not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                                                        for n in ast.walk(operand)):
            if any("cache" in w for w in identifiers(operand)):
                return True  # `if args.empty_cache_mode != "never":`
    return False


_PROCESS_WORDS = ("rank", "process", "local", "world", "device", "gpu", "node", "main", "master")


def _runs_once(test: ast.expr) -> bool:
    """`step == 0`, `batch_cnt == 1 and epoch == 0`: an equality with a constant and no
    modulus, so the branch runs once, not every few steps. `step % 10 == 0 and args.rank == 0`
    is periodic: a modulus anywhere in the test keeps it so, and an equality on the process
    (`rank == 0`) says which process, not when."""
    operands = list(_truth_operands(test))
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for operand in operands for n in ast.walk(operand)):
        return False
    for operand in operands:
        if isinstance(operand, ast.Compare) and any(
                word in (getattr(n, "id", None) or getattr(n, "attr", None) or "").lower()
                for n in ast.walk(operand.left) for word in _PROCESS_WORDS):
            continue
        if (isinstance(operand, ast.Compare) and len(operand.ops) == 1 and isinstance(operand.ops[0], ast.Eq)
                and isinstance(operand.comparators[0], ast.Constant) and isinstance(operand.comparators[0].value, int)
                and not any(isinstance(n, ast.BinOp) for n in ast.walk(operand.left))):
            return True
    return False


def _call_line_in_loop(ctx, word: str) -> bool:
    """Text and statements only: a line that mentions `word` lies inside some loop."""
    src = ctx.source
    lines = set()
    pos = src.text.find(word)
    while pos >= 0:
        lines.add(src.position(pos)[0])
        pos = src.text.find(word, pos + 1)
    if not lines:
        return False
    for stmt in module_statements(ctx.document.tree):
        if isinstance(stmt, Loop) and any(stmt.lineno < line <= (stmt.end_lineno or stmt.lineno) for line in lines):
            return True
    return False


def _inside(body: list[ast.stmt], stmt: ast.stmt) -> bool:
    return any(node is stmt for top in body for node in ast.walk(top))


def _is_gc_collect(ctx, stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and ctx.index.imports.qualify(stmt.value.func) == "gc.collect"
    )


def _pure(ctx, test: ast.expr) -> bool:
    """A condition that can be dropped with its branch: no calls with side effects."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            if ctx.index.imports.qualify(node.func) not in _PURE_CALLS:
                return False
        elif not isinstance(
            node,
            (ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp,
             ast.Subscript, ast.operator, ast.cmpop, ast.boolop, ast.unaryop, ast.expr_context),
        ):
            return False
    return True


def _word_in_loop_text(data: bytes, word: bytes) -> bool:
    """Text only: `word` on a line inside a `for`/`while` block by indentation."""
    pos = data.find(word)
    while pos >= 0:
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        if in_loop_text(data, start, data[start:end]):
            return True
        pos = data.find(word, end)
    return False
