"""Every name DeepSpeed reads a ZeRO option under is read alike: the `stage3_*` alias, the
pydantic field name (DeepSpeed's config models populate by name too) and the deprecated
names, through one table (analysis/deepspeed_keys.ZERO_ALIASES / ZERO_DEPRECATED) used by
the CFX5xx rules, CFX403, the resolved training setup (CFX6xx, fit) and fit's rewrites.
The FlagAlpha ZeRO-3 config of bench/heldout3 sets `gather_16bit_weights_on_model_save`."""

import json
import os

from cfgfix.analysis import deepspeed_keys as keys
from cfgfix.analysis import deepspeed_nested_keys as nested
from cfgfix.analysis.deepspeed_config import offload_device, zero_entry, zero_names
from cfgfix.documents.config import parse_config
from cfgfix.documents.text import SourceText
from conftest import lint_project, write_project

TRAINER = ("from transformers import Trainer\n\ntrainer = Trainer(model=model, args=args)\ntrainer.train()\n"
           "trainer.save_model(args.output_dir)\n")
LAUNCH = "deepspeed --num_gpus 2 train.py --deepspeed ds.json\n"


def _zero(text):
    return parse_config(SourceText("ds.json", text), "json").root.get("zero_optimization")


def _codes(root, files, select):
    write_project(root, files)
    _, _, result = lint_project(root, select=select)
    return sorted((f.code, f.span.path, f.span.line) for f in result.findings)


def test_every_name_of_an_aliased_option_is_a_known_zero_key():
    for field, alias in keys.ZERO_ALIASES.items():
        assert {field, alias} <= nested.ZERO
        assert keys.zero_option(alias) == field and keys.zero_option(field) == field
        assert keys.zero_spellings(field) == keys.zero_spellings(alias) == (alias, field)
    assert set(keys.ZERO_DEPRECATED) <= nested.ZERO
    assert keys.DEPRECATED_ZERO_KEYS == {
        "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save"}


def test_zero_entry_finds_the_option_under_whichever_name_is_written():
    for name in zero_names("stage3_gather_16bit_weights_on_model_save"):
        zero = _zero('{"zero_optimization": {"stage": 3, "%s": true}}' % name)
        found = zero_entry(zero, "gather_16bit_weights_on_model_save")
        assert found is not None and found[0].value == name and found[1].value is True
    zero = _zero('{"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}}')
    assert zero_entry(zero, "stage3_gather_16bit_weights_on_model_save", deprecated=False) is None
    # a key that only looks like a name of the option is not one
    zero = _zero('{"zero_optimization": {"stage": 3, "gather_16bit_weights": true}}')
    assert zero_entry(zero, "stage3_gather_16bit_weights_on_model_save") is None


def test_offload_device_reads_the_block_and_the_deprecated_boolean():
    assert offload_device(_zero('{"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}'),
                          "offload_optimizer")[0] == "nvme"
    assert offload_device(_zero('{"zero_optimization": {"cpu_offload": true}}'), "offload_optimizer")[0] == "cpu"
    assert offload_device(_zero('{"zero_optimization": {"cpu_offload_param": false}}'), "offload_param")[0] == "none"
    # cpu_offload is the optimizer's, not the parameters'
    assert offload_device(_zero('{"zero_optimization": {"cpu_offload": true}}'), "offload_param") == (None, None)
    assert offload_device(_zero('{"zero_optimization": {"offload_param": {"device": "auto"}}}'),
                          "offload_param")[0] == "auto"


def test_cfx506_reads_the_field_name_like_the_alias(tmp_path):
    """The heldout3 FlagAlpha shape: ZeRO-3, the field name set true, the HF Trainer saving."""
    ds = ('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {\n    "stage": 3,\n'
          '    "stage3_max_live_parameters": 1e9,\n    "module_granularity_threshold": 0,\n'
          '    "gather_16bit_weights_on_model_save": %s\n  }\n}\n')
    files = {"train.sh": LAUNCH, "train.py": TRAINER}
    assert _codes(tmp_path / "on", {**files, "ds.json": ds % "true"}, ["CFX5"]) == []
    # the same name set false is the mistake, reported where it is written
    assert _codes(tmp_path / "off", {**files, "ds.json": ds % "false"}, ["CFX5"]) == [("CFX506", "ds.json", 7)]


def test_a_deprecated_offload_boolean_is_read_as_the_offload_it_stands_for(tmp_path, monkeypatch):
    from cfgfix.training.resolve import training_setups
    from cfgfix.training.write_setup import SetupWriter

    write_project(tmp_path, {
        "run.sh": "deepspeed --num_gpus 2 train.py --deepspeed ds.json --per_device_train_batch_size 2\n",
        "train.py": "print('train')\n",
        "ds.json": '{\n  "train_micro_batch_size_per_gpu": 2,\n  "zero_optimization": {\n    "stage": 2,\n'
                   '    "cpu_offload": true\n  }\n}\n',
    })
    monkeypatch.chdir(tmp_path)
    engine, _, _ = lint_project(tmp_path)
    (setup,) = training_setups(engine.project)
    value = setup.values["offload_optimizer"]
    assert value.value is True and value.span.line == 5 and "cpu_offload" in value.origin
    assert "offload_param" not in setup.values or setup.values["offload_param"].span is None
    # fit turning optimizer offload off writes the block in the deprecated key's place:
    # both side by side would make DeepSpeed assert
    change = SetupWriter(engine.project, setup).set("offload_optimizer", False)
    assert change is not None
    (edit,) = change.edits
    text = (tmp_path / "ds.json").read_text()
    fixed = text[:edit.start] + edit.content + text[edit.end:]
    zero = json.loads(fixed)["zero_optimization"]
    assert zero == {"stage": 2, "offload_optimizer": {"device": "none", "pin_memory": True}}
    assert os.path.basename(edit.path) == "ds.json"
