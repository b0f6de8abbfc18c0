"""Branch tests that tell a single-process run from a launched one (analysis/process_tests.py),
and the model analysis marking the loads only a single-process run reaches."""

from __future__ import annotations

import ast
import textwrap

import pytest

from cfgfix.analysis.models import analyze_models
from cfgfix.analysis.names import ImportMap, single_assignments
from cfgfix.analysis.process_tests import single_process_side


def _sides(prelude: str, test: str) -> tuple[bool, bool]:
    """(body, else) of `if test:` after `prelude`: which side only a single process takes."""
    tree = ast.parse(textwrap.dedent(prelude) + f"\nif {test}:\n    pass\n")
    imports, consts = ImportMap(tree), single_assignments(tree.body)

    def deref(node):
        return consts.get(node.id, node) if isinstance(node, ast.Name) else node

    node = tree.body[-1].test
    return (single_process_side(node, True, deref, imports.qualify),
            single_process_side(node, False, deref, imports.qualify))


ENV = "import os\n"
RANK = ENV + "local_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
WORLD = ENV + "world_size = int(os.environ.get('WORLD_SIZE', 1))\n"


@pytest.mark.parametrize("prelude, test, sides", [
    (RANK, "local_rank == -1", (True, False)),
    (RANK, "local_rank != -1", (False, True)),
    (RANK, "-1 != local_rank", (False, True)),
    (RANK, "local_rank < 0", (True, False)),
    (RANK, "local_rank >= 0", (False, True)),
    (ENV, "int(os.getenv('RANK', '-1')) == -1", (True, False)),
    (ENV + "from os import environ\n", "environ.get('LOCAL_RANK', -1) == -1", (True, False)),
    (ENV, "'LOCAL_RANK' not in os.environ", (True, False)),
    (ENV, "'WORLD_SIZE' in os.environ", (False, True)),
    (WORLD, "world_size == 1", (True, False)),
    (WORLD, "world_size > 1", (False, True)),
    (WORLD, "world_size < 2", (True, False)),
    (WORLD, "1 < world_size", (False, True)),
    (WORLD + "ddp = world_size != 1\n", "ddp", (False, True)),
    (WORLD + "ddp = world_size != 1\n", "not ddp", (True, False)),
    (WORLD, "world_size == 1 and use_auto", (True, False)),  # both hold: single
    (WORLD, "world_size > 1 or force", (False, True)),       # neither holds: single
])
def test_launcher_environment_tests(prelude, test, sides):
    assert _sides(prelude, test) == sides


@pytest.mark.parametrize("prelude, test", [
    # a real rank may equal the default (rank 0 exists in a launched run too)
    (ENV + "local_rank = int(os.environ.get('LOCAL_RANK', 0))\n", "local_rank == 0"),
    (ENV + "local_rank = int(os.environ.get('LOCAL_RANK', 0))\n", "local_rank != 0"),
    # a comparison that does not split unset from launched (`-1 <= rank`, rank 0 vs others)
    (RANK, "local_rank <= 0"),
    (RANK, "local_rank == 1"),
    # a command-line rank: torchrun does not pass `--local_rank`
    ("", "args.local_rank == -1"),
    # a world size compared with something else than 1, or with no usable default
    (WORLD, "world_size == 8"),
    (ENV + "world_size = int(os.environ['WORLD_SIZE'])\n", "world_size == 1"),
    # a name bound twice, or another variable
    (RANK + "local_rank = args.local_rank\n", "local_rank == -1"),
    (ENV, "os.environ.get('MASTER_ADDR', -1) == -1"),
    # `or` in the body / `and` in the else: one part alone does not decide
    (WORLD, "world_size == 1 or big_model"),
    (WORLD, "world_size > 1 and not cpu"),
    ("import torch\n", "torch.cuda.device_count() == 1"),
])
def test_tests_that_do_not_tell(prelude, test):
    assert _sides(prelude, test) == (False, False)


def _single(code: str) -> list[tuple[int, bool]]:
    code = textwrap.dedent(code)
    analysis = analyze_models(ast.parse(code), code)
    return sorted((load.line, load.single_process) for load in analysis.loads)


def test_loads_in_single_process_branches_are_marked():
    assert _single("""
        import os
        from transformers import AutoModelForCausalLM
        def main():
            local_rank = int(os.environ.get("LOCAL_RANK", -1))
            if local_rank != -1:
                model = AutoModelForCausalLM.from_pretrained("m")
            else:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
            return model
    """) == [(7, False), (9, True)]


def test_after_an_early_exit_only_the_other_side_continues():
    assert _single("""
        import os, sys
        from transformers import AutoModelForCausalLM
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        def main():
            if world_size > 1:
                sys.exit("run me without a launcher")
            return AutoModelForCausalLM.from_pretrained("m", device_map="auto")
        def other():
            if world_size > 1:
                print("distributed")
            return AutoModelForCausalLM.from_pretrained("m", device_map="auto")
    """) == [(8, True), (12, False)]


def test_a_nested_branch_keeps_what_the_outer_one_says():
    assert _single("""
        import os
        from transformers import AutoModelForCausalLM
        if "LOCAL_RANK" not in os.environ:
            if big:
                model = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
        model2 = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
    """) == [(6, True), (7, False)]
