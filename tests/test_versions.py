from pathlib import Path

import pytest

from cfgfix.analysis import versions as versions_module
from cfgfix.analysis.versions import VersionInfo, Versions, normalize


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture(autouse=True)
def nothing_installed(monkeypatch):
    """Tests must not depend on what this machine has installed."""

    monkeypatch.setattr(versions_module, "_metadata_version", lambda name: None)


# ----------------------------------------------------------------------- range logic


@pytest.mark.parametrize(
    "spec, threshold, below",
    [
        (">=4.40,<5", "5", True),
        (">=5.1", "5", False),
        (">=4.40", "5", None),
        ("==4.46.3", "4.56", True),
        ("~=4.46", "5", True),
        ("~=4.46", "4.50", None),
        ("~=4.46.1", "4.47", True),
        ("==4.*", "5", True),
        ("==4.*", "4", False),
        ("==4.46.*", "4.46", False),
        ("==4.46.*", "4.47", True),
        ("<=4.57.1", "5", True),
        ("<=5", "5", None),
        ("<5", "5", True),
        (">5", "5", False),
        (">=5", "5", False),
        ("==5.0", "5", False),
        ("!=4.50", "5", None),
        (">=4.40,<5,!=4.45", "5", True),
        ("==2.3.0+cu121", "2.4", True),
        ("==2.3.0+cu121", "2.3", False),
        (">=2.4.0rc1", "2.4", None),  # the release candidate is admitted and is below 2.4
        ("<2.4.0rc1", "2.4", True),
        (">=2.4.0.dev20240101", "2.3", False),
        ("==2.5.0.post1", "2.5", False),
        ("", "5", None),
        (">5,<4", "5", None),  # contradictory pins say nothing
        ("not a spec", "5", None),
    ],
)
def test_below_reasons_on_ranges(spec, threshold, below):
    info = VersionInfo("transformers", spec, "requirements.txt")
    assert info.below(threshold) is below
    assert info.at_least(threshold) is (None if below is None else not below)


def test_plain_specifiers_answer_as_packaging_does():
    """The fast path for plain releases (no `packaging` import, issue 15) gives the answers
    `packaging` gives, bounds compared alike, on every combination of clauses."""
    import itertools

    from packaging.version import Version

    clauses = [f"{op}{v}" for op in (">=", ">", "<=", "<", "==", "!=") for v in ("4", "4.40", "4.40.0", "5", "5.0.1")]
    specs = [",".join(c) for n in (1, 2) for c in itertools.product(clauses, repeat=n)] + [" >= 4.40 , < 5 "]
    for spec in specs:
        plain = versions_module._plain_bounds(spec)
        assert plain is not False, spec
        assert versions_module._admits(spec) is (versions_module._bounds(spec) is not None), spec
        assert versions_module._same_bounds(spec, ">=4.40") is (versions_module._bounds(spec) == versions_module._bounds(">=4.40"))
        for threshold in ("4", "4.40", "4.40.0", "5", "5.0.1", "6"):
            slow = versions_module._below(versions_module._bounds(spec), Version(threshold))
            assert VersionInfo("transformers", spec).below(threshold) is slow, (spec, threshold)
    for spec in ("~=4.46", "==4.*", ">=2.4.0rc1", "==2.3.0+cu121", "not a spec", ">=4,"):
        assert versions_module._plain_bounds(spec) is False, spec


