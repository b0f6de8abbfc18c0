"""CFX203 / CFX205 / CFX206 beyond the embedded examples: owners of the precision that the
analysis must see, message details, and code shapes that must not crash."""

import pytest

from conftest import lint_project, write_project

HEAD = "import torch\n"
LOOP = "model(x).sum().backward()\noptimizer.step()\n"


def _codes(tmp_path, code, files=None, select="CFX203,CFX205,CFX206"):
    write_project(tmp_path, {"train.py": code, **(files or {})})
    _, _, result = lint_project(tmp_path, select=select.split(","))
    return [(f.code, f.span.line, f.message) for f in result.findings]


SILENT = {
    "cast after the optimizer is built": HEAD
    + "model = Net().half()\noptimizer = torch.optim.Adam(model.parameters())\nmodel.float()\n" + LOOP,
    "Lightning Fabric owns the optimizer": HEAD
    + "model = Net().half()\noptimizer = torch.optim.Adam(model.parameters())\n"
    "model, optimizer = fabric.setup(model, optimizer)\n" + LOOP,
    "apex FP16_Optimizer keeps master weights": HEAD
    + "from apex.fp16_utils import FP16_Optimizer\nmodel = Net().cuda().half()\n"
    "optimizer = torch.optim.Adam(model.parameters())\noptimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n"
    "optimizer.backward(model(x).sum())\noptimizer.step()\n",
    "a wrapper optimizer built around it": HEAD
    + "model = Net().half()\noptimizer = Lookahead(torch.optim.Adam(model.parameters()))\n" + LOOP,
    "adapters added through transformers' PEFT integration": HEAD
    + "from transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
    "model.add_adapter(lora_config)\noptimizer = torch.optim.AdamW(model.parameters())\n" + LOOP,
    "a half-precision base wrapped by PEFT afterwards (peft >= 0.12 makes float32 adapters)": HEAD
    + "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m')\nmodel.half()\nmodel = get_peft_model(model, cfg)\n"
    "optimizer = torch.optim.Adam(model.parameters())\n" + LOOP,
    "a cast after the PEFT wrap only on one branch": HEAD
    + "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m')\nmodel = get_peft_model(model, cfg)\n"
    "if args.bf16:\n    model.to(torch.bfloat16)\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n" + LOOP,
    "saved adapters loaded frozen (no is_trainable=True), then cast": HEAD
    + "from peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m')\nmodel = PeftModel.from_pretrained(model, 'out')\n"
    "model.to(torch.bfloat16)\noptimizer = torch.optim.AdamW(model.parameters())\n" + LOOP,
    "the optimizer built before the PEFT wrap": HEAD
    + "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
    "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
    "optimizer = torch.optim.AdamW(model.parameters())\nmodel = get_peft_model(model, cfg)\n" + LOOP,
    "a frozen model": HEAD
    + "model = Net().half()\nmodel.requires_grad_(False)\noptimizer = torch.optim.Adam(model.parameters())\n" + LOOP,
    "a module constant eps that float16 represents": HEAD
    + "EPS = 1e-4\nmodel = Net().half()\noptimizer = torch.optim.Adam(model.parameters(), eps=EPS)\n" + LOOP,
    "a parameter loop that freezes": HEAD
    + "model = Net().to(torch.bfloat16)\nfor name, p in model.named_parameters():\n    p.requires_grad = 'head' in name\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n" + LOOP,
    "another model's parameters": HEAD
    + "teacher = Net().bfloat16()\nstudent = Net()\noptimizer = torch.optim.AdamW(list(student.parameters()))\n" + LOOP,
    "an optimizer built in another function from a parameter": HEAD
    + "def make(model):\n    return torch.optim.AdamW(model.parameters())\nmodel = Net().bfloat16()\n"
    "optimizer = make(model)\n" + LOOP,
    "the optimizer handed to an unknown helper that may wrap it": HEAD
    + "from mylib import wrap_optimizer\nmodel = Net().half()\noptimizer = torch.optim.Adam(model.parameters())\n"
    "optimizer = wrap_optimizer(optimizer)\n" + LOOP,
    "odd shapes: no arguments, starred groups": HEAD
    + "model = Net().half()\na = torch.optim.Adam()\nb = torch.optim.Adam(*groups)\n"
    "c = torch.optim.AdamW({k: v for k, v in model.named_parameters()}.values())\n" + LOOP,
}


@pytest.mark.parametrize("why", SILENT)
def test_silent(tmp_path, why):
    assert _codes(tmp_path, SILENT[why]) == []


def test_positional_eps_and_betas_shape_the_message(tmp_path):
    code = HEAD + "model = Net().half()\noptimizer = torch.optim.Adam(model.parameters(), 1e-3, (0.9, 0.95), 1e-8)\n" + LOOP
    [(code_, line, message)] = _codes(tmp_path, code)
    assert (code_, line) == ("CFX203", 3)
    assert "below ~8e-4" in message and "`eps=1e-8` rounds to 0" in message


