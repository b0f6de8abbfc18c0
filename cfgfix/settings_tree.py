"""Which settings each checked file uses: ruff's hierarchical configuration.

Every file uses the closest `.cfgfix.toml`, `cfgfix.toml` or `pyproject.toml` with a
`[tool.cfgfix]` table in its folder or above it; parent configs are not merged in. A file
with none above it uses the settings of the current folder (the closest config above the
cwd, else the defaults rooted at the cwd), as before there was a hierarchy. `--config`
gives one file's settings to every file; `--isolated` reads no config file at all.

Each config file's folder is the root of its settings: its relative paths (`exclude`,
`per-file-ignores`) and its project (the launches, the cache, the library versions) start
there. Lookups are memoised per folder, so a walk stats each folder's candidates once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cfgfix.settings import CONFIG_NAMES, Settings, SettingsError, config_in, load_settings, settings_of_file

_NAMES = frozenset((*CONFIG_NAMES, "pyproject.toml"))


class SettingsTree:
    """Settings per folder. `adjust` applies the command line's overrides (--select, --gpu,
    ...) to every settings object once, when it is first loaded."""

    def __init__(self, cwd: Path | str, config_file: Path | None = None, isolated: bool = False,
                 adjust: Callable[[Settings], Settings] = lambda s: s) -> None:
        if config_file is not None and isolated:
            raise SettingsError("--config and --isolated cannot be used together")
        self.cwd = os.path.abspath(cwd)
        self._adjust = adjust
        self._by_folder: dict[str, Settings] = {}
        self._by_config: dict[str, Settings] = {}
        self.fixed: Settings | None = None  # every file's, with --config or --isolated
        if config_file is not None:
            if not str(config_file).strip():
                raise SettingsError("--config: empty path; give a cfgfix.toml or pyproject.toml")
            try:
                self.fixed = adjust(settings_of_file(Path(config_file)))
            except SettingsError as exc:
                raise SettingsError(f"--config: {exc}") from None
        elif isolated:
            self.fixed = adjust(Settings(root=Path(self.cwd), config_path=None, select=None))
        self._fallback: Settings | None = None

    @classmethod
    def single(cls, settings: Settings) -> SettingsTree:
        """A tree that gives `settings` to every file (callers that hold one settings object)."""
        tree = cls(settings.root)
        tree.fixed = settings
        return tree

    @property
    def fallback(self) -> Settings:
        """The settings of a file with no config above it: the current folder's."""
        if self.fixed is not None:
            return self.fixed
        if self._fallback is None:
            found = load_settings(Path(self.cwd))
            if found.config_path is None:
                self._fallback = self._adjust(found)
            else:
                key = str(found.config_path)
                self._fallback = self._by_config.get(key) or self._by_config.setdefault(key, self._adjust(found))
        return self._fallback

    def _of_config(self, path: Path) -> Settings:
        key = str(path)
        settings = self._by_config.get(key)
        if settings is None:
            settings = self._by_config[key] = self._adjust(settings_of_file(path))
        return settings

    def for_folder(self, folder: str, names=None) -> Settings:
        """The settings of the files in `folder` (absolute). `names`: its entries, when listed."""
        if self.fixed is not None:
            return self.fixed
        settings = self._by_folder.get(folder)
        if settings is not None:
            return settings
        config = config_in(Path(folder), names) if names is None or not _NAMES.isdisjoint(names) else None
        if config is not None:
            settings = self._of_config(config)
        else:
            parent = os.path.dirname(folder)
            settings = self.fallback if parent == folder else self.for_folder(parent)
        self._by_folder[folder] = settings
        return settings

    def for_path(self, path: Path | str) -> Settings:
        """The settings of one file (or of a folder's own files)."""
        path = os.path.abspath(path)
        return self.for_folder(path if os.path.isdir(path) else os.path.dirname(path))

    def inside(self, folder: str, names, parent: Settings) -> Settings:
        """A walked subfolder's settings: its own config, else its parent folder's (no stat
        for a folder that holds no candidate name)."""
        if self.fixed is not None:
            return self.fixed
        settings = self._by_folder.get(folder)
        if settings is None:
            config = config_in(Path(folder), names) if not _NAMES.isdisjoint(names) else None
            settings = self._of_config(config) if config is not None else parent
            self._by_folder[folder] = settings
        return settings