def test_plain_specifier_questions_do_not_import_packaging():
    import subprocess
    import sys

    code = (
        "import sys; from cfgfix.analysis.versions import VersionInfo, Versions\n"
        "assert VersionInfo('transformers', '>=5.23.0').at_least('5') is True\n"
        "assert VersionInfo('transformers', '>=4.40,<5').known\n"
        "assert not [m for m in sys.modules if m.startswith('packaging')], sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_info():
    info = VersionInfo("torch")
    assert info.specifier == "" and info.source == "" and not info.known
    assert info.below("2") is None and info.at_least("2") is None


def test_normalize():
    assert normalize("Flash_Attn") == normalize("flash.attn") == "flash-attn"


# ---------------------------------------------------------------------- requirements


def test_requirements_txt_with_includes_comments_and_options(tmp_path):
    write(
        tmp_path,
        "requirements.txt",
        "# training deps\n"
        "--extra-index-url https://download.pytorch.org/whl/cu121\n"
        "-r requirements/base.txt\n"
        "-e git+https://github.com/x/y.git#egg=y\n"
        "accelerate>=0.30 \\\n    ,<1.0  # keep below 1.0\n"
        "transformers==9.0  # base.txt was read first\n",
    )
    write(tmp_path, "requirements/base.txt", "torch==2.3.0+cu121\ntransformers>=4.40,<5\n-r ../requirements.txt\n")
    v = Versions.from_project(tmp_path)
    assert v.get("torch") == VersionInfo("torch", "==2.3.0+cu121", "requirements/base.txt")
    assert v.get("torch").below("2.4") is True
    assert v.get("transformers").specifier == ">=4.40,<5"
    assert v.get("accelerate") == VersionInfo("accelerate", ">=0.30,<1.0", "requirements.txt")


def test_requirements_order_and_extra_files(tmp_path):
    write(tmp_path, "requirements-dev.txt", "peft==0.10\n")
    write(tmp_path, "requirements.txt", "peft==0.11\n")
    write(tmp_path, "requirements/gpu.txt", "bitsandbytes>=0.43.2 --hash=sha256:abc\n")
    v = Versions.from_project(tmp_path)
    assert v.get("peft").specifier == "==0.11"
    assert v.get("bitsandbytes") == VersionInfo("bitsandbytes", ">=0.43.2", "requirements/gpu.txt")


def test_wheel_urls_and_bare_names(tmp_path):
    write(
        tmp_path,
        "requirements.txt",
        "https://download.pytorch.org/whl/cu118/torch-2.1.0%2Bcu118-cp310-cp310-linux_x86_64.whl\n"
        "diffusers\n"
        "deepspeed @ git+https://github.com/microsoft/DeepSpeed.git\n",
    )
    write(tmp_path, "pyproject.toml", '[project]\ndependencies = ["diffusers>=0.27"]\n')
    v = Versions.from_project(tmp_path)
    assert v.get("torch").specifier == "==2.1.0+cu118"
    # A bare name pins nothing, so a later source answers.
    assert v.get("diffusers") == VersionInfo("diffusers", ">=0.27", "pyproject.toml")
    assert v.get("deepspeed") == VersionInfo("deepspeed")


def test_markers_for_other_machines_lose_to_matching_ones(tmp_path):
    write(
        tmp_path,
        "requirements.txt",
        'torch==1.0; python_version < "3"\n'
        'torch==2.2; python_version >= "3"\n'
        'peft==0.9; python_version < "3"\n',
    )
    v = Versions.from_project(tmp_path)
    assert v.get("torch").specifier == "==2.2"
    assert v.get("peft").specifier == "==0.9"  # still better than nothing


# ------------------------------------------------------------------- other sources


def test_pyproject_dependencies_and_extras(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        '[project]\nname = "x"\ndependencies = ["Transformers[torch]>=4.40,<5"]\n'
        '[project.optional-dependencies]\ntrain = ["deepspeed==0.14.2; sys_platform != \'win32\'"]\n',
    )
    v = Versions.from_project(tmp_path)
    assert v.get("transformers") == VersionInfo("transformers", ">=4.40,<5", "pyproject.toml")
    assert v.get("deepspeed").specifier == "==0.14.2"


@pytest.mark.parametrize(
    "constraint, spec",
    [
        ('"^2.1"', ">=2.1,<3"),
        ('"^0.2.3"', ">=0.2.3,<0.3"),
        ('"^0.0.3"', ">=0.0.3,<0.0.4"),
        ('"~4.40.1"', ">=4.40.1,<4.41"),
        ('"~4"', ">=4,<5"),
        ('"4.46.*"', "==4.46.*"),
        ('"2.3.0"', "==2.3.0"),
        ('">=4.40 <5"', ">=4.40,<5"),
        ('{ version = "^4.40", extras = ["torch"] }', ">=4.40,<5"),
        ('"*"', ""),
        ('">=1 || <0.5"', ""),
    ],
)
def test_poetry_constraints(tmp_path, constraint, spec):
    write(tmp_path, "pyproject.toml", f'[tool.poetry.dependencies]\npython = "^3.10"\ntransformers = {constraint}\n')
    info = Versions.from_project(tmp_path).get("transformers")
    assert info.specifier == spec
    assert info.source == ("pyproject.toml" if spec else "")


def test_poetry_groups(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.poetry.group.train.dependencies]\naccelerate = "^0.30"\n')
    assert Versions.from_project(tmp_path).get("accelerate").below("1.0") is True


def test_setup_cfg(tmp_path):
    write(
        tmp_path,
        "setup.cfg",
        "[options]\ninstall_requires =\n    torch>=2.1\n    peft~=0.10.0\n"
        "[options.extras_require]\nquant =\n    bitsandbytes<0.43\n",
    )
    v = Versions.from_project(tmp_path)
    assert v.get("torch") == VersionInfo("torch", ">=2.1", "setup.cfg")
    assert v.get("peft").below("0.11") is True
    assert v.get("bitsandbytes").below("0.43.2") is True


@pytest.mark.parametrize("name", ["environment.yml", "environment.yaml"])
def test_environment_yml(tmp_path, name):
    write(
        tmp_path,
        name,
        "name: train\nchannels: [pytorch, nvidia]\ndependencies:\n"
        "  - python=3.10\n"
        "  - pytorch::pytorch=2.1.0=py3.10_cuda11.8_cudnn8.7.0_0\n"
        "  - conda-forge::accelerate>=0.25,<0.30\n"
        "  - pip\n"
        "  - pip:\n"
        "    - transformers==4.36.2\n"
        "    - -r requirements-extra.txt\n",
    )
    write(tmp_path, "requirements-extra.txt", "peft>=0.7\n")
    # requirements-extra.txt is also a requirements*.txt file, read first.
    v = Versions.from_project(tmp_path)
    assert v.get("torch") == VersionInfo("torch", "==2.1.0.*", name)
    assert v.get("torch").below("2.2") is True and v.get("torch").at_least("2.1") is True
    assert v.get("accelerate").specifier == ">=0.25,<0.30"
    assert v.get("transformers") == VersionInfo("transformers", "==4.36.2", name)
    assert v.get("peft").source == "requirements-extra.txt"


def test_source_order(tmp_path):
    write(tmp_path, "requirements.txt", "torch==2.1\n")
    write(tmp_path, "pyproject.toml", '[project]\ndependencies = ["torch==2.2", "peft==0.8"]\n')
    write(tmp_path, "setup.cfg", "[options]\ninstall_requires =\n    peft==0.9\n    diffusers==0.20\n")
    write(tmp_path, "environment.yml", "dependencies:\n  - diffusers=0.21\n  - deepspeed=0.12\n")
    v = Versions.from_project(tmp_path)
    assert [(v.get(p).specifier, v.get(p).source) for p in ("torch", "peft", "diffusers", "deepspeed")] == [
        ("==2.1", "requirements.txt"),
        ("==0.8", "pyproject.toml"),
        ("==0.20", "setup.cfg"),
        ("==0.12.*", "environment.yml"),
    ]


def test_broken_files_are_skipped(tmp_path):
    write(tmp_path, "pyproject.toml", "[project\n")
    write(tmp_path, "environment.yml", "dependencies: [\n")
    write(tmp_path, "setup.cfg", "not an ini file\n")
    write(tmp_path, "requirements.txt", "torch==2.1\n")
    assert Versions.from_project(tmp_path).get("torch").specifier == "==2.1"


# ------------------------------------------------------------------ installed fallback


def test_installed_fallback_uses_metadata_only(tmp_path, monkeypatch):
    asked = []

    def version(name):
        asked.append(name)
        return "4.57.1" if name == "transformers" else None

    monkeypatch.setattr(versions_module, "_metadata_version", version)
    write(tmp_path, "requirements.txt", "torch>=2.1\n")
    v = Versions.from_project(tmp_path)
    assert v.get("transformers") == VersionInfo("transformers", "==4.57.1", "installed")
    assert v.get("transformers").below("5") is True
    assert v.get("peft") == VersionInfo("peft")
    assert v.get("torch").source == "requirements.txt"
    assert "torch" not in asked  # pinned: metadata never consulted


def test_fingerprint_tracks_pins_and_installs(tmp_path, monkeypatch):
    write(tmp_path, "requirements.txt", "torch==2.1\n")
    a = Versions.from_project(tmp_path).fingerprint()
    assert a == Versions.from_project(tmp_path).fingerprint()
    write(tmp_path, "requirements.txt", "torch==2.2\n")
    b = Versions.from_project(tmp_path).fingerprint()
    assert a != b
    monkeypatch.setattr(versions_module, "_metadata_version", lambda name: "1.0")
    assert Versions.from_project(tmp_path).fingerprint() != b


def test_metadata_version_reads_dist_info_folders(tmp_path, monkeypatch):
    """The fast scan agrees with importlib.metadata on real folders."""
    import sys

    (tmp_path / "Flash_Attn-2.6.3.dist-info").mkdir()
    (tmp_path / "bitsandbytes-0.45.5.dist-info").mkdir()
    legacy = tmp_path / "deepspeed.egg-info"
    legacy.mkdir()
    (legacy / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.16.9\n\nbody\n")
    monkeypatch.undo()  # drop the autouse stub: this test checks the real scan
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    versions_module._listing.cache_clear()
    assert versions_module._metadata_version("flash-attn") == "2.6.3"
    assert versions_module._metadata_version("bitsandbytes") == "0.45.5"
    assert versions_module._metadata_version("deepspeed") == "0.16.9"
    assert versions_module._metadata_version("torch") is None
    versions_module._listing.cache_clear()


def test_a_nested_project_inherits_the_pins_it_does_not_state(tmp_path):
    """issue 25: `sub/requirements.txt` without a torch line under a root that pins
    `torch>=2.0.0` is on the root's torch range, not on an assumed current release; a
    library the nested file states keeps its own answer."""
    from cfgfix.analysis.versions import ProjectVersions

    (tmp_path / "requirements.txt").write_text("torch>=2.0.0\ntransformers==4.46.3\n")
    sub = tmp_path / "examples" / "sft"
    sub.mkdir(parents=True)
    (sub / "requirements.txt").write_text("transformers==5.2.0\ndatasets\n")
    (tmp_path / "examples" / "other").mkdir()
    versions = ProjectVersions(tmp_path)
    nested = versions.for_file(sub / "train.py")
    assert nested.resolve("torch").specifier == ">=2.0.0" and nested.resolve("torch").evidence == "pin"
    assert nested.resolve("transformers").specifier == "==5.2.0"
    assert versions.for_file(tmp_path / "examples" / "other" / "x.py").resolve("transformers").specifier == "==4.46.3"
