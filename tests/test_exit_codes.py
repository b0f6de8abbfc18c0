"""Exit codes and settings that never lie (issue 14): a typo'd path, an unknown GPU, a plan
that cannot be made and a folder with nothing to read are each said, with a non-green exit
where the user's request failed; every bad setting names its key and file."""

import pytest
from click.testing import CliRunner

from cfgfix.commands import cli
from cfgfix.settings import SettingsError, load_settings
from conftest import write_project

TRAIN = (
    "import torch\n"
    "from transformers import AutoModelForSeq2SeqLM\n"
    "model = AutoModelForSeq2SeqLM.from_pretrained('google/flan-t5-xl', torch_dtype=torch.bfloat16, device_map='auto')\n"
    "model.to(device)\n"
)


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [("check",), ("fix",), ("check", "--fix"), ("fix", "--diff")])
def test_a_path_that_does_not_exist_is_an_error(in_tmp, command):
    write_project(in_tmp, {"train.py": TRAIN})
    code, out = run(*command, "--no-cache", "nope/")
    assert code == 2, out
    assert "nope: no such file or folder" in out
    assert "All checks passed" not in out


def test_a_missing_path_beside_a_real_one_is_still_an_error(in_tmp):
    write_project(in_tmp, {"train.py": TRAIN})
    code, out = run("check", "--no-cache", "train.py", "trian.py")
    assert code == 2 and "trian.py: no such file or folder" in out


def test_a_folder_with_nothing_cfgfix_reads_says_so(in_tmp):
    write_project(in_tmp, {"docs/notes.txt": "hello\n", "data/x.csv": "1,2\n"})
    for command in (("check",), ("fix",)):
        code, out = run(*command, "--no-cache", ".")
        assert code == 0, out
        assert "No files checked." in out and "All checks passed" not in out
    code, out = run("check", "--no-cache", "--output-format", "json", ".")
    assert code == 0 and "[]" in out  # machine formats keep their (empty) document


@pytest.mark.parametrize("where", ["cfgfix.toml", "pyproject.toml"])
def test_an_unknown_gpu_in_the_settings_names_the_key_the_file_and_the_catalog(in_tmp, where):
    text = 'gpu = "Mystery 9000"\n' if where == "cfgfix.toml" else '[tool.cfgfix]\ngpu = "Mystery 9000"\n'
    write_project(in_tmp, {"train.py": TRAIN, where: text})
    for command in (("check",), ("fix",), ("explain",), ("estimate",), ("fix", "--fit")):
        code, out = run(*command)
        assert code == 2, (command, out)
        assert f"{in_tmp / where}: 'gpu': unknown GPU 'Mystery 9000'" in out
        assert "--list-gpus" in out and "RTX 4090" not in out  # no close name: no catalog dump


def test_common_cards_are_in_the_catalog(in_tmp):
    from cfgfix.memory.gpus import find_gpu

    for name, gib in (("RTX 4070", 12), ("GeForce RTX 4070 Ti", 12), ("4060 Ti 16GB", 16), ("RTX 3060", 12),
                      ("P100", 16), ("A40", 48), ("RTX 5080", 16), ("RTX 2080 Ti", 11)):
        gpu = find_gpu(name)
        assert gpu is not None and gpu.memory_bytes == gib * 1024**3 and gpu.source, name
    write_project(in_tmp, {"train.py": TRAIN, "cfgfix.toml": 'gpu = "RTX 4070"\n'})
    assert load_settings(in_tmp).gpu == "RTX 4070"


@pytest.mark.parametrize("command", [("explain",), ("estimate",), ("fix", "--fit"), ("estimate", "--params", "1e9")])
def test_an_unknown_gpu_flag_is_blamed_on_the_flag(in_tmp, command):
    write_project(in_tmp, {"train.py": TRAIN})
    code, out = run(*command, "--gpu", "bogus")
    assert code == 2, out
    assert "--gpu: unknown GPU 'bogus'" in out and "--list-gpus" in out
    code, out = run(*command, "--gpu", "RTX 4090 Ti")
    assert code == 2, out
    assert "--gpu: unknown GPU 'RTX 4090 Ti'; did you mean one of 'RTX 4090', " in out
    assert "H200" not in out  # the close names, not the whole catalog
    code, out = run(*command, "--gpu", "")
    assert code == 2 and "--gpu must be a GPU name" in out, out


