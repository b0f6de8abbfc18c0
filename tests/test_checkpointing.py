"""CFX306 / CFX307 beyond the embedded examples: the two rules never report the same call,
one call reached from two wraps is reported once, and the kwargs-dict helpers."""

import ast

import pytest
from conftest import lint_project, write_project

from cfgfix.analysis.checkpointing import use_reentrant_of

PINS_V4 = {"requirements.txt": "transformers==4.45.2\npeft==0.13.2\ntorch==2.4.1\n"}
HEAD = (
    "from peft import LoraConfig, get_peft_model\n"
    "from transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m')\n"
)


def _codes(tmp_path, code, files=PINS_V4):
    write_project(tmp_path, {"train.py": code, **files})
    _, _, result = lint_project(tmp_path, select=["CFX306", "CFX307"])
    return sorted((f.code, f.span.line) for f in result.findings)


def test_a_dict_without_the_key_is_cfx306_only_when_it_breaks_peft(tmp_path):
    code = HEAD + (
        "model = get_peft_model(model, LoraConfig(r=8))\n"
        "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False})\n"
    )
    assert _codes(tmp_path, code) == [("CFX306", 5)]


def test_the_same_dict_without_peft_is_cfx307(tmp_path):
    code = HEAD + "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'preserve_rng_state': False})\n"
    assert _codes(tmp_path, code) == [("CFX307", 4)]


def test_two_wraps_reaching_one_call_report_it_once(tmp_path):
    code = HEAD + (
        "peft_model = get_peft_model(model, LoraConfig(r=8))\n"
        "peft_model = get_peft_model(model, LoraConfig(r=16))\n"
        "model.gradient_checkpointing_enable()\n"
    )
    assert _codes(tmp_path, code) == [("CFX306", 6)]


def test_trainer_args_inline_and_a_loop_that_only_unfreezes_the_head(tmp_path):
    code = (
        "from peft import LoraConfig, get_peft_model\n"
        "from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments\n"
        "model = AutoModelForSequenceClassification.from_pretrained('m')\n"
        "model = get_peft_model(model, LoraConfig(r=8, target_modules=['query', 'value']))\n"
        "for name, p in model.named_parameters():\n"
        "    if 'classifier' in name:\n"
        "        p.requires_grad = True\n"
        "Trainer(model=model, args=TrainingArguments('out', gradient_checkpointing=True)).train()\n"
    )
    assert _codes(tmp_path, code) == [("CFX306", 8)]


def test_a_loop_that_unfreezes_everything_is_silent(tmp_path):
    code = HEAD + (
        "model = get_peft_model(model, LoraConfig(r=8))\n"
        "for p in model.parameters():\n"
        "    p.requires_grad = True\n"
        "model.gradient_checkpointing_enable()\n"
    )
    assert _codes(tmp_path, code) == []


def test_a_config_from_elsewhere_counts_only_when_the_file_builds_adapter_configs(tmp_path):
    lora = HEAD + "cfg = LoraConfig(r=8)\ndef go(m, c):\n    pass\nmodel = get_peft_model(model, CONFIGS['x'])\nmodel.gradient_checkpointing_enable()\n"
    assert _codes(tmp_path, lora) == [("CFX306", 8)]
    prompt = lora.replace("LoraConfig", "PromptTuningConfig")
    assert _codes(tmp_path, prompt) == []


@pytest.mark.parametrize(
    "text, state",
    [
        ("None", "default"),
        ("{'use_reentrant': True}", "true"),
        ("{'use_reentrant': False, 'x': 1}", "false"),
        ("{'preserve_rng_state': False}", "missing"),
        ("{}", "missing"),
        ("dict(use_reentrant=False)", "false"),
        ("{**base}", "unknown"),
        ("{'use_reentrant': flag}", "unknown"),
        ("gc_kwargs", "unknown"),
    ],
)
def test_use_reentrant_of(text, state):
    assert use_reentrant_of(ast.parse(text, mode="eval").body) == state


@pytest.mark.parametrize(
    "signature, body, flagged",
    [
        ("fn, *args, use_reentrant=True, **kwargs", "", True),
        ("fn, use_reentrant, *args, **kwargs", "", True),
        ("fn, *args, **kwargs", "", False),  # a caller's use_reentrant= lands in kwargs
        ("fn, use_reentrant, /, *args, **kwargs", "", False),  # positional-only: the name is free
        ("fn, *args, use_reentrant=True, **kwargs", "    kwargs.update(extra)\n", False),
        ("fn, *args, use_reentrant=True, **kwargs", "    kwargs = dict(kwargs, **extra)\n", False),
        ("fn, *args, use_reentrant=True, **kwargs", "    kwargs.setdefault('use_reentrant', use_reentrant)\n", False),
    ],
)
def test_a_functions_own_kwargs_cannot_carry_its_named_use_reentrant(tmp_path, signature, body, flagged):
    code = (
        "import torch.utils.checkpoint\n"
        f"def ckpt({signature}):\n"
        + body
        + "    return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)\n"
    )
    line = code.count("\n")
    assert _codes(tmp_path, code, {}) == ([("CFX307", line)] if flagged else [])


def test_other_spread_dicts_still_silence_cfx307(tmp_path):
    code = (
        "import torch.utils.checkpoint\n"
        "def ckpt(fn, *args, use_reentrant=True, **kwargs):\n"
        "    return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs, **self_opts)\n"
    )
    assert _codes(tmp_path, code, {}) == []


@pytest.mark.parametrize("data, calls, inline", [
    (b"checkpoint(f, x)", True, False),
    (b"y = cp.checkpoint (f, x)", True, False),
    (b"checkpoint_sequential\n(fs, 2, x)", True, False),
    (b"xcheckpoint(f)", False, False),
    (b"_checkpoint(f)", False, False),
    (b"checkpoint_sequentialx(f)", False, False),
    (b"checkpoints(f) and checkpoint = 1", False, False),
    (b"gradient_checkpointing_kwargs = {'use_reentrant': False}", False, True),
    (b"model.gradient_checkpointing_enable( dict(use_reentrant=True))", False, True),
    (b"gradient_checkpointing_kwargs == {}", False, False),
    (b"args.gradient_checkpointing_kwargs = kwargs", False, False),
])
def test_cfx307_text_look(data, calls, inline):
    """What the two patterns found, found from `bytes.find` hits."""
    import re

    from cfgfix.rules.loops.cfx307_checkpoint_without_use_reentrant import (
        _INLINE_KWARGS, _calls_checkpoint, _inline_kwargs)

    assert _calls_checkpoint(data) is calls is bool(re.search(rb"\bcheckpoint(?:_sequential)?\s*\(", data))
    assert _inline_kwargs(data) is inline is bool(_INLINE_KWARGS.search(data))
