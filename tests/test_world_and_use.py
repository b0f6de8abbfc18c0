"""World sizes DeepSpeed's runner decides (hostfile, --include, --num_nodes/--num_gpus), the
data-parallel size under pipeline parallelism, DeepSpeed's derived batch arithmetic, and a
config recognised by its use (CFX502); accelerate's legacy keys (CFX405) and inline offload
(CFX503)."""

import json

import pytest

from conftest import lint_project, write_project


def _502(tmp_path, files):
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path)
    return [f for f in result.findings if f.code == "CFX502"]


DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}


@pytest.mark.parametrize("launch,hostfile,world", [
    ("deepspeed --hostfile hosts train.py --deepspeed ds.json", "a slots=4\nb slots=4\n", 8),
    ("deepspeed --hostfile hosts --num_nodes 1 train.py --deepspeed ds.json", "a slots=4\nb slots=4\n", 4),
    ("deepspeed --hostfile hosts --num_gpus 2 train.py --deepspeed ds.json", "# two nodes\na slots=4\nb slots=4\n", 4),
    ("deepspeed --include a:0,1@b:0 train.py --deepspeed ds.json", "", 3),
])
def test_deepspeed_hosts_decide_the_world_size(tmp_path, launch, hostfile, world):
    files = {"run.sh": launch + "\n", "ds.json": json.dumps(DS)}
    if hostfile:
        files["hosts"] = hostfile
    found = _502(tmp_path, files)
    if 2 * 4 * world == 16:
        assert found == []
    else:
        [finding] = found
        assert f"= {2 * 4 * world}" in finding.message


@pytest.mark.parametrize("launch,files", [
    ("deepspeed --hostfile missing --num_gpus 2 train.py --deepspeed ds.json", {}),  # unreadable: unknown, not 2
    ("deepspeed --hostfile hosts train.py --deepspeed ds.json", {"hosts": "a slots=four\n"}),  # DeepSpeed refuses it
    ("deepspeed --include a train.py --deepspeed ds.json", {}),  # every GPU of host a: unknown
    ("deepspeed --exclude a:0 --num_gpus 2 train.py --deepspeed ds.json", {}),
])
def test_deepspeed_hosts_near_misses(tmp_path, launch, files):
    assert _502(tmp_path, {"run.sh": launch + "\n", "ds.json": json.dumps(DS), **files}) == []


def test_pipeline_stages_divide_the_world(tmp_path):
    script = ("import deepspeed\nfrom deepspeed.pipe import PipelineModule\n"
              "net = PipelineModule(layers=layers, num_stages=2)\n"
              "engine, *_ = deepspeed.initialize(model=net, config='ds.json')\n")
    # 8 processes / 2 stages = 4 data-parallel ranks: 2 x 4 x 4 = 32
    [finding] = _502(tmp_path, {"run.sh": "deepspeed --num_gpus 8 train.py --deepspeed_config ds.json\n",
                                "train.py": script, "ds.json": json.dumps(DS)})
    assert "8 processes / 2 pipeline stages" in finding.message and "= 32" in finding.message
    computed = script.replace("num_stages=2", "num_stages=args.stages")
    assert _502(tmp_path / "x", {"run.sh": "deepspeed --num_gpus 8 train.py --deepspeed_config ds.json\n",
                                 "train.py": computed, "ds.json": json.dumps(DS)}) == []


@pytest.mark.parametrize("ds,expected", [
    ({"train_batch_size": 33, "train_micro_batch_size_per_gpu": 17}, "gradient_accumulation_steps = 33 // 17 // 2 = 0"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, "gradient_accumulation_steps = 30 // 4 // 2 = 3"),
    ({"train_batch_size": 1}, "train_micro_batch_size_per_gpu = 1 // 2 (accumulation 1) = 0"),
    ({"train_batch_size": 16, "gradient_accumulation_steps": 3}, "train_micro_batch_size_per_gpu = 16 // 2 // 3 = 2"),
])
def test_derived_batch_arithmetic(tmp_path, ds, expected):
    [finding] = _502(tmp_path, {"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed_config ds.json\n",
                                "ds.json": json.dumps({**ds, "zero_optimization": {"stage": 1}})})
    assert expected in finding.message and finding.fix is None


@pytest.mark.parametrize("ds", [
    {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4},  # 32 // 4 // 2 = 4: 4 x 4 x 2 = 32
    {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3},  # the total is derived: consistent
    {"train_batch_size": 16},  # micro 8, accumulation 1
    {"train_batch_size": 33, "train_micro_batch_size_per_gpu": "auto"},  # filled by the HF Trainer
])
def test_derived_batch_arithmetic_near_misses(tmp_path, ds):
    assert _502(tmp_path, {"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed_config ds.json\n",
                           "ds.json": json.dumps({**ds, "zero_optimization": {"stage": 1}})}) == []


