from pathlib import Path

import pytest

from cfgfix.settings import (
    DEFAULT_EXCLUDE,
    Settings,
    SettingsError,
    enabled_codes,
    ignored_codes_for,
    load_settings,
    selector_matches,
    with_overrides,
)

CODES = ["CFX101", "CFX102", "CFX103", "CFX104", "CFX105", "CFX201", "CFX202", "CFX901"]
DEFAULTS = {"CFX101", "CFX102", "CFX103", "CFX104", "CFX105", "CFX901"}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def settings(**kw) -> Settings:
    kw.setdefault("select", None)
    return Settings(root=Path("/r"), config_path=None, **kw)


# ----------------------------------------------------------------------- discovery


def test_no_config_uses_start_folder_and_defaults(tmp_path):
    s = load_settings(tmp_path)
    assert s.root == tmp_path and s.config_path is None
    assert s.select is None and s.exclude is None and s.ignore == ()


def test_pyproject_tool_table_found_walking_up(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.cfgfix]\nselect = ["CFX1"]\nignore = ["CFX103"]\n')
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    s = load_settings(sub)
    assert s.root == tmp_path and s.config_path == tmp_path / "pyproject.toml"
    assert s.select == ("CFX1",) and s.ignore == ("CFX103",)


def test_pyproject_without_tool_table_is_skipped(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.cfgfix]\nselect = ["CFX2"]\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "x"\n')
    s = load_settings(tmp_path / "pkg")
    assert s.config_path == tmp_path / "pyproject.toml"


def test_nearest_config_wins(tmp_path):
    write(tmp_path / "cfgfix.toml", 'select = ["CFX1"]\n')
    write(tmp_path / "pkg" / ".cfgfix.toml", 'select = ["CFX2"]\n')
    s = load_settings(tmp_path / "pkg")
    assert s.select == ("CFX2",) and s.root == tmp_path / "pkg"


def test_cfgfix_toml_beats_pyproject_in_same_folder(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.cfgfix]\nselect = ["CFX2"]\n')
    write(tmp_path / "cfgfix.toml", 'select = ["CFX1"]\n')
    assert load_settings(tmp_path).select == ("CFX1",)


def test_explicit_config_file(tmp_path):
    write(tmp_path / "cfgfix.toml", 'select = ["CFX1"]\n')
    other = write(tmp_path / "conf" / "pyproject.toml", '[tool.cfgfix]\nignore = ["CFX2"]\n')
    s = load_settings(tmp_path, other)
    assert s.config_path == other and s.root == other.parent
    assert s.select is None and s.ignore == ("CFX2",)
    top = write(tmp_path / "conf" / "custom.toml", 'extend-select = ["CFX201"]\n')
    assert load_settings(tmp_path, top).extend_select == ("CFX201",)


def test_explicit_config_file_missing(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path, tmp_path / "nope.toml")


def test_all_keys_parsed(tmp_path):
    write(
        tmp_path / "cfgfix.toml",
        """
select = ["CFX1"]
ignore = ["CFX105"]
extend-select = ["CFX201"]
exclude = ["build"]
extend-exclude = ["gen/*.py"]
[per-file-ignores]
"tests/*" = ["CFX103"]
"__init__.py" = ["CFX1"]
""",
    )
    s = load_settings(tmp_path)
    assert s.extend_select == ("CFX201",)
    assert s.exclude == ("build",) and s.extend_exclude == ("gen/*.py",)
    assert s.per_file_ignores == (("tests/*", ("CFX103",)), ("__init__.py", ("CFX1",)))


# -------------------------------------------------------------------------- errors


def test_unknown_key_names_file_key_and_suggestion(tmp_path):
    cfg = write(tmp_path / "pyproject.toml", '[tool.cfgfix]\nextend-selct = ["CFX1"]\n')
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path)
    msg = str(err.value)
    assert str(cfg) in msg and "'extend-selct'" in msg and "did you mean 'extend-select'" in msg


def test_snake_case_key_is_unknown(tmp_path):
    write(tmp_path / "cfgfix.toml", 'per_file_ignores = {}\n')
    with pytest.raises(SettingsError, match="unknown key 'per_file_ignores'.*'per-file-ignores'"):
        load_settings(tmp_path)


