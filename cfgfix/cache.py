"""Per-file results cached by content hash, in `.cfgfix_cache/` under the project root.

One JSON file per configuration fingerprint (cfgfix version, settings, enabled rules,
library versions): a warm run reads it once and parses nothing that did not change.
Each entry also keeps the file's stat signature (size, mtime, ctime, inode, as ruff and git
do): a warm run stats an unchanged file and neither reads nor hashes it. The signature is
recorded from a stat taken before the bytes were read, and only for a file whose last
change is older than `RACY_SECONDS` (a write in the same clock tick as our read could
otherwise leave the signature unchanged); any other file is hashed as before.
The folder carries its own `.gitignore` so it never lands in a commit. What is read back is
checked (a checksum over the file, the shape of every entry); anything odd is a miss, and a
`.cfgfix_cache` that is a link is not used at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

from cfgfix.documents.files import read_file

CACHE_DIR = ".cfgfix_cache"
# A temporary file older than this was left by a run that died mid-write (killed, disk full,
# `ulimit -f`): no live run holds one for more than a moment.
STALE_SECONDS = 600
# Written first in every results file: a file that does not start with it, or whose checksum
# does not match what follows, is someone else's (or a damaged) file and is never read.
_MAGIC = b"cfgfix-cache 1 "
# A file changed this recently may change again within the same timestamp tick: its stat
# signature is not trusted (the content hash decides), as git treats "racily clean" entries.
RACY_SECONDS = 2


def stat_key(path) -> list[int] | None:
    """The stat signature of a regular file (links followed), or None."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_HASH_CHARS = 32  # content_hash's length: an entry's key is the hash, then `extra`


def _meta(data: bytes, key: list[int] | None) -> dict | None:
    """What an entry keeps besides the hash: the stat signature (None for a file changed
    within RACY_SECONDS of now) and whether the bytes hold a suppression directive."""
    if key is None or time.time_ns() - max(key[1], key[2]) < RACY_SECONDS * 1_000_000_000:
        return None
    return {"stat": key, "directive": b"cfgfix:" in data}


def _valid_meta(meta) -> bool:
    return (isinstance(meta, dict) and isinstance(meta.get("directive"), bool) and isinstance(meta.get("stat"), list)
            and len(meta["stat"]) == 4 and all(type(n) is int for n in meta["stat"]))


def _valid_entry(entry) -> bool:
    return (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)
            and isinstance(entry[1], dict) and (len(entry) == 2 or _valid_meta(entry[2])))


class Cache:
    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root = Path(root)
        self.folder = self.root / CACHE_DIR
        key = hashlib.blake2b(fingerprint.encode(), digest_size=12).hexdigest()
        self.file = self.folder / f"results-{key}.json"
        self.entries: dict[str, list] = {}
        self.dirty = False
        self.usable = self._folder_is_ours()
        if self.usable:
            self.entries = self._load()

    def _folder_is_ours(self) -> bool:
        """A `.cfgfix_cache` that is a link (or lies outside the project) would have cfgfix
        read and write files elsewhere: such a cache is not used."""
        if os.path.islink(self.folder):
            return False
        try:
            real_root = os.path.realpath(self.root)
            real = os.path.realpath(self.folder)
        except (OSError, ValueError):
            return False
        return os.path.dirname(real) == real_root

    def _load(self) -> dict:
        """The entries of the results file, or nothing when it is missing, not a regular
        file (a FIFO would block), damaged, or not of the shape this code writes."""
        try:
            raw = read_file(self.file, limit=512 * 1024 * 1024)
        except OSError:
            return {}
        head, _, body = raw.partition(b"\n")
        if not head.startswith(_MAGIC) or head[len(_MAGIC):].decode("ascii", "replace") != content_hash(body):
            return {}
        try:
            entries = json.loads(body)
        except (ValueError, RecursionError):
            return {}
        # Entries are checked when read (`_entry`) and before a write (`save`), not here: a
        # pre-commit run reads 5 entries of a whole tree's thousands (~20 ms, issue 15).
        return entries if isinstance(entries, dict) else {}

    def _entry(self, relpath: str) -> list | None:
        """The entry for `relpath` when it has the shape this code writes; one that does not
        (edited by hand, written by other code) is dropped."""
        entry = self.entries.get(relpath)
        if entry is not None and not _valid_entry(entry):
            del self.entries[relpath]
            return None
        return entry

    def get_unchanged(self, relpath: str, key: list[int] | None, extra: str) -> dict | None:
        """The cached result when the file's stat signature `key` (taken now, before any
        read) is the recorded one and `extra` is unchanged: no read, no hash."""
        entry = self._entry(relpath)
        if key is None or entry is None or len(entry) < 3 or entry[2]["stat"] != key:
            return None
        if entry[0][_HASH_CHARS:] != extra:
            return None
        return entry[1]

    def may_hold_directive(self, relpath: str) -> bool:
        """Whether the file held `cfgfix:` (a suppression comment) when its entry was written;
        True when unknown. A result with no findings and no directive needs no read."""
        entry = self._entry(relpath)
        return entry is None or len(entry) < 3 or entry[2]["directive"]

    def get(self, relpath: str, data: bytes, extra: str, key: list[int] | None = None) -> dict | None:
        """The cached result when the bytes and `extra` (what else the result depends on,
        such as the file's project versions) are unchanged. With the stat signature `key`
        taken before `data` was read, a hit records it for the next run."""
        entry = self._entry(relpath)
        if entry is not None and entry[0] == content_hash(data) + extra:
            meta = _meta(data, key)
            if meta is not None and (len(entry) < 3 or entry[2] != meta):
                self.entries[relpath] = [entry[0], entry[1], meta]  # touched, not changed
                self.dirty = True
            return entry[1]
        return None

    def put(self, relpath: str, data: bytes, extra: str, result: dict, key: list[int] | None = None) -> None:
        meta = _meta(data, key)
        entry = [content_hash(data) + extra, result]
        self.entries[relpath] = entry if meta is None else entry + [meta]
        self.dirty = True

    def save(self) -> None:
        """Write atomically; a cache that cannot be written is simply not written, and no
        temporary file is left behind (a full disk, `ulimit -f`)."""
        if not self.dirty or not self.usable:
            return
        tmp = None
        try:
            self.folder.mkdir(exist_ok=True)
            if not self._folder_is_ours():  # replaced by a link since we looked
                return
            ignore = self.folder / ".gitignore"
            if not os.path.lexists(ignore):
                ignore.write_text("# Created by cfgfix\n*\n", encoding="utf-8")
            self._remove_stale()
            valid = {k: v for k, v in self.entries.items() if _valid_entry(v)}
            body = json.dumps(valid, separators=(",", ":")).encode("utf-8")
            import tempfile  # only when writing (~10 ms to import: a warm run never pays it)

            handle, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(handle, "wb") as out:
                out.write(_MAGIC + content_hash(body).encode("ascii") + b"\n")
                out.write(body)
            os.replace(tmp, self.file)
            tmp = None
        except (OSError, ValueError):
            pass
        finally:
            if tmp is not None:  # the write failed or was interrupted: leave nothing behind
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _remove_stale(self) -> None:
        """Temporary files that a run killed mid-write (SIGKILL) could not remove."""
        now = time.time()
        try:
            with os.scandir(self.folder) as entries:
                for entry in entries:
                    if entry.name.startswith(".tmp-") and entry.is_file(follow_symlinks=False):
                        if now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                            os.unlink(entry.path)
        except OSError:
            pass
