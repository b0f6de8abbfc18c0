"""Version evidence beyond requirements files: setup.py install_requires, Dockerfile and
README `pip install` lines (and notebooks', tested in test_notebook.py)."""

from cfgfix.analysis.versions import ProjectVersions, Versions
from conftest import write_project


def test_setup_py_install_requires(tmp_path):
    write_project(tmp_path, {"setup.py": (
        "from setuptools import setup\nDEPS = ['transformers>=4.40,<5', 'peft']\n"
        "setup(name='x', install_requires=DEPS, extras_require={'ds': ['deepspeed==0.14.4']})\n")})
    versions = Versions.from_project(tmp_path)
    assert versions.get("transformers").specifier == ">=4.40,<5"
    assert versions.get("transformers").source == "setup.py"
    assert versions.get("deepspeed").specifier == "==0.14.4"
    assert ProjectVersions(tmp_path).for_file(tmp_path / "sub" / "train.py").get("transformers").source == "setup.py"


def test_dockerfile_and_readme_install_lines(tmp_path):
    write_project(tmp_path, {
        "Dockerfile": "FROM python:3.11\nRUN pip install --no-cache-dir torch==2.3.1 \\\n    transformers==4.44.2 && pip install -e .\n",
        "README.md": "Install:\n\n```bash\npip install bitsandbytes==0.43.1 transformers==4.30.0\n```\n\n"
                     "Prose that says pip install deepspeed==0.9.0 is not a code block.\n",
    })
    versions = Versions.from_project(tmp_path)
    assert versions.get("torch").specifier == "==2.3.1" and versions.get("torch").source == "Dockerfile (pip install)"
    assert versions.get("transformers").source == "Dockerfile (pip install)"  # the image beats the README
    assert versions.get("bitsandbytes").source == "README.md (pip install)"
    assert versions.get("deepspeed").source != "README.md (pip install)"  # near miss: prose, not a command


def test_requirements_beat_install_lines(tmp_path):
    write_project(tmp_path, {"requirements.txt": "torch==2.4.0\n", "Dockerfile": "RUN pip install torch==2.1.0\n"})
    assert Versions.from_project(tmp_path).get("torch").specifier == "==2.4.0"


def test_unreadable_setup_py_is_no_evidence(tmp_path):
    write_project(tmp_path, {"setup.py": "setup(install_requires=[\n", "requirements.txt": ""})
    assert Versions.from_project(tmp_path).get("torch").source in ("installed", "")
