"""Which versions of the ML libraries a project runs on, read without importing them.

Some rules are only right on some versions (transformers renamed `torch_dtype` to `dtype`;
bitsandbytes stopped forcing hooks). The project's own pins say what it will run, so they
come first; the installed version is the fallback; else the rule takes the cautious reading.
Questions are asked about ranges (`>=4.40,<5` is below 5), so loose pins still answer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from cfgfix.records import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (issue 15)

from cfgfix.core import LazyRegex
from cfgfix.documents.files import read_text

# `packaging` (~40 ms to import, most of it `packaging.markers`), the TOML and INI readers
# and hashing are imported where they are used: a run whose rules ask no version question
# of a project without pins never needs them.
if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

TRACKED = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "diffusers")

# What an environment built today without a pin gets: the newest release of each library
# that the facts were read from (shared/design/facts.md, "Where the facts come from"). A rule
# whose verdict depends on the version and that finds no evidence (no pin, no installed
# copy, no dating idiom in the code) may assume this and must say so in its message
# (`Versions.resolve`). bitsandbytes is absent: the facts read no release of it.
CURRENT = {
    "torch": "2.13.0",
    "transformers": "5.23.0",
    "accelerate": "1.15.0",
    "peft": "0.21.2",
    "deepspeed": "0.19.8",
    "diffusers": "0.42.1",
    "trl": "1.16.0",  # training/frameworks/trl.py: its config defaults, read up to this wheel
}
_CONDA_NAMES = {"pytorch": "torch"}  # conda's name for torch

# A release and every later one (up to CURRENT) that installs only beside another library's
# release, read from each release's own requirements: (since, library, lowest version, where
# read). A project whose pins exclude that lowest version cannot get those releases, so an
# assumed current release gives way to "older than `since`".
REQUIRES = {
    # deepspeed 0.19.3, 0.19.6, 0.19.7 and 0.19.8 sdists, requirements/requirements.txt: torch>=2.0.0
    "deepspeed": (("0.19.3", "torch", "2.0.0", "deepspeed 0.19.3-0.19.8 require torch>=2.0.0"),),
}


def normalize(name: str) -> str:
    """PEP 503 name: Flash_Attn, flash.attn and flash-attn are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------ range logic

_Bound = tuple["Version", bool]  # (version, inclusive)


@lru_cache(maxsize=256)
def _bounds(text: str) -> tuple[_Bound | None, _Bound | None] | None:
    """The interval a specifier admits as (lower, upper), None when unknown or empty."""
    if not text:
        return None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        spec = SpecifierSet(text)
        lows: list[_Bound] = []
        highs: list[_Bound] = []
        for s in spec:
            op, v = s.operator, s.version
            if op == "!=":
                continue  # removes a point, never moves a bound
            if v.endswith(".*"):  # ==4.* admits 4 up to, not including, 5.dev0
                release = Version(v[:-2]).release
                # Like >=4, pre-releases of 4 only come in when asked for (PEP 440).
                lows.append((Version(v[:-2]), True))
                highs.append((_dev0(_bump(release, len(release) - 1)), False))
            elif op == "~=":  # ~=4.46 is >=4.46, ==4.*
                release = Version(v).release
                lows.append((Version(v), True))
                highs.append((_dev0(_bump(release, len(release) - 2)), False))
            elif op in ("==", "==="):
                lows.append((Version(v), True))
                highs.append((Version(v), True))
            elif op in (">=", ">"):
                lows.append((Version(v), op == ">="))
            elif op in ("<=", "<"):
                highs.append((Version(v), op == "<="))
    except (InvalidSpecifier, InvalidVersion):
        return None
    # The tightest bound wins; at an equal version an exclusive bound is the tighter one.
    lo = max(lows, key=lambda b: (b[0], not b[1]), default=None)
    hi = min(highs, key=lambda b: (b[0], b[1]), default=None)
    if lo and hi and (lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1]))):
        return None  # contradictory pins admit nothing: claim nothing
    return lo, hi


