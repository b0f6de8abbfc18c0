"""CFX304/CFX305 beyond the embedded examples: the allocator grammar and its offsets, the
places a value can come from, and what counts as CUDA having run before the assignment."""

import os

import pytest
from conftest import lint_project, write_project

from cfgfix.analysis.alloc_conf import check, close_keys, parse, tokenize
from cfgfix.fixing import fix_file

V = "PYTORCH_CUDA_ALLOC_CONF"


def problems(value, variable=V, report_unknown=True):
    return [
        (p.severity, value[p.start:p.end], p.replacement and p.replacement[2])
        for p in check(value, variable, report_unknown)
    ]


def test_tokens_keep_offsets_and_drop_whitespace():
    value = " expandable _segments : True ,max_split_size_mb:[ 64:2 ]"
    tokens = tokenize(value)
    assert [t.text for t in tokens] == [
        "expandable_segments", ":", "True", ",", "max_split_size_mb", ":", "[", "64", ":", "2", "]",
    ]
    first = tokens[0]
    assert value[first.start:first.end] == "expandable _segments"


def test_parse_list_form():
    (option,) = parse("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert [(k.text, v.text) for k, v in option.items] == [("256", "1"), ("512", "2"), (">", "4")]
    assert option.end == len("roundup_power2_divisions:[256:1,512:2,>:4]")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("expandable_segments:True", []),
        ("expandable_segments:TRUE", [("error", "TRUE", "True")]),
        ("expandable_segments:yes", [("error", "yes", None)]),
        ("max_split_size_mb:20,max_non_split_rounding_mb:19", [("error", "19", None)]),
        ("max_split_size_mb:-1", []),  # stoull wraps it: accepted
        ("large_segment_size_mb:10", [("error", "10", None)]),
        ("large_segment_size_mb:11", []),
        ("garbage_collection_threshold:0", [("error", "0", None)]),
        ("garbage_collection_threshold:.5", []),
        ("per_process_memory_fraction:1.0", []),
        ("per_process_memory_fraction:1.5", [("error", "1.5", None)]),
        ("roundup_power2_divisions:0", [("error", "0", None)]),
        ("roundup_power2_divisions:[256:0,>:8]", []),
        ("roundup_power2_divisions:[256]", [("error", "256", None)]),
        ("pinned_num_register_threads:256", [("error", "256", None)]),
        ("pinned_num_register_threads:8", []),
        ("backend:native", []),
        ("backend:jemalloc", [("error", "jemalloc", None)]),
        ("backend:CudaMallocAsync", [("error", "CudaMallocAsync", "cudaMallocAsync")]),
        ("Expandable_Segments:True", [("error", "Expandable_Segments", "expandable_segments")]),
        ("max_split_size:256", [("error", "max_split_size", "max_split_size_mb")]),
        ("expandable_segments_reserve:0.5", []),  # a newer key, never a typo
        ("pinned_max_cached_size_mb:64", []),
        ("expandable_segments:True,", []),
        ("", []),
        ("expandable_segments:True,max_split_size_mb:10", [("error", "10", None)]),  # the error, not the combo too
        ("backend:cudaMallocAsync,expandable_segments:True,max_split_size_mb:64",
         [("warning", "max_split_size_mb:64", None)]),
    ],
)
def test_grammar(value, expected):
    assert problems(value) == expected


def test_unknown_keys_without_a_close_match_depend_on_the_variable_and_version():
    assert problems("no_such_option:1") == [("error", "no_such_option", None)]
    assert problems("no_such_option:1", variable="PYTORCH_ALLOC_CONF") == []
    assert problems("no_such_option:1", report_unknown=False) == []
    # a typo is a typo whatever the version
    assert problems("expandable_segmens:True", report_unknown=False) == [
        ("error", "expandable_segmens", "expandable_segments")
    ]


def test_close_keys_prefers_a_clear_winner():
    assert close_keys("garbage_collect_threshold") == ["garbage_collection_threshold"]
    assert close_keys("pinned_use_cud_host_register") == ["pinned_use_cuda_host_register"]
    assert close_keys("completely_different") == []


