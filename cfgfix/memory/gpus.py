"""The GPU catalog: a card's name or alias -> its memory and number-format support.

The figures live in `data/gpus.json`, each with its source. `usable_bytes` is what torch
reports as the card's total capacity (the budget a training process really has) where it
is known, else the sold memory times `default_usable_fraction`, and `usable_known` says which.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

from cfgfix.records import dataclass

GIB = 1024**3

# words that vendors and users put around a model name without changing the card
_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|generation")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int  # as sold (datasheet), binary GiB
    usable_bytes: int  # what a process can allocate: torch's "total capacity"
    usable_known: bool  # False: usable_bytes is memory_bytes x default_usable_fraction
    bf16: bool
    fp8: bool
    source: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "usable_bytes": self.usable_bytes,
            "usable_known": self.usable_known,
            "bf16": self.bf16,
            "fp8": self.fp8,
            "source": self.source,
        }


def normalize(name: str) -> str:
    """'NVIDIA GeForce RTX 4090' -> 'rtx4090'; 'a100 80gb' -> 'a10080gb'."""
    text = _NOISE.sub("", name.lower())
    text = re.sub(r"[^a-z0-9]", "", text)
    return text.replace("gib", "gb")


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, Gpu], tuple[Gpu, ...]]:
    data = json.loads(resources.files("cfgfix.memory").joinpath("data/gpus.json").read_text("utf-8"))
    fraction = data["default_usable_fraction"]
    by_key: dict[str, Gpu] = {}
    gpus = []
    for row in data["gpus"]:
        memory = int(row["memory_gib"] * GIB)
        usable = row["usable_gib"]
        gpu = Gpu(
            name=row["name"],
            memory_bytes=memory,
            usable_bytes=int(usable * GIB) if usable is not None else int(memory * fraction),
            usable_known=usable is not None,
            bf16=row["bf16"],
            fp8=row["fp8"],
            source=row["source"],
        )
        gpus.append(gpu)
        for alias in [row["name"], *row["aliases"]]:
            by_key.setdefault(normalize(alias), gpu)
    return by_key, tuple(gpus)


def all_gpus() -> tuple[Gpu, ...]:
    return _catalog()[1]


def find_gpu(name: str) -> Gpu | None:
    """The catalog entry for a name or alias, forgiving about case, spaces, dashes and
    vendor words ("RTX 4090", "rtx4090", "4090", "A100-80GB", "a100 80gb"); None if unknown.
    A bare number with a memory suffix the catalog does not know ("4090 48gb") is unknown."""
    by_key, _ = _catalog()
    key = normalize(name)
    if not key:
        return None
    if key in by_key:
        return by_key[key]
    # "rtx a6000" typed as "rtxa6000" is covered above; also accept a leading "rtx" that the
    # alias lacks ("rtx l4") and "<name>gb" spellings of sizes ("a10040g")
    for variant in (key.removeprefix("rtx"), re.sub(r"(\d+)g$", r"\1gb", key)):
        if variant in by_key:
            return by_key[variant]
    return None


def close_gpus(name: str, n: int = 3) -> list[str]:
    """The catalog names closest to an unknown `name` (by its normalised spelling and the
    aliases'), for a "did you mean": "RTX 4090 Ti" -> RTX 4090, RTX 4070 Ti."""
    import difflib

    by_key, _ = _catalog()
    typed = normalize(name)
    # a known name the input starts with first ("RTX 4090 Ti": RTX 4090), then by similarity
    prefixes = sorted((k for k in by_key if len(k) >= 4 and typed.startswith(k)), key=len, reverse=True)
    out: list[str] = []
    for key in prefixes + difflib.get_close_matches(typed, list(by_key), n=3 * n, cutoff=0.6):
        if by_key[key].name not in out:
            out.append(by_key[key].name)
    return out[:n]


def gpu_names() -> list[str]:
    return [gpu.name for gpu in all_gpus()]