def test_string_instead_of_list(tmp_path):
    cfg = write(tmp_path / "cfgfix.toml", 'select = "CFX1"\n')
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path)
    assert str(cfg) in str(err.value) and "'select' must be a list of strings" in str(err.value)


def test_per_file_ignores_wrong_types(tmp_path):
    write(tmp_path / "cfgfix.toml", 'per-file-ignores = ["x"]\n')
    with pytest.raises(SettingsError, match="per-file-ignores"):
        load_settings(tmp_path)
    write(tmp_path / "cfgfix.toml", '[per-file-ignores]\n"a.py" = "CFX1"\n')
    with pytest.raises(SettingsError, match="'a.py' must be a list"):
        load_settings(tmp_path)


def test_invalid_toml_has_parser_message(tmp_path):
    cfg = write(tmp_path / "cfgfix.toml", 'select = ["CFX1"]\nignore = [CFX2]\n')
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path)
    assert str(err.value).startswith(f"{cfg}: invalid TOML: ")
    assert "line 2" in str(err.value)  # the parser's own position


def test_malformed_selector_in_file(tmp_path):
    cfg = write(tmp_path / "cfgfix.toml", 'ignore = ["CFX1O3"]\n')
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path)
    assert str(cfg) in str(err.value) and "unknown rule selector 'CFX1O3'" in str(err.value)


def test_malformed_selector_on_command_line():
    with pytest.raises(SettingsError, match="--select: unknown rule selector 'cfx1'"):
        with_overrides(settings(), select=["cfx1"])


def test_selector_matching_no_code_names_origin(tmp_path):
    cfg = write(tmp_path / "cfgfix.toml", 'extend-select = ["CFX7"]\n')
    s = load_settings(tmp_path)
    with pytest.raises(SettingsError) as err:
        enabled_codes(s, CODES, DEFAULTS)
    assert str(err.value).startswith(f"{cfg}: 'extend-select': unknown rule selector 'CFX7' ")
    # The same file with a bad flag: the flag is blamed, not the file.
    write(tmp_path / "cfgfix.toml", 'extend-select = ["CFX2"]\n')
    s = with_overrides(load_settings(tmp_path), ignore=["CFX999"])
    with pytest.raises(SettingsError, match="--ignore: unknown rule selector 'CFX999'"):
        enabled_codes(s, CODES, DEFAULTS)


def test_unknown_selector_says_did_you_mean(tmp_path):
    s = with_overrides(load_settings(tmp_path), select=["CFX1033"])
    with pytest.raises(SettingsError, match="--select: unknown rule selector 'CFX1033'; did you mean 'CFX103'"):
        enabled_codes(s, CODES, DEFAULTS)
    with pytest.raises(SettingsError, match="--ignore: unknown rule selector 'cfx103'; did you mean 'CFX103'"):
        with_overrides(load_settings(tmp_path), ignore=["cfx103"])


# ------------------------------------------------------------------------ selection


def test_defaults_when_nothing_selected():
    assert enabled_codes(settings(), CODES, DEFAULTS) == DEFAULTS


def test_select_replaces_defaults():
    assert enabled_codes(settings(select=("CFX2",)), CODES, DEFAULTS) == {"CFX201", "CFX202"}


def test_empty_select_enables_nothing():
    assert enabled_codes(settings(select=()), CODES, DEFAULTS) == set()


def test_all_selects_everything():
    assert enabled_codes(settings(select=("ALL",)), CODES, DEFAULTS) == set(CODES)


def test_extend_select_adds_to_defaults():
    got = enabled_codes(settings(extend_select=("CFX201",)), CODES, DEFAULTS)
    assert got == DEFAULTS | {"CFX201"}


def test_specific_ignore_beats_broad_select():
    got = enabled_codes(settings(select=("CFX1",), ignore=("CFX103",)), CODES, DEFAULTS)
    assert got == {"CFX101", "CFX102", "CFX104", "CFX105"}


def test_specific_extend_select_beats_broad_ignore():
    got = enabled_codes(settings(ignore=("CFX1",), extend_select=("CFX103",)), CODES, DEFAULTS)
    assert got == {"CFX103", "CFX901"}


def test_specific_select_beats_ignore_all():
    got = enabled_codes(settings(select=("CFX10",), ignore=("ALL",)), CODES, DEFAULTS)
    assert got == {"CFX101", "CFX102", "CFX103", "CFX104", "CFX105"}


