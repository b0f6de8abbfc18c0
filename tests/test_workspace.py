import os
from pathlib import Path

import pytest

from cfgfix.settings import Settings
from cfgfix.workspace import classify, discover


def touch(root: Path, *names: str, text: str = "") -> None:
    for name in names:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def settings(root: Path, **kw) -> Settings:
    kw.setdefault("select", None)
    return Settings(root=root, config_path=None, **kw)


def found(tmp_path, paths=None, **kw) -> list[str]:
    files, warnings = discover(paths or [tmp_path], settings(tmp_path, **kw))
    assert warnings == []
    return [f.relpath for f in files]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "name, head, kind",
    [
        ("train.py", b"", "python"),
        ("stubs.pyi", b"", "python"),
        ("run.sh", b"", "shell"),
        ("run.bash", b"", "shell"),
        ("run.zsh", b"", "shell"),
        ("launch", b"#!/bin/bash\naccelerate launch x.py\n", "shell"),
        ("launch", b"#!/usr/bin/env bash\n", "shell"),
        ("launch", b"#!/usr/bin/env -S bash -e\n", "shell"),
        ("job.slurm", b"#!/bin/sh -l\n#SBATCH -N 1\n", "shell"),
        ("job.sbatch", b"#!/usr/bin/dash\n", "shell"),
        ("job.zsh.in", b"#! /bin/zsh\n", "shell"),
        ("tool", b"#!/usr/bin/env python3\n", None),
        ("tool", b"#!/usr/bin/perl\n", None),
        ("notes", b"plain text\n", None),
        ("config.yaml", b"", "yaml"),
        ("config.yml", b"", "yaml"),
        ("ds_zero2.json", b"", "json"),
        ("Dockerfile", b"", "dockerfile"),
        ("Dockerfile.gpu", b"", "dockerfile"),
        ("train.dockerfile", b"", "dockerfile"),
        ("Containerfile", b"", "dockerfile"),
        ("Makefile", b"", "makefile"),
        ("GNUmakefile", b"", "makefile"),
        ("rules.mk", b"", "makefile"),
        (".env", b"", "env"),
        ("prod.env", b"", "env"),
        (".env.local", b"", "env"),
        ("README.md", b"", "markdown"),  # read for the launches in its shell blocks
        ("notes.md", b"", None),
        ("setup.cfg", b"", None),
        ("weights.safetensors", b"", None),
    ],
)
def test_classify(name, head, kind):
    assert classify(Path(name), head) == kind


# --------------------------------------------------------------------------- walking


def test_walk_finds_kinds_sorted_with_paths(tmp_path):
    touch(tmp_path, "train.py", "configs/ds.json", "scripts/run.sh", "README.md", "Dockerfile", "a.yaml")
    touch(tmp_path, "scripts/launch", text="#!/bin/bash\ntorchrun x.py\n")
    files, warnings = discover([Path(".")], settings(tmp_path))
    assert warnings == []
    assert [(f.display, f.kind) for f in files] == [
        ("Dockerfile", "dockerfile"),
        ("README.md", "markdown"),
        ("a.yaml", "yaml"),
        ("configs/ds.json", "json"),
        ("scripts/launch", "shell"),
        ("scripts/run.sh", "shell"),
        ("train.py", "python"),
    ]
    f = files[-1]
    assert f.path == tmp_path / "train.py" and f.path.is_absolute()
    assert f.relpath == "train.py"


def test_display_relative_to_cwd_relpath_to_root(tmp_path, monkeypatch):
    touch(tmp_path, "proj/src/train.py")
    monkeypatch.chdir(tmp_path / "proj" / "src")
    files, _ = discover([Path(".")], settings(tmp_path / "proj"))
    assert [(f.display, f.relpath) for f in files] == [("train.py", "src/train.py")]


def test_outside_cwd_and_root_is_absolute(tmp_path, monkeypatch):
    touch(tmp_path, "other/x.py")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    files, _ = discover([tmp_path / "other"], settings(tmp_path / "here"))
    assert [(f.display, f.relpath) for f in files] == [((tmp_path / "other/x.py").as_posix(),) * 2]


def test_default_excludes_skipped(tmp_path):
    touch(tmp_path, "ok.py", ".git/hooks/x.py", "node_modules/a/b.json", "dist/x.py", ".cfgfix_cache/c.json")
    touch(tmp_path, "sub/venv/lib/x.py", "lib/site-packages/pkg/x.py", ".tox/py/x.py")
    assert found(tmp_path) == ["ok.py"]


def test_virtualenvs_skipped_by_marker(tmp_path):
    touch(tmp_path, "ok.py", "myenv/pyvenv.cfg", "myenv/lib/x.py", "conda/conda-meta/history", "conda/x.py")
    assert found(tmp_path) == ["ok.py"]


def test_user_exclude_replaces_defaults(tmp_path):
    touch(tmp_path, "ok.py", "dist/x.py", "build/y.py")
    assert found(tmp_path, exclude=("build",)) == ["dist/x.py", "ok.py"]


