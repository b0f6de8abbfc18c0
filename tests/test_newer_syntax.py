"""Python newer than the interpreter (PEP 701 f-strings, PEP 695 type parameters): the rules
still read the file; CFX901 is only for code no current Python accepts."""

import ast
import sys

import pytest

from cfgfix.documents.python import parse_python
from conftest import lint_project, write_project

NEW_FSTRING = sys.version_info < (3, 12)  # this interpreter's ast rejects PEP 701 f-strings

SCRIPT = (
    "import torch\n"
    "from transformers import AutoModelForCausalLM\n"
    'name = "Qwen/Qwen2.5-7B#main"\n'
    'print(f"loading {name.split("#")[0]} with {"\\n".join(["a", "b"])}")\n'
    'model = AutoModelForCausalLM.from_pretrained(name.split("#")[0], device_map="auto", torch_dtype=torch.bfloat16)\n'
    "type Batch = dict[str, torch.Tensor]\n"
    "def step[T](m: T) -> T:\n"
    "    return m\n"
    "model.to('cuda')\n"
)
# The same script as Python 3.11 writes it: the findings must be the same.
TWIN = SCRIPT.replace('{name.split("#")[0]} with {"\\n".join(["a", "b"])}', "{name.split('#')[0]} with {chr(10).join(['a', 'b'])}")


def test_newer_file_gets_the_findings_of_its_older_twin(tmp_path):
    write_project(tmp_path, {"new.py": SCRIPT, "old.py": TWIN.replace("type Batch = ", "Batch = ").replace("def step[T]", "def step")})
    _, _, result = lint_project(tmp_path)
    by_file = {}
    for f in result.findings:
        by_file.setdefault(f.path, []).append((f.code, f.span.line, f.span.column, f.span.end_column))
    assert by_file["new.py"] == by_file["old.py"] == [("CFX103", 9, 1, 17)]


def test_newer_file_is_fixed(tmp_path, monkeypatch):
    from cfgfix.fixing import fix_file

    write_project(tmp_path, {"new.py": SCRIPT})
    engine, files, _ = lint_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    outcome = fix_file(engine, files[0], files[0].path.read_bytes(), unsafe=False)
    assert outcome.fixed == SCRIPT.replace("model.to('cuda')\n", "")


def test_invalid_code_is_still_a_syntax_error(tmp_path):
    """Near miss: code that no Python accepts keeps its CFX901 error and the interpreter's message."""
    write_project(tmp_path, {"bad.py": SCRIPT + "def broken(:\n    pass\n"})
    _, _, result = lint_project(tmp_path)
    [finding] = result.findings
    assert finding.code == "CFX901" and finding.severity.value == "error"
    # The interpreter stumbles on the (valid) f-string of line 4 first; the error is below it.
    assert finding.span.line in (10, 11) and finding.message.startswith("syntax error: ")


@pytest.mark.skipif(not NEW_FSTRING, reason="this interpreter parses PEP 701 f-strings itself")
def test_fstrings_are_blanked_at_equal_length():
    from cfgfix.documents.newer_syntax import neutralise

    text = 'x = rf"{a["k"]}" + f"{b}"\ny = f"""{c}\n{"\\n".join(d)}"""\n'
    out = neutralise(text)
    assert len(out) == len(text) and out.replace(" ", "") == 'x=""+f"{b}"\ny="""\n"""\n'
    assert out.index('"') == text.index('"') and out.index("\n") == text.index("\n")
    ast.parse(out)


def test_type_parameters_and_aliases_keep_positions():
    from cfgfix.documents.newer_syntax import neutralise

    text = "type Pair[T] = tuple[T, T]\nclass Box[T: int]:\n    def get[U](self, u: U) -> U: ...\n"
    out = neutralise(text)
    assert len(out) == len(text)
    if sys.version_info < (3, 12):
        assert out == "_=0; Pair    = tuple[T, T]\nclass Box        :\n    def get   (self, u: U) -> U: ...\n"
    tree = ast.parse(out)
    alias = tree.body[1]  # after the `_=0` that stands in for the `type` keyword
    assert isinstance(alias, ast.Assign) and alias.targets[0].col_offset == 5


def test_parse_python_gives_the_interpreters_error_for_invalid_code():
    with pytest.raises(SyntaxError) as caught:
        parse_python("x = (\n")
    assert caught.type is SyntaxError and "never closed" in caught.value.msg
