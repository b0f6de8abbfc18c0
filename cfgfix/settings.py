"""Settings: where they come from (cfgfix.toml or [tool.cfgfix]) and what they select.

Shaped like ruff's so users know it already: the nearest config file wins, CLI flags win
over files, and a more specific rule selector wins over a less specific one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from cfgfix.core import LazyRegex
from cfgfix.records import dataclass, field, replace

# In one folder, as ruff ranks .ruff.toml > ruff.toml > pyproject.toml: the first one found wins
# (a pyproject.toml only when it has a [tool.cfgfix] table).
CONFIG_NAMES = (".cfgfix.toml", "cfgfix.toml")

# ruff's defaults, plus our own cache.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints",
    ".mypy_cache", ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache",
    ".svn", ".tox", ".venv", ".vscode", "__pypackages__", "_build", "buck-out", "dist",
    "node_modules", "site-packages", "venv", ".cfgfix_cache",
)

_LIST_KEYS = ("select", "ignore", "extend-select", "exclude", "extend-exclude")
_KNOWN_KEYS = _LIST_KEYS + ("per-file-ignores", "gpu", "gpus", "model")
_SELECTOR_KEYS = ("select", "ignore", "extend-select")
# A code (CFX103), a prefix of one (CFX1, CFX), or ALL.
_SELECTOR_RE = LazyRegex(r"ALL|[A-Z]+[0-9]*")


class SettingsError(Exception):
    """A config file or flag cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Settings:
    """The run's settings: the project root, the rules chosen and the files excluded."""

    root: Path
    config_path: Path | None
    select: tuple[str, ...] | None  # None = the rules' defaults
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, selectors)
    exclude: tuple[str, ...] | None = None  # None = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    gpu: str | None = None  # the target GPU ("RTX 4090"): CFX602, CFX701, `estimate`, `fix --fit`
    gpus: int | None = None  # GPUs per run, when no launch says
    simulate: bool = False  # `check --simulate`: CFX7xx measure with the FakeTensor simulator
    # `[tool.cfgfix.model]`: what cfgfix cannot size statically in the script's own model class
    # (training/custom_model.py): `params` (the whole model) and `modules` (attribute -> a
    # parameter count, or a model id / folder), as ((name, value), ...)
    model_params: int | None = None
    model_modules: tuple[tuple[str, object], ...] = ()
    # Where `gpu` came from, as `explain` shows it: the settings file, or the --gpu flag.
    gpu_origin: str = field(default="gpu in the cfgfix settings", compare=False, repr=False)
    # Selectors given on the command line, only so errors blame the flag, not the file.
    cli_selectors: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def fingerprint(self) -> str:
        # root and config_path are left out: moving a checkout must not invalidate a cache.
        data = [
            self.select, self.ignore, self.extend_select,
            [[g, list(c)] for g, c in self.per_file_ignores],
            self.exclude, self.extend_exclude, self.gpu, self.gpus,
            self.model_params, [list(m) for m in self.model_modules],
        ]
        import hashlib  # the cache's key only
        import json

        return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- loading


def load_settings(start: Path, config_file: Path | None = None) -> Settings:
    """Settings from `config_file`, else from the nearest config above `start`."""
    start = Path(start).absolute()
    if config_file is not None:
        return settings_of_file(config_file)
    folder = start if start.is_dir() else start.parent
    for d in (folder, *folder.parents):
        found = config_in(d)
        if found is not None:
            return settings_of_file(found)
    return Settings(root=folder, config_path=None, select=None)


def settings_of_file(config_file: Path) -> Settings:
    """The settings a file given by --config holds (a pyproject.toml without [tool.cfgfix]:
    the defaults, rooted at its folder)."""
    path = Path(config_file).absolute()
    if path.is_dir():
        raise SettingsError(f"{path}: a folder, not a config file (give its cfgfix.toml or pyproject.toml)")
    if not path.is_file():
        raise SettingsError(f"{path}: config file does not exist")
    table = _read(path)
    if path.name == "pyproject.toml":
        table = _cfgfix_table(table, path) or {}
    return _from_table(table, path)