def test_extend_exclude_globs_names_and_paths(tmp_path):
    touch(tmp_path, "ok.py", "gen/a.py", "src/gen/b.py", "x_pb2.py", "src/y_pb2.py", "dist/z.py")
    got = found(tmp_path, extend_exclude=("/gen/", "*_pb2.py"))
    assert got == ["ok.py", "src/gen/b.py"]


def test_gitignore_root_and_nested(tmp_path):
    touch(tmp_path, ".gitignore", text="outputs/\n*.gen.py\n/local.yaml\n")
    touch(tmp_path, "train.py", "outputs/run1/cfg.yaml", "a.gen.py", "local.yaml", "sub/local.yaml")
    touch(tmp_path, "sub/.gitignore", text="secret.json\n!keep.gen.py\n")
    touch(tmp_path, "sub/secret.json", "secret.json", "sub/keep.gen.py", "sub/drop.gen.py")
    assert found(tmp_path) == ["secret.json", "sub/keep.gen.py", "sub/local.yaml", "train.py"]


def test_git_info_exclude(tmp_path):
    touch(tmp_path, ".git/info/exclude", text="scratch/\n")
    touch(tmp_path, "scratch/a.py", "b.py")
    assert found(tmp_path) == ["b.py"]


def test_parent_gitignore_applies_when_walking_a_subfolder(tmp_path):
    (tmp_path / ".git").mkdir()
    touch(tmp_path, ".gitignore", text="*.tmp.py\n")
    touch(tmp_path, "src/a.py", "src/b.tmp.py")
    files, _ = discover([tmp_path / "src"], settings(tmp_path))
    assert [f.relpath for f in files] == ["src/a.py"]


def test_explicit_paths_bypass_defaults_and_gitignore(tmp_path):
    touch(tmp_path, ".gitignore", text="ignored.py\nbuild/\n")
    touch(tmp_path, "ignored.py", "build/gen.py", "venv/x.py", "env/pyvenv.cfg", "env/y.py")
    paths = [Path("ignored.py"), Path("build"), Path("venv/x.py"), Path("env")]
    files, warnings = discover(paths, settings(tmp_path))
    assert warnings == []
    assert [f.display for f in files] == ["build/gen.py", "env/y.py", "ignored.py", "venv/x.py"]


def test_user_exclude_still_applies_to_explicit_files(tmp_path):
    touch(tmp_path, "gen/a.py", "b_pb2.py", "c.py")
    paths = [Path("gen/a.py"), Path("b_pb2.py"), Path("c.py"), Path("gen")]
    files, _ = discover(paths, settings(tmp_path, extend_exclude=("gen", "*_pb2.py")))
    assert [f.display for f in files] == ["c.py"]


def test_explicit_unknown_kind_is_skipped_quietly(tmp_path):
    touch(tmp_path, "notes.md")
    assert discover([Path("notes.md")], settings(tmp_path)) == ([], [])


def test_missing_path_is_a_warning(tmp_path):
    touch(tmp_path, "a.py")
    files, warnings = discover([Path("nope"), Path("a.py")], settings(tmp_path))
    assert [f.display for f in files] == ["a.py"]
    assert warnings == ["nope: path does not exist"]


def test_duplicates_collapse(tmp_path):
    touch(tmp_path, "a.py")
    files, _ = discover([Path("."), Path("a.py"), tmp_path / "a.py"], settings(tmp_path))
    assert [f.display for f in files] == ["a.py"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_directory_symlinks_not_followed_file_links_kept(tmp_path):
    touch(tmp_path, "real/a.py", "configs/base.yaml")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.symlink(tmp_path / "configs" / "base.yaml", tmp_path / "accelerate.yaml")
    assert found(tmp_path) == ["accelerate.yaml", "configs/base.yaml", "real/a.py"]


def test_gitignore_agrees_with_pathspec(tmp_path):
    # The walk prefilters with combined regexes; its answers must equal pathspec's own.
    from pathspec import GitIgnoreSpec

    rules = [
        "__pycache__/", "*.py[cod]", "/site", "docs/_build/", "**/logs", "*.gen.*", "!keep.gen.py",
        "outputs/*", "!outputs/keep.yaml", "a/**/b.json", "lib/", "[Tt]emp*.sh", "\\#odd.py", "*.yaml",
        "!cfg/*.yaml",
    ]
    touch(tmp_path, ".gitignore", text="\n".join(rules) + "\n")
    files = [
        "x.py", "x.pyc", "__pycache__/m.py", "pkg/__pycache__/m.py", "site/a.py", "pkg/site/a.py",
        "docs/_build/i.json", "pkg/docs/_build/i.json", "logs/r.json", "pkg/logs/r.json", "pkg/logs.py",
        "m.gen.py", "keep.gen.py", "pkg/keep.gen.py", "outputs/a.json", "outputs/keep.yaml", "a/b.json",
        "a/x/y/b.json", "lib/z.py", "pkg/lib/z.py", "Temp1.sh", "temp2.sh", "tmp.sh", "#odd.py",
        "c.yaml", "cfg/d.yaml", "cfg/sub/e.yaml",
    ]
    touch(tmp_path, *files)
    spec = GitIgnoreSpec.from_lines(rules)
    expected = sorted(f for f in files if not spec.match_file(f))
    assert found(tmp_path, exclude=()) == expected  # no default excludes (_build is one)