_PLAIN_RELEASE = LazyRegex(r"[0-9]+(?:\.[0-9]+)*")
_PLAIN_PIN = LazyRegex(r"==([0-9]+(?:\.[0-9]+)*)")
# One clause of a specifier made only of plain releases (`>=4.40`, `<5`, `!=4.41.0`).
_PLAIN_CLAUSE = LazyRegex(r"\s*(>=|<=|==|!=|>|<)\s*([0-9]+(?:\.[0-9]+)*)\s*")


def _plain_bounds(text: str):
    """`_bounds` for a specifier of plain releases only (`>=4.40,<5`, the assumed
    `>=5.23.0`), with release tuples for versions: the same answer without importing
    `packaging.specifiers` and `packaging.version` (~4.5 ms of a 5-file pre-commit run's
    CPU, spent to ask whether `>=5.23.0` is at least 5; issue 15). False when some clause
    is not plain (a wildcard, `~=`, a pre-release, a local version): `_bounds` answers."""
    lows: list[tuple[tuple[int, ...], bool]] = []
    highs: list[tuple[tuple[int, ...], bool]] = []
    for clause in text.split(","):
        match = _PLAIN_CLAUSE.fullmatch(clause)
        if match is None:
            return False
        op, release = match.group(1), _release(match.group(2))
        if op == "==":
            lows.append((release, True))
            highs.append((release, True))
        elif op in (">=", ">"):
            lows.append((release, op == ">="))
        elif op in ("<=", "<"):
            highs.append((release, op == "<="))
    lo = max(lows, key=lambda b: (b[0], not b[1]), default=None)
    hi = min(highs, key=lambda b: (b[0], b[1]), default=None)
    if lo and hi and (lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1]))):
        return None
    return lo, hi


def _admits(text: str) -> bool:
    """`_bounds(text) is not None`, through `_plain_bounds` when the specifier is plain."""
    plain = _plain_bounds(text) if text else None
    return plain is not None if plain is not False else _bounds(text) is not None


def _same_bounds(a: str, b: str) -> bool:
    """`_bounds(a) == _bounds(b)`, through `_plain_bounds` when both are plain."""
    plain_a, plain_b = _plain_bounds(a) if a else False, _plain_bounds(b) if b else False
    if plain_a is not False and plain_b is not False:
        return plain_a == plain_b
    return _bounds(a) == _bounds(b)


