"""Branch tests that tell a single-process run from a distributed one.

Every multi-process launcher (`torchrun`, `accelerate launch`, the `deepspeed` launcher)
sets `LOCAL_RANK`, `RANK` and `WORLD_SIZE` in each process's environment; a plain `python
train.py` sets none of them. Training scripts test that to pick a placement:

    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    if local_rank != -1:
        model = AutoModelForCausalLM.from_pretrained(name)                      # distributed
    else:
        model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")   # one process

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    ddp = world_size != 1
    if not ddp:
        ...                                                                       # one process

The idioms read: an environment read of `LOCAL_RANK`/`RANK` (`os.environ.get`,
`os.getenv`, wrapped in `int()` or not) compared with its own negative default (`== -1`,
`!= -1`, `< 0`, `>= 0`); a read of `WORLD_SIZE` with a default of 1 or less compared with 1
(`== 1`, `!= 1`, `> 1`, `<= 1`, `< 2`, `>= 2`); `"LOCAL_RANK" in os.environ` (any of the
three names); each either in the test or through a name bound once (`deref`), and combined
by `not`, `and`, `or`. A rank read with a default a real rank can take (`0`) says nothing,
nor does a command-line `args.local_rank` (torchrun does not pass `--local_rank`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

_RANK_VARS = frozenset({"LOCAL_RANK", "RANK"})
_SIZE_VAR = "WORLD_SIZE"
_LAUNCH_VARS = _RANK_VARS | {_SIZE_VAR}
_ENV_READS = frozenset({"os.environ.get", "os.getenv"})
# Which words a module must contain for a test to be worth reading.
TOKENS = tuple(_LAUNCH_VARS)


def single_process_side(test: ast.expr, truth: bool, deref: Callable[[ast.expr], ast.expr],
                        qualify: Callable[[ast.AST], str | None], depth: int = 0) -> bool:
    """The side of `if test:` where the test is `truth` is taken only by a single-process
    run (no launcher variables set)."""
    if depth > 6:
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return single_process_side(test.operand, not truth, deref, qualify, depth + 1)
    if isinstance(test, ast.BoolOp):
        parts = [single_process_side(v, truth, deref, qualify, depth + 1) for v in test.values]
        # `a and b` holds: both hold, one single-process part is enough; it fails: either
        # part may have failed, so every part must say so (and dually for `or`).
        every = isinstance(test.op, ast.And) != truth
        return all(parts) if every else any(parts)
    if isinstance(test, ast.Name):
        value = deref(test)
        if value is not test:
            return single_process_side(value, truth, deref, qualify, depth + 1)
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        distributed = _distributed_when(test, deref, qualify)
        return distributed is not None and distributed != truth
    return False


def _distributed_when(test: ast.Compare, deref, qualify) -> bool | None:
    """True: the comparison holds exactly in a launched (multi-process) run; False: exactly
    in a plain single-process one; None: it does not say."""
    op, left, right = type(test.ops[0]), test.left, test.comparators[0]
    if op in (ast.In, ast.NotIn):
        if isinstance(left, ast.Constant) and left.value in _LAUNCH_VARS and qualify(right) == "os.environ":
            return op is ast.In
        return None
    if _number(left) is not None and _number(right) is None:
        left, right, op = right, left, _MIRROR.get(op, op)  # `-1 == rank` is `rank == -1`
    value = _number(right)
    read = _env_read(left, deref, qualify) if value is not None else None
    if read is None:
        return None
    var, default = read
    holds_at = {ast.Eq: lambda x: x == value, ast.NotEq: lambda x: x != value, ast.Lt: lambda x: x < value,
                ast.LtE: lambda x: x <= value, ast.Gt: lambda x: x > value, ast.GtE: lambda x: x >= value}
    check = holds_at.get(op)
    if check is None:
        return None
    if var in _RANK_VARS:
        if default is None or default >= 0:
            return None  # rank 0 exists in a launched run too
        # unset: the default; launched: some rank >= 0. The test must split them.
        at_default, at_ranks = check(default), {check(r) for r in (0, 1, 2, 7, 1000)}
    else:
        if default is None or default > 1:
            return None
        at_default, at_ranks = check(default), {check(n) for n in (2, 3, 4, 8, 1000)}
    if len(at_ranks) != 1:
        return None
    launched = at_ranks.pop()
    if launched == at_default:
        return None
    return launched


_MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


def _env_read(node: ast.expr, deref, qualify, depth: int = 0) -> tuple[str, int | None] | None:
    """`(variable, default)` for `os.environ.get("LOCAL_RANK", -1)`, `int(os.getenv("RANK",
    "-1"))`, or a name bound once to one; None otherwise. The default is an int, or None
    when absent or not a number."""
    if depth > 4:
        return None
    if isinstance(node, ast.Name):
        value = deref(node)
        return None if value is node else _env_read(value, deref, qualify, depth + 1)
    if not isinstance(node, ast.Call):
        return None
    name = qualify(node.func)
    if name == "int" and len(node.args) == 1 and not node.keywords:
        return _env_read(node.args[0], deref, qualify, depth + 1)
    if name not in _ENV_READS or not node.args:
        return None
    var = deref(node.args[0])
    if not (isinstance(var, ast.Constant) and var.value in _LAUNCH_VARS):
        return None
    default = _number(deref(node.args[1]), text=True) if len(node.args) > 1 else None
    return var.value, default


def _number(node: ast.expr, text: bool = False) -> int | None:
    """An int literal (`1`, `-1`), or with `text` a string holding one (`"-1"`)."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node, sign = node.operand, -1
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return None
    if isinstance(node.value, int):
        return sign * node.value
    if text and isinstance(node.value, str) and sign == 1:
        try:
            return int(node.value)
        except ValueError:
            return None
    return None