def findings(tmp_path, files, code):
    write_project(tmp_path, files)
    engine, sfs, result = lint_project(tmp_path)
    return engine, sfs, [f for f in result.findings if f.code == code]


def lines(tmp_path, files, code):
    return [(f.path, f.span.line) for f in findings(tmp_path, files, code)[2]]


# -- CFX305: where values come from ------------------------------------------------------------


def test_python_forms(tmp_path):
    code = (
        "import os\nfrom os import environ, putenv as pe\n"
        "environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:true'\n"
        "pe('PYTORCH_CUDA_ALLOC_CONF', 'max_split_size_mb:4')\n"
        "NAME = 'PYTORCH_CUDA_ALLOC_CONF'\n"
        "os.environ[NAME] = 'garbage_collection_threshold:2'\n"
        "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:\\x74rue'\n"
    )
    _, _, found = findings(tmp_path, {"a.py": code}, "CFX305")
    assert [(f.span.line, f.span.column) for f in found] == [(3, 59), (4, 50), (6, 50), (7, 41)]
    # the escaped literal cannot be edited token by token: whole literal, no fix
    assert found[-1].fix is None and found[0].fix is not None


def test_shell_dialects(tmp_path):
    files = {
        "Makefile": "export PYTORCH_CUDA_ALLOC_CONF := expandable_segments:true\n",
        "Dockerfile": "FROM x\nENV PYTORCH_CUDA_ALLOC_CONF expandable_segments:true\n",
        ".env": "export PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:true\"\n",
        "a.sh": "#!/bin/sh\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:tru\\e python x.py\n",
    }
    engine, sfs, found = findings(tmp_path, files, "CFX305")
    spans = {f.path: (f.span.line, f.span.column, f.span.end_column, f.fix is not None) for f in found}
    assert spans == {
        "Makefile": (1, 55, 59, True),
        "Dockerfile": (2, 49, 53, True),
        ".env": (1, 53, 57, True),
        "a.sh": (2, 25, 50, False),  # a backslash inside: the whole word, no fix
    }
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        sf = next(s for s in sfs if s.display == "Dockerfile")
        assert fix_file(engine, sf, sf.path.read_bytes(), unsafe=False).fixed.endswith("segments:True\n")
    finally:
        os.chdir(cwd)


def test_both_names_in_a_shell_script_report_the_later_one(tmp_path):
    files = {"env.sh": "export PYTORCH_ALLOC_CONF=expandable_segments:True\n"
                       "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128\n"}
    _, _, found = findings(tmp_path, files, "CFX305")
    assert [(f.span.line, f.severity.value) for f in found] == [(2, "warning")]
    assert "line 1" in found[0].message


def test_newer_torch_pin_silences_unknown_keys_only(tmp_path):
    files = {
        "run.sh": "export PYTORCH_CUDA_ALLOC_CONF=future_key:1,expandable_segmnts:True\n",
        "requirements.txt": "torch==2.16.0\n",
    }
    assert lines(tmp_path, files, "CFX305") == [("run.sh", 1)]


# -- CFX304: what ran before ---------------------------------------------------------------------

SET = "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'"


