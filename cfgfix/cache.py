"""Per-file results cached by content hash, in `.cfgfix_cache/` under the project root.

One JSON file per configuration fingerprint (cfgfix version, settings, enabled rules,
library versions): a warm run reads it once and parses nothing that did not change.
The folder carries its own `.gitignore` so it never lands in a commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

CACHE_DIR = ".cfgfix_cache"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Cache:
    def __init__(self, root: Path, fingerprint: str) -> None:
        self.folder = root / CACHE_DIR
        key = hashlib.blake2b(fingerprint.encode(), digest_size=12).hexdigest()
        self.file = self.folder / f"results-{key}.json"
        self.entries: dict[str, list] = {}
        self.dirty = False
        try:
            self.entries = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.entries = {}

    def get(self, relpath: str, data: bytes, extra: str) -> dict | None:
        """The cached result when the bytes and `extra` (what else the result depends on,
        such as the file's project versions) are unchanged."""
        entry = self.entries.get(relpath)
        if entry is not None and entry[0] == content_hash(data) + extra:
            return entry[1]
        return None

    def put(self, relpath: str, data: bytes, extra: str, result: dict) -> None:
        self.entries[relpath] = [content_hash(data) + extra, result]
        self.dirty = True

    def save(self) -> None:
        """Write atomically; a cache that cannot be written is simply not written."""
        if not self.dirty:
            return
        try:
            self.folder.mkdir(exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# Created by cfgfix\n*\n", encoding="utf-8")
            handle, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(self.entries, out, separators=(",", ":"))
            os.replace(tmp, self.file)
        except OSError:
            pass