def config_in(folder: Path, names=None) -> Path | None:
    """The config file of `folder` (ruff's ranking among the three), or None. `names`: the
    folder's entries when the caller has listed them already (no stat per candidate)."""
    for name in (*CONFIG_NAMES, "pyproject.toml"):
        if names is not None and name not in names:
            continue
        path = Path(folder, name)
        if not path.is_file():
            continue
        if name != "pyproject.toml" or (_mentions_cfgfix(path) and _cfgfix_table(_read(path), path) is not None):
            return path
    return None


def _mentions_cfgfix(path: Path) -> bool:
    """Whether a pyproject.toml can hold a [tool.cfgfix] table at all: another project's
    (a vendored package in a walked tree) is neither parsed nor blamed for its TOML."""
    try:
        with open(path, "rb") as f:
            return b"cfgfix" in f.read()
    except OSError:
        return True  # let the reader report it


def _read(path: Path) -> dict:
    # Imported here: a project without a config file (and a pre-commit run in one) never reads TOML.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot read: {exc}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # a >4,300-digit integer, absurd nesting
        raise SettingsError(f"{path}: cannot read: {type(exc).__name__}: {str(exc)[:200]}") from None


def _cfgfix_table(doc: dict, path: Path) -> dict | None:
    table = doc.get("tool", {}).get("cfgfix") if isinstance(doc.get("tool"), dict) else None
    if table is not None and not isinstance(table, dict):
        raise SettingsError(f"{path}: 'tool.cfgfix' must be a table")
    return table


