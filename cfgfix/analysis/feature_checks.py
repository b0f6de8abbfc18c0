"""Feature fallbacks: code that runs only where a newer API is missing.

Code that supports several releases often tests for the new API instead of a version:

    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda")
    else:
        scaler = torch.cuda.amp.GradScaler()     # runs only where torch.amp has no GradScaler

    try:
        from torch.amp import GradScaler
    except ImportError:
        from torch.cuda.amp import GradScaler    # the same, spelled as an import fallback

A rule that asks for the new spelling has nothing to say about such a fallback: on every
release where the new API exists, the fallback does not run. What is read:

- `if hasattr(obj, "name"):` … `else:` (and `if not hasattr(...)`'s body, and the
  conditional expression `a if hasattr(...) else b`): the fallback is the branch taken
  when the attribute is missing;
- `try:` … `except (ImportError | ModuleNotFoundError | AttributeError | Exception):`
  whose body uses the feature: the handler is the fallback.

`fallback_nodes(tree, feature)` gives the ids of every node inside a fallback for a feature
whose dotted name (`torch.amp.GradScaler`) ends with or contains one of `feature`'s names.
"""

from __future__ import annotations

import ast

from cfgfix.analysis.names import dotted

_FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception"}


def _hasattr_feature(test: ast.expr) -> tuple[str, bool] | None:
    """`hasattr(obj, "name")` -> ("obj.name", True); `not hasattr(...)` -> (..., False);
    `hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")` -> the last, True (its
    `else` runs only where some part, each a step towards the feature, is missing)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        parts = [_hasattr_feature(v) for v in test.values]
        if parts and all(p is not None and p[1] for p in parts):
            return max(parts, key=lambda p: len(p[0]))
        return None
    positive = True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, False
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "hasattr"
            and len(test.args) == 2 and isinstance(test.args[1], ast.Constant)
            and isinstance(test.args[1].value, str)):
        owner = dotted(test.args[0]) or ""
        return f"{owner}.{test.args[1].value}", positive
    return None


def _mentions(name: str, features: tuple[str, ...]) -> bool:
    return any(f in name for f in features)


def _uses(body: list[ast.stmt], features: tuple[str, ...]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, (ast.Attribute, ast.Name)) and _mentions(dotted(node) or "", features):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and any(
                _mentions(f"{node.module}.{alias.name}", features) for alias in node.names):
            return True
    return False


def _catches_fallback(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((dotted(k) or "").rsplit(".", 1)[-1] in _FALLBACK_ERRORS for k in kinds)


def _after_early_exit(block: list, features: tuple[str, ...]) -> list[ast.stmt]:
    """The statements after `if hasattr(<feature>): ... return` in one block: they run only
    where the feature is missing."""
    for i, stmt in enumerate(block):
        if isinstance(stmt, ast.If) and not stmt.orelse and stmt.body \
                and isinstance(stmt.body[-1], (ast.Return, ast.Raise)):
            found = _hasattr_feature(stmt.test)
            if found is not None and found[1] and _mentions(found[0], features):
                return block[i + 1:]
    return []


def fallback_nodes(tree: ast.AST, features: tuple[str, ...]) -> set[int]:
    """Ids of the nodes that run only where one of `features` (dotted names such as
    `torch.amp.GradScaler`, matched by containment) is missing."""
    inside: set[int] = set()

    def take(parts) -> None:
        for part in parts:
            inside.update(id(n) for n in ast.walk(part))

    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            found = _hasattr_feature(node.test)
            if found is None or not _mentions(found[0], features):
                continue
            missing = node.orelse if found[1] else node.body
            take(missing if isinstance(missing, list) else [missing])
        elif isinstance(node, ast.Try) and _uses(node.body, features):
            take(h for h in node.handlers if _catches_fallback(h))
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                take(_after_early_exit(block, features))
    return inside


def fallback_import_names(tree: ast.AST, features: tuple[str, ...]) -> set[str]:
    """Local names an import inside a fallback binds (`except ImportError: from torch.cuda.amp
    import autocast`): where the feature exists, the name holds the new API instead."""
    inside = fallback_nodes(tree, features)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) in inside:
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names
