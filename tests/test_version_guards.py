"""The shared version-guard fact: which library versions reach a piece of code."""

from __future__ import annotations

import ast
import textwrap

import pytest

from cfgfix.analysis.version_guards import Bound, VersionGuards


def _call(tree: ast.Module, marker: str) -> ast.Call:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == marker:
            return node
    raise AssertionError(marker)


def _guards(code: str):
    tree = ast.parse(textwrap.dedent(code))
    return tree, VersionGuards(tree)


@pytest.mark.parametrize(
    "test, expected_else",
    [
        ('is_torch_version(">=", "1.11.0")', Bound("torch", "<", "1.11.0")),
        ('is_torch_greater_or_equal("2.0")', Bound("torch", "<", "2.0")),
        ("is_torch_greater_or_equal_than_1_13", Bound("torch", "<", "1.13")),
        ('version.parse(torch.__version__) >= version.parse("1.11")', Bound("torch", "<", "1.11")),
        ('version.parse("1.11") <= version.parse(torch.__version__)', Bound("torch", "<", "1.11")),
        ('torch.__version__ > "1.10"', Bound("torch", "<=", "1.10")),
        ('TORCH_VERSION >= version.parse("1.11")', Bound("torch", "<", "1.11")),
        ('is_transformers_version(">=", "4.40")', Bound("transformers", "<", "4.40")),
    ],
)
def test_idioms_bound_the_else_branch(test, expected_else):
    tree, guards = _guards(f"""
        import torch
        from packaging import version
        TORCH_VERSION = version.parse(torch.__version__)
        if {test}:
            new()
        else:
            old()
    """)
    assert guards.bounds(_call(tree, "old")) == (expected_else,)
    assert guards.bounds(_call(tree, "new")) == (expected_else.negated(),)


def test_runs_only_below_compares_releases():
    tree, guards = _guards("""
        if is_torch_version(">=", "1.11.0"):
            new()
        else:
            old()
        if not is_torch_version(">=", "2.0"):
            older_than_2()
        other()
    """)
    assert guards.runs_only_below(_call(tree, "old"), "torch", "1.11")
    assert not guards.runs_only_below(_call(tree, "new"), "torch", "1.11")
    # torch 1.11 .. 1.13 reach this branch
    assert not guards.runs_only_below(_call(tree, "older_than_2"), "torch", "1.11")
    assert guards.runs_only_below(_call(tree, "older_than_2"), "torch", "2.0")
    assert not guards.runs_only_below(_call(tree, "other"), "torch", "1.11")
    assert not guards.runs_only_below(_call(tree, "old"), "transformers", "1.11")


def test_combinations_early_exits_and_conditional_expressions():
    tree, guards = _guards("""
        def f(flag):
            if flag and is_torch_version("<", "1.11"):
                both()
            else:
                either()
            if flag or is_torch_version(">=", "1.11"):
                pass
            else:
                neither()
            if is_torch_version(">=", "1.11"):
                return fast()
            return slow()
        kw = ctor(a=1) if is_torch_version(">=", "1.11") else legacy()
        def g():
            if unknown():
                return
            after_unknown()
    """)
    assert guards.runs_only_below(_call(tree, "both"), "torch", "1.11")
    assert guards.bounds(_call(tree, "either")) == ()  # `a and b` false: neither is known
    assert guards.runs_only_below(_call(tree, "neither"), "torch", "1.11")
    assert guards.runs_only_below(_call(tree, "slow"), "torch", "1.11")
    assert not guards.runs_only_below(_call(tree, "fast"), "torch", "1.11")
    assert guards.runs_only_below(_call(tree, "legacy"), "torch", "1.11")
    assert not guards.runs_only_below(_call(tree, "ctor"), "torch", "1.11")
    assert guards.bounds(_call(tree, "after_unknown")) == ()


def test_non_version_tests_and_unrelated_strings_add_nothing():
    tree, guards = _guards("""
        import torch
        if torch.cuda.is_available():
            a()
        if name >= "1.11":
            b()
        if is_torch_version(">=", some_variable):
            c()
        else:
            d()
    """)
    for marker in "abcd":
        assert guards.bounds(_call(tree, marker)) == ()