def _release(text: str) -> tuple[int, ...]:
    """A plain release as PEP 440 compares it: numbers, trailing zeros dropped (5.0 == 5)."""
    numbers = [int(part) for part in text.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def _bump(release: tuple[int, ...], index: int) -> tuple[int, ...]:
    return release[:index] + (release[index] + 1,)


def _dev0(release: tuple[int, ...]) -> Version:
    from packaging.version import Version

    return Version(".".join(map(str, release)) + ".dev0")  # the first version with that prefix


@dataclass(frozen=True)
class VersionInfo:
    """What is known of one package's version for a file, and where it comes from."""

    package: str
    specifier: str = ""  # e.g. ">=4.40,<5" ("" when unknown)
    source: str = ""  # the file holding the pin, "installed", the code idiom, or "" (unknown)
    # How the version is known: "pin" (the project's files, a notebook's %pip), "installed",
    # "code" (a lower bound from an API the code uses, version_idioms.py), "assumed" (no
    # evidence: the current release, CURRENT) or "" (unknown).
    evidence: str = field(default="", compare=False)

    def describe(self) -> str:
        """`transformers==4.46.3 (requirements.txt)`, `torch==2.13.0 (installed)`, or for an
        assumption the words that say it is one: a finding that rests on an assumed version
        states it, so a reader can pin a version to confirm."""
        text = f"{self.package}{self.specifier}"
        if self.evidence == "assumed":
            return f"{text} (assumed: {self.source}; pin a version to confirm)"
        if self.source == "installed":
            return f"{text} (installed)"
        return f"{text} ({self.source})" if self.source else text

    @property
    def known(self) -> bool:
        if _PLAIN_PIN.fullmatch(self.specifier):
            return True
        return _admits(self.specifier)

    def below(self, version: str) -> bool | None:
        """True when every admitted version is < `version`, False when every one is >=,
        None when the range straddles it or nothing is known."""
        pinned = _PLAIN_PIN.fullmatch(self.specifier)
        if pinned and _PLAIN_RELEASE.fullmatch(version):
            # `==5.23.0` (an installed version, an exact pin) against a plain release: the
            # same answer as the general path below, without importing packaging.
            return _release(pinned.group(1)) < _release(version)
        if self.specifier and _PLAIN_RELEASE.fullmatch(version):
            plain = _plain_bounds(self.specifier)
            if plain is not False:
                return _below(plain, _release(version))
        bounds = _bounds(self.specifier)
        if bounds is None:
            return None
        from packaging.version import Version

        return _below(bounds, Version(version))

    def at_least(self, version: str) -> bool | None:
        below = self.below(version)
        return None if below is None else not below


def _below(bounds, v) -> bool | None:
    """`VersionInfo.below` on bounds, with `v` of the same kind as their versions."""
    if bounds is None:
        return None
    lo, hi = bounds
    if hi is not None and (hi[0] < v or (hi[0] == v and not hi[1])):
        return True
    if lo is not None and lo[0] >= v:
        return False
    return None


# ---------------------------------------------------------------------------- sources

_Pin = tuple[str, str, str, bool]  # (name, specifier, source, marker matches this machine)


_OP_ORDER = {op: i for i, op in enumerate((">=", ">", "~=", "==", "===", "<=", "<", "!="))}


def _fmt(spec: SpecifierSet) -> str:
    """Lower bounds first (">=4.40,<5"), as people write them; str(SpecifierSet) sorts by text."""
    return ",".join(str(s) for s in sorted(spec, key=lambda s: (_OP_ORDER.get(s.operator, 9), s.version)))


def _label(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _from_requirement(text: str, source: str) -> _Pin | None:
    text = text.split(" --")[0].split("\t--")[0].strip()  # per-line options: --hash=...
    wheel = _from_wheel_url(text, source)
    if wheel:
        return wheel
    from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.url:
        return _from_wheel_url(req.url, source)
    matches = True
    if req.marker is not None:
        try:
            matches = req.marker.evaluate({"extra": ""})
        except (UndefinedComparison, UndefinedEnvironmentName):
            matches = True  # markers we cannot evaluate: keep the pin
    return req.name, _fmt(req.specifier), source, matches


def _from_wheel_url(text: str, source: str) -> _Pin | None:
    # https://download.pytorch.org/whl/cu121/torch-2.3.0%2Bcu121-cp311-...whl
    if ".whl" not in text and "%" not in text:
        return None  # the common case, without importing urllib
    import urllib.parse

    name = urllib.parse.unquote(text.split("#")[0].split("?")[0].rsplit("/", 1)[-1])
    if not name.endswith(".whl"):
        return None
    from packaging.version import InvalidVersion

    try:
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename  # pulls packaging.tags

        dist, version, _, _ = parse_wheel_filename(name)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return dist, f"=={version}", source, True


def _requirement_lines(text: str) -> Iterator[str]:
    text = re.sub(r"\\\r?\n", " ", text)  # line continuations
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a '#' inside a URL is no comment
        if line:
            yield line


def _read_requirements(path: Path, root: Path, seen: set[Path]) -> Iterator[_Pin]:
    key = path.resolve()
    if key in seen:  # includes can loop
        return
    seen.add(key)
    try:
        text = read_text(path, errors="replace")
    except OSError:
        return
    yield from _requirements_text(text, path.parent, _label(path, root), root, seen)


def _requirements_text(text: str, folder: Path, source: str, root: Path, seen: set[Path]) -> Iterator[_Pin]:
    for line in _requirement_lines(text):
        include = re.match(r"(?:-r|--requirement|-c|--constraint)(?:\s*=?\s*)(\S+)", line)
        if include:
            yield from _read_requirements(folder / include.group(1), root, seen)
        elif not line.startswith("-"):  # -e, --index-url, -f ...: not pins
            pin = _from_requirement(line, source)
            if pin:
                yield pin


def _requirements(root: Path) -> Iterator[_Pin]:
    files = sorted(root.glob("requirements*.txt"), key=lambda p: (p.name != "requirements.txt", p.name))
    files += sorted((root / "requirements").glob("*.txt"))
    seen: set[Path] = set()
    for path in files:
        yield from _read_requirements(path, root, seen)


def _table(doc, *keys) -> dict:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else {}


def _pyproject(root: Path) -> Iterator[_Pin]:
    if not (root / "pyproject.toml").is_file():
        return  # the common case, without importing the TOML reader
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(read_text(root / "pyproject.toml"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError, RecursionError):
        return  # unreadable pins (a >4,300-digit integer, absurd nesting) are no pins
    project = _table(doc, "project")
    lines = list(project.get("dependencies") or [])
    for group in _table(project, "optional-dependencies").values():
        lines += group if isinstance(group, list) else []
    for group in _table(doc, "dependency-groups").values():
        lines += group if isinstance(group, list) else []
    for line in lines:
        pin = _from_requirement(line, "pyproject.toml") if isinstance(line, str) else None
        if pin:
            yield pin
    poetry = _table(doc, "tool", "poetry")
    tables = [_table(poetry, "dependencies"), _table(poetry, "dev-dependencies")]
    tables += [_table(g, "dependencies") for g in _table(poetry, "group").values()]
    for table in tables:
        for name, value in table.items():
            if name != "python":
                yield name, _poetry_spec(value), "pyproject.toml", True


def _poetry_spec(value) -> str:
    """Poetry constraints (^1.2, ~1.2, 1.2.*, >=1,<2, "*") as a PEP 440 specifier."""
    if isinstance(value, list):  # per-platform constraints: the first is as good as any
        value = value[0] if value else ""
    if isinstance(value, dict):
        value = value.get("version", "")
    if not isinstance(value, str) or "||" in value:
        return ""  # unions do not fit one interval
    value = re.sub(r"([<>=!~^]+)\s+", r"\1", value.strip())
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    parts = []
    try:
        for part in filter(None, re.split(r"[,\s]+", value)):
            if part == "*":
                continue
            if part[0] in "^~" and not part.startswith("~="):
                v = Version(part[1:])
                release = v.release
                if part[0] == "^":  # bump the first non-zero component
                    index = next((i for i, n in enumerate(release) if n), len(release) - 1)
                else:  # ~1.2.3 bumps the minor, ~1 the major
                    index = 1 if len(release) > 1 else 0
                parts += [f">={v}", f"<{'.'.join(map(str, _bump(release, index)))}"]
            elif part[0].isdigit():
                parts.append(f"=={part}")
            else:
                parts.append(part)
        return _fmt(SpecifierSet(",".join(parts)))
    except (InvalidVersion, InvalidSpecifier):
        return ""


def _setup_cfg(root: Path) -> Iterator[_Pin]:
    path = root / "setup.cfg"
    if not path.exists():
        return
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(read_text(path), source=str(path))
    except (OSError, configparser.Error, UnicodeDecodeError):
        return
    values = [parser.get("options", "install_requires", fallback="")]
    if parser.has_section("options.extras_require"):
        values += [v for _, v in parser.items("options.extras_require")]
    for value in values:
        for line in _requirement_lines(value):
            pin = _from_requirement(line, "setup.cfg")
            if pin:
                yield pin


def _setup_py(root: Path) -> Iterator[_Pin]:
    """`setup(install_requires=[...], extras_require={...: [...]})` as literals (or module
    constants) in setup.py; read with `ast`, never run."""
    path = root / "setup.py"
    if not path.is_file():
        return
    import ast

    try:
        tree = ast.parse(read_text(path, errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return
    names = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name)}

    def strings(node, depth=0) -> list[str]:
        if isinstance(node, ast.Name) and node.id in names and depth < 3:
            return strings(names[node.id], depth + 1)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.Dict):
            return [v for value in node.values for v in strings(value, depth + 1)]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "setup" or getattr(node.func, "attr", None) == "setup"):
            for kw in node.keywords:
                if kw.arg in ("install_requires", "extras_require"):
                    for text in strings(kw.value):
                        pin = _from_requirement(text, "setup.py")
                        if pin:
                            yield pin


def _install_lines(root: Path) -> Iterator[_Pin]:
    """`pip install torch==2.3.0` in the project's Dockerfiles (`RUN` lines) and in its
    README's code blocks: what the image or the documented setup installs."""
    from cfgfix.documents.installs import pip_install_requirements

    candidates = sorted(p for p in root.glob("Dockerfile*") if p.is_file())
    candidates += sorted(p for p in root.glob("*.dockerfile") if p.is_file())
    candidates += sorted(p for p in root.iterdir() if p.is_file() and p.name.lower().startswith("readme")
                         and p.suffix.lower() in (".md", ".markdown", ".rst", ".txt")) if root.is_dir() else []
    for path in candidates[:8]:
        try:
            text = read_text(path, errors="replace")[:1_000_000]
        except (OSError, ValueError):
            continue
        if path.name.lower().startswith("readme") and path.suffix.lower() in (".md", ".markdown"):
            text = "\n".join(re.findall(r"^\s*(?:```|~~~)[^\n]*\n(.*?)^\s*(?:```|~~~)", text, re.M | re.S))
        label = f"{path.name} (pip install)"
        for requirement in pip_install_requirements(text):
            pin = _from_requirement(requirement, label)
            if pin:
                yield pin


def _environment(root: Path) -> Iterator[_Pin]:
    for name in ("environment.yml", "environment.yaml"):
        path = root / name
        if not path.is_file():
            continue
        import yaml  # only projects with an environment file pay for it

        try:
            doc = yaml.safe_load(read_text(path, errors="replace"))
        except (OSError, yaml.YAMLError, ValueError, RecursionError):  # a broken environment file must not stop the lint
            continue
        deps = doc.get("dependencies") if isinstance(doc, dict) else None
        for dep in deps if isinstance(deps, list) else []:
            if isinstance(dep, str):
                pin = _conda_spec(dep)
                if pin:
                    yield pin[0], pin[1], name, True
            elif isinstance(dep, dict) and isinstance(dep.get("pip"), list):
                text = "\n".join(x for x in dep["pip"] if isinstance(x, str))
                yield from _requirements_text(text, root, name, root, set())


def _conda_spec(entry: str) -> tuple[str, str] | None:
    """conda match specs: pytorch=2.1 (2.1.*), pytorch==2.1.0=build, pytorch>=2.1,<2.3."""
    m = re.fullmatch(r"\s*(?:[^:\s]+::)?([A-Za-z0-9_.\-]+)\s*(.*?)\s*", entry)
    if not m:
        return None
    name, rest = m.groups()
    name = _CONDA_NAMES.get(name.lower(), name)
    if not rest or "|" in rest:
        return name, ""
    if rest[0] in "=0123456789":
        raw = rest.lstrip("=").split("=")[0].split()[0]  # drop the build string
        version = re.sub(r"\.?\*$", "", raw)
        # `pkg=1.2` and `pkg 1.2*` are prefix matches; `pkg==1.2` and `pkg 1.2` are exact.
        prefix = raw.endswith("*") or (rest[0] == "=" and not rest.startswith("=="))
        spec = f"=={version}.*" if prefix else f"=={version}"
    else:
        spec = re.sub(r"(\d)\*", r"\1.*", rest.split()[0])
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return name, _fmt(SpecifierSet(spec))
    except InvalidSpecifier:
        return name, ""


# ----------------------------------------------------------------------------- lookup


class Versions:
    """Pins of one project; the first source that pins a package wins."""

    def __init__(self, pins: dict[str, VersionInfo], unpinned: dict[str, str] | None = None,
                 code: dict[str, dict[str, tuple[str, str]]] | None = None):
        self._pins = pins
        self._installed: dict[str, VersionInfo] = {}
        # Packages the project installs without a version (`transformers` in requirements.txt,
        # `!pip install transformers`), with where: such an install gets the current release.
        self._unpinned = unpinned or {}
        # Bounds the code's own idioms set (version_idioms.py): package -> {">=" | "<": (version, why)},
        # or a function that reads them, called on the first question (most files ask none).
        self._code_source = code if callable(code) else None
        self._code_value = None if callable(code) else (code or {})

    @property
    def _code(self) -> dict:
        if self._code_value is None:
            self._code_value = self._code_source() or {}
        return self._code_value

    @classmethod
    def from_project(cls, root: Path) -> Versions:
        root = Path(root)
        pins: dict[str, VersionInfo] = {}
        unpinned: dict[str, str] = {}
        # A pin whose marker is false here (sys_platform == "linux" on a laptop) still
        # describes the training machine better than what happens to be installed locally.
        fallback: dict[str, VersionInfo] = {}
        for source in (_requirements, _pyproject, _setup_cfg, _setup_py, _environment, _install_lines):
            for name, spec, label, matches in source(root):
                name = normalize(name)
                if spec and _ABSURD_NUMBER.search(spec):
                    continue  # `torch==2.999…9` (thousands of digits) pins nothing pip could install
                if spec:  # a bare `torch` pins nothing: let a later source or install answer
                    target = pins if matches else fallback
                    target.setdefault(name, VersionInfo(name, spec, label, "pin"))
                else:
                    unpinned.setdefault(name, label)
        return cls({**fallback, **pins}, unpinned)

    def inheriting(self, outer: Versions) -> Versions:
        """These pins, with `outer`'s for the packages this project does not mention."""
        mentioned = set(self._pins) | set(self._unpinned)
        pins = {**{k: v for k, v in outer._pins.items() if k not in mentioned}, **self._pins}
        unpinned = {**{k: v for k, v in outer._unpinned.items() if k not in mentioned}, **self._unpinned}
        if pins == self._pins and unpinned == self._unpinned:
            return self
        return Versions(pins, unpinned)

    def with_requirements(self, requirements: list[str], source: str) -> Versions:
        """These versions with `requirements` (pip arguments: `transformers==4.44.2`) put
        first: what a notebook or a Dockerfile installs is what its code runs on."""
        pins = dict(self._pins)
        unpinned = dict(self._unpinned)
        for text in requirements:
            pin = _from_requirement(text, source)
            if pin and pin[1]:
                pins[normalize(pin[0])] = VersionInfo(normalize(pin[0]), pin[1], source, "pin")
            elif pin:
                unpinned[normalize(pin[0])] = source
        return Versions(pins, unpinned, self._code_source if self._code_value is None else self._code_value)

    def with_code_bounds(self, bounds) -> Versions:
        """These versions with the bounds read from the code: `dtype=` in `from_pretrained`
        exists from transformers 4.56 (">="), `Trainer(tokenizer=...)` only below 5 ("<").
        A pin still wins, narrowed by the bounds where they overlap; an installed copy
        outside the bounds is not the one the code runs on, so the bounds replace it.
        `bounds` may be a function that returns them: it is called when a rule first asks."""
        if callable(bounds):
            return Versions(self._pins, self._unpinned, lambda: self._merged(bounds()))
        if not bounds:
            return self
        return Versions(self._pins, self._unpinned, self._merged(bounds))

    def _merged(self, bounds) -> dict:
        from cfgfix.analysis.version_idioms import tighten

        merged = {name: dict(found) for name, found in self._code.items()}
        for package, found in (bounds or {}).items():
            target = merged.setdefault(normalize(package), {})
            for op, (version, why) in found.items():
                tighten(target, op, version, why)
        return merged

    def _code_info(self, name: str) -> VersionInfo | None:
        found = self._code.get(name)
        if not found:
            return None
        ops = [op for op in (">=", "<") if op in found]
        spec = ",".join(f"{op}{found[op][0]}" for op in ops)
        if not _admits(spec):
            return None  # contradictory idioms (an API added after another was removed): no claim
        return VersionInfo(name, spec, "; ".join(found[op][1] for op in ops), "code")

    def resolve(self, package: str) -> VersionInfo:
        """The version for a rule whose policy is to assume the current release when there is
        no evidence (docs/versions.md): the evidence when there is a pin, an installed copy or
        an upper bound from the code (an API removed later: the code cannot run on the
        current release); else, for a package whose current release the facts read
        (CURRENT), that release as a lower bound with `evidence="assumed"` and the reason in
        `source`, for the message. A lower bound from the code alone does not stop the
        assumption: an install without a pin gets the current release, which is above
        every lower bound in version_idioms.py."""
        info = self.get(package)
        name = normalize(package)
        current = CURRENT.get(name)
        if info.evidence in ("pin", "installed") or current is None:
            return info
        if info.evidence == "code" and "<" in self._code.get(name, {}):
            return info
        for since, library, lowest, why in REQUIRES.get(name, ()):
            other = self.get(library)
            if other.evidence == "pin" and other.below(lowest) is True:
                # torch==1.13.1 pinned: no deepspeed that needs torch>=2.0 installs beside it
                return VersionInfo(name, f"<{since}", f"{library}{other.specifier} in {other.source}; {why}", "pin")
        where = self._unpinned.get(name)
        why = (f"the current release, which `{name}` unpinned in {where} installs" if where
               else f"the current release: no version of {name} is pinned or installed")
        return VersionInfo(name, f">={current}", why, "assumed")

    def get(self, package: str) -> VersionInfo:
        """The version evidence: the project's pin, else the installed copy (when it is not
        older than the code's idioms need), else the code's lower bound, else unknown."""
        name = normalize(package)
        code = self._code_info(name)
        if name in self._pins:
            pin = self._pins[name]
            if code is not None:
                # `>=4.40` and code that only runs below 5: the code narrows the pin's range.
                narrowed = f"{pin.specifier},{code.specifier}"
                if _admits(narrowed) and not _same_bounds(narrowed, pin.specifier):
                    return VersionInfo(name, narrowed, f"{pin.source}; {code.source}", "pin")
            return pin
        if name not in self._installed:
            self._installed[name] = _installed(name)
        installed = self._installed[name]
        if code is None:
            return installed
        if installed.known and _admits(f"{installed.specifier},{code.specifier}"):
            return installed  # the installed copy is one the code runs on
        return code

    def fingerprint(self) -> str:
        if getattr(self, "_fingerprint", None) is None:
            self._fingerprint = self._compute_fingerprint()
        return self._fingerprint

    def _compute_fingerprint(self) -> str:
        infos = {p: self.get(p) for p in TRACKED}
        infos.update(self._pins)
        infos.update({f"unpinned:{p}": VersionInfo(p, "", where) for p, where in self._unpinned.items()})
        data = sorted((i.package, i.specifier, i.source) for i in infos.values())
        import hashlib
        import json

        return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


def _installed(name: str) -> VersionInfo:
    # Metadata only: importing torch to ask its version would cost seconds.
    version = _metadata_version(name)
    # Broken metadata can lack a version; say nothing rather than guess.
    return VersionInfo(name, f"=={version}", "installed", "installed") if version else VersionInfo(name)


def _metadata_version(name: str) -> str | None:
    """The installed version from the `*.dist-info` / `*.egg-info` folders on `sys.path`,
    found by name. This is what `importlib.metadata.version` does, without its ~70 ms of
    imports (email.*) that a pre-commit run cannot afford."""
    import sys

    wanted = re.sub(r"[-_.]+", "_", name).lower()
    for entry in sys.path:
        for folder in _listing(entry or "."):
            stem, dot, suffix = folder.rpartition(".")
            if suffix not in ("dist-info", "egg-info"):
                continue
            dist, _, version = stem.partition("-")
            if re.sub(r"[-_.]+", "_", dist).lower() != wanted:
                continue
            version = version.split("-")[0]
            return version or _version_from_metadata(os.path.join(entry, folder))
    return None


@lru_cache(maxsize=None)
def _listing(folder: str) -> tuple[str, ...]:
    try:
        return tuple(n for n in os.listdir(folder) if n.endswith(("-info")))
    except OSError:
        return ()


def _version_from_metadata(folder: str) -> str | None:
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip() or None
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


_PIN_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "environment.yml", "environment.yaml")


