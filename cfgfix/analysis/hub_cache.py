"""A model's `config.json` from the local Hugging Face cache, when the user's machine has
downloaded it: never the network. The cache folder is the one huggingface_hub uses
(`HF_HUB_CACHE`, else the older `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`); a model's files are under
`models--{org}--{name}/snapshots/{commit}/`, and `refs/main` names the commit `main` was at
when it was downloaded (huggingface_hub `constants.py` and `file_download.py`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

_MAX_CONFIG_BYTES = 1_000_000


def hub_cache_folder() -> Path:
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def cached_config(model_id: str) -> dict | None:
    """The cached `config.json` of a hub model id (`org/name`), or None when it is not in the
    cache (or cannot be read). The snapshot `refs/main` names first, else the newest one."""
    if not isinstance(model_id, str) or model_id.count("/") != 1 or len(model_id) > 200 or ".." in model_id:
        return None
    org, name = model_id.split("/")
    if not org or not name:
        return None
    repo = hub_cache_folder() / f"models--{org}--{name}"
    snapshots = repo / "snapshots"
    try:
        if not snapshots.is_dir():
            return None
        candidates = []
        ref = repo / "refs" / "main"
        if ref.is_file():
            candidates.append(snapshots / ref.read_text(encoding="utf-8", errors="replace").strip())
        candidates += sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime,
                             reverse=True)
        for snapshot in candidates:
            config = snapshot / "config.json"
            if config.is_file() and config.stat().st_size <= _MAX_CONFIG_BYTES:
                data = json.loads(config.read_text(encoding="utf-8", errors="replace"))
                return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        return None
    return None
