"""Issue 13 items 2, 3 and 5: transformers' default attention kernel per family and version,
T5's tied head per version (both read from released wheels, memory/transformers_versions.py),
and the CUDA context and cuBLAS workspaces (measured on an H200, torch's CublasHandlePool)."""

import re
from pathlib import Path

import pytest
from conftest import REPO
from test_training_setup import _setups

from cfgfix.memory.estimator import (
    CUBLAS_HANDLES,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    MIB,
    attention_kernel,
    estimate,
)
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.memory.transformers_versions import ATTENTION_DEFAULTS, default_attention, exact_version, t5_head_tied
from cfgfix.records import replace


@pytest.mark.parametrize("family,version,kernel", [
    ("llama", "4.35.2", "eager"), ("llama", "4.36.0", "sdpa"), ("llama", "4.46.3", "sdpa"), ("llama", "4.30.0", "eager"),
    ("mistral", "4.36.0", "eager"), ("mistral", "4.38.0", None), ("mistral", "4.41.0", "sdpa"),
    ("gpt2", "4.41.2", None), ("gpt2", "4.42.0", "sdpa"), ("gpt_neox", "4.40.0", "eager"),
    ("phi3", "4.42.0", "eager"), ("phi3", "4.44.0", None), ("phi3", "4.46.3", "sdpa"),
    ("gemma2", "4.42.0", "sdpa"), ("gemma2", "4.45.0", "eager"), ("gemma2", "4.46.3", None), ("gemma2", "4.48.0", "sdpa"),
    ("gemma2", "5.17.0", "sdpa"), ("gemma2", "5.20.0", "sdpa"), ("gemma2", "5.21.0", "eager"), ("gemma2", "5.24.0", "eager"),
    ("gemma2", "6.0.0", "eager"),
    ("t5", "4.46.3", "eager"), ("t5", "5.14.0", "eager"), ("t5", "5.15.0", None), ("t5", "5.17.0", "sdpa"),
    ("unknownfamily", "5.0.0", None), ("llama", None, None), ("llama", "main", None),
])
def test_default_attention_by_version(family, version, kernel):
    assert default_attention(family, version) == kernel


def test_t5_head_tied_by_version():
    assert t5_head_tied("4.46.3") is False and t5_head_tied("4.57.1") is False
    assert t5_head_tied("5.0.0") is True and t5_head_tied("5.24.0") is True
    assert t5_head_tied(None) is None


def test_exact_version():
    assert exact_version("==4.46.3") == "4.46.3"
    assert exact_version(">=4.40,<5") is None and exact_version("") is None


def test_the_table_agrees_with_the_installed_transformers():
    """The installed wheel is one more checked point: each family's modeling file says whether
    it supports SDPA (and T5Config whether it forces the tie), as the table predicts."""
    transformers = pytest.importorskip("transformers")
    version = transformers.__version__
    root = Path(transformers.__file__).parent / "models"
    for family in ATTENTION_DEFAULTS:
        source = (root / family / f"modeling_{family}.py").read_text()
        match = re.search(r"_supports_sdpa\s*=\s*(True|False)", source)
        installed = "sdpa" if match and match.group(1) == "True" else "eager"
        predicted = default_attention(family, version)
        assert predicted in (installed, None), (family, version, installed, predicted)
    from transformers import T5Config

    assert T5Config(tie_word_embeddings=False).tie_word_embeddings is t5_head_tied(version)


def test_gemma2_follows_the_version():
    shape = shape_from_catalog("google/gemma-2-9b")
    base = MemorySetup(weights="bf16")
    assert attention_kernel(replace(base, transformers_version="5.17.0"), shape) == "fused"
    assert attention_kernel(replace(base, transformers_version="5.24.0"), shape) == "eager"
    assert attention_kernel(base, shape) == "eager"  # unknown version: the larger reading
    eager = estimate(replace(base, seq_len=1024, transformers_version="5.24.0"), shape)
    assert any("transformers 5.24.0 builds it with eager attention" in n for n in eager.assumptions)


def test_llama_before_sdpa_existed_runs_eager():
    shape = shape_from_catalog("meta-llama/Llama-3.2-1B")
    assert attention_kernel(MemorySetup(weights="bf16", transformers_version="4.35.2"), shape) == "eager"
    assert attention_kernel(MemorySetup(weights="bf16", transformers_version="4.40.0"), shape) == "fused"


def test_flan_t5_head_by_version():
    shape = shape_from_catalog("google/flan-t5-xl")
    untied = shape.params
    head = 32128 * 2048
    v4 = estimate(MemorySetup(weights="bf16", transformers_version="4.46.3"), shape)
    v5 = estimate(MemorySetup(weights="bf16", transformers_version="5.0.0"), shape)
    unknown = estimate(MemorySetup(weights="bf16"), shape)
    assert v4.shape.params == untied and unknown.shape.params == untied
    assert v5.shape.params == untied - head
    assert any("ties T5's lm_head" in n for n in v5.assumptions)
    assert any("counted untied as its config says" in n for n in unknown.assumptions)
    assert v4.peak > v5.peak


def test_the_flan_story_reads_its_pinned_transformers():
    setup = _setups(REPO / "fixtures" / "flan-t5-xl-trainer" / "project")[0]
    assert setup.transformers_version == "4.46.3"  # requirements.txt


def test_cuda_context_and_cublas_workspaces():
    shape = shape_from_catalog("meta-llama/Llama-3.2-1B")
    cuda = estimate(MemorySetup(weights="bf16", seq_len=512), shape)
    cpu = estimate(MemorySetup(weights="bf16", seq_len=512, device="cpu"), shape)
    assert CUDA_CONTEXT_BYTES == 765 * MIB and CUBLAS_WORKSPACE_BYTES * CUBLAS_HANDLES == 64 * MIB
    assert cuda.component("cuda_context").size == 765 * MIB
    assert "cuBLAS workspaces 64 MiB" in cuda.component("temporaries").formula
    assert cpu.component("cuda_context").size == 0 and "cuBLAS" not in cpu.component("temporaries").formula
    assert any("cuBLAS workspaces" in n for n in cuda.assumptions)
