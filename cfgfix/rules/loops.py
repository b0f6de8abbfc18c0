"""CFX301, CFX302, CFX303: memory hygiene in training and evaluation loops (Python)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Iterable

from cfgfix.analysis.loops import (
    BACKWARD,
    EVAL_FUNCTION,
    NUMBER,
    TENSOR,
    UNKNOWN,
    accumulator_uses,
    graph_origin,
    identifiers,
    last_part,
    loop_analysis,
    scope_flow,
    scope_statements,
    statements_in_loops,
)
from cfgfix.analysis.names import dotted, iter_statements
from cfgfix.analysis.structure import Loop
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.cuda.memory.empty_cache")
_LOOP_WORDS = (b"for ", b"while ")


# -- CFX301 ------------------------------------------------------------------------------

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
    loader, every iteration or every few (`if step % 10 == 0`).

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
    stays silent there: outside step loops, in loops over models or checkpoints, in an
    `except` handler (out-of-memory recovery), in a branch that also evaluates or saves,
    and behind an explicit option (`if args.empty_cache_steps and ...`).

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
    triggers = ((b"empty_cache",), _LOOP_WORDS)
    trigger_check = staticmethod(lambda data: _word_in_loop_text(data, b"empty_cache"))

    VALID = [
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
        if not _call_line_in_loop(ctx, "empty_cache"):
            return  # most modules: no need for the module index
        analysis = loop_analysis(ctx)
        src = ctx.source
        for site in ctx.index.calls_named(*EMPTY_CACHE):
            context = site.context
            if not context.loops:
                continue
            loop = context.loops[-1]
            kind = analysis.is_step_loop(loop)
            if kind is None:
                continue
            chain = analysis.chain(context.stmt, loop)
            if any(isinstance(node, ast.ExceptHandler) for node in chain):
                continue  # out-of-memory recovery runs once, not every step
            branches = [node for node in chain if isinstance(node, ast.If)]
            if any(any("cache" in word for word in identifiers(node.test)) for node in branches):
                continue  # an explicit option: the user asked for it
            if branches and self._phase_boundary(ctx, analysis, branches[0], context.stmt):
                continue
            how_often = "in a branch of" if branches else "every iteration of"
            yield self.finding(
                src.span_of_node(site.node),
                f"`{src.node_text(site.node)}` runs {how_often} the {kind} loop on line {loop.lineno}: it "
                "synchronises the GPU and gives cached blocks back to the driver, which the next step "
                "must `cudaMalloc` again. It does not lower peak memory (tensors in use are not "
                "cache), and the allocator already empties its cache and retries before it raises "
                "out-of-memory. Keep it for phase boundaries (after training, between models).",
                fix=self._fix(ctx, analysis, site),
                related=[Related(_header_span(src, loop), f"the {kind} loop")],
            )

    @staticmethod
    def _phase_boundary(ctx, analysis, branch: ast.If, stmt: ast.stmt) -> bool:
        """The branch holding the call also evaluates, saves, generates or runs a loop."""
        body = branch.body if _inside(branch.body, stmt) else branch.orelse
        for node in body:
            if any(isinstance(sub, Loop) for sub in ast.walk(node)):
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
    for stmt in iter_statements(ctx.document.tree.body):
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


def _header_span(src, loop: ast.stmt):
    """From `for`/`while` to the end of its iterable or test."""
    end_node = loop.iter if isinstance(loop, (ast.For, ast.AsyncFor)) else loop.test  # type: ignore[attr-defined]
    start = src.span_of_node(loop).start
    return src.span(start, src.span_of_node(end_node).end)


# -- CFX302 ------------------------------------------------------------------------------


_LOSS_WORDS = (b"oss", b"criterion")  # "oss": loss, Loss, cross_entropy
_LOSS_WORD = re.compile(rb"loss|Loss|criterion|cross_entropy")
# A whole line that accumulates into a plain name (what the rule handles): `acc += v`,
# `acc = acc + v`, `acc = v + acc`, `acc.append(v)`; group "value" is v.
_ACCUMULATE_LINE = re.compile(
    rb"[ \t]*(?P<acc>\w+)[ \t]*(?:\+=(?P<value>[^\n]*)"
    rb"|=[ \t]*(?:(?P=acc)[ \t]*\+(?P<right>[^\n]*)|(?P<left>[^\n]*)\+[ \t]*(?P=acc)[ \t]*(?:#[^\n]*)?$)"
    rb"|\.append\((?P<arg>[^\n]*))"
)
# Functions that build a loss for their caller: what they accumulate is meant to keep its graph.
_LOSS_BUILDER = re.compile(r"^(?:forward|__call__|.*loss.*)$", re.IGNORECASE)
_LOSS_BUILDER_DEF = re.compile(rb"(?:async\s+)?def\s+(?:forward|__call__|\w*(?:loss|Loss|LOSS)\w*)\s*\(")
_LOOP_HEAD = (b"for ", b"for(", b"while ", b"while(", b"async for ")
_BLOCK_HEAD = (b"if ", b"if(", b"elif ", b"else", b"try", b"except", b"finally", b"with ", b"async with", b"match ", b"case ", b"@")


def _may_accumulate_loss(data: bytes) -> bool:
    """Text only: a line that accumulates into a plain name (`+=`, `.append(`, `x = x + ...`)
    a value that mentions a loss, inside a `for`/`while` block by indentation. (`bytes.find`
    per word, then a match per line: much faster than a multi-line regex over large files.)"""
    for word in _LOSS_WORDS:
        pos = data.find(word)
        while pos >= 0:
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end
            line = data[start:end]
            match = _ACCUMULATE_LINE.match(line)
            if match is not None:
                value = match.group("value") or match.group("right") or match.group("left") or match.group("arg") or b""
                if _LOSS_WORD.search(value) and _in_loop_text(data, start, line, _LOSS_BUILDER_DEF):
                    return True
            pos = data.find(word, end)
    return False


def _word_in_loop_text(data: bytes, word: bytes) -> bool:
    """Text only: `word` on a line inside a `for`/`while` block by indentation."""
    pos = data.find(word)
    while pos >= 0:
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        if _in_loop_text(data, start, data[start:end]):
            return True
        pos = data.find(word, end)
    return False


def _in_loop_text(data: bytes, start: int, line: bytes, skip_function: re.Pattern | None = None) -> bool:
    """Walk up by indentation to the enclosing block headers: a `for`/`while` before the
    `def`/`class` (and, with `skip_function`, a `def` whose line it does not match)."""
    stripped = line.lstrip(b" \t")
    in_loop = stripped.startswith(_LOOP_HEAD)
    indent = len(line) - len(stripped)
    pos, budget = start, 3000
    while pos > 0 and budget:
        budget -= 1
        prev_start = data.rfind(b"\n", 0, pos - 1) + 1
        text = data[prev_start:pos - 1]
        pos = prev_start
        head = text.lstrip(b" \t")
        if not head or head.startswith(b"#") or len(text) - len(head) >= indent:
            continue
        if head.startswith((b"def ", b"async def ", b"class ")):
            return in_loop and not (skip_function is not None and skip_function.match(head))
        if head.startswith(_LOOP_HEAD):
            if skip_function is None:
                return True
            in_loop = True
            indent = len(text) - len(head)
        elif head.startswith(_BLOCK_HEAD):
            indent = len(text) - len(head)
        # anything else at a smaller indent continues a header over several lines
    return in_loop or budget == 0


def _accumulation(stmt: ast.stmt):
    """(accumulator name, accumulated value, accumulator Name nodes read by the statement)
    for `acc += v`, `acc = acc + v`, `acc = v + acc`, `acc.append(v)`; else None."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value, []
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.BinOp)
        and isinstance(stmt.value.op, ast.Add)
    ):
        name = stmt.targets[0].id
        left, right = stmt.value.left, stmt.value.right
        if isinstance(left, ast.Name) and left.id == name:
            return name, right, [left]
        if isinstance(right, ast.Name) and right.id == name:
            return name, left, [right]
        return None
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "append"
            and isinstance(func.value, ast.Name)
            and len(call.args) == 1
            and not call.keywords
            and not isinstance(call.args[0], ast.Starred)
        ):
            return func.value.id, call.args[0], [func.value]
    return None


