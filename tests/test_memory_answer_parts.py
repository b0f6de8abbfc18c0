"""Issue 21, item 3: partial knowledge still answers, for the SDXL story as its user wrote it
(../shared/seeds/000: `scripts/train_lora_model.py --config configs/full_sdxl.yaml`, a YAML
with `training_method: "full"` and a leftover `lora_rank`, fp16 mixed precision on 5 GPUs,
the UNet loaded without a dtype, the VAE and both CLIP text encoders frozen on the GPU)."""

import json

from click.testing import CliRunner
from conftest import lint_project, write_project

from cfgfix.commands import cli
from cfgfix.training.memory_answer import DOES_NOT_FIT, answers

SDXL_STORY = {'accelerate_config.yaml': "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'fp16'\nnum_machines: 1\nnum_processes: 5\nuse_cpu: false\n", 'cfgfix.toml': 'gpu = "RTX 4090"\n', 'configs/full_sdxl.yaml': 'model:\n  pretrained_model: "stabilityai/stable-diffusion-xl-base-1.0"\n  vae_model: "madebyollin/sdxl-vae-fp16-fix"\n  resolution: 128  # Reduced from 256 for memory\n  training_method: "full"  # 100% parameter training\n  lora_rank: 64\n  lora_alpha: 64\n\ntraining:\n  batch_size_per_gpu: 1  # Minimal for memory\n  gradient_accumulation_steps: 16  # Effective batch = 1 * 16 * 5 = 80\n  learning_rate: 1.0e-5\n\nhardware:\n  mixed_precision: "fp16"\n  gradient_checkpointing: true\n  enable_cpu_offload: true\n', 'scripts/train_lora_model.py': 'import argparse\n\nimport torch\nimport yaml\nfrom accelerate import Accelerator\nfrom diffusers import AutoencoderKL, UNet2DConditionModel\nfrom peft import LoraConfig\nfrom transformers import CLIPTextModel, CLIPTextModelWithProjection\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument("--config", required=True)\n    parser.add_argument("--resume", default="none")\n    args = parser.parse_args()\n    cfg = yaml.safe_load(open(args.config))\n    accelerator = Accelerator(mixed_precision=cfg["hardware"]["mixed_precision"],\n                              gradient_accumulation_steps=cfg["training"]["gradient_accumulation_steps"])\n    base = cfg["model"]["pretrained_model"]\n    unet = UNet2DConditionModel.from_pretrained(base, subfolder="unet")\n    vae = AutoencoderKL.from_pretrained(cfg["model"]["vae_model"])\n    text_encoder = CLIPTextModel.from_pretrained(base, subfolder="text_encoder")\n    text_encoder_2 = CLIPTextModelWithProjection.from_pretrained(base, subfolder="text_encoder_2")\n    vae.requires_grad_(False)\n    text_encoder.requires_grad_(False)\n    text_encoder_2.requires_grad_(False)\n    if cfg["model"]["training_method"] == "lora":\n        unet.add_adapter(LoraConfig(r=cfg["model"]["lora_rank"], lora_alpha=cfg["model"]["lora_alpha"],\n                                    target_modules=["to_k", "to_q", "to_v", "to_out.0"]))\n    if cfg["hardware"]["gradient_checkpointing"]:\n        unet.enable_gradient_checkpointing()\n    params = [p for p in unet.parameters() if p.requires_grad]\n    optimizer = torch.optim.AdamW(params, lr=cfg["training"]["learning_rate"])\n    vae.to(accelerator.device)\n    text_encoder.to(accelerator.device)\n    text_encoder_2.to(accelerator.device)\n    dataset = load_dataset(cfg)\n    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg["training"]["batch_size_per_gpu"], shuffle=True)\n    unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)\n    for batch in loader:\n        with accelerator.accumulate(unet):\n            loss = unet(batch).sample.mean()\n            accelerator.backward(loss)\n            optimizer.step()\n            optimizer.zero_grad()\n\n\nif __name__ == "__main__":\n    main()\n', 'train.sh': 'accelerate launch \\\n  --config_file accelerate_config.yaml \\\n  scripts/train_lora_model.py \\\n  --resume none \\\n  --config configs/full_sdxl.yaml \\\n  2>&1 | tee full_sdxl.log\n'}


