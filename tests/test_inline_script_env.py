"""`srun bash -c '...'`: the inner shell expands the single-quoted script itself and sees only
the variables the outer shell exported (or that the script sets), not its plain ones; a
double-quoted script, or a variable spliced in (`'"$G"'`), is expanded by the outer shell."""

import pytest

from cfgfix.documents.launches import find_launches
from cfgfix.documents.shell import parse_shell
from cfgfix.documents.text import SourceText


def _worlds(text: str) -> list:
    doc = parse_shell(SourceText.from_bytes("run.sh", text.encode()))
    return [launch.world_size for launch in find_launches(doc)]


@pytest.mark.parametrize("before, expected", [
    ("GPUS=4\n", None),  # plain: the inner bash does not see it
    ("export GPUS=4\n", 4),
    ("GPUS=4\nexport GPUS\n", 4),  # exported after the assignment
    ("declare -x GPUS=4\n", 4),
    ("set -a\nGPUS=4\n", 4),  # allexport
    ("GPUS=4\nexport OTHER=1\n", None),  # another name exported
])
def test_outer_variables_inside_a_single_quoted_script(before, expected):
    text = before + "srun bash -c 'torchrun --nproc_per_node ${GPUS} --nnodes 1 train.py'\n"
    assert _worlds(text) == [expected]


def test_an_export_after_the_launch_does_not_reach_it():
    text = "GPUS=4\nsrun bash -c 'torchrun --nproc_per_node $GPUS train.py'\nexport GPUS\n"
    assert _worlds(text) == [None]


@pytest.mark.parametrize("script, expected", [
    ("srun bash -c \"torchrun --nproc_per_node $GPUS train.py\"", 4),  # the outer shell expands it
    ("srun bash -c 'N=2; torchrun --nproc_per_node $N train.py'", 2),  # set inside the script
    ("bash -c 'torchrun --nproc_per_node $GPUS train.py'", None),  # any single-quoted -c script, not only srun's
])
def test_who_expands_the_variable(script, expected):
    assert _worlds("GPUS=4\n" + script + "\n") == [expected]


def test_plain_variables_outside_inline_scripts_are_unchanged():
    assert _worlds("GPUS=4\ntorchrun --nproc_per_node $GPUS train.py\n") == [4]