def _may_carry_graph(value: ast.AST) -> bool:
    """A syntactic first look: a name, `x.loss`, `x["loss"]`, a call that is not `.item()`
    or `float(...)`, or arithmetic on one of those (not a tuple, a constant, a string)."""
    if isinstance(value, ast.Name):
        return True
    if isinstance(value, ast.Attribute):
        return value.attr == "loss"
    if isinstance(value, ast.Subscript):
        return isinstance(value.slice, ast.Constant) and value.slice.value == "loss"
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute):
            return func.attr not in ("item", "detach", "tolist", "numpy")
        return not (isinstance(func, ast.Name) and func.id in ("float", "int", "round", "len", "str"))
    if isinstance(value, ast.BinOp):
        return _may_carry_graph(value.left) or _may_carry_graph(value.right)
    if isinstance(value, ast.UnaryOp):
        return _may_carry_graph(value.operand)
    return False


def _is_reset(value: ast.AST | None, imports) -> bool:
    """`0`, `0.0`, `[]`, `list()`, `torch.zeros(())`: a fresh accumulator."""
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, (ast.List, ast.Tuple, ast.Dict)) and not getattr(value, "elts", getattr(value, "keys", None)):
        return True
    if isinstance(value, ast.Call):
        name = imports.qualify(value.func) or ""
        return name in ("list", "float", "int") and not value.args or name.startswith("torch.")
    return False


