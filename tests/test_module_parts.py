"""Another module of the project parsed in parts (analysis/module_parts.py): the model
analysis that follows an import into it reads the same as from a whole parse, while the
blocks it never asks for stay unparsed; whatever is uncertain parses the whole module."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from cfgfix.analysis import module_parts
from cfgfix.analysis.models import FunctionTable, analyze_models
from cfgfix.analysis.module_parts import ModuleParts
from cfgfix.analysis.names import ImportMap, single_assignments, walk
from cfgfix.analysis.project_modules import ProjectModules

# Blocks the analysis never asks for: they must stay unparsed.
FILLER = "".join(
    f"\n\ndef helper_{i}(x, device=None):\n    y = x.to(device)\n    return y.cpu()\n" for i in range(40)
)


def big(text: str) -> str:
    """A module of more than 40 blocks: the one asked for, and filler."""
    return textwrap.dedent(text) + FILLER


def write(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def run(tmp_path: Path, monkeypatch, parts: bool, main: str = "train.py"):
    """The analysis of `main`, following its imports in parts (or whole), and the
    ParsedModule of every module it followed."""
    monkeypatch.setattr(module_parts, "MIN_BYTES", 0 if parts else 10**9)
    project = ProjectModules(tmp_path)
    path = tmp_path / main
    text = path.read_text()
    analysis = analyze_models(ast.parse(text), text, None, project, path)
    followed = {Path(key.removeprefix("parts:")).name: value[1] for key, value in project._parsed.items()
                if not key.startswith("raw:") and value[1]}
    return analysis, followed


def summary(analysis) -> list:
    loads = [(l.line, l.class_name, l.dtype, l.device_map and l.device_map.kind, l.quantized, l.library, l.path)
             for l in analysis.loads]
    calls = [(c.call.lineno, c.method, c.key, c.state.dtype, c.target_dtype, c.moves_device, c.state.load.where,
              c.state.load.class_name, c.state.load.library) for c in analysis.calls]
    return [loads, calls, [Path(d).name for d in analysis.deps]]


def both(tmp_path, monkeypatch, files, main="train.py"):
    write(tmp_path, files)
    whole, _ = run(tmp_path, monkeypatch, parts=False, main=main)
    parted, followed = run(tmp_path, monkeypatch, parts=True, main=main)
    assert summary(parted) == summary(whole)
    return summary(parted), followed


TRAIN = """
    import torch
    from models.build import build_model
    model = build_model("m")
    model.to(torch.bfloat16)
"""


def test_a_followed_function_is_parsed_alone(tmp_path, monkeypatch):
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            import torch
            from transformers import AutoModelForCausalLM

            DTYPE = torch.bfloat16


            def build_model(name):
                model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=DTYPE, device_map="auto")
                return model
        """),
        "train.py": TRAIN,
    })
    assert [call[:5] for call in result[1]] == [(5, "to", "model", "bfloat16", "bfloat16")]
    parts = followed["build.py"]
    assert isinstance(parts, ModuleParts) and not parts.whole
    assert "build_model" not in parts.pending and "helper_0" in parts.pending and len(parts.pending) == 40
    assert [s.name for s in parts.tree.body if isinstance(s, ast.FunctionDef)] == ["build_model"]