def _from_table(table: dict, path: Path) -> Settings:
    where = "[tool.cfgfix]" if path.name == "pyproject.toml" else "settings"
    values: dict = {}
    for key, value in table.items():
        if key not in _KNOWN_KEYS:
            import difflib

            close = difflib.get_close_matches(key, _KNOWN_KEYS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise SettingsError(f"{path}: unknown key '{key}' in {where}{hint}")
        if key == "per-file-ignores":
            values[key] = _per_file_ignores(value, path)
        elif key == "gpu":
            values[key] = check_gpu(value, f"{path}: 'gpu'")
        elif key == "model":
            values["model"] = _model_table(value, path, where)
        elif key == "gpus":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
                raise SettingsError(f"{path}: 'gpus' must be an integer from 1 to {MAX_GPUS}, got {_short(value)}")
            values[key] = value
        else:
            values[key] = _str_list(value, f"{path}: '{key}'")
            if key in _SELECTOR_KEYS:
                _check_syntax(values[key], f"{path}: '{key}'")
            else:
                _check_patterns(values[key], f"{path}: '{key}'")
    return Settings(
        root=path.parent,
        config_path=path,
        select=values.get("select"),
        ignore=values.get("ignore", ()),
        extend_select=values.get("extend-select", ()),
        per_file_ignores=values.get("per-file-ignores", ()),
        exclude=values.get("exclude"),
        extend_exclude=values.get("extend-exclude", ()),
        gpu=values.get("gpu"),
        gpus=values.get("gpus"),
        model_params=values.get("model", (None, ()))[0],
        model_modules=values.get("model", (None, ()))[1],
    )


MAX_PARAMS = 10**14  # far beyond any model trained; a bigger count is a typo


def _model_table(value, path: Path, where: str) -> tuple[int | None, tuple[tuple[str, object], ...]]:
    """`[model]`: `params = 8.5e9` and `[model.modules]` `name = 94_000_000` or `name = "org/id"`."""
    if not isinstance(value, dict):
        raise SettingsError(f"{path}: 'model' in {where} must be a table with 'params' and/or 'modules', got {_short(value)}")
    unknown = [k for k in value if k not in ("params", "modules")]
    if unknown:
        raise SettingsError(f"{path}: unknown key 'model.{unknown[0]}' in {where} (known: model.params, model.modules)")
    params = value.get("params")
    if params is not None:
        params = _count(params, f"{path}: 'model.params'")
    modules = value.get("modules", {})
    if not isinstance(modules, dict):
        raise SettingsError(f"{path}: 'model.modules' must be a table of attribute = parameter count or model id, "
                            f"got {_short(modules)}")
    out = []
    for name, item in modules.items():
        what = f"{path}: 'model.modules.{name}'"
        if not name.isidentifier():
            raise SettingsError(f"{what}: a module is named by its attribute in the model class (self.<name>)")
        if isinstance(item, str) and item.strip():
            out.append((name, item.strip()))
        else:
            out.append((name, _count(item, what)))
    return params, tuple(out)


def _count(value, what: str) -> int:
    """A parameter count: an integer or a float such as 8.5e9, at least 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not 1 <= value <= MAX_PARAMS:
        raise SettingsError(f"{what} must be a parameter count from 1 to {MAX_PARAMS:.0e} (such as 8.5e9), got {_short(value)}")
    return int(value)


MAX_GPUS = 65536  # more than any cluster runs one job on; a bigger number is a typo
MAX_BRACE_EXPANSIONS = 256  # "{a,b}" twenty times is a million globs: a mistake, never a need


def _short(value) -> str:
    """A value for an error message, cut short (a setting can hold a huge nested table)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def _str_list(value, what: str) -> tuple[str, ...]:
    # A bare string is the classic mistake (select = "CFX1"): say so instead of iterating it.
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SettingsError(f"{what} must be a list of strings, got {_short(value)}")
    return tuple(value)


def _check_patterns(patterns: Iterable[str], what: str) -> None:
    """gitignore-style patterns that pathspec compiles ("!" and a lone "\\" do not)."""
    from pathspec import GitIgnoreSpec
    from pathspec.patterns.gitwildmatch import GitWildMatchPatternError

    for pattern in patterns:
        try:
            GitIgnoreSpec.from_lines([pattern])
        except (GitWildMatchPatternError, ValueError, re.error) as exc:
            raise SettingsError(f"{what}: invalid pattern {pattern!r}: {exc}") from None


def _per_file_ignores(value, path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise SettingsError(f"{path}: 'per-file-ignores' must be a table of glob = [codes], got {value!r}")
    out = []
    for glob, codes in value.items():
        what = f"{path}: 'per-file-ignores' entry {glob!r}"
        codes = _str_list(codes, what)
        _check_syntax(codes, what)
        globs = _expand_braces(glob)
        if globs is None:
            raise SettingsError(f"{what}: the braces expand to more than {MAX_BRACE_EXPANSIONS} patterns")
        _check_patterns(globs, what)
        out.append((glob, codes))
    return tuple(out)


def _check_syntax(selectors: Iterable[str], what: str) -> None:
    for sel in selectors:
        if not _SELECTOR_RE.fullmatch(sel):
            hint = f"; did you mean '{sel.strip().upper()}'?" if _SELECTOR_RE.fullmatch(sel.strip().upper()) else ""
            raise SettingsError(f"{what}: unknown rule selector '{sel}'{hint}")


def _did_you_mean(selector: str, codes: list[str]) -> str:
    """"; did you mean 'CFX103'?" for a code one typo away from a known one."""
    import difflib

    close = difflib.get_close_matches(selector, codes, n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'? (`cfgfix rule --all` lists the rules)" if close else \
        " (`cfgfix rule --all` lists the rules)"


def check_gpu(value, what: str) -> str:
    """A target GPU the catalog knows, stripped; else SettingsError naming the catalog. The one
    check for `gpu` in a settings file and for every command's --gpu flag: an unknown card
    would silently switch off CFX602/CFX701 and leave `fix --fit` without a budget."""
    from cfgfix.memory.gpus import close_gpus, find_gpu  # a leaf module: JSON data, no imports back

    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{what} must be a GPU name such as \"RTX 4090\", got {value!r}")
    if find_gpu(value) is None:
        close = close_gpus(value)
        hint = f"did you mean {_one_of(close)}? " if close else ""
        raise SettingsError(
            f"{what}: unknown GPU {value.strip()!r}; {hint}"
            f"`cfgfix estimate --list-gpus` lists the catalog's GPUs with their memory")
    return value.strip()


def _one_of(names: list[str]) -> str:
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else "one of " + ", ".join(quoted)


def with_gpu(settings: Settings, gpu: str | None) -> Settings:
    """The --gpu flag over the settings' `gpu` (checked the same way, blamed on the flag)."""
    if gpu is None:
        return settings
    return replace(settings, gpu=check_gpu(gpu, "--gpu"), gpu_origin="--gpu")


def with_overrides(settings: Settings, *, select=None, ignore=None, extend_select=None) -> Settings:
    """Apply CLI flags: --select replaces the file's select; --ignore/--extend-select add."""
    given = [tuple(v) for v in (select, ignore, extend_select) if v is not None]
    for flag, v in (("--select", select), ("--ignore", ignore), ("--extend-select", extend_select)):
        if v is not None:
            _check_syntax(v, flag)
    return replace(
        settings,
        select=tuple(select) if select is not None else settings.select,
        ignore=settings.ignore + tuple(ignore or ()),
        extend_select=settings.extend_select + tuple(extend_select or ()),
        cli_selectors=settings.cli_selectors.union(*given),
    )


# -------------------------------------------------------------------------- selection


def selector_matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def enabled_codes(settings: Settings, codes: list[str], default_codes: set[str]) -> frozenset[str]:
    """(select or defaults) + extend-select - ignore, the most specific selector winning.

    Like ruff: selectors are applied from least to most specific, and at equal
    specificity an ignore beats a select. So select=CFX1 + ignore=CFX103 turns CFX103 off,
    and ignore=CFX1 + extend-select=CFX103 turns it on.
    """
    known = list(codes)
    enabled = set(default_codes) & set(known) if settings.select is None else set()
    steps = []
    for key, selectors, on in (
        ("select", settings.select or (), True),
        ("extend-select", settings.extend_select, True),
        ("ignore", settings.ignore, False),
    ):
        for sel in selectors:
            matched = {c for c in known if selector_matches(sel, c)}
            if not matched:
                raise SettingsError(f"{_origin(settings, sel, key)}: unknown rule selector '{sel}'{_did_you_mean(sel, known)}")
            steps.append((_specificity(sel), not on, on, matched))
    for _, _, on, matched in sorted(steps, key=lambda s: (s[0], s[1])):
        enabled = enabled | matched if on else enabled - matched
    return frozenset(enabled)


def _origin(settings: Settings, selector: str, key: str) -> str:
    if selector in settings.cli_selectors or settings.config_path is None:
        return f"--{key}"
    return f"{settings.config_path}: '{key}'"


def ignored_codes_for(settings: Settings, relpath: str, codes: Iterable[str] | None = None) -> frozenset[str]:
    """Selectors that per-file-ignores switches off for `relpath` (posix, relative to root).

    Without `codes` the selectors come back as written (test them with selector_matches);
    with the known codes, prefixes and ALL are expanded to codes.
    """
    selectors: set[str] = set()
    for spec, sels in _compiled_per_file(settings.per_file_ignores):
        if spec.match_file(relpath):
            selectors.update(sels)
    if codes is None:
        return frozenset(selectors)
    if not selectors:
        return frozenset()  # the usual case: asked once per file of the run
    return frozenset(c for c in codes if any(selector_matches(s, c) for s in selectors))


@lru_cache(maxsize=32)
def _compiled_per_file(per_file_ignores):
    # gitignore-style globs: "train.py" matches at any depth, "scripts/*.sh" from the root.
    if not per_file_ignores:
        return []  # without importing pathspec
    from pathspec import GitIgnoreSpec

    return [(GitIgnoreSpec.from_lines(_expand_braces(glob) or [glob]), sels) for glob, sels in per_file_ignores]


def _expand_braces(glob: str, limit: int = MAX_BRACE_EXPANSIONS) -> list[str] | None:
    """ruff's examples use "**/{tests,docs}/*"; gitignore globs have no braces. None when the
    expansion would pass `limit` globs (it grows exponentially with the number of braces)."""
    out, todo = [], [glob]
    while todo:
        item = todo.pop()
        m = re.search(r"\{([^{}]*)\}", item)
        if not m:
            out.append(item)
        else:
            todo.extend(item[: m.start()] + alt + item[m.end():] for alt in reversed(m.group(1).split(",")))
        if len(out) + len(todo) > limit:
            return None
    return out