@pytest.mark.parametrize(
    "body, flagged",
    [
        # a try body may have stopped before its CUDA use
        (f"try:\n    x = torch.zeros(1).cuda()\nexcept RuntimeError:\n    pass\n{SET}\n", False),
        # a with body always runs
        (f"with open('f') as fh:\n    x = torch.zeros(1).cuda()\n{SET}\n", True),
        # the finally block always runs
        (f"try:\n    pass\nfinally:\n    torch.cuda.synchronize()\n{SET}\n", True),
        # a loop body may run zero times; its iterable always runs
        (f"for _ in range(3):\n    torch.cuda.synchronize()\n{SET}\n", False),
        (f"for d in [torch.cuda.current_device()]:\n    pass\n{SET}\n", True),
        # short-circuits and conditional expressions
        (f"ok = args.gpu and torch.cuda.synchronize()\n{SET}\n", False),
        (f"x = torch.zeros(1).cuda() if args.gpu else None\n{SET}\n", False),
        # aliases of torch.cuda
        (f"import torch as th\nth.cuda.set_device(0)\n{SET}\n", True),
        (f"from torch import cuda\ncuda.mem_get_info()\n{SET}\n", True),
        # calls that do not create the allocator
        (f"torch.cuda.manual_seed_all(0)\ntorch.cuda.empty_cache()\nn = torch.cuda.memory_allocated()\n{SET}\n", False),
        # `.to()` of something that is not a device
        (f"x = torch.zeros(1).to(torch.float16)\n{SET}\n", False),
        # the entry point of the script
        (f"def main():\n    pass\nif __name__ == '__main__':\n    x = torch.zeros(1).cuda()\n    {SET}\n", True),
        # a def after the `__main__` block runs only on import, when that block did not run
        (f"if __name__ == '__main__':\n    x = torch.zeros(1).cuda()\ndef later():\n    {SET}\n", False),
        # a helper that may return before its CUDA use
        ("def load(cpu):\n    if cpu:\n        return None\n    return torch.zeros(1).cuda()\n"
         + f"def main():\n    load(True)\n    {SET}\n", False),
        # a helper that always uses CUDA, and one that calls itself
        (f"def load():\n    return torch.zeros(1).cuda()\ndef main():\n    load()\n    {SET}\n", True),
        (f"def spin(n):\n    return spin(n - 1)\ndef main():\n    spin(3)\n    {SET}\n", False),
        # a local name that shadows the module's helper
        (f"def load():\n    return torch.zeros(1).cuda()\ndef main(load):\n    load()\n    {SET}\n", False),
        # a method of a class defined after a module-level CUDA use
        (f"x = torch.zeros(1, device='cuda:0')\nclass T:\n    def setup(self):\n        {SET}\n", True),
        # `device=` on torch factories, `map_location=` on torch.load; not on a config of our own
        (f"w = torch.load('w.pt', map_location='cuda')\n{SET}\n", True),
        (f"g = torch.Generator(device='cuda')\n{SET}\n", True),
        (f"cfg = TrainConfig(device='cuda')\nm = load_model('m', device_map='auto')\n{SET}\n", False),
        # a device map that keeps the model on the CPU, and one that does not
        (f"m = AutoModel.from_pretrained('m', device_map={{'': 'cpu'}})\n{SET}\n", False),
        (f"m = AutoModel.from_pretrained('m', device_map={{'': 0}})\n{SET}\n", True),
    ],
)
def test_cuda_order(tmp_path, body, flagged):
    code = "import os\nimport torch\nfrom transformers import AutoModel\n" + body
    assert bool(lines(tmp_path, {"t.py": code}, "CFX304")) is flagged


def test_fix_keeps_a_conditional_assignment_where_it_is(tmp_path):
    code = f"import os\nimport torch\nx = torch.zeros(1).cuda()\nif args.frag:\n    {SET}\n"
    _, _, found = findings(tmp_path, {"t.py": code}, "CFX304")
    assert len(found) == 1 and found[0].fix is None


def test_fix_imports_os_that_was_only_imported_in_a_function(tmp_path):
    code = (
        "import torch\n\n"
        "def main():\n"
        "    import os\n"
        "    torch.cuda.synchronize()\n"
        f"    {SET}  # fragmentation\n"
        "    run()\n"
    )
    engine, sfs, found = findings(tmp_path, {"t.py": code}, "CFX304")
    assert len(found) == 1
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        fixed = fix_file(engine, sfs[0], sfs[0].path.read_bytes(), unsafe=True).fixed
    finally:
        os.chdir(cwd)
    assert fixed == (
        f"import os\n{SET}  # fragmentation\n\n"
        "import torch\n\n"
        "def main():\n"
        "    import os\n"
        "    torch.cuda.synchronize()\n"
        "    run()\n"
    )