def _run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _answer(root):
    engine, _, _ = lint_project(root)
    return answers(engine.project)[0]


def test_sdxl_story_is_a_full_fine_tune_that_does_not_fit(tmp_path):
    write_project(tmp_path, SDXL_STORY)
    found = _answer(tmp_path)
    setup = found.high.setup
    assert setup.lora_rank is None and found.high.trainable_params == found.high.shape.params  # not a LoRA run
    assert any("lora_rank 64" in c and "training_method: full" in c for c in found.training.conflicts)
    # diffusers loads the UNet (and the frozen VAE and text encoders) in fp32 without a torch_dtype
    assert setup.weights == "fp32" and not found.open
    assert {name: nbytes for name, _, nbytes in setup.frozen} == {"vae": 4, "text_encoder": 4, "text_encoder_2": 4}
    assert setup.checkpointing and setup.resolution == 128 and setup.num_gpus == 5
    assert found.verdict == DOES_NOT_FIT  # the run that went out of memory on the 24 GB cards
    _, out = _run("check", "--no-cache", "--select", "CFX7", "--output-format", "json", str(tmp_path))
    assert [f["code"] for f in json.loads(out)] == ["CFX701"]
    _, out = _run("explain", "--no-cache", str(tmp_path))
    assert "conflict: lora_rank 64" in out


def test_the_training_method_decides_only_when_it_says_full(tmp_path):
    for method, rank in (('"lora"', 64), ('"full"', None), ('"FULL"', None), (None, 64)):
        yaml = SDXL_STORY["configs/full_sdxl.yaml"]
        yaml = yaml.replace('"full"', method) if method else yaml.replace('  training_method: "full"  # 100% parameter training\n', "")
        root = tmp_path / str(method).strip('"')
        write_project(root, {**SDXL_STORY, "configs/full_sdxl.yaml": yaml})
        found = _answer(root)
        assert found.high.setup.lora_rank == rank, (method, found.training.conflicts)
        assert bool(found.training.conflicts) == (rank is None), method


def test_llamafactory_finetuning_type_full_beats_a_leftover_lora_rank(tmp_path):
    """LLaMA-Factory's own model (training/frameworks/llamafactory.py) decides it: a lora_rank
    key counts only with finetuning_type lora."""
    from test_training_setup import _setups

    write_project(tmp_path, {
        "train.yaml": ("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: full\nlora_rank: 8\n"
                       "per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\ncutoff_len: 1024\n"),
        "run.sh": "llamafactory-cli train train.yaml\n"})
    (setup,) = _setups(tmp_path)
    assert setup.get("lora_rank") is None


def test_a_vae_loaded_by_a_literal_id_is_never_the_trained_model(tmp_path):
    script = SDXL_STORY["scripts/train_lora_model.py"].replace(
        'AutoencoderKL.from_pretrained(cfg["model"]["vae_model"])',
        'AutoencoderKL.from_pretrained("madebyollin/sdxl-vae-fp16-fix", torch_dtype=torch.float16)')
    write_project(tmp_path, {**SDXL_STORY, "scripts/train_lora_model.py": script})
    found = _answer(tmp_path)
    assert found.training.get("model") == "stabilityai/stable-diffusion-xl-base-1.0"
    # the fp16-fix VAE is an SDXL VAE (83.65M), kept in the fp16 it was loaded in
    assert ("vae", 83_653_863, 2) in found.high.setup.frozen


def test_a_derivative_vae_named_as_the_model_says_what_it_is(tmp_path):
    yaml = SDXL_STORY["configs/full_sdxl.yaml"].replace("stabilityai/stable-diffusion-xl-base-1.0",
                                                        "madebyollin/sdxl-vae-fp16-fix")
    write_project(tmp_path, {**SDXL_STORY, "configs/full_sdxl.yaml": yaml})
    found = _answer(tmp_path)
    assert not found.estimated and "is a AutoencoderKL" in found.problem and "frozen part" in found.problem
