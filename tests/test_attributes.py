"""`self.x` across a class's methods, and the expression a name's value was built from."""

from __future__ import annotations

import ast
import textwrap

from cfgfix.analysis.attributes import ValueIndex


def setup(code: str):
    tree = ast.parse(textwrap.dedent(code))
    index = ValueIndex(tree)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    return index, cls, methods


def expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def test_attribute_assigned_once_in_another_method():
    index, cls, methods = setup("""
        class T:
            def __init__(self):
                self.scaler = None
                self.use_amp = True
            def setup(self):
                self.scaler = torch.amp.GradScaler("cuda")
            def step(self):
                self.scaler.step(self.opt)
    """)
    origin = index.origin(expr("self.scaler"), methods["step"], cls)
    assert ast.unparse(origin) == "torch.amp.GradScaler('cuda')"
    assert ast.unparse(index.origin(expr("self.use_amp"), methods["step"], cls)) == "True"


def test_attribute_assigned_twice_or_unpacked_is_unknown():
    index, cls, methods = setup("""
        class T:
            def __init__(self, a):
                self.flag = True
                self.x, self.y = a
            def later(self):
                self.flag = False
    """)
    assert ast.unparse(index.origin(expr("self.flag"), methods["later"], cls)) == "self.flag"
    assert ast.unparse(index.origin(expr("self.x"), methods["later"], cls)) == "self.x"


def test_name_through_local_and_module_bindings():
    index, cls, methods = setup("""
        AMP = True
        class T:
            def run(self, enabled):
                flag = AMP
                other = enabled
    """)
    run = methods["run"]
    assert ast.unparse(index.origin(expr("flag"), run, cls)) == "True"
    assert ast.unparse(index.origin(expr("enabled"), run, cls)) == "enabled"  # a parameter

