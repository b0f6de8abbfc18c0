"""Branches in the model analysis (models.py): what an `if` test says about names
(facts), which options of a `Choice` a branch keeps, whether a block falls through, and
the env (key -> value) after branches, loops and rebinding."""

from __future__ import annotations

import ast

from cfgfix.analysis.model_values import MOVE_METHODS, Choice, Option, TupleState, _choice, _merge_values, _stamp
from cfgfix.analysis.names import ImportMap, dotted, walk


# -- branch conditions -------------------------------------------------------------------
def _facts(test: ast.expr) -> tuple[frozenset, frozenset]:
    """What holds in the body and in the `else` of `if test:`, as facts on names:
    truthiness (`if args.q:`, `if not flag:`) and equality with a constant
    (`if t == "qwen":`, `if cfg is None:`); `and`/`or` where each part gives a fact."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yes, no = _facts(test.operand)
        return no, yes
    if isinstance(test, ast.BoolOp):
        parts = [_facts(value) for value in test.values]
        if isinstance(test.op, ast.And):
            return frozenset().union(*(p[0] for p in parts)), frozenset()
        return frozenset(), frozenset().union(*(p[1] for p in parts))
    key = dotted(test)
    if key is not None:
        return frozenset({(key, "truthy", None, True)}), frozenset({(key, "truthy", None, False)})
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(right, ast.Constant) and dotted(left):
            key, value = dotted(left), right.value
        elif isinstance(left, ast.Constant) and dotted(right):
            key, value = dotted(right), left.value
        else:
            return frozenset(), frozenset()
        op = test.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            truth = True
        elif isinstance(op, (ast.NotEq, ast.IsNot)):
            truth = False
        else:
            return frozenset(), frozenset()
        return frozenset({(key, "eq", value, truth)}), frozenset({(key, "eq", value, not truth)})
    return frozenset(), frozenset()


def _same_key(a: str, b: str) -> bool:
    if a == b:
        return True
    return (a.startswith("*.") or b.startswith("*.")) and a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def _if_sides(node: ast.IfExp, depth: int = 0) -> list[tuple[ast.expr, frozenset]]:
    """Each value of `a if t else (b if u else c)` with the facts under which it is taken
    (a nested conditional in either side is split further, a few levels deep)."""
    yes, no = _facts(node.test)
    out = []
    for expr, when in ((node.body, yes), (node.orelse, no)):
        if isinstance(expr, ast.IfExp) and depth < 3:
            out.extend((inner, when | also) for inner, also in _if_sides(expr, depth + 1)
                       if not any(_contradicts(f, g) for f in when for g in also))
        else:
            out.append((expr, when))
    return out


def _contradicts(f: tuple, g: tuple) -> bool:
    """Two facts that cannot both hold (`flag` true and false, `t == "a"` and `t == "b"`)."""
    if not _same_key(f[0], g[0]):
        return False
    if f[1] == g[1] == "truthy":
        return f[3] != g[3]
    if f[1] == g[1] == "eq":
        if f[2] == g[2]:
            return f[3] != g[3]
        return f[3] and g[3]
    truthy, eq = (f, g) if f[1] == "truthy" else (g, f)
    return eq[3] and bool(eq[2]) != truthy[3]


def _assume(env: dict, facts: frozenset, depth: int) -> dict:
    """The env inside a branch (`depth` ifs deep) where `facts` hold: options of a Choice
    that need the opposite are dropped (`if flag: A else: B` ... `if not flag:` sees only
    B); what is left is as certain there as it was outside."""
    env = dict(env)
    if not facts:
        return env
    for key, value in list(env.items()):
        if isinstance(value, Choice):
            kept = [o for o in value.options if not any(_contradicts(f, g) for f in o.when for g in facts)]
            if len(kept) != len(value.options):
                narrowed = _choice(kept) if kept else None
                if narrowed is None:
                    del env[key]
                else:
                    env[key] = _stamp(narrowed, depth)
    return env


def _forget_facts(env: dict, key: str) -> None:
    """`key` was rebound: conditions on it no longer say which option holds."""
    prefix = key if key.endswith(".") else key + "."
    for name, value in list(env.items()):
        if isinstance(value, Choice) and any(f[0] == key or f[0].startswith(prefix) for o in value.options for f in o.when):
            env[name] = Choice(tuple(
                Option(o.state, frozenset(f for f in o.when if not (f[0] == key or f[0].startswith(prefix))))
                for o in value.options), value.depth)


_EXITS = {"sys.exit", "exit", "quit", "os._exit"}


def _ends(body: list[ast.stmt], imports: ImportMap) -> bool:
    """The block never falls through to the statement after it (`return`, `raise`,
    `continue`, `break`, `sys.exit()`, or an `if` whose branches all end)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return (imports.qualify(last.value.func) or "") in _EXITS
    if isinstance(last, ast.If):
        return _ends(last.body, imports) and _ends(last.orelse, imports)
    return False