def test_explain_says_a_gpu_flag_comes_from_the_flag(in_tmp):
    import json

    write_project(in_tmp, {
        "train.py": ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
                     "Trainer(model=model, args=TrainingArguments('o')).train()\n"),
        "run.sh": "python train.py\n",
        "cfgfix.toml": 'gpu = "RTX 4090"\n',
    })
    code, out = run("explain", "--output-format", "json")
    assert code == 0
    gpu = json.loads(out)[0]["settings"]["gpu"]
    assert gpu["value"] == "RTX 4090" and "settings" in gpu["origin"]
    code, out = run("explain", "--output-format", "json", "--gpu", "A100 80GB")
    gpu = json.loads(out)[0]["settings"]["gpu"]
    assert gpu["value"] == "A100 80GB" and gpu["origin"] == "--gpu"


def test_fit_with_a_model_of_unknown_size_exits_non_zero(in_tmp):
    write_project(in_tmp, {
        "train.py": ("from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
                     "model = AutoModelForCausalLM.from_pretrained('someone/private-model')\n"
                     "Trainer(model=model, args=TrainingArguments('o')).train()\n"),
        "run.sh": "python train.py\n",
        "cfgfix.toml": 'gpu = "RTX 4070"\n',
    })
    code, out = run("fix", "--fit")
    assert code == 2, out
    assert "the model's size is unknown" in out and "no launch could be estimated" in out


def test_fit_without_a_launch_is_an_error(in_tmp):
    write_project(in_tmp, {"train.py": TRAIN, "cfgfix.toml": 'gpu = "RTX 4070"\n'})
    code, out = run("fix", "--fit")
    assert code == 2 and "no training launch found" in out


@pytest.mark.parametrize("text, key", [
    ('exclude = ["!"]\n', "'exclude': invalid pattern '!'"),
    ('extend-exclude = ["\\\\"]\n', "'extend-exclude': invalid pattern"),
    ('[per-file-ignores]\n"!" = ["CFX1"]\n', "'per-file-ignores' entry '!': invalid pattern"),
    ('[per-file-ignores]\n"' + "{a,b}" * 20 + '" = ["CFX1"]\n', "the braces expand to more than"),
    ("gpus = 0\n", "'gpus' must be an integer from 1 to"),
    ("gpus = 1" + "0" * 40 + "\n", "'gpus' must be an integer from 1 to"),
    ("gpus = " + "9" * 5000 + "\n", "cannot read: ValueError"),
    ("x = " + "[" * 2000 + "]" * 2000 + "\n", "cannot read"),
    ('select = "' + "A" * 10000 + '"\n', "'select' must be a list of strings, got 'AAAA"),
])
def test_bad_settings_are_one_clear_error_naming_key_and_file(in_tmp, text, key):
    path = in_tmp / "cfgfix.toml"
    path.write_text(text)
    with pytest.raises(SettingsError) as info:
        load_settings(in_tmp)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and key in message, message
    assert len(message) < 1000  # a huge value is cut short, not echoed whole
    write_project(in_tmp, {"train.py": TRAIN})
    code, out = run("check", "--no-cache")
    assert code == 2 and key in out


def test_braces_within_the_bound_still_expand(in_tmp):
    write_project(in_tmp, {"tests/train.py": TRAIN, "docs/train.py": TRAIN, "src/train.py": TRAIN,
                           "cfgfix.toml": '[per-file-ignores]\n"**/{tests,docs}/*" = ["ALL"]\n'})
    code, out = run("check", "--no-cache")
    assert "src/train.py" in out and "tests/train.py" not in out and "docs/train.py" not in out
