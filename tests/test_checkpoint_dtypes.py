"""Which checkpoints are stored in float32 (transformers 5's dtype="auto" changes nothing
for them: CFX206 stays silent), and how a load's model id is read (issue 25)."""

from __future__ import annotations

import pytest

from cfgfix.analysis.checkpoint_dtypes import stored_dtype


@pytest.mark.parametrize("model_id", [
    "bert-base-uncased", "google-bert/bert-large-cased", "roberta-base", "FacebookAI/roberta-large",
    "distilbert-base-uncased", "distilbert/distilbert-base-cased", "albert-base-v2", "xlm-roberta-base",
    "google/electra-small-discriminator", "microsoft/deberta-v3-base", "facebook/bart-large", "t5-small",
    "google-t5/t5-base", "google/t5-v1_1-large", "gpt2", "openai-community/gpt2-xl", "distilgpt2",
])
def test_float32_families(model_id):
    assert stored_dtype(model_id) == "float32"


@pytest.mark.parametrize("model_id", [
    "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "google/flan-t5-xl", "gpt2-finetuned/model",
    "someone/bert-base-uncased", "t5-base-finetuned", "google/gemma-2b", "EleutherAI/pythia-1.4b",
    "./checkpoints/bert-base-uncased/sub/deeper", "", "x" * 400,
])
def test_unknown_or_half_precision_ids(model_id):
    assert stored_dtype(model_id) is None


def test_a_local_checkpoint_says_its_own_dtype(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert stored_dtype("ckpt", tmp_path) == "bfloat16"
    assert stored_dtype("./ckpt", tmp_path) == "bfloat16"
    (tmp_path / "ckpt" / "config.json").write_text("not json")
    assert stored_dtype("ckpt", tmp_path) is None


def _cache(root, model_id: str, config: str, commit: str = "abc123", ref: bool = True) -> None:
    repo = root / ("models--" + model_id.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(config)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit + "\n")


def test_the_hub_cache_says_a_downloaded_checkpoints_dtype(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    _cache(hub, "someone/bert-finetuned", '{"model_type": "bert", "torch_dtype": "float32"}')
    _cache(hub, "Qwen/Qwen2.5-7B", '{"dtype": "bfloat16"}', ref=False)
    _cache(hub, "google-bert/bert-base-uncased", '{"torch_dtype": "bfloat16"}')  # the file wins over the family
    _cache(hub, "broken/model", "not json")
    assert stored_dtype("someone/bert-finetuned") == "float32"
    assert stored_dtype("Qwen/Qwen2.5-7B") == "bfloat16"
    assert stored_dtype("google-bert/bert-base-uncased") == "bfloat16"
    assert stored_dtype("broken/model") is None
    assert stored_dtype("not/cached") is None
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    _cache(tmp_path / "home" / "hub", "org/m", '{"torch_dtype": "float16"}')
    assert stored_dtype("org/m") == "float16"