def test_fused_bf16_still_rounds(tmp_path):
    code = HEAD + "model = Net().to(torch.bfloat16)\noptimizer = torch.optim.AdamW(model.parameters(), fused=True)\n" + LOOP
    assert [c[:2] for c in _codes(tmp_path, code)] == [("CFX205", 3)]


def test_bf16_load_then_fp16_cast_is_cfx203_only(tmp_path):
    code = (
        HEAD + "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
        "model.half()\noptimizer = torch.optim.AdamW(model.parameters())\n" + LOOP
    )
    assert [c[:2] for c in _codes(tmp_path, code)] == [("CFX203", 5)]


def test_cfx206_without_amp_has_no_fix_and_names_the_evidence(tmp_path):
    code = (
        "from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n"
        "def main():\n"
        "    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
        "    model = AutoModelForCausalLM.from_pretrained(args.model)\n"
        "    Trainer(model=model, args=args).train()\n"
    )
    write_project(tmp_path, {"train.py": code, "requirements.txt": "transformers~=5.1\n"})
    _, _, result = lint_project(tmp_path, select=["CFX206"])
    [finding] = result.findings
    assert finding.span.line == 4 and finding.fix is None
    assert "Trainer(model=...)" in finding.message and "~=5.1" in finding.message


def test_cfx206_reference_model_prepared_alone_is_not_trained(tmp_path):
    code = (
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        "policy = AutoModelForCausalLM.from_pretrained('m', dtype=torch.float32)\n"
        "ref = AutoModelForCausalLM.from_pretrained('m')\n"
        "optimizer = torch.optim.AdamW(policy.parameters())\n"
        "policy, optimizer = accelerator.prepare(policy, optimizer)\n"
        "ref = accelerator.prepare(ref)\n"
        "accelerator.backward(loss)\n"
    )
    assert _codes(tmp_path, code, {"requirements.txt": "transformers>=5\n"}) == []


def test_a_loop_that_only_reads_parameters_does_not_silence(tmp_path):
    code = (
        HEAD + "model = Net().to(torch.bfloat16)\nnorms = {}\n"
        "for n, p in model.named_parameters():\n    norms[n] = p.norm()\n"
        "optimizer = torch.optim.AdamW(model.parameters())\n" + LOOP
    )
    assert [c[:2] for c in _codes(tmp_path, code)] == [("CFX205", 6)]


def test_a_cast_of_the_peft_model_after_wrapping_casts_the_adapters(tmp_path):
    # peft 0.21.2: `.half()` / `.to(torch.bfloat16)` on the PeftModel makes the LoRA weights
    # float16 / bfloat16 too, so the optimizer updates half-precision trainable weights.
    head = HEAD + "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
    half = head + (
        "model = AutoModelForCausalLM.from_pretrained('m')\nmodel = get_peft_model(model, cfg)\nmodel.half()\n"
        "optimizer = torch.optim.Adam(model.parameters())\n" + LOOP
    )
    assert [c[:2] for c in _codes(tmp_path, half)] == [("CFX203", 7)]
    bf16 = head + (
        "model = AutoModelForCausalLM.from_pretrained('m', torch_dtype=torch.bfloat16)\n"
        "model = prepare_model_for_kbit_training(get_peft_model(model, cfg))\n"
        "model = model.to(torch.bfloat16)\n"
        "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])\n" + LOOP
    )
    assert [c[:2] for c in _codes(tmp_path, bf16)] == [("CFX205", 7)]
    helper = head + (
        "def wrap(model):\n    return get_peft_model(model, cfg)\n"
        "model = wrap(AutoModelForCausalLM.from_pretrained('m'))\nmodel.half()\n"
        "optimizer = torch.optim.Adam(model.parameters())\n" + LOOP
    )
    assert [c[:2] for c in _codes(tmp_path, helper)] == [("CFX203", 8)]


def test_a_model_built_in_a_setup_method_that_init_calls(tmp_path):
    code = HEAD + (
        "from peft import get_peft_model\nfrom transformers import AutoModelForCausalLM\n"
        "class Tuner:\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n"
        "        self.model_init()\n"
        "    def model_init(self):\n"
        "        self.model = AutoModelForCausalLM.from_pretrained(self.name)\n"
        "        self.model = get_peft_model(self.model, cfg)\n"
        "        self.model.to(torch.bfloat16)\n"
        "    def train(self, loader):\n"
        "        optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)\n"
        "        for batch in loader:\n"
        "            self.model(**batch).loss.backward()\n"
        "            optimizer.step()\n"
    )
    assert [c[:2] for c in _codes(tmp_path, code)] == [("CFX205", 13)]