def _forget(env: dict, key: str) -> None:
    """Drop `key` and everything under it (`self.` drops every attribute of self), and
    the branch conditions that name them."""
    prefix = key if key.endswith(".") else key + "."
    for name in [k for k in env if k == key or k.startswith(prefix)]:
        del env[name]
    _forget_facts(env, key)


def _merge(a: dict, b: dict) -> dict:
    """What both paths bind: the same state, the same load whose dtype differs by path
    (`if args.bf16: model = model.to(torch.bfloat16)` keeps the `device_map` placement
    either way; the dtype becomes unknown), or a `Choice` of their values."""
    merged = {}
    for key, value in a.items():
        if key in b:
            joined = _merge_values(value, b[key])
            if joined is not None:
                merged[key] = joined
    return merged


def _restamp(env: dict, before: dict, depth: int) -> dict:
    """Choices an `if` made or changed became uncertain at the `if` itself."""
    for key, value in env.items():
        if isinstance(value, (Choice, TupleState)) and before.get(key) is not value:
            env[key] = _stamp(value, depth)
    return env


def _join(a: dict, b: dict, when_a: frozenset, when_b: frozenset) -> dict:
    """After `if`/`else`: every name either branch holds. A name only one branch binds
    becomes a Choice with an untracked option (what it held before, or another object):
    a branch that binds a dispatched model still reaches what follows."""
    merged = {}
    for key in [*a, *(k for k in b if k not in a)]:
        joined = _merge_values(a.get(key), b.get(key), when_a, when_b)
        if joined is not None:
            merged[key] = joined
    return merged


def _bound_in(stmt: ast.stmt) -> set[str]:
    """Names and self attributes that a compound statement may rebind anywhere inside it."""
    names: set[str] = set()
    for node in walk(stmt):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            key = dotted(node)
            if key:
                names.add(key)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            key = dotted(node.func.value)  # an in-place cast inside a loop changes the dtype
            if key and node.func.attr in MOVE_METHODS | {"apply"}:
                names.add(key)
    return names


# What a test reads to learn where a model is: `model.device`, `model.device.type`,
# `next(model.parameters()).device` / `.is_cuda`, `model.hf_device_map`, `hasattr(model,
# "hf_device_map")`.
_PLACEMENT_ATTRS = frozenset({"device", "is_cuda", "hf_device_map"})


def placement_tested(test: ast.expr, attrs: frozenset = _PLACEMENT_ATTRS) -> frozenset:
    """The keys (`model`, `self.model`) whose placement `test` reads (or whose `attrs`:
    `dtype_tested`)."""
    keys = set()
    for node in walk(test):
        if isinstance(node, ast.Attribute) and node.attr in attrs:
            owner = node.value
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "next" \
                    and owner.args and isinstance(owner.args[0], ast.Call) \
                    and isinstance(owner.args[0].func, ast.Attribute) and owner.args[0].func.attr == "parameters":
                owner = owner.args[0].func.value  # next(model.parameters()).device
            key = dotted(owner)
            if key is not None:
                keys.add(key)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in attrs:
            key = dotted(node.args[0])
            if key is not None:
                keys.add(key)
    return frozenset(keys)


def dtype_tested(test: ast.expr) -> frozenset:
    """The keys whose dtype `test` reads (`if self.model.dtype != torch.bfloat16:`)."""
    return placement_tested(test, _DTYPE_ATTRS)


_DTYPE_ATTRS = frozenset({"dtype"})
