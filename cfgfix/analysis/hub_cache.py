"""A model's files in the local Hugging Face cache, when the user's machine has downloaded
them: never the network. The cache folders are those huggingface_hub uses (`HF_HUB_CACHE`,
the older `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
`~/.cache/huggingface/hub`), each looked in; a model's files are under
`models--{org}--{name}/snapshots/{commit}/`, and `refs/main` names the commit `main` was at
when it was downloaded (huggingface_hub `constants.py` and `file_download.py`). One reader
for CFX206's stored dtype and the estimate's model shapes (memory/shapes.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

_MAX_CONFIG_BYTES = 1_000_000


def hub_cache_folders() -> list[Path]:
    env = os.environ
    roots = [Path(env[key]).expanduser() for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if env.get(key)]
    if env.get("HF_HOME"):
        roots.append(Path(env["HF_HOME"]).expanduser() / "hub")
    if env.get("XDG_CACHE_HOME"):
        roots.append(Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(roots))


def snapshot_with(model_id: str, files: tuple[str, ...] = ("config.json",)) -> Path | None:
    """The cached snapshot folder of a hub model id (`org/name`) that holds one of `files`
    (paths inside the snapshot): `refs/main`'s snapshot first, else the newest one."""
    if not isinstance(model_id, str) or len(model_id) > 200:
        return None
    parts = model_id.strip().strip("/").split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        return None
    for root in hub_cache_folders():
        repo = root / f"models--{parts[0]}--{parts[1]}"
        snapshots = repo / "snapshots"
        try:
            if not snapshots.is_dir():
                continue
            ref = repo / "refs" / "main"
            main = ref.read_text(encoding="utf-8", errors="replace").strip() if ref.is_file() else None
            candidates = ([snapshots / main] if main else []) + sorted(
                (p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
            for folder in candidates:
                if any((folder / name).is_file() for name in files):
                    return folder
        except (OSError, ValueError):
            continue
    return None


def cached_config(model_id: str) -> dict | None:
    """The cached `config.json` of a hub model id, or None when it is not in the cache (or
    cannot be read)."""
    folder = snapshot_with(model_id)
    if folder is None:
        return None
    config = folder / "config.json"
    try:
        if config.stat().st_size > _MAX_CONFIG_BYTES:
            return None
        data = json.loads(config.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
