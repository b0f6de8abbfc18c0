"""CFX302 loss-accumulates-graph."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from cfgfix.analysis.loop_text import LOOP_WORDS, in_loop_text
from cfgfix.analysis.loops import (
    BACKWARD,
    NUMBER,
    TENSOR,
    UNKNOWN,
    accumulator_uses,
    graph_origin,
    loop_analysis,
    scope_flow,
    statements_in_loops,
)
from cfgfix.core import Applicability, Finding, Fix, LazyRegex, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

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


def _may_accumulate_loss(data: bytes) -> bool:
    """Text only: a line that accumulates into a plain name (`+=`, `.append(`, `x = x + ...`)
    a value that mentions a loss, inside a `for`/`while` block by indentation; or a name
    bound from a call (`cost = train_step(...)` ... `avg_cost += cost`), whose origin the
    analysis decides. (`bytes.find` per word, then a match per line: much faster than a
    multi-line regex over large files.)"""
    return _loss_word_accumulated(data) or _call_result_accumulated(data)


_ACCUMULATE_NAME = re.compile(rb"^[ \t]*\w+[ \t]*\+=[ \t]*(\w+)[ \t]*(?:#[^\n]*)?$", re.MULTILINE)


def _call_result_accumulated(data: bytes) -> bool:
    """`avg_cost += cost` in a loop, where `cost = <name>(...)` somewhere: the value of a
    plain function's call (the analysis follows those, here or in the project's modules),
    which may return a loss whatever it is called."""
    if b".backward(" not in data and b" import " not in data:
        return False
    accumulated = _accumulated_names(data)
    if not accumulated:
        return False
    for name in _bound_from_call(data, list(accumulated)):
        match = accumulated[name]
        start = data.rfind(b"\n", 0, match.start()) + 1
        end = data.find(b"\n", match.end())
        line = data[start:end if end >= 0 else len(data)]
        if in_loop_text(data, start, line.rstrip(b"\r"), _LOSS_BUILDER_DEF):
            return True
    return False


# What follows a name bound from a call: `cost = f(`, `cost, n = f(`.
_BOUND_TAIL = LazyRegex(rb"[ \t]*(?:,[^=\n]*)?=[ \t]*[A-Za-z_]\w*\(")
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _bound_from_call(data: bytes, names: list[bytes]) -> set[bytes]:
    """The names `re.finditer(rb"\b(n1|n2|...)" + _BOUND_TAIL)` finds, literal first: a
    pattern that begins with `\b` and an alternation made `re` try every position of the file
    (~0.3 s of CPU on the bench corpus). Same leftmost, first-alternative, non-overlapping
    matches: at each start, the names in their order; the next match starts after this one."""
    starts: dict[int, list[int]] = {}
    for order, name in enumerate(names):
        pos = data.find(name)
        while pos >= 0:
            if pos == 0 or data[pos - 1] not in _WORD_BYTES:  # `\b` before a word character
                starts.setdefault(pos, []).append(order)
            pos = data.find(name, pos + 1)
    found: set[bytes] = set()
    resume = 0
    for pos in sorted(starts):
        if pos < resume:
            continue
        for order in starts[pos]:  # appended in name order
            match = _BOUND_TAIL.match(data, pos + len(names[order]))
            if match is not None:
                found.add(names[order])
                resume = match.end()
                break
    return found


def _accumulated_names(data: bytes) -> dict:
    """`_ACCUMULATE_NAME`'s matches by accumulated name (the last wins), matched only on the
    lines that hold `+=` (the line-anchored pattern alone tried every line start). `+=` is
    found as a `+` (a one-byte search, `memchr`) followed by `=`: searching for the two bytes
    took ten times as long (issue 15)."""
    starts = []
    find = data.find
    pos = find(b"+")
    while pos >= 0:
        if data[pos + 1:pos + 2] != b"=":
            pos = find(b"+", pos + 1)
            continue
        starts.append(data.rfind(b"\n", 0, pos) + 1)
        end = find(b"\n", pos)
        if end < 0:
            break
        pos = find(b"+", end)
    accumulated = {}
    for start in starts:
        match = _ACCUMULATE_NAME.match(data, start)  # a match never leaves its line
        if match is not None:
            accumulated[match.group(1)] = match
    return accumulated


def _loss_word_accumulated(data: bytes) -> bool:
    """A line that `_ACCUMULATE_LINE` matches with a loss word in its value, in a loop. Such
    a line holds a `+` or `.append(`, and a loss word: the lines are found by the first two
    (a `+` is a one-byte search; scanning for the short, frequent "oss" took longer), and
    only those naming a loss are matched."""
    for token in (b"+", b".append("):
        pos = data.find(token)
        while pos >= 0:
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end
            line = data[start:end]
            if b"oss" in line or b"criterion" in line:  # `_LOSS_WORDS`
                match = _ACCUMULATE_LINE.match(line)
                if match is not None:
                    value = match.group("value") or match.group("right") or match.group("left") or match.group("arg") or b""
                    if _LOSS_WORD.search(value) and in_loop_text(data, start, line, _LOSS_BUILDER_DEF):
                        return True
            pos = data.find(token, end)
    return False


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
    triggers = ((b"oss", b"criterion", b"+="), (b"+", b".append("), LOOP_WORDS)
    trigger_check = staticmethod(_may_accumulate_loss)

    VALID = [
        Example(
            "import torch\n"
            "from engine.steps import train_one_step\n"
            "def run(model, loader, optimizer):\n"
            "    avg_cost = 0\n"
            "    for batch in loader:\n"
            "        cost = train_one_step(model, batch, optimizer)\n"
            "        avg_cost += cost\n",
            why="the step function returns `loss.item()`, a number",
            files={"engine/__init__.py": "", "engine/steps.py": "def train_one_step(model, batch, optimizer):\n"
                   "    loss = model(**batch).loss\n"
                   "    loss.backward()\n"
                   "    optimizer.step()\n"
                   "    return loss.item()\n"},
        ),
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
            "from engine.steps import train_one_step\n"
            "def run(model, loader, optimizer):\n"
            "    avg_cost = 0\n"
            "    for batch in loader:\n"
            "        cost = train_one_step(model, batch, optimizer)\n"
            "        avg_cost += cost\n"
            "    print(avg_cost / len(loader))\n",
            why="the loss comes back from a step function in another module, under another name",
            line=7,
            files={"engine/__init__.py": "", "engine/steps.py": "def train_one_step(model, batch, optimizer):\n"
                   "    loss = model(**batch).loss\n"
                   "    loss.backward()\n"
                   "    optimizer.step()\n"
                   "    return loss\n"},
            fixed="import torch\n"
            "from engine.steps import train_one_step\n"
            "def run(model, loader, optimizer):\n"
            "    avg_cost = 0\n"
            "    for batch in loader:\n"
            "        cost = train_one_step(model, batch, optimizer)\n"
            "        avg_cost += cost.item()\n"
            "    print(avg_cost / len(loader))\n",
        ),
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
            no_backward = not analysis.backward_sites(context.function) and not any(
                analysis.calls_step_function(site) for site in analysis.calls_within(context.loops[0]))
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
        eval_function = analysis.is_eval_function(func) or bool(analysis.eval_receivers(loop, func))
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
