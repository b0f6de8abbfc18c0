"""Keyword dicts built step by step and spread into a call (analysis/keyword_dicts.py)."""

from __future__ import annotations

import ast
import textwrap

from cfgfix.analysis.keyword_dicts import spread_keywords


def _spread(code: str, name: str = "kw"):
    tree = ast.parse(textwrap.dedent(code))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "from_pretrained")
    found = spread_keywords(tree, name, call)
    return None if found is None else {k.arg: ast.unparse(k.value) for k in found}


def test_built_filled_and_updated_before_the_call():
    assert _spread("""
        def f(name):
            kw = dict(trust_remote_code=True)
            kw["device_map"] = "auto"
            kw.update(low_cpu_mem_usage=True)
            kw.update({"torch_dtype": torch.float16})
            m = M.from_pretrained(name, **kw)
            kw["device_map"] = None   # after the call: not what it passed
            return m
    """) == {"trust_remote_code": "True", "device_map": "'auto'", "low_cpu_mem_usage": "True",
             "torch_dtype": "torch.float16"}


def test_keys_set_under_tests_become_conditional_expressions():
    assert _spread("""
        kw = {}
        if multi:
            kw["device_map"] = "auto"
        else:
            kw["device_map"] = {"": 0}
        if q and not cpu:
            kw["quantization_config"] = bnb
        if half:
            kw["torch_dtype"] = torch.float16
        m = M.from_pretrained(name, **kw)
    """) == {"device_map": "'auto' if multi else {'': 0}",
             "quantization_config": "bnb if q and (not cpu) else None",
             # absent is not None for a dtype: the other path stays unknown
             "torch_dtype": "torch.float16 if half else <absent>"}


def test_uses_not_understood_leave_the_dict_unknown():
    for use in ("log(kw)", "other = kw", "kw.pop('device_map')", "kw[key] = 1", "del kw['a']",
                "for k in ks:\n    kw[k] = 1", "for k in ks:\n    kw['a'] = k"):
        body = textwrap.indent(use, "    ")
        assert _spread(f"def f():\n    kw = dict(a=1)\n{body}\n    M.from_pretrained('m', **kw)\n") is None, use
    # reads are fine
    assert _spread("def f():\n    kw = dict(a=1)\n    print(kw['a'], kw.get('a'), 'a' in kw)\n"
                   "    M.from_pretrained('m', **kw)\n") == {"a": "1"}
    # rebound, built from something else, or spread from a parameter: not followed
    assert _spread("def f(kw):\n    M.from_pretrained('m', **kw)\n") is None
    assert _spread("def f():\n    kw = dict(a=1)\n    kw = dict(b=2)\n    M.from_pretrained('m', **kw)\n") is None
    assert _spread("def f():\n    kw = make()\n    M.from_pretrained('m', **kw)\n") is None
    assert _spread("def f():\n    kw = dict(**base)\n    M.from_pretrained('m', **kw)\n") is None
