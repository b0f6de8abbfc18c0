"""The import map and the statement walks it reads (analysis/names.py)."""

import ast
import textwrap

from cfgfix.analysis.names import ImportMap, iter_statements, module_statements


def imports_of(code: str) -> ImportMap:
    return ImportMap(ast.parse(textwrap.dedent(code)))


def qualify(imports: ImportMap, expr: str) -> str | None:
    return imports.qualify(ast.parse(expr, mode="eval").body)


def test_imports_in_every_block_and_scope():
    imports = imports_of("""
        import torch as th
        import torch.nn
        from transformers import AutoModel as AM
        from .build import build_model
        from ..data import *
        try:
            from apex import amp
        except ImportError:
            from torch.cuda import amp
        def f():
            import numpy as np
            class C:
                from os import path
    """)
    assert imports.aliases == {
        "th": "torch", "torch": "torch", "AM": "transformers.AutoModel",
        # the handler's import comes before the `try` body's (a stack's order): the body wins
        "amp": "apex.amp", "np": "numpy", "path": "os.path",
    }
    assert imports.relative == {"build_model": (1, "build", "build_model")}


def test_a_name_bound_once_to_an_api_path_is_an_alias():
    imports = imports_of("""
        import torch
        ckpt = torch.utils.checkpoint.checkpoint
        def f():
            autocast = torch.cuda.amp.autocast
    """)
    assert qualify(imports, "ckpt") == "torch.utils.checkpoint.checkpoint"
    assert qualify(imports, "autocast(x)") is None
    assert qualify(imports, "autocast.y") == "torch.cuda.amp.autocast.y"


def test_a_name_bound_again_anyhow_is_no_alias():
    imports = imports_of("""
        import torch
        a = torch.utils.checkpoint.checkpoint
        a = torch.utils.checkpoint.checkpoint
        b = torch.utils.checkpoint.checkpoint
        x, (b, *c) = 1, (2, 3)
        d = torch.utils.checkpoint.checkpoint
        [e, d] = 1, 2
        f = torch.utils.checkpoint.checkpoint
        f += 1
        g = torch.utils.checkpoint.checkpoint
        g: int = 0
        h = torch.utils.checkpoint.checkpoint
        (*h,) = [1]
    """)
    for name in "abdfgh":
        assert qualify(imports, name) == name


def test_a_name_written_into_is_a_value_not_an_alias():
    imports = imports_of("""
        import uvicorn
        log_config = uvicorn.config.LOGGING_CONFIG
        log_config["formatters"]["access"]["fmt"] = "%(message)s"
        handler = uvicorn.config.Handler
        handler.level, other = 1, 2
    """)
    assert qualify(imports, "log_config") == "log_config"
    assert qualify(imports, "handler") == "handler"


def test_a_name_read_in_a_target_is_no_alias():
    """Every name of a target that is not a plain name counts as assigned there, as
    `module_parts` assumes: `table[ckpt] = 1` makes `ckpt` no alias (nor `self`, `pair`)."""
    imports = imports_of("""
        import torch
        ckpt = torch.utils.checkpoint.checkpoint
        table[ckpt] = 1
        other = torch.utils.checkpoint.checkpoint
        self.items[0], pair[other.x] = 1, 2
        kept = torch.utils.checkpoint.checkpoint
        self.items.last = kept
    """)
    assert qualify(imports, "ckpt") == "ckpt"
    assert qualify(imports, "other") == "other"
    assert qualify(imports, "kept") == "torch.utils.checkpoint.checkpoint"


def test_iter_statements_yields_every_statement_once_without_expressions():
    tree = ast.parse(textwrap.dedent("""
        import os
        class A:
            def f(self):
                if x:
                    for i in y:
                        pass
                    else:
                        a = lambda: 1
                elif z:
                    while True:
                        break
                try:
                    pass
                except E:
                    pass
                else:
                    pass
                finally:
                    pass
                with m:
                    match v:
                        case 1:
                            pass
        async def g():
            async for i in y:
                pass
            async with m:
                pass
    """))
    walked = [n for n in ast.walk(tree) if isinstance(n, (ast.stmt, ast.excepthandler, ast.match_case))]
    yielded = list(iter_statements(tree.body))
    assert len(yielded) == len(walked)
    assert {id(n) for n in yielded} == {id(n) for n in walked}
    assert module_statements(tree) == yielded
    assert module_statements(tree) is module_statements(tree)  # memoised on the tree
