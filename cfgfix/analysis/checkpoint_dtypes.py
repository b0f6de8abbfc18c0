"""The dtype a checkpoint is stored in, where it is known, for `from_pretrained(dtype="auto")`
(transformers 5's default): the config's `torch_dtype`, else the weights' own dtype.

Known from three places:
- the user's local Hugging Face cache (`analysis/hub_cache.py`): the downloaded `config.json`'s
  `torch_dtype` (or `dtype`);
- a local checkpoint folder of the project (`from_pretrained("./ckpt")`) whose `config.json`
  states `torch_dtype` (or `dtype`);
- families whose published checkpoints predate `torch_dtype` and hold float32 weights
  (BERT, RoBERTa, DistilBERT, ALBERT, XLM-R, ELECTRA, DeBERTa, BART, the original T5 and
  T5 v1.1, GPT-2): their configs state no dtype and their weight files are 4 bytes a
  parameter (bert-base-uncased: 440 MB for 110M parameters; gpt2: 548 MB for 124M), so
  "auto" loads float32 there, as 4.x did.
Everything else is unknown (None): most current checkpoints are bfloat16 or float16."""

from __future__ import annotations

import json
import re
from pathlib import Path

_FLOAT32_FAMILIES = re.compile(
    r"^(?:bert-|roberta-|distilbert-|distilroberta-|albert-|xlm-roberta-|electra-|deberta-|bart-|"
    r"t5-(?:small|base|large|3b|11b)$|t5-v1_1-|gpt2(?:-medium|-large|-xl)?$|distilgpt2$)",
    re.IGNORECASE,
)
# The organisations those published checkpoints live under (bare ids are their old names).
_FLOAT32_ORGS = {"", "google-bert", "facebookai", "distilbert", "albert", "openai-community", "google-t5",
                 "google", "microsoft", "facebook"}


def stored_dtype(model_id: str, folder: Path | None = None) -> str | None:
    """"float32", "bfloat16", "float16"... for a model id or local path, else None."""
    if not isinstance(model_id, str) or not model_id or len(model_id) > 300:
        return None
    if folder is not None and not model_id.startswith(("http:", "https:")):
        local = _local_config_dtype(folder / model_id)
        if local is not None:
            return local
    org, _, name = model_id.strip("/").rpartition("/")
    if "/" in org:
        return None  # a path, not a hub id
    if org:
        from cfgfix.analysis.hub_cache import cached_config

        cached = cached_config(model_id.strip("/"))
        value = cached.get("torch_dtype", cached.get("dtype")) if cached else None
        if isinstance(value, str):
            return value
    if org.lower() in _FLOAT32_ORGS and _FLOAT32_FAMILIES.match(name):
        return "float32"
    return None


def _local_config_dtype(path: Path) -> str | None:
    try:
        config = path / "config.json"
        if not config.is_file() or config.stat().st_size > 1_000_000:
            return None
        data = json.loads(config.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("torch_dtype", data.get("dtype"))
    return value if isinstance(value, str) else None