@register
class LossAccumulatesGraph(Rule):
    """## What it does
    Flags `total += loss`, `total = total + loss` and `losses.append(loss)` inside a loop,
    where `loss` still carries its autograd graph (the `.loss` of a forward pass, a
    `criterion(...)` or `F.cross_entropy(...)` result, or arithmetic on one) and the
    accumulator is never `backward()`-ed.

    ## Why is this bad?
    A tensor that requires grad keeps its whole graph alive, and with it the activations
    its forward pass saved for backward. `total += loss` turns `total` into a tensor whose
    graph chains every iteration's graph; a list of losses keeps one graph per entry. In a
    training loop that calls `backward()` every step the saved tensors are already freed,
    so the leak is small, but the graph nodes still pile up. In code that never calls
    `backward()` (evaluation without `torch.no_grad()`), every iteration's activations stay
    in memory until the accumulator goes: it grows by one batch of activations per step.
    This is the first item of PyTorch's own out-of-memory FAQ.

    ## Example
    ```python
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss)
    print(torch.stack(losses).mean().item())
    ```

    ## Use instead
    ```python
        losses.append(loss.detach())
    ```
    or `total += loss.item()` when the accumulator is only used as a number.

    ## Fix safety
    Safe: the accumulator is never differentiated, so dropping the graph changes no value.
    The fix uses `.item()` when every use of the accumulator reads it as a number (printed,
    logged, divided, compared, `sum(...)` of a list), and `.detach()` otherwise (stacked,
    reduced with torch, `.item()` called on it later). Gradient accumulation that later
    calls `(total / n).backward()` is left alone, and so is an accumulator that leaves the
    function (returned from a loss helper, stored on `self`, passed on), since its caller
    may differentiate it.

    ## References
    - facts A9: PyTorch docs, notes/faq "Don't accumulate history across your training
      loop ... `total_loss += loss` ... You can fix this by writing
      `total_loss += float(loss)` instead"; experiment: +8 MiB per iteration in an eval loop
      without `no_grad`.
    """

    code = "CFX302"
    name = "loss-accumulates-graph"
    severity = Severity.WARNING
    fix_availability = "safe"
    # "oss": loss, Loss, cross_entropy in one scan
    triggers = ((b"oss", b"criterion"), (b"+", b".append("), _LOOP_WORDS)
    trigger_check = staticmethod(_may_accumulate_loss)

    VALID = [
        Example(
            "total = 0.0\nfor batch in loader:\n    loss = model(**batch).loss\n    loss.backward()\n"
            "    total += loss.item()\nprint(total)\n",
            why="`.item()` already",
        ),
        Example(
            "total = 0.0\nfor batch in loader:\n    loss = criterion(model(batch.x), batch.y)\n    loss.backward()\n"
            "    total += float(loss)\nprint(total)\n",
            why="`float(loss)`",
        ),
        Example(
            "import torch\nlosses = []\nfor batch in loader:\n    loss = model(**batch).loss\n    loss.backward()\n"
            "    losses.append(loss.detach())\nprint(torch.stack(losses).mean())\n",
            why="`loss.detach()`",
        ),
        Example(
            "import torch\n"
            "def evaluate(model, loader, accelerator):\n"
            "    model.eval()\n"
            "    losses = []\n"
            "    with torch.no_grad():\n"
            "        for batch in loader:\n"
            "            loss = model(**batch).loss\n"
            "            losses.append(loss)\n"
            "    return torch.stack(losses).mean().item()\n",
            why="values computed under `torch.no_grad()` carry no graph",
        ),
        Example(
            "import torch\n"
            "@torch.inference_mode()\n"
            "def evaluate(model, loader):\n"
            "    total = 0.0\n"
            "    for x, y in loader:\n"
            "        total += criterion(model(x), y)\n"
            "    return total / len(loader)\n",
            why="an `@torch.inference_mode()` function",
        ),
        Example(
            "import torch\n"
            "def evaluate(model, loader):\n"
            "    total = 0.0\n"
            "    for x, y in loader:\n"
            "        with torch.no_grad():\n"
            "            loss = criterion(model(x), y)\n"
            "        total += loss\n"
            "    return total / len(loader)\n",
            why="the loss was computed in a `no_grad` block",
        ),
        Example(
            "import torch\n"
            "def evaluate(model, loader):\n"
            "    total = 0.0\n"
            "    for x, y in loader:\n"
            "        total += criterion(model(x), y)\n"
            "    return total / len(loader)\n"
            "with torch.no_grad():\n"
            "    print(evaluate(model, loader))\n",
            why="the function is called under `torch.no_grad()`",
        ),
        Example(
            "losses = []\nfor batch in loader:\n    loss = model(**batch).loss\n    accelerator.backward(loss)\n"
            "    losses.append(accelerator.gather(loss))\nprint(sum(losses))\n",
            why="a value from `accelerator.gather`",
        ),
        Example(
            "total = 0\nfor i, batch in enumerate(loader):\n    total = total + model(**batch).loss\n"
            "    if (i + 1) % accum == 0:\n        (total / accum).backward()\n        optimizer.step()\n        total = 0\n",
            why="gradient accumulation: the accumulator is backward()-ed",
        ),
        Example(
            "losses = []\nfor chunk in chunks:\n    losses.append(criterion(model(chunk.x), chunk.y))\n"
            "accelerator.backward(sum(losses) / len(losses))\n",
            why="a list of losses summed and backward()-ed",
        ),
        Example(
            "import torch.nn.functional as F\nlosses = []\nfor i in range(n):\n"
            "    losses.append(F.mse_loss(ddp_model(x[i]), y[i]))\n"
            "for i in range(n):\n    loss = losses[i]\n    accelerator.backward(loss)\n",
            why="losses kept for a later backward() one by one (accelerate's test_sync)",
        ),
        Example(
            "import torch.nn.functional as F\n"
            "def compute_loss(outputs, targets):\n"
            "    loss = 0.0\n"
            "    for out, target in zip(outputs, targets):\n"
            "        loss += F.cross_entropy(out, target)\n"
            "    return loss\n",
            why="a loss helper returns the sum: its caller backward()s it",
        ),
        Example(
            "import torch.nn.functional as F\n"
            "class MultiHead(nn.Module):\n"
            "    def forward(self, x, targets):\n"
            "        total = 0.0\n"
            "        for head, target in zip(self.heads, targets):\n"
            "            total += F.cross_entropy(head(x), target)\n"
            "        self.log('loss', total)\n"
            "        return x\n",
            why="a sum over heads inside `forward` (or a `*loss*` function): one step's loss, gone when it returns",
        ),
        Example(
            "for batch in loader:\n    loss = model(**batch).loss\n    loss += 0.1 * aux_loss(model)\n    loss.backward()\n",
            why="`loss += aux` builds this step's loss; it is not an accumulator across steps",
        ),
        Example(
            "from sklearn.metrics import log_loss\ntotal = 0.0\nfor y, p in zip(ys, ps):\n    total += log_loss(y, p)\n"
            "print(total)\n",
            why="a non-torch loss function returns a plain number",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "losses = []\n"
            "for batch in train_loader:\n"
            "    with accelerator.accumulate(model):\n"
            "        outputs = model(**batch)\n"
            "        loss = outputs.loss\n"
            "        accelerator.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            "    losses.append(loss)\n"
            "    if step % 10 == 0:\n"
            "        print(torch.stack(losses).mean().item())\n"
            "        losses = []\n",
            why="a list that is stacked: `.detach()`",
            line=10,
            fixed="import torch\n"
            "losses = []\n"
            "for batch in train_loader:\n"
            "    with accelerator.accumulate(model):\n"
            "        outputs = model(**batch)\n"
            "        loss = outputs.loss\n"
            "        accelerator.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            "    losses.append(loss.detach())\n"
            "    if step % 10 == 0:\n"
            "        print(torch.stack(losses).mean().item())\n"
            "        losses = []\n",
        ),
        Example(
            "def train(model, loader, optimizer):\n"
            "    running_loss = 0.0\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = criterion(model(x), y) / accum\n"
            "        loss.backward()\n"
            "        running_loss += loss\n"
            "        if step % 100 == 0:\n"
            "            print(f'loss {running_loss / 100:.4f}')\n"
            "            running_loss = 0.0\n",
            why="only printed: `.item()`",
            line=6,
            fixed="def train(model, loader, optimizer):\n"
            "    running_loss = 0.0\n"
            "    for step, (x, y) in enumerate(loader):\n"
            "        loss = criterion(model(x), y) / accum\n"
            "        loss.backward()\n"
            "        running_loss += loss.item()\n"
            "        if step % 100 == 0:\n"
            "            print(f'loss {running_loss / 100:.4f}')\n"
            "            running_loss = 0.0\n",
        ),
        Example(
            "import torch.nn.functional as F\n"
            "def report(model, loader):\n"
            "    total = 0.0\n"
            "    for x, y in loader:\n"
            "        total = total + F.cross_entropy(model(x), y)\n"
            "    print(f'loss {total / len(loader):.3f}')\n",
            why="code that never calls backward(): an error; `total = total + ...`",
            line=5,
            fixed="import torch.nn.functional as F\n"
            "def report(model, loader):\n"
            "    total = 0.0\n"
            "    for x, y in loader:\n"
            "        total = total + F.cross_entropy(model(x), y).item()\n"
            "    print(f'loss {total / len(loader):.3f}')\n",
        ),
        Example(
            "import torch\n"
            "total = torch.zeros(())\n"
            "for batch in loader:\n"
            "    out = model(**batch)\n"
            "    out.loss.backward()\n"
            "    total += out.loss / n\n"
            "writer.add_scalar('loss', total, 0)\n",
            why="a tensor accumulator: `.detach()` around an expression",
            line=6,
            fixed="import torch\n"
            "total = torch.zeros(())\n"
            "for batch in loader:\n"
            "    out = model(**batch)\n"
            "    out.loss.backward()\n"
            "    total += (out.loss / n).detach()\n"
            "writer.add_scalar('loss', total, 0)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        # A first look without the module index: accumulations in loops whose value is,
        # syntactically, a loss with a graph. Most modules stop here.
        imports = ctx.imports
        candidates = []
        for stmt, function, outer in statements_in_loops(ctx.document.tree):
            parts = _accumulation(stmt)
            if parts is None or not _may_carry_graph(parts[1]):
                continue
            if graph_origin(None, scope_flow(ctx, function), parts[1], stmt, outer, imports) is not None:
                candidates.append((stmt, parts))
        if not candidates:
            return
        analysis = loop_analysis(ctx)
        for stmt, parts in candidates:
            context = ctx.index.context_of_stmt(stmt)
            acc, value, _ = parts
            if any(isinstance(n, ast.Name) and n.id == acc for n in ast.walk(value)):
                continue  # `loss = loss + aux`: this step's loss, not an accumulator
            if context.function is not None and _LOSS_BUILDER.match(getattr(context.function, "name", "")):
                continue  # `forward()` or a loss function: the sum is the loss its caller trains on
            if analysis.context_guarded(context, stmt.lineno):
                continue
            flow = scope_flow(ctx, context.function)
            origin = graph_origin(analysis, flow, value, stmt, context.loops[0], imports)
            if origin is None:
                continue
            method = self._accumulator(analysis, flow, context, acc, context.loops[-1], imports)
            if method is None:
                continue
            no_backward = not analysis.backward_sites(context.function)
            yield self._report(ctx, stmt, acc, value, origin, method, no_backward)

    @staticmethod
    def _accumulator(analysis, flow, context, acc: str, loop, imports):
        """"item" or "detach" when `acc` is a real accumulator (initialised before the loop,
        only reset inside it) that is never differentiated; None otherwise."""
        before = [e for e in flow.bindings.get(acc, ()) if e[0] < loop.lineno]
        if not before:
            return None
        skip: set[int] = set()
        for line, _, bound, value in flow.bindings.get(acc, ()):
            if loop.lineno <= line <= (loop.end_lineno or line):
                parts = _accumulation(bound)
                if not (parts and parts[0] == acc) and not _is_reset(value, imports):
                    return None  # rebound to something else each iteration
        for stmt in flow.statements:
            parts = _accumulation(stmt)
            if parts and parts[0] == acc:
                skip.update(id(node) for node in parts[2])
        func = context.function
        eval_function = analysis.is_eval_function(func) or bool(analysis.eval_receivers(loop, context))
        uses = accumulator_uses(analysis, flow, acc, skip, eval_function)
        if BACKWARD in uses or UNKNOWN in uses:
            return None
        tensor_init = any(
            isinstance(e[3], ast.Call) and (imports.qualify(e[3].func) or "").startswith("torch.") for e in before
        )
        return "detach" if TENSOR in uses or NUMBER not in uses or tensor_init else "item"

    def _report(self, ctx, stmt, acc, value, origin, method, no_backward) -> Finding:
        src = ctx.source
        value_text = src.node_text(value)
        simple = isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        new = f"{value_text}.{method}()" if simple else f"({value_text}).{method}()"
        written = src.node_text(stmt.value) if isinstance(stmt, ast.Expr) else src.node_text(stmt)
        source = "" if origin is value else f" (from `{src.node_text(origin)}`, line {origin.lineno})"
        if method == "item":
            use = "it is only read as a number"
        else:
            use = "it is only reduced and read, so `.detach()` keeps it a tensor without a host sync"
        if no_backward:
            consequence = (
                "This code never calls `backward()`, so nothing frees those graphs: every iteration's "
                f"activations stay in memory until `{acc}` goes."
            )
        else:
            consequence = f"Every step's graph stays alive until `{acc}` is reset."
        node = stmt.value if isinstance(stmt, ast.Expr) else stmt
        return self.finding(
            src.span_of_node(node),
            f"`{written}` keeps the autograd graph of `{value_text}`{source}, and `{acc}` is never "
            f"`backward()`-ed ({use}). {consequence} Accumulate `{new}` instead.",
            fix=Fix((python_edits.replace_node(src, value, new),), f"Accumulate `{new}`", Applicability.SAFE),
            severity=Severity.ERROR if no_backward else None,
        )


# -- CFX303 ------------------------------------------------------------------------------

_EVAL_TRIGGERS = (b"val", b"train(False)")  # `eval`, `def val_`, `validate`; the check does the rest
_EVAL_DEF = re.compile(rb"def _*(?:(?:evaluate|validate|evaluation|validation|eval|val)\s*\(|(?:eval|val)_)")


def _may_evaluate_text(data: bytes) -> bool:
    """Text only: a loop in an evaluate-named function, or a loop after a code line (not a
    `>>>` example, not prose quoting it in backticks) with `.eval()` / `.train(False)`."""
    for match in _EVAL_DEF.finditer(data):
        start = data.rfind(b"\n", 0, match.start()) + 1
        if _loop_follows(data, match.start(), match.start() - start):
            return True
    for token in (b".eval()", b".train(False)"):
        pos = data.find(token)
        while pos >= 0:
            start = data.rfind(b"\n", 0, pos) + 1
            head = data[start:pos].lstrip()
            code = not head.startswith((b">>>", b"...")) and b"`" not in head and b"#" not in head
            if code and _loop_follows(data, pos, len(data[start:pos]) - len(head) - 1):
                return True
            pos = data.find(token, pos + 1)
    return False


def _loop_follows(data: bytes, pos: int, indent: int) -> bool:
    """A `for`/`while` line after `pos`, before the next `def`/`class`/decorator at an
    indentation of at most `indent` (the end of the function, roughly)."""
    end = data.find(b"\n", pos)
    budget = 3000
    while end >= 0 and budget:
        budget -= 1
        start = end + 1
        end = data.find(b"\n", start)
        text = data[start:] if end < 0 else data[start:end]
        head = text.lstrip(b" \t")
        if head.startswith(_LOOP_HEAD):
            return True
        if head.startswith((b"def ", b"async def ", b"class ", b"@")) and len(text) - len(head) <= indent:
            return False
    return budget == 0


@register
class EvalWithoutNoGrad(Rule):
    """## What it does
    Flags forward passes in an evaluation loop that runs with autograd on: a loop after
    `model.eval()` in the same function (or in a function named `evaluate`, `validate`,
    `evaluation`, `validation`, `eval_*` or `val_*`) that calls the model, never calls `backward()`, and is not inside
    `torch.no_grad()` / `torch.inference_mode()` (a `with` block, a decorator on the
    function, `torch.set_grad_enabled(False)`, or a caller that evaluates under one).

    ## Why is this bad?
    `model.eval()` does not turn off autograd: it only switches dropout and batch norm to
    inference behaviour. Every forward pass still records its graph and keeps the
    activations it would need for a backward pass that never comes. Evaluation then needs
    training-sized memory per batch, and any output or loss kept across iterations keeps
    its batch's activations alive too (+8 MiB per batch in the experiment behind this
    rule). Under `torch.no_grad()` the same loop keeps nothing.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        for batch in loader:
            outputs = model(**batch)
            total += outputs.loss.item()
    ```

    ## Use instead
    ```python
    def evaluate(model, loader):
        model.eval()
        with torch.no_grad():
            for batch in loader:
                outputs = model(**batch)
                total += outputs.loss.item()
    ```

    ## Fix safety
    Unsafe: results are the same, but anything that later relied on gradients through
    these outputs would stop working (cfgfix stays silent when the loop or the code after
    it calls `backward()`, `torch.autograd.grad`, `requires_grad_()` or reads `.grad`).
    The fix wraps the loop in `with torch.no_grad():` and re-indents it line by line,
    keeping comments and blank lines, and leaving the lines of multi-line strings as they
    are. `model.generate(...)` loops are not flagged: `generate` already runs without
    gradients.

    ## References
    - facts A9: `model.eval()` does not disable autograd; an eval loop without `no_grad`
      that keeps its outputs grew by 224 MiB over 28 batches, 0 MiB with `torch.no_grad()`.
    - PyTorch docs, `torch.no_grad` and notes/autograd "Locally disabling gradient
      computation".
    """

    code = "CFX303"
    name = "eval-without-no-grad"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    triggers = (_EVAL_TRIGGERS, _LOOP_WORDS)
    trigger_check = staticmethod(_may_evaluate_text)

    VALID = [
        Example(
            "import torch\ndef evaluate(model, loader):\n    model.eval()\n    with torch.no_grad():\n"
            "        for batch in loader:\n            out = model(**batch)\n",
            why="the loop is inside `torch.no_grad()`",
        ),
        Example(
            "import torch\n@torch.no_grad()\ndef evaluate(model, loader):\n    model.eval()\n"
            "    for batch in loader:\n        out = model(**batch)\n",
            why="`@torch.no_grad()` on the function",
        ),
        Example(
            "import torch\n@torch.inference_mode\ndef validate(model, loader):\n"
            "    for batch in loader:\n        out = model(**batch)\n",
            why="`@torch.inference_mode` without parentheses",
        ),
        Example(
            "import torch\ntorch.set_grad_enabled(False)\nmodel.eval()\nfor x in inputs:\n    print(model(x))\n",
            why="`torch.set_grad_enabled(False)` earlier",
        ),
        Example(
            "import torch\ndef evaluate(model, loader):\n    model.eval()\n    for batch in loader:\n"
            "        with torch.inference_mode():\n            out = model(**batch)\n        metric.add(out.logits)\n",
            why="the forward pass is guarded inside the loop",
        ),
        Example(
            "def evaluate(model, loader):\n    model.eval()\n    for batch in loader:\n        out = model(**batch)\n"
            "    return out\n"
            "import torch\nwith torch.no_grad():\n    evaluate(model, loader)\n",
            why="the only caller runs it under `torch.no_grad()`",
        ),
        Example(
            "model.eval()  # frozen batch norm while fine-tuning\n"
            "for batch in loader:\n    loss = model(**batch).loss\n    loss.backward()\n    optimizer.step()\n",
            why="training in eval mode: the loop calls backward()",
        ),
        Example(
            "def main():\n    for batch in loader:\n        out = model(**batch)\n        print(out.logits)\n",
            why="no evidence that this loop evaluates",
        ),
        Example(
            "def main():\n    model.eval()\n    run_eval()\n    model.train()\n"
            "    for batch in loader:\n        out = model(**batch)\n",
            why="back in train mode before the loop",
        ),
        Example(
            "def evaluate(model, loader):\n    model.eval()\n    for batch in loader:\n"
            "        ids = model.generate(**batch, max_new_tokens=32)\n",
            why="`generate` runs without gradients itself",
        ),
        Example(
            "def evaluate(model, loader):\n    model.eval()\n    model.requires_grad_(False)\n"
            "    for batch in loader:\n        out = model(**batch)\n",
            why="a frozen model records no graph",
        ),
        Example(
            "import torch\nmodel.eval()\nfor x, y in loader:\n    x.requires_grad_()\n"
            "    score = model(x)[0, y]\n    saliency = torch.autograd.grad(score, x)[0]\n",
            why="input gradients: the loop needs autograd",
        ),
        Example(
            "def main():\n    model.eval()\n    outs = []\n    for x in chunks:\n        outs.append(model(x))\n"
            "    loss = criterion(torch.cat(outs), y)\n    loss.backward()\n",
            why="the outputs are backward()-ed after the loop",
        ),
        Example(
            "import pytorch_lightning as pl\nclass Net(pl.LightningModule):\n"
            "    def val_loop(self, batches):\n        for b in batches:\n            self.model(b)\n",
            why="Lightning runs its hooks under no_grad",
        ),
        Example(
            "import torch\n"
            "def profile(model, x):\n"
            "    model.eval()\n"
            "    for _ in range(3):\n"
            "        _ = model(x)\n"
            "    return measure(model, x)\n",
            why="a warm-up loop that drops each output at once (a profiler may want autograd on)",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "def evaluate(model, loader, device):\n"
            "    model.eval()\n"
            "    total_loss, n_batches = 0.0, 0\n"
            "    for batch in loader:\n"
            "        batch = {k: v.to(device) for k, v in batch.items()}\n"
            "        outputs = model(**batch)  # forward\n"
            "\n"
            '        note = """eval\n'
            'batch"""\n'
            "        total_loss += outputs.loss.item()\n"
            "        n_batches += 1\n"
            "    model.train()\n"
            "    return total_loss / max(n_batches, 1)\n",
            why="after model.eval(); comments, blank lines and a multi-line string survive the re-indent",
            line=7,
            fixed="import torch\n"
            "def evaluate(model, loader, device):\n"
            "    model.eval()\n"
            "    total_loss, n_batches = 0.0, 0\n"
            "    with torch.no_grad():\n"
            "        for batch in loader:\n"
            "            batch = {k: v.to(device) for k, v in batch.items()}\n"
            "            outputs = model(**batch)  # forward\n"
            "\n"
            '            note = """eval\n'
            'batch"""\n'
            "            total_loss += outputs.loss.item()\n"
            "            n_batches += 1\n"
            "    model.train()\n"
            "    return total_loss / max(n_batches, 1)\n",
        ),
        Example(
            "import torch as th\n"
            "net.eval()\n"
            "for x, y in test_loader:\n"
            "    correct += (net(x).argmax(1) == y).sum().item()\n",
            why="a module-level script with an aliased torch",
            line=4,
            fixed="import torch as th\n"
            "net.eval()\n"
            "with th.no_grad():\n"
            "    for x, y in test_loader:\n"
            "        correct += (net(x).argmax(1) == y).sum().item()\n",
        ),
        Example(
            "from torch import nn\n"
            "class Runner:\n"
            "\tdef val_epoch(self, loader):\n"
            "\t\tfor x, y in loader:\n"
            "\t\t\tlogits = self.model(x)\n"
            "\t\t\tself.metric.update(logits, y)\n",
            why="a `val_*` method with tab indentation; `import torch` is added",
            line=5,
            fixed="from torch import nn\n"
            "import torch\n"
            "class Runner:\n"
            "\tdef val_epoch(self, loader):\n"
            "\t\twith torch.no_grad():\n"
            "\t\t\tfor x, y in loader:\n"
            "\t\t\t\tlogits = self.model(x)\n"
            "\t\t\t\tself.metric.update(logits, y)\n",
        ),
    ]

    def check(self, ctx) -> Iterable[Finding]:
        if not _may_evaluate(ctx.document.tree):
            return  # most modules: no need for the module index
        analysis = loop_analysis(ctx)
        flagged: set[int] = set()
        for context in list(ctx.index.contexts.values()):
            loop = context.stmt
            if not isinstance(loop, Loop) or any(id(outer) in flagged for outer in context.loops):
                continue
            if context.function is None and context.classdef is not None:
                continue
            func = context.function
            receivers = analysis.eval_receivers(loop, context)
            named = analysis.is_eval_function(func)
            if not receivers and not named:
                continue
            if analysis.context_guarded(context, loop.lineno) or analysis.needs_grad_inside(loop):
                continue
            backwards = analysis.backward_sites(func)
            if any(site.node.lineno > (loop.end_lineno or loop.lineno) for site in backwards):
                continue  # the outputs may be differentiated after the loop
            if named and not receivers and backwards:
                continue
            forwards = [
                site
                for site in analysis.calls_within(loop)
                if self._is_forward(analysis, site, receivers, named) and not analysis.with_guarded(site.context)
            ]
            if not forwards or (_repeats(loop) and all(_discarded(site) for site in forwards)):
                continue  # a warm-up / timing loop (`for _ in range(n)`) drops each output at once
            first = min(forwards, key=lambda s: (s.node.lineno, s.node.col_offset))
            flagged.add(id(loop))
            yield self._report(ctx, loop, first, receivers, func)

    @staticmethod
    def _is_forward(analysis, site, receivers: dict, named: bool) -> bool:
        """`model(...)` / `model.forward(...)` of a module put in eval mode, or (in an
        evaluate-named function) of any module; never `generate`, never a frozen module."""
        name = site.receiver if site.method == "forward" else dotted(site.node.func)
        if name is None or name in analysis.frozen_modules:
            return False
        if name in receivers:
            return True
        return named and analysis.is_forward(site)

    def _report(self, ctx, loop, first, receivers, func) -> Finding:
        src = ctx.source
        name = first.receiver if first.method == "forward" else dotted(first.node.func)
        if name in receivers:
            evidence = f"after `{name}.eval()` (line {receivers[name].node.lineno})"
        else:
            evidence = f"in `{func.name}()`"
        related = [Related(_header_span(src, loop), "this loop never calls backward()")]
        if name in receivers:
            related.append(Related(src.span_of_node(receivers[name].node), "eval mode only, autograd stays on"))
        return self.finding(
            src.span_of_node(first.node),
            f"`{src.node_text(first.node.func)}(...)` runs {evidence} in a loop that never calls "
            "`backward()`, outside `torch.no_grad()`/`torch.inference_mode()`: autograd records every "
            "forward pass and keeps its activations for a backward pass that never comes"
            + (" (`.eval()` only switches dropout and batch norm; it does not turn autograd off)" if name in receivers else "")
            + ". Wrap the loop in `with torch.no_grad():`.",
            fix=_wrap_in_no_grad(ctx, loop),
            related=related,
        )


def _repeats(loop: ast.stmt) -> bool:
    """`for _ in range(n)`: a loop that repeats a call, not one that walks data."""
    return (
        isinstance(loop, (ast.For, ast.AsyncFor))
        and isinstance(loop.iter, ast.Call)
        and isinstance(loop.iter.func, ast.Name)
        and loop.iter.func.id == "range"
    )


def _discarded(site) -> bool:
    """`model(x)` as a statement, or `_ = model(x)`: the output is dropped right away."""
    stmt = site.context.stmt
    if isinstance(stmt, ast.Expr):
        return stmt.value is site.node
    if isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return isinstance(target, ast.Name) and target.id == "_"
    return False


def _may_evaluate(tree: ast.Module) -> bool:
    """A statement-only look, scope by scope: a loop in an evaluate-named function, or a
    loop after a `.eval()` / `.train(False)` statement of the same function."""
    scopes: list[tuple[str, list[ast.stmt]]] = [("", tree.body)]
    scopes += [
        (stmt.name, stmt.body)
        for stmt in iter_statements(tree.body)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for name, body in scopes:
        named = bool(name) and bool(EVAL_FUNCTION.match(name))
        eval_line = None
        for stmt in scope_statements(body):
            if isinstance(stmt, Loop) and (named or (eval_line is not None and stmt.lineno > eval_line)):
                return True
            if eval_line is None and _sets_eval_mode(stmt):
                eval_line = stmt.lineno
    return False


def _sets_eval_mode(stmt: ast.stmt) -> bool:
    """`model.eval()`, `model = model.eval()`, `model.eval().to(device)`, `model.train(False)`."""
    if not isinstance(stmt, (ast.Expr, ast.Assign)) or not isinstance(stmt.value, ast.Call):
        return False
    call = stmt.value
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        if call.func.attr in ("eval", "train"):
            return True
        call = call.func.value
    return False


def _wrap_in_no_grad(ctx, loop: ast.stmt) -> Fix | None:
    """`with torch.no_grad():` above the loop and the loop indented one level, line by line:
    comments move with the code, blank lines stay blank, and lines that continue a
    multi-line string are left exactly as they are."""
    src = ctx.source
    imports = ctx.index.imports
    edits = []
    torch_name = imports.local_name_for("torch")
    if torch_name:
        guard = f"{torch_name}.no_grad()"
    elif imports.local_name_for("torch.no_grad"):
        guard = f"{imports.local_name_for('torch.no_grad')}()"
    else:
        guard = "torch.no_grad()"
        edits.append(python_edits.insert_import(src, ctx.document.tree, "import torch", loop.lineno))
    first, last = loop.lineno, loop.end_lineno or loop.lineno
    header = src.line_text(first)
    indent = header[: len(header) - len(header.lstrip())]
    body_line = loop.body[0].lineno
    if body_line > first:
        body_text = src.line_text(body_line)
        body_indent = body_text[: len(body_text) - len(body_text.lstrip())]
        if not body_indent.startswith(indent) or len(body_indent) <= len(indent):
            return None
        unit = body_indent[len(indent):]
    else:
        unit = "\t" if indent.startswith("\t") else "    "
    frozen = _string_rows(src.text)
    if frozen is None:
        return None
    start = src.line_starts[first - 1]
    end = src.line_starts[last - 1] + len(src.line_text(last))
    lines = re.split(r"(\r\n|\r|\n)", src.text[start:end])
    out = []
    for i in range(0, len(lines), 2):
        row = first + i // 2
        text = lines[i]
        if text.strip() and row not in frozen:
            text = unit + text
        out.append(text + (lines[i + 1] if i + 1 < len(lines) else ""))
    new = f"{indent}with {guard}:{src.newline}" + "".join(out)
    edits.append(python_edits.Edit(src.path, start, end, new))
    return Fix(tuple(edits), "Wrap the evaluation loop in `with torch.no_grad():`", Applicability.UNSAFE)


def _string_rows(text: str) -> set[int] | None:
    """Rows (1-based) that continue a string started on an earlier row."""
    rows: set[int] = set()
    fstring_start = getattr(tokenize, "FSTRING_START", None)
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    starts: list[int] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
            elif fstring_start is not None and tok.type == fstring_start:
                starts.append(tok.start[0])
            elif fstring_end is not None and tok.type == fstring_end and starts:
                begin = starts.pop()
                if not starts and tok.end[0] > begin:
                    rows.update(range(begin + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return rows