# No release number has 100 digits; a longer run is fuzzed or broken input, and past 4,300
# digits Python cannot even convert it (every range question would raise).
_ABSURD_NUMBER = LazyRegex(r"\d{100}")


def _has_pins(folder: str) -> bool:
    """One listing of the folder (not a stat per candidate name and a glob)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name in _PIN_FILES or name == "requirements" or (
                        name.startswith("requirements") and name.endswith(".txt")):
                    if name == "requirements":
                        if entry.is_dir():
                            return True
                    elif name in _PIN_FILES:
                        if entry.is_file():
                            return True
                    else:
                        return True  # requirements*.txt, as the glob matched it (any entry)
    except OSError:
        return False
    return False


class ProjectVersions:
    """Versions for each file: the pins of the nearest folder above it that has any
    (requirements*.txt, pyproject.toml, setup.cfg, environment.yml), up to the folder
    holding `.git` or the settings root, and for a library that folder does not mention,
    the pins of the folders above it. One repository can hold several projects, each with
    its own pins; a file outside every pinned folder gets the root's view."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self._root = str(self.root)
        self._by_folder: dict[str, Versions] = {}
        self._owner: dict[str, str] = {}  # real folder -> the folder whose pins it uses
        self._by_dir: dict[str, Versions] = {}  # a file's folder as named -> its versions
        self._real: dict[str, str] = {}  # a folder as named -> its real path

    def for_file(self, path: Path) -> Versions:
        """Memoised per folder: a whole-tree run asks once per file, and files of one folder
        share the answer (no `realpath` per file, no pin test per ancestor per file). A
        symlinked file is looked up by its target's folder, as before."""
        name = os.fspath(path)
        if not os.path.islink(name):
            folder = os.path.dirname(os.path.abspath(name))
            found = self._by_dir.get(folder)
            if found is None:
                found = self._by_dir[folder] = self._for_folder(self._real_folder(folder))
            return found
        return self._for_folder(os.path.dirname(os.path.realpath(name)))

    def _real_folder(self, folder: str) -> str:
        """`os.path.realpath(folder)` (an absolute, normalised path), one `lstat` per folder:
        a folder that is no link is its real parent's real path plus its name."""
        real = self._real.get(folder)
        if real is None:
            parent = os.path.dirname(folder)
            if parent == folder or os.path.islink(folder):
                real = os.path.realpath(folder)
            else:
                real = os.path.join(self._real_folder(parent), os.path.basename(folder))
            self._real[folder] = real
        return real

    def _for_folder(self, folder: str) -> Versions:
        owner = self._find_owner(folder)
        if owner not in self._by_folder:
            own = Versions.from_project(Path(owner))
            parent = os.path.dirname(owner)
            if owner != self._root and parent != owner and not os.path.exists(os.path.join(owner, ".git")):
                # a nested project's file without a line for a library inherits the pin of
                # the project around it (`sub/requirements.txt` without torch, `torch>=2.0`
                # at the root: the sub-project runs in that environment)
                own = own.inheriting(self._for_folder(parent))
            self._by_folder[owner] = own
        return self._by_folder[owner]

    def _find_owner(self, folder: str) -> str:
        """The nearest folder at or above `folder` with pins; every folder the walk passes
        gets the same answer (walking from it would take the same remaining steps)."""
        visited: list[str] = []
        owner = self._root
        candidate = folder
        while True:
            known = self._owner.get(candidate)
            if known is not None:
                owner = known
                break
            visited.append(candidate)
            if _has_pins(candidate):
                owner = candidate
                break
            if candidate == self._root or os.path.exists(os.path.join(candidate, ".git")):
                break
            parent = os.path.dirname(candidate)
            if parent == candidate:
                break
            candidate = parent
        for seen in visited:
            self._owner[seen] = owner
        return owner