def test_a_black_formatted_signature_and_decorators_stay_in_their_block(tmp_path, monkeypatch):
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            import functools
            from transformers import AutoModelForCausalLM


            @functools.lru_cache(
                maxsize=None
            )
            def build_model(
                name: str,
            ) -> AutoModelForCausalLM:
                return AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        """),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][7] == "AutoModelForCausalLM"
    parts = followed["build.py"]
    assert isinstance(parts, ModuleParts) and "build_model" not in parts.pending and len(parts.pending) == 40


def test_a_block_cut_inside_a_string_parses_the_whole_module(tmp_path, monkeypatch):
    # `def helper():` at column 0 inside the docstring makes a block of its own: the loader's
    # block alone does not parse, so the whole module is parsed instead
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big('''
            from transformers import AutoModelForCausalLM


            def build_model(name):
                """Builds the model, as in
            def helper():
                pass
                """
                return AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        '''),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][7] == "AutoModelForCausalLM"
    assert followed["build.py"].whole


def test_top_level_code_that_does_not_parse_alone_parses_the_whole_module(tmp_path, monkeypatch):
    # "Example:" at column 0 inside a docstring reads as top-level code: the first parse fails
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big('''
            from transformers import AutoModelForCausalLM


            def build_model(name):
                """Builds the model.
            Example:
                """
                return AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        '''),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][7] == "AutoModelForCausalLM"
    assert not isinstance(followed["build.py"], ModuleParts)


def test_a_string_that_runs_across_a_blanked_block_parses_the_whole_module(tmp_path, monkeypatch):
    # the `def` inside the module-level string is blanked: the string's statement then runs
    # across it (it would parse, with another value), so the whole module is parsed
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big('''
            from transformers import AutoModelForCausalLM

            DOC = """
            def example():
                pass
            """


            def build_model(name):
                return AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        '''),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][7] == "AutoModelForCausalLM"
    assert not isinstance(followed["build.py"], ModuleParts)


def test_an_alias_assigned_in_another_function_is_read_as_a_whole_parse_reads_it(tmp_path, monkeypatch):
    # `ImportMap` reads a name assigned once anywhere in the file, to a path under an import,
    # as an alias of that path: the block that assigns it is parsed too
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            import transformers


            def _configure():
                Loader = transformers.models.AutoModelForCausalLM
                return Loader


            def build_model(name):
                return Loader.from_pretrained(name, device_map="auto")
        """),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][7] == "AutoModelForCausalLM"  # what the whole parse finds
    parts = followed["build.py"]
    assert isinstance(parts, ModuleParts) and "_configure" not in parts.pending and "helper_0" in parts.pending


def test_an_alias_undone_by_another_function_stays_undone(tmp_path, monkeypatch):
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            import transformers

            Loader = transformers.models.AutoModelForCausalLM


            def _reset():
                Loader: object = None  # a local, yet `ImportMap` counts it for the whole file


            def build_model(name):
                return Loader.from_pretrained(name, device_map="auto")
        """),
        "train.py": TRAIN,
    })
    assert result[1] == []  # two assignments: no alias, in parts as in the whole parse
    assert "_reset" not in followed["build.py"].pending


def test_an_import_inside_another_function_counts_for_the_whole_module(tmp_path, monkeypatch):
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            def _lazy():
                from transformers import AutoModelForCausalLM as Loader
                return Loader


            def build_model(name):
                return Loader.from_pretrained(name, device_map="auto")
        """),
        "train.py": TRAIN,
    })
    assert result[1] and result[1][0][8] == "transformers"
    assert "_lazy" not in followed["build.py"].pending


def test_a_second_lookup_adds_its_block_and_keeps_the_nodes_handed_out(tmp_path, monkeypatch):
    write(tmp_path, {
        "models/build.py": big("""
            from transformers import AutoModelForCausalLM


            def build_model(name):
                return AutoModelForCausalLM.from_pretrained(name, device_map="auto")


            def build_other(name):
                return AutoModelForCausalLM.from_pretrained(name)
        """),
        "train.py": """
            from models.build import build_model, build_other
        """,
    })
    monkeypatch.setattr(module_parts, "MIN_BYTES", 0)
    path = tmp_path / "train.py"
    tree = ast.parse(path.read_text())
    table = FunctionTable(tree, ImportMap(tree), ProjectModules(tmp_path), path)
    first = table.lookup(ast.Name(id="build_model"), None)
    other, node, _ = first
    assert other._parts is not None and "build_other" in other._parts.pending
    second = table.lookup(ast.Name(id="build_other"), None)
    assert second[0] is other and second[1].name == "build_other"
    assert other._defs["build_model"] is node  # the same node after the tree grew
    assert "helper_3" in other._parts.pending
    # a reader of the whole tree (the step-loop analysis) gets the whole module, same nodes
    whole = other.tree
    assert other._parts is None and len(other.defs) == 42 and whole.body[1] is node


