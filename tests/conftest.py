import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run with the current folder at a fresh temporary project."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_project(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8", newline="")


def lint_project(root: Path, select=None, use_cache=False):
    """Run the real engine over a folder, as `cfgfix check` does."""
    from cfgfix.engine import Engine
    from cfgfix.settings import load_settings, with_overrides
    from cfgfix.workspace import discover

    cwd = os.getcwd()
    os.chdir(root)
    try:
        settings = with_overrides(load_settings(root), select=select)
        engine = Engine(settings, use_cache=use_cache)
        files, _ = discover([Path(".")], settings)
        return engine, files, engine.run(files)
    finally:
        os.chdir(cwd)


def training_setups_of(root: Path) -> list:
    """The resolved training setup of each launch of the project at `root` (`cfgfix
    explain`'s data), after a real engine run over it."""
    from cfgfix.training.resolve import training_setups

    engine, _, _ = lint_project(root)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return training_setups(engine.project)
    finally:
        os.chdir(cwd)


def setting_value(setup, setting: str):
    """A resolved setting's value, None when unknown."""
    value = setup.values.get(setting)
    return value.value if value is not None else None


@pytest.fixture(autouse=True)
def no_installed_versions(request, monkeypatch):
    """Tests see only the versions their sample projects pin, never this machine's."""
    from cfgfix.analysis import versions

    if request.module.__name__.endswith("test_versions"):
        return  # those tests exercise the installed fallback themselves
    monkeypatch.setattr(versions, "_installed", lambda name: versions.VersionInfo(name, "", ""))


@pytest.fixture(autouse=True)
def no_hub_cache(monkeypatch, tmp_path_factory):
    """Tests never read this machine's Hugging Face cache: an empty one of their own (a test
    that needs cached configs writes them there, analysis/hub_cache.py)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hub-cache")))


@pytest.fixture(autouse=True)
def _not_in_github_actions(monkeypatch):
    """The suite may run inside GitHub Actions; `verify`'s guard reads GITHUB_ACTIONS, and a
    test that clears GITHUB_EVENT_NAME means a local run."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
