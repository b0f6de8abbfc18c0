"""Arms of compound statements that never both run in one pass: an `if`'s body and its
`else`, the cases of a `match`, and a `try`'s handler against anything but `finally`.

`ArmPaths` records, for every statement of one scope, the arms around it (outermost
first), so two statements can be asked whether one run may reach both."""

from __future__ import annotations

import ast


def arms_exclusive(kind: str, a: str, b: str) -> bool:
    """Two different arms (`body`, `orelse`, `finalbody`, `handlerN`, `caseN`) of one
    compound statement of `kind` ("if", "match", "try", "other")."""
    if kind in ("if", "match"):
        return True
    if kind == "try":
        return "finalbody" not in (a, b) and (a.startswith("handler") or b.startswith("handler"))
    return False  # a loop's body and `else` both run


class ArmPaths:
    """For each statement of one body (not inside nested functions or classes), the arms of
    the compound statements around it: `(id(statement), arm, kind)`, outermost first."""

    def __init__(self, body: list[ast.stmt]) -> None:
        self.paths: dict[int, tuple[tuple[int, str, str], ...]] = {}
        self._block(body, ())

    def _block(self, body, path) -> None:
        for stmt in body:
            self.paths[id(stmt)] = path
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # another scope
            kind = {ast.If: "if", ast.Try: "try", ast.Match: "match"}.get(type(stmt), "other")
            if getattr(ast, "TryStar", None) is type(stmt):
                kind = "try"
            for name in ("body", "orelse", "finalbody"):
                children = getattr(stmt, name, None)
                if children:
                    self._block(children, path + ((id(stmt), name, kind),))
            for i, handler in enumerate(getattr(stmt, "handlers", ()) or ()):
                self._block(handler.body, path + ((id(stmt), f"handler{i}", kind),))
            for i, case in enumerate(getattr(stmt, "cases", ()) or ()):
                self._block(case.body, path + ((id(stmt), f"case{i}", kind),))

    def exclusive(self, a: ast.stmt, b: ast.stmt) -> bool:
        """The two statements sit in arms of one compound statement that never both run."""
        for (na, fa, kind), (nb, fb, _) in zip(self.paths.get(id(a), ()), self.paths.get(id(b), ())):
            if na != nb:
                return False
            if fa != fb:
                return arms_exclusive(kind, fa, fb)
        return False
