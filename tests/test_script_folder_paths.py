"""A launch script that names its files from its own folder (`ROOT="$(cd "$(dirname "$0")/.."
&& pwd)"`, `$(dirname "$0")/ds.json`): the paths resolve from the script's folder, so the
tool's config is read (project._expand / _script_folder)."""

import pytest

from cfgfix.project import _script_folder
from conftest import setting_value, training_setups_of, write_project

LF = ("model_name_or_path: Qwen/Qwen3-0.6B\nstage: sft\nfinetuning_type: lora\nlora_rank: 32\ntemplate: qwen3\n"
      "per_device_train_batch_size: 2\ngradient_accumulation_steps: 8\ncutoff_len: 2048\nbf16: true\n")


@pytest.mark.parametrize("assign, path", [
    ('ROOT="$(cd "$(dirname "$0")/.." && pwd)"', "${ROOT}/configs/lora.yaml"),
    ("ROOT=$(cd $(dirname ${BASH_SOURCE[0]})/..; pwd -P)", "$ROOT/configs/lora.yaml"),
    ('HERE="$(dirname "$0")"', "$HERE/../configs/lora.yaml"),
])
def test_a_config_named_from_the_scripts_folder_is_read(tmp_path, assign, path):
    write_project(tmp_path, {"scripts/train.sh": f"{assign}\nllamafactory-cli train \"{path}\"\n",
                             "configs/lora.yaml": LF})
    setup = training_setups_of(tmp_path)[0]
    assert setting_value(setup, "lora_rank") == 32 and setting_value(setup, "micro_batch") == 2


@pytest.mark.parametrize("text", ["$(pwd)/x.yaml", "$(dirname $1)/x.yaml", "$(cd /opt && pwd)/x.yaml",
                                  "$(git rev-parse --show-toplevel)/x.yaml"])
def test_other_command_substitutions_stay_unknown(text):
    assert _script_folder(text) == text