def test_equal_specificity_ignore_wins():
    got = enabled_codes(settings(select=("CFX103",), ignore=("CFX103",)), CODES, DEFAULTS)
    assert got == set()


def test_ignore_prefix_over_defaults():
    assert enabled_codes(settings(ignore=("CFX10",)), CODES, DEFAULTS) == {"CFX901"}


def test_selector_matches():
    assert selector_matches("ALL", "CFX101")
    assert selector_matches("CFX1", "CFX101") and not selector_matches("CFX2", "CFX101")


# ------------------------------------------------------------------------ overrides


def test_cli_select_replaces_file_select_and_ignore_adds(tmp_path):
    write(tmp_path / "cfgfix.toml", 'select = ["CFX2"]\nignore = ["CFX202"]\nextend-select = ["CFX901"]\n')
    s = with_overrides(load_settings(tmp_path), select=["CFX1"], ignore=["CFX105"], extend_select=["CFX201"])
    assert s.select == ("CFX1",)
    assert s.ignore == ("CFX202", "CFX105")
    assert s.extend_select == ("CFX901", "CFX201")
    assert enabled_codes(s, CODES, DEFAULTS) == {"CFX101", "CFX102", "CFX103", "CFX104", "CFX201", "CFX901"}


def test_overrides_none_change_nothing(tmp_path):
    write(tmp_path / "cfgfix.toml", 'select = ["CFX2"]\n')
    s = load_settings(tmp_path)
    assert with_overrides(s) == s


# -------------------------------------------------------------------- per-file-ignores


def test_per_file_ignores_globs():
    s = settings(
        per_file_ignores=(
            ("tests/*", ("CFX103",)),
            ("__init__.py", ("CFX1",)),
            ("scripts/**/*.sh", ("CFX2",)),
            ("**/{examples,docs}/*.py", ("ALL",)),
        )
    )
    assert ignored_codes_for(s, "tests/test_a.py") == {"CFX103"}
    # gitignore-style: "tests/*" matches tests/sub, so everything below it too...
    assert ignored_codes_for(s, "tests/sub/test_a.py") == {"CFX103"}
    # ...but a glob with a slash is anchored at the root.
    assert ignored_codes_for(s, "pkg/tests/test_a.py") == set()
    assert ignored_codes_for(s, "pkg/sub/__init__.py") == {"CFX1"}  # a bare name matches at any depth
    assert ignored_codes_for(s, "scripts/a/b/run.sh") == {"CFX2"}
    assert ignored_codes_for(s, "x/docs/a.py") == {"ALL"}
    assert ignored_codes_for(s, "train.py") == set()
    assert ignored_codes_for(s, "tests/__init__.py") == {"CFX103", "CFX1"}


def test_per_file_ignores_expanded_with_codes():
    s = settings(per_file_ignores=(("tests/*", ("CFX10",)), ("gen/*", ("ALL",))))
    assert ignored_codes_for(s, "tests/t.py", CODES) == {"CFX101", "CFX102", "CFX103", "CFX104", "CFX105"}
    assert ignored_codes_for(s, "gen/x.py", CODES) == set(CODES)


# ------------------------------------------------------------------------ fingerprint


def test_fingerprint_stable_ignores_root_and_tracks_settings(tmp_path):
    a = Settings(root=Path("/a"), config_path=None, select=("CFX1",))
    b = Settings(root=Path("/b"), config_path=Path("/b/cfgfix.toml"), select=("CFX1",))
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != Settings(root=Path("/a"), config_path=None, select=("CFX2",)).fingerprint()
    assert a.fingerprint() != Settings(root=Path("/a"), config_path=None, select=None).fingerprint()
    c = Settings(root=Path("/a"), config_path=None, select=("CFX1",), per_file_ignores=(("t/*", ("CFX1",)),))
    assert a.fingerprint() != c.fingerprint()
    assert a.fingerprint() == Settings(root=Path("/a"), config_path=None, select=("CFX1",)).fingerprint()


def test_default_exclude_has_ruffs_names():
    for name in (".git", ".venv", "venv", "site-packages", "node_modules", ".cfgfix_cache", "dist"):
        assert name in DEFAULT_EXCLUDE
