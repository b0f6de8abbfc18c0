"""Issue 21, item 6: fit plans an expert would choose: ZeRO-2 before checkpointing when the
launch can take a DeepSpeed config and ZeRO-2 alone fits; the 8-bit optimizer written as a
patch when the script builds torch's AdamW; ZeRO-3's cost over PCIe stated, with QLoRA as
the road it leaves out; host RAM for offload and for ranks that each load the whole model."""

from click.testing import CliRunner
from conftest import lint_project, write_project

from cfgfix.commands import cli
from cfgfix.memory.gpus import find_gpu
from cfgfix.memory.setup import MemorySetup
from cfgfix.memory.shapes import shape_from_catalog
from cfgfix.training.fit import plan
from cfgfix.training.memory_answer import answers

TRAINER = ("from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments\n\n"
           "args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
           "model = AutoModelForCausalLM.from_pretrained('{model}', torch_dtype='bfloat16')\n"
           "Trainer(model=model, args=args).train()\n")
LOOP = ("import torch\nfrom transformers import AutoModelForCausalLM\n\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-1.5B', torch_dtype=torch.bfloat16)\n"
        "model.gradient_checkpointing_enable()\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)\n"
        "for batch in loader:\n    model(**batch).loss.backward()\n    optimizer.step()\n")


def _fit(root, *extra):
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(cli, ["fix", "--fit", "--no-cache", *extra], catch_exceptions=False)
    finally:
        os.chdir(cwd)
    return result.exit_code, result.output


def test_zero2_before_checkpointing_when_it_alone_fits(tmp_path):
    write_project(tmp_path, {"train.py": TRAINER.format(model="Qwen/Qwen2.5-1.5B"), "cfgfix.toml": 'gpu = "RTX 4090"\n',
                             "run.sh": "torchrun --nproc_per_node 8 train.py --output_dir o --per_device_train_batch_size 2 "
                                       "--bf16 True --max_seq_length 1024\n"})
    engine, _, _ = lint_project(tmp_path)
    found = answers(engine.project)[0]
    assert [r.key for r in found.plan.rungs] == ["zero2"], found.plan.rungs
    assert found.plan_verdict[0] == "fits"


def test_zero2_stays_after_checkpointing_where_cfgfix_cannot_write_a_deepspeed_config():
    shape = shape_from_catalog("Qwen/Qwen2.5-1.5B")
    setup = MemorySetup(params=shape.params, weights="bf16", autocast="bf16", num_gpus=8, micro_batch=2, seq_len=1024)
    gpu = find_gpu("RTX 4090")
    assert [r.key for r in plan(setup, shape, gpu, True, deepspeed_ready=False).rungs] == ["checkpointing"]
    assert [r.key for r in plan(setup, shape, gpu, True, deepspeed_ready=True).rungs] == ["zero2"]
    # one GPU: ZeRO-2 alone shards nothing, checkpointing first as before
    single = setup.with_(num_gpus=1, micro_batch=4)
    assert plan(single, shape, gpu, True, deepspeed_ready=True).rungs[0].key == "checkpointing"


def test_torch_adamw_built_in_code_gets_the_8bit_optimizer_as_a_patch(tmp_path):
    write_project(tmp_path, {"train.py": LOOP, "cfgfix.toml": 'gpu = "RTX 3080"\n',
                             "run.sh": "python train.py --max_seq_length 1024 --per_device_train_batch_size 1\n"})
    code, out = _fit(tmp_path)
    assert "written: train.py" in out, out
    text = (tmp_path / "train.py").read_text()
    assert "optimizer = bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-5, weight_decay=0.0)" in text
    assert "import bitsandbytes as bnb\n" in text
    compile(text, "train.py", "exec")
    code, out = _fit(tmp_path)
    assert code == 0 and "nothing to change" in out, out  # read back: the patched optimizer is paged 8-bit


def test_an_optimizer_call_with_torch_only_arguments_stays_advice(tmp_path):
    for extra in ("fused=True", "foreach=False", "maximize=False"):
        write_project(tmp_path, {"train.py": LOOP.replace("weight_decay=0.0)", f"weight_decay=0.0, {extra})"),
                                 "cfgfix.toml": 'gpu = "RTX 3080"\n',
                                 "run.sh": "python train.py --max_seq_length 1024 --per_device_train_batch_size 1\n"})
        _, out = _fit(tmp_path, "--diff")
        assert "advice only: optimizer" in out and "bnb" not in out.split("advice only")[0].split("\n")[-1], out


def test_zero3_over_pcie_states_its_cost_and_the_road_it_leaves_out(tmp_path):
    write_project(tmp_path, {"train.py": TRAINER.format(model="Qwen/Qwen2.5-14B"), "cfgfix.toml": 'gpu = "RTX 4090"\n',
                             "run.sh": "torchrun --nproc_per_node 8 train.py --output_dir o --per_device_train_batch_size 1 "
                                       "--bf16 True --max_seq_length 1024 --gradient_checkpointing True\n"})
    _, out = _fit(tmp_path, "--diff")
    assert "+ DeepSpeed ZeRO-3" in out and "the RTX 4090 has no NVLink" in out, out
    assert "consider: LoRA (rank 16) instead of a full fine-tune fits without ZeRO-3's PCIe traffic" in out
    assert "host RAM: the offloaded states take" in out
    assert "host RAM at load" not in out  # the HF Trainer loads under zero.Init with a ZeRO-3 config
    # the same launch on an NVLink card says nothing about PCIe
    write_project(tmp_path, {"cfgfix.toml": 'gpu = "A100 40GB"\n'})
    _, out = _fit(tmp_path, "--diff")
    assert "has no NVLink" not in out and "consider:" not in out


def test_ranks_that_each_load_the_whole_model_need_host_ram(tmp_path):
    write_project(tmp_path, {"train.py": TRAINER.format(model="Qwen/Qwen2.5-7B"), "cfgfix.toml": 'gpu = "RTX 4090"\n',
                             "run.sh": "torchrun --nproc_per_node 4 train.py --output_dir o --per_device_train_batch_size 1 "
                                       "--bf16 True --max_seq_length 1024 --gradient_checkpointing True\n"})
    _, out = _fit(tmp_path, "--diff")
    assert "+ DeepSpeed ZeRO-2" in out and "+ optimizer offload to CPU" in out, out
    assert "host RAM at load: each of the 4 processes loads the whole model before it is sharded, about 4 x 14.2 GiB" in out