def test_a_config_is_recognised_by_its_use(tmp_path):
    """`{"train_batch_size": 1}` alone says nothing about DeepSpeed, but `--deepspeed_config`
    makes it one: 1 // 2 processes derives a micro batch of 0."""
    [finding] = _502(tmp_path, {"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed_config tiny.json\n",
                                "tiny.json": '{"train_batch_size": 1}\n'})
    assert finding.path == "tiny.json" and "= 0" in finding.message
    # near miss: the same file that no launch passes to DeepSpeed is nobody's config
    assert _502(tmp_path / "x", {"run.sh": "python train.py --data tiny.json\n", "tiny.json": '{"train_batch_size": 1}\n'}) == []


# -- accelerate ------------------------------------------------------------------------------
ACC = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n"


def test_legacy_dynamo_backend_is_not_unknown(tmp_path):
    """accelerate's ClusterConfig.process_config converts `dynamo_backend` (config_args.py)."""
    write_project(tmp_path, {"a.yaml": ACC + "dynamo_backend: 'NO'\n", "b.yaml": ACC + "dynamo_backnd: 'NO'\n"})
    _, _, result = lint_project(tmp_path)
    assert [(f.path, f.code) for f in result.findings if f.code == "CFX405"] == [("b.yaml", "CFX405")]


def test_accelerate_inline_parameter_offload_under_zero2(tmp_path):
    inline = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
              "  zero_stage: {stage}\n  offload_param_device: cpu\n  offload_optimizer_device: cpu\nnum_processes: 2\n")
    write_project(tmp_path, {"zero2.yaml": inline.format(stage=2), "zero3.yaml": inline.format(stage=3),
                             "multi.yaml": inline.format(stage=2).replace("DEEPSPEED", "MULTI_GPU")})
    _, _, result = lint_project(tmp_path)
    found = [(f.path, f.span.line) for f in result.findings if f.code == "CFX503"]
    assert found == [("zero2.yaml", 5)]


# -- configs named by a launch, whatever their suffix -----------------------------------------
GPU_FP32 = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'no'\n"
            "num_processes: 2\nuse_cpu: false\n")


def _codes(tmp_path, files, code):
    write_project(tmp_path, files)
    _, _, result = lint_project(tmp_path)
    return [(f.path, f.span.line) for f in result.findings if f.code == code]


def test_an_accelerate_config_saved_as_sh_is_read_as_the_launch_passes_it(tmp_path):
    """accelerate reads any `--config_file` not ending in .json as YAML: a `.sh` name does
    not make the file a shell script (bench/heldout2, mahiratmis/ProbLoRA)."""
    files = {"cfg.sh": GPU_FP32, "run.sh": "accelerate launch --config_file cfg.sh train.py\n",
             "train.py": "from accelerate import Accelerator\naccelerator = Accelerator()\n"}
    assert _codes(tmp_path, files, "CFX401") == [("cfg.sh", 3)]
    # the other spelling of the option
    files["run.sh"] = "accelerate launch --config-file=cfg.sh train.py\n"
    assert _codes(tmp_path / "dash", files, "CFX401") == [("cfg.sh", 3)]
    # near miss: the same file that no launch names is a shell script, never a config
    assert _codes(tmp_path / "x", {"cfg.sh": GPU_FP32, "run.sh": "accelerate launch train.py\n",
                                   "train.py": "print(1)\n"}, "CFX401") == []
    # near miss: a real shell script passed as the config is no mapping: nothing is read into it
    script = {"cfg.sh": "#!/bin/bash\nexport X=1\necho done\n", "run.sh": "accelerate launch --config_file cfg.sh train.py\n",
              "train.py": "print(1)\n"}
    write_project(tmp_path / "y", script)
    _, _, result = lint_project(tmp_path / "y")
    assert [f for f in result.findings if f.path == "cfg.sh" and f.code.startswith("CFX4")] == []
    assert not result.errors


def test_a_deepspeed_json_with_another_suffix_is_read_as_json(tmp_path):
    """`--deepspeed_config zero.sh`: a file of the run that the launch passes to DeepSpeed is
    DeepSpeed's JSON (read by content), so its batch arithmetic is checked (CFX502) as for
    `ds.json`. (Files cfgfix does not collect, `ds.conf`, are not part of the run.)"""
    [finding] = _502(tmp_path, {"run.sh": "deepspeed --num_gpus 2 train.py --deepspeed_config zero.sh\n",
                                "zero.sh": '{"train_batch_size": 1}\n'})
    assert finding.path == "zero.sh" and "= 0" in finding.message


