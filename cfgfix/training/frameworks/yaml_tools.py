"""What the training tools driven by one YAML (LLaMA-Factory, axolotl) share: facts that hold
for a range of releases, the release a project runs, the YAML's keys with their overrides, and
the process count a tool derives from `CUDA_VISIBLE_DEVICES`.

A tool's model (llamafactory.py, axolotl.py) adds two sources to a launch's setup: its
YAML's own keys as the tool reads them, and "framework defaults" (what the tool does for a
key the YAML leaves out), then `finish` sets what only the tool decides (the load dtype, the
process count, whether the LoRA rank counts). Every fact names the release range it was read
for and the file of the wheel it was read from.
"""

from __future__ import annotations

import re

from cfgfix.analysis.tool_processes import env_int, env_true, visible_gpus  # noqa: F401 (used by the tools)
from cfgfix.records import dataclass, field, replace
from cfgfix.training.values import Value, normalise


@dataclass(frozen=True)
class Fact:
    """A default or behaviour of a tool, true from release `since` (None: every release read)
    up to, not including, `until`; `where` is the file of the wheel that shows it."""

    name: str
    value: object
    since: str | None
    until: str | None
    where: str

    def holds(self, release: str) -> bool:
        return (self.since is None or _key(release) >= _key(self.since)) and (
            self.until is None or _key(release) < _key(self.until))


def fact(facts: tuple[Fact, ...], name: str, release: str) -> Fact | None:
    return next((f for f in facts if f.name == name and f.holds(release)), None)


@dataclass
class ToolRun:
    """A launch of a YAML-driven tool: which tool, the release whose facts apply (and how it
    was chosen), the YAML's keys (and the launch's overrides) as the tool reads them."""

    tool: str  # "llamafactory" | "axolotl"
    release: str
    release_origin: str
    keys: dict[str, Value] = field(default_factory=dict)  # key as written -> its value
    nodes: dict[str, object] = field(default_factory=dict)  # key -> the YAML node (mappings, lists)
    doc: object = None  # the tool's YAML (a ConfigDocument), where `fix --fit` writes
    written_path: str | None = None  # the YAML's path as the launch writes it
    origin: str = ""  # the YAML's path as cfgfix shows it
    facts: dict[str, object] = field(default_factory=dict)  # what `explain --output-format json` shows

    def get(self, key: str, default=None):
        value = self.keys.get(key)
        return value.value if value is not None else default

    def to_dict(self) -> dict:
        return {"tool": self.tool, "release": self.release, "release_origin": self.release_origin, **self.facts}


def pick_release(releases: tuple[str, ...], specifier: str) -> str | None:
    """The newest release read that `specifier` admits (`==0.9.3`, `>=0.8,<0.9`); None when
    it admits none of them (or cannot be parsed)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        allowed = SpecifierSet(specifier or "")
    except InvalidSpecifier:
        return None
    exact = re.fullmatch(r"\s*===?\s*(\d+(?:\.\d+){0,3})\S*\s*", specifier or "")
    if exact:
        # a release between two read ones (0.9.2.dev0) takes the facts of the newest read one below it
        wanted = _key(exact.group(1))
        below = [r for r in releases if _key(r) <= wanted]
        return max(below, key=_key) if below else None
    admitted = [r for r in releases if allowed.contains(r, prereleases=True)]
    return max(admitted, key=_key) if admitted else None


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", release)[:4])


def release_for(project, where, packages: tuple[str, ...], releases: tuple[str, ...]) -> tuple[str, str] | None:
    """(release, how it was chosen) from the project's pin or the installed copy of one of
    `packages`; None when neither names a version."""
    from cfgfix.analysis.versions import ProjectVersions

    key = ("project-versions",)
    cache = project._scripts
    if key not in cache:
        cache[key] = ProjectVersions(project.root)
    for package in packages:
        try:
            info = cache[key].for_file(where).get(package)
        except (OSError, ValueError):
            return None
        if not info.specifier:
            continue
        release = pick_release(releases, info.specifier)
        if release is not None:
            source = "installed" if info.source == "installed" else info.source
            return release, f"{package}{info.specifier} ({source})"
    return None


def top_level(doc, origin: str) -> tuple[dict[str, Value], dict[str, object]]:
    """The YAML's top-level keys: scalars as `Value`s (numbers and booleans as the tools'
    parsers read them), and every node by key (lists and mappings such as `fsdp_config`)."""
    values: dict[str, Value] = {}
    nodes: dict[str, object] = {}
    root = doc.root if doc is not None else None
    if root is None or root.kind != "mapping":
        return values, nodes
    for key, node in root.entries:
        if not isinstance(key.value, str):
            continue
        nodes[key.value] = node
        if node.kind == "scalar":
            values[key.value] = Value(key.value, normalise(key.value, node.value), f"{key.value} in {origin}",
                                      doc.span(node), key.value)
    return values, nodes


def dotlist_overrides(args, origin: str, start: int = 0) -> dict[str, Value]:
    """`key=value` words after the YAML (OmegaConf.from_cli): each as a Value whose span is the
    value's own characters, so `fix --fit` can rewrite it."""
    found: dict[str, Value] = {}
    for text, span in list(args)[start:]:
        name, eq, raw = text.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
            continue
        value = _yaml_scalar(raw)
        sub = None
        if span is not None and span.end - span.start == len(text):  # written unquoted: the value's span is exact
            at = len(name) + 1
            sub = replace(span, column=span.column + at, start=span.start + at)
        found[name] = Value(name, value, f"{name}={raw} in {origin}", sub, name)
    return found


def flag_overrides(args, origin: str, known: frozenset[str]) -> dict[str, Value]:
    """`--key value` / `--key=value` / a bare `--key` (a boolean) among the launch's words, for
    the tool's own keys `known` (axolotl's CLI options, LLaMA-Factory's HfArgumentParser flags)."""
    found: dict[str, Value] = {}
    words = list(args)
    for i, (text, span) in enumerate(words):
        if not text.startswith("--"):
            continue
        name, eq, inline = text[2:].partition("=")
        name = name.replace("-", "_")
        if name not in known:
            continue
        if eq:
            raw, value_span = inline, None
        elif i + 1 < len(words) and not words[i + 1][0].startswith("--"):
            raw, value_span = words[i + 1]
        else:
            raw, value_span = "true", None
        found[name] = Value(name, _yaml_scalar(raw), f"--{name} in {origin}", value_span or span, name)
    return found


def _yaml_scalar(raw: str):
    text = raw.strip().strip("'\"")
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    return normalise("", text)