def test_a_block_that_declares_a_constant_global_is_parsed(tmp_path, monkeypatch):
    # `_reset` rebinds `DTYPE`: not a constant of the module, in parts as in the whole parse
    # (each lookup makes a bigger tree; the constants are read again from it)
    result, followed = both(tmp_path, monkeypatch, {
        "models/build.py": big("""
            import torch
            from transformers import AutoModelForCausalLM

            DTYPE = torch.float16


            def build_a(name):
                return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)


            def build_b(name):
                return AutoModelForCausalLM.from_pretrained(name, torch_dtype=DTYPE)


            def _reset():
                global DTYPE
                DTYPE = torch.float32
        """),
        "train.py": """
            import torch
            from models.build import build_a, build_b
            model_a = build_a("a")
            model_a.to(torch.bfloat16)
            model_b = build_b("b")
            model_b.to(torch.float16)
        """,
    })
    assert [call[:4] for call in result[1]] == [(5, "to", "model_a", "bfloat16"), (7, "to", "model_b", None)]
    assert "_reset" not in followed["build.py"].pending


def test_a_module_that_does_not_parse_is_not_followed_in_parts_either(tmp_path, monkeypatch):
    # the block the caller asks for parses, but the module does not: the whole parse says
    # so once its other blocks are read (here, by the analysis of the whole tree)
    write(tmp_path, {"models/build.py": big("""
        from transformers import AutoModelForCausalLM


        def build_model(name):
            return AutoModelForCausalLM.from_pretrained(name)


        def broken(:
            pass
    """)})
    monkeypatch.setattr(module_parts, "MIN_BYTES", 0)
    parts = module_parts.module_parts(tmp_path / "models/build.py", "b", (tmp_path / "models/build.py").read_bytes())
    assert parts is not None and parts.need("build_model")
    assert not parts.complete() and not parts.pending  # not retried


def test_indented_code_before_the_first_block_is_not_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(module_parts, "MIN_BYTES", 0)
    text = "    x = 1\n" + FILLER  # an IndentationError: the whole parse rejects it
    assert module_parts.module_parts(tmp_path / "m.py", "m.py", text.encode()) is None


@pytest.mark.parametrize("source", sorted((Path(__file__).resolve().parent.parent / "cfgfix" / "analysis").glob("*.py")))
def test_every_block_parses_as_in_the_whole_module(source, monkeypatch):
    """On real modules (cfgfix's own analyses): each top-level block asked for alone is
    the whole parse's, and the imports and module-level constants agree on every name the
    parsed code mentions."""
    monkeypatch.setattr(module_parts, "MIN_BYTES", 0)
    data = source.read_bytes()
    full = ast.parse(data.decode())
    parts = module_parts.module_parts(source, source.name, data)
    if parts is None:
        return
    whole_imports, whole_consts = ImportMap(full), single_assignments(full.body)
    for name in list(parts.pending):
        assert parts.need(name)
        mine = [ast.dump(s, include_attributes=True) for s in parts.tree.body if getattr(s, "name", None) == name]
        theirs = [ast.dump(s, include_attributes=True) for s in full.body if getattr(s, "name", None) == name]
        assert mine == theirs
        imports = ImportMap(parts.tree)
        consts = module_parts_consts(parts.tree)
        for word in {n.id for s in parts.tree.body for n in walk(s) if isinstance(n, ast.Name)}:
            assert imports.aliases.get(word) == whole_imports.aliases.get(word), word
            assert imports.relative.get(word) == whole_imports.relative.get(word), word
            assert (word in consts) == (word in whole_consts), word
    assert parts.complete()
    assert ast.dump(parts.tree, include_attributes=True) == ast.dump(full, include_attributes=True)


def module_parts_consts(tree: ast.Module) -> dict:
    from cfgfix.analysis.names import _single_assignments

    return _single_assignments(tree.body)  # not memoised: the tree grows