SCRIPT_FLAG = ("from accelerate import Accelerator\nfrom opts import parse_args\n"
               "def main(args):\n    accelerator = Accelerator(mixed_precision=args.mixed_precision)\n"
               "if __name__ == '__main__':\n    main(parse_args())\n")
PARSER = ("import argparse\ndef parse_args():\n    parser = argparse.ArgumentParser()\n"
          "    parser.add_argument('--mixed_precision', {default}choices=['no', 'fp16', 'bf16'])\n"
          "    return parser.parse_args()\n")


def _flagged(tmp_path, launch, script, parser_default="default=None, ", extra=None):
    files = {"acc.yaml": GPU_FP32, "run.sh": launch + "\n", "train.py": script,
             "opts.py": PARSER.format(default=parser_default), **(extra or {})}
    return _codes(tmp_path, files, "CFX401")


def test_accelerator_mixed_precision_from_a_flag_the_launch_leaves_unset(tmp_path):
    bound = SCRIPT_FLAG.replace("    main(parse_args())\n", "    args = parse_args()\n    main(args)\n")
    launch = "accelerate launch --config_file acc.yaml train.py --lr 1e-4"
    assert _flagged(tmp_path / "a", launch, bound) == [("acc.yaml", 3)]
    # no `default=` at all is argparse's None too
    assert _flagged(tmp_path / "b", launch, bound, parser_default="") == [("acc.yaml", 3)]
    # the script's own parser
    own = ("import argparse\nfrom accelerate import Accelerator\nparser = argparse.ArgumentParser()\n"
           "parser.add_argument('--mixed_precision', default=None)\nargs = parser.parse_args()\n"
           "accelerator = Accelerator(mixed_precision=args.mixed_precision)\n")
    assert _flagged(tmp_path / "c", launch, own) == [("acc.yaml", 3)]


@pytest.mark.parametrize("why,launch,default", [
    ("the launch passes the script's flag", "accelerate launch --config_file acc.yaml train.py --mixed_precision=bf16",
     "default=None, "),
    ("arguments hidden in a variable", "accelerate launch --config_file acc.yaml train.py $EXTRA_ARGS", "default=None, "),
    ("a default computed at run time", "accelerate launch --config_file acc.yaml train.py",
     "default=os.environ.get('MP'), "),
    ("a bf16 default", "accelerate launch --config_file acc.yaml train.py", "default='bf16', "),
])
def test_accelerator_mixed_precision_from_a_flag_near_misses(tmp_path, why, launch, default):
    bound = SCRIPT_FLAG.replace("    main(parse_args())\n", "    args = parse_args()\n    main(args)\n")
    assert _flagged(tmp_path, launch, bound, parser_default=default) == [], why


def test_a_flag_declared_twice_in_the_parser_function_has_no_sure_default(tmp_path):
    twice = PARSER.format(default="default=None, ").replace(
        "    return", "    if 0:\n        parser.add_argument('--mixed_precision', default='bf16')\n    return")
    bound = SCRIPT_FLAG.replace("    main(parse_args())\n", "    args = parse_args()\n    main(args)\n")
    assert _flagged(tmp_path, "accelerate launch --config_file acc.yaml train.py", bound,
                    extra={"opts.py": twice}) == []


@pytest.mark.parametrize("write", [
    "    args.mixed_precision = 'bf16'\n",
    "    vars(args).update({'mixed_precision': 'bf16'})\n",
    "    setattr(args, 'mixed_precision', 'bf16')\n",
])
def test_a_namespace_changed_after_parsing_is_not_left_unset(tmp_path, write):
    script = SCRIPT_FLAG.replace("    main(parse_args())\n", "    args = parse_args()\n" + write + "    main(args)\n")
    assert _flagged(tmp_path, "accelerate launch --config_file acc.yaml train.py", script) == []


def test_the_per_file_config_rules_read_a_config_named_by_its_launch(tmp_path):
    """CFX405 (an unknown accelerate key) on an accelerate YAML saved as `.sh` that a launch
    passes as `--config_file`; the same file no launch names is a shell script."""
    config = GPU_FP32.replace("mixed_precision: 'no'", "mixed_precision: bf16") + "num_procesess: 2\n"
    files = {"cfg.sh": config, "run.sh": "accelerate launch --config_file cfg.sh train.py\n", "train.py": "print(1)\n"}
    assert _codes(tmp_path, files, "CFX405") == [("cfg.sh", 6)]
    assert _codes(tmp_path / "x", {**files, "run.sh": "accelerate launch train.py\n"}, "CFX405") == []
    # with only the per-file rule selected
    write_project(tmp_path / "y", files)
    _, _, result = lint_project(tmp_path / "y", select=["CFX405"])
    assert [(f.path, f.code) for f in result.findings] == [("cfg.sh", "CFX405")]
