"""CFX303 eval-without-no-grad."""

from __future__ import annotations

import ast
import bisect
import io
import re
from collections.abc import Iterable

from cfgfix.analysis.loop_text import LOOP_HEAD, LOOP_WORDS, header_span
from cfgfix.analysis.loops import EVAL_FUNCTION, loop_analysis
from cfgfix.analysis.names import dotted
from cfgfix.analysis.structure import Loop
from cfgfix.core import Applicability, Finding, Fix, Related, Severity
from cfgfix.documents import python_edits
from cfgfix.rules.base import Example, Rule, register

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
        if head.startswith(LOOP_HEAD):
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
    `Variable(x, volatile=True)`, the pre-0.4 spelling, turns nothing off.

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
    - torch 2.13: `Variable(x, volatile=True)` warns "volatile was removed and now has no
      effect. Use `with torch.no_grad():` instead." and a module's output on it requires grad.
    """

    code = "CFX303"
    name = "eval-without-no-grad"
    severity = Severity.WARNING
    fix_availability = "unsafe"
    triggers = (_EVAL_TRIGGERS, LOOP_WORDS)
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
        Example(
            "import torch\n"
            "from torch.autograd import Variable\n"
            "def valid(model, loader):\n"
            "    model.eval()\n"
            "    with torch.no_grad():\n"
            "        for x, y in loader:\n"
            "            out = model(Variable(x, volatile=True))\n",
            why="a leftover `volatile=True` inside `torch.no_grad()`: the guard does the work",
        ),
        Example(
            "import torch\n"
            "def valid(model, loader):\n"
            "    model.eval()\n"
            "    for x, y in loader:\n"
            "        x = torch.zeros_like(x, requires_grad=flag)\n"
            "        out = model(x)\n",
            why="`requires_grad=` a value that may be True: the loop may want gradients",
        ),
    ]
    INVALID = [
        Example(
            "import torch\n"
            "from torch.autograd import Variable\n"
            "def valid(epoch):\n"
            "    model.eval()\n"
            "    for batch in valid_loader:\n"
            "        inputs = Variable(batch['input'], volatile=True)\n"
            "        targets = Variable(batch['target'], requires_grad=False)\n"
            "        loss = criterion(model(inputs), targets)\n"
            "        running_loss += loss.item()\n",
            why="a pre-0.4 eval loop: torch ignores `volatile=True`, and `requires_grad=False` asks for no gradient",
            line=8,
            fixed="import torch\n"
            "from torch.autograd import Variable\n"
            "def valid(epoch):\n"
            "    model.eval()\n"
            "    with torch.no_grad():\n"
            "        for batch in valid_loader:\n"
            "            inputs = Variable(batch['input'], volatile=True)\n"
            "            targets = Variable(batch['target'], requires_grad=False)\n"
            "            loss = criterion(model(inputs), targets)\n"
            "            running_loss += loss.item()\n",
        ),
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
        loops = _evaluation_loops(ctx.document.tree, ctx.call_text)
        if loops is None:
            return  # most modules: no need for the module index
        analysis = loop_analysis(ctx)
        flagged: set[int] = set()
        # Loops found by statements alone, and the index asked only about those in an
        # evaluating function: iterating every statement's context walked every function
        # body of the module (issue 15).
        for loop, func, classdef, outer_loops in loops:
            if any(id(outer) in flagged for outer in outer_loops):
                continue
            if func is None and classdef is not None:
                continue
            receivers = analysis.eval_receivers(loop, func)
            named = analysis.is_eval_function(func)
            if not receivers and not named:
                continue
            context = ctx.index.context_of_stmt(loop)
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
        if name is None or analysis.is_frozen(name):
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
        related = [Related(header_span(src, loop), "this loop never calls backward()")]
        if name in receivers:
            related.append(Related(src.span_of_node(receivers[name].node), "eval mode only, autograd stays on"))
        volatile = _volatile_keyword(loop)
        if volatile is not None:
            related.append(Related(src.span_of_node(volatile), "no effect since torch 0.4"))
        return self.finding(
            src.span_of_node(first.node),
            f"`{src.node_text(first.node.func)}(...)` runs {evidence} in a loop that never calls "
            "`backward()`, outside `torch.no_grad()`/`torch.inference_mode()`: autograd records every "
            "forward pass and keeps its activations for a backward pass that never comes"
            + (" (`.eval()` only switches dropout and batch norm; it does not turn autograd off)" if name in receivers else "")
            + (f"; `Variable(..., volatile=True)` (line {volatile.value.lineno}) has been ignored since torch 0.4"
               if volatile is not None else "")
            + ". Wrap the loop in `with torch.no_grad():`.",
            fix=_wrap_in_no_grad(ctx, loop),
            related=related,
        )


def _volatile_keyword(loop: ast.stmt) -> ast.keyword | None:
    """`Variable(x, volatile=True)` in the loop: the pre-0.4 way of turning autograd off,
    which torch now ignores with a warning (the loop runs with autograd on)."""
    for node in ast.walk(loop):
        if isinstance(node, ast.keyword) and node.arg == "volatile" \
                and isinstance(node.value, ast.Constant) and node.value.value is True:
            return node
    return None


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


class _Scope:
    __slots__ = ("named", "eval_line")

    def __init__(self, named: bool) -> None:
        self.named = named
        self.eval_line: int | None = None


def _evaluation_loops(tree: ast.Module, text=None) -> list | None:
    """One statement-only walk. None when no scope may evaluate: none has a loop in an
    evaluate-named function, or a loop after a `.eval()` / `.train(False)` statement of the
    same function (its statements taken in `scope_statements` order). Otherwise the loops
    that may evaluate, as (loop, its function, its class, the loops around it in that
    function), in the module index's order (by line: no two loops start on one line).
    This look and a second walk to list the loops were 6 of CFX303's 15 ms on five trl
    trainer files (issue 15).

    With the module's `CallText`, a function is not entered when its lines call no
    `eval(` / `train(`, define no evaluate-named function and its own name is none: no
    scope in it can evaluate (no `.eval()` statement, no evaluate name), and no loop in it
    can be reported (no module put in eval mode in its function, no evaluate name)."""
    hot = None
    if text is not None:
        hot = sorted({*text.lines_calling("eval"), *text.lines_calling("train"),
                      *text.lines_defining(EVAL_FUNCTION.match)})
    may = False
    loops = []
    module = _Scope(False)
    stack: list = [(stmt, module, None, None, ()) for stmt in reversed(tree.body)]
    while stack:
        node, scope, function, classdef, outer = stack.pop()
        is_loop = isinstance(node, Loop)
        if is_loop:
            loops.append((node, function, classdef, outer))
        if scope is not None and not may:
            if is_loop and (scope.named or (scope.eval_line is not None and node.lineno > scope.eval_line)):
                may = True
            if scope.eval_line is None and _sets_eval_mode(node):
                scope.eval_line = node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            named = bool(EVAL_FUNCTION.match(node.name))
            if hot is not None and not named:
                at = bisect.bisect_left(hot, node.lineno)
                if at == len(hot) or hot[at] > (node.end_lineno or node.lineno):
                    continue  # nothing in it can evaluate
            inner = _Scope(named)
            stack.extend((stmt, inner, node, classdef, ()) for stmt in reversed(node.body))
            continue
        if isinstance(node, ast.ClassDef):  # a class body is no scope; its methods are
            stack.extend((stmt, None, None, node, ()) for stmt in reversed(node.body))
            continue
        inner_loops = outer + (node,) if is_loop else outer
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):  # scope_statements' order
            children = getattr(node, name, None)
            if children:
                around = outer if name == "orelse" and is_loop else inner_loops
                for child in reversed(children):
                    if isinstance(child, ast.stmt):
                        stack.append((child, scope, function, classdef, around))
                    else:  # except handlers, match cases
                        stack.extend((stmt, scope, function, classdef, around) for stmt in reversed(child.body))
    if not may:
        return None
    loops.sort(key=lambda entry: entry[0].lineno)
    return loops


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
    import tokenize  # only a fix needs it: 1.3 ms to import

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
