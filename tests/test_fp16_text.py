"""Whether a file may run float16, from its text less the casts of state-dict copies
(analysis/fp16_text.py; CFX202 stays silent where it may)."""

from __future__ import annotations

import ast

import pytest

from cfgfix.analysis.fp16_text import may_run_float16, may_run_float16_text


def _may(code: str) -> bool:
    data = code.encode()
    return may_run_float16(data, ast.parse(data))


@pytest.mark.parametrize("code", [
    # casts of a state dict's tensors make copies: the model keeps its dtype
    "sd = {k: v.half().cpu() for k, v in model.state_dict().items()}\n",
    "sd = model.state_dict()\nfor k, v in sd.items():\n    sd[k] = v.to(torch.float16)\n",
    "sd = model.state_dict()\nsd['w'] = sd['w'].half()\n",
    "torch.save({k: v.half() for k, v in get_peft_model_state_dict(model).items()}, p)\n",
    "torch.save([v.to(dtype=torch.float16) for v in model.state_dict().values()], p)\n",
    "x = 1  # no half precision at all\n",
])
def test_state_dict_copies_do_not_run_float16(code):
    assert not _may(code)


@pytest.mark.parametrize("code", [
    "model.half()\nsd = {k: v.half() for k, v in model.state_dict().items()}\n",  # the model itself
    "x = {k: v.half() for k, v in batch.items()}\nsd = model.state_dict()\n",       # a batch
    "for k, v in model.state_dict().items():\n    pass\nw = v.half()\n",               # outside the loop
    "model.load_state_dict({k: v.half() for k, v in ckpt.items()})\n",              # not known a state dict
    "for name, p in model.named_parameters():\n    p.data = p.data.half()\nsd = model.state_dict()\n",
    "args.fp16 = True\nsd = model.state_dict()\n",
    "dtype = torch.float16\n",
])
def test_other_mentions_still_count(code):
    assert _may(code)


def test_the_text_check_leaves_state_dict_files_to_the_tree():
    assert may_run_float16_text(b"model.half()\n")
    assert not may_run_float16_text(b"sd = {k: v.half() for k, v in model.state_dict().items()}\n")
    assert not may_run_float16_text(b"torch.bfloat16\n")


@pytest.mark.parametrize("data", [
    b"torch.half", b"torch.halfx", b"torch.half(", b"xtorch.half_", b"bfloat16 float16", b"Bfp16 fp16 bf16",
    b"aFP16 _FP16 FP16x .FP16", b".half(torch.half(", b"torch.half.half(", b"float16fp16FP16", b"x.half(",
    b"fp16fp16fp16", b"bfp16", b"FP16", b"", b"no mention", b"dtype=torch.bfloat16\nopt.fp16 = True\n",
])
def test_fp16_mentions_are_the_patterns_matches(data):
    from cfgfix.analysis.fp16_text import FP16_TEXT, fp16_mentions

    assert fp16_mentions(data) == [m.start() for m in FP16_TEXT.finditer(data)]
    assert bool(fp16_mentions(data, first=True)) == (FP16_TEXT.search(data) is not None)
