"""Issue 21, item 3: the 8.5B multimodal story as its user wrote it (../shared/seeds/004): a
`giblet` package whose `MultimodalEncoder` is re-exported by `giblet/models/__init__.py`,
built with `**cfg["model"]` (or by a factory, `create_encoder(cfg)`), a Whisper `.encoder`
part, and `model.bfloat16()` under a `torch.cuda.is_bf16_supported()` guard, on 8 GPUs."""

from conftest import lint_project, write_project

from cfgfix.training.memory_answer import DOES_NOT_FIT, answers

GIBLET = {'cfgfix.toml': 'gpu = "RTX A6000"\n', 'configs/train.yaml': 'model:\n  text_model: Qwen/Qwen2.5-7B\n  audio_model: openai/whisper-large-v3\n  bottleneck_dim: 2048\n  num_layers: 4\ndata:\n  max_seq_length: 512\ntraining:\n  batch_size: 64\n  learning_rate: 1.0e-4\n  num_epochs: 10\n', 'giblet/__init__.py': '', 'giblet/models/__init__.py': 'from .encoder import MultimodalEncoder\nfrom .factory import create_encoder\n\n__all__ = ["MultimodalEncoder", "create_encoder"]\n', 'giblet/models/encoder.py': 'import torch\nfrom torch import nn\nfrom transformers import AutoModel, WhisperModel\n\n\nclass MultimodalEncoder(nn.Module):\n    def __init__(self, text_model="Qwen/Qwen2.5-7B", audio_model="openai/whisper-large-v3", bottleneck_dim=1024,\n                 num_layers=2, **kwargs):\n        super().__init__()\n        self.text = AutoModel.from_pretrained(text_model)\n        self.audio = WhisperModel.from_pretrained(audio_model).encoder\n        hidden = self.text.config.hidden_size\n        self.bottleneck = nn.Linear(hidden, bottleneck_dim)\n        layer = nn.TransformerEncoderLayer(bottleneck_dim, 16, batch_first=True)\n        self.fusion = nn.TransformerEncoder(layer, num_layers)\n        self.head = nn.Linear(bottleneck_dim, 1000)\n\n    def forward(self, text, audio):\n        return self.head(self.fusion(self.bottleneck(self.text(text).last_hidden_state)))\n', 'giblet/models/factory.py': 'from .encoder import MultimodalEncoder\n\n\ndef create_encoder(cfg):\n    return MultimodalEncoder(**cfg["model"])\n', 'run.sh': 'torchrun --nproc_per_node 8 scripts/train.py --config configs/train.yaml\n', 'scripts/train.py': 'import argparse\n\nimport torch\nimport yaml\nfrom torch.utils.data import DataLoader\n\nfrom giblet.models import MultimodalEncoder\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument("--config", default="configs/train.yaml")\n    args = parser.parse_args()\n    cfg = yaml.safe_load(open(args.config))\n    model = MultimodalEncoder(**cfg["model"])\n    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():\n        model = model.bfloat16()\n    model = model.cuda()\n    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["training"]["learning_rate"])\n    loader = DataLoader(make_dataset(cfg), batch_size=cfg["training"]["batch_size"], shuffle=True)\n    for batch in loader:\n        loss = model(**batch).mean()\n        loss.backward()\n        optimizer.step()\n        optimizer.zero_grad()\n\n\nif __name__ == "__main__":\n    main()\n'}


def _answer(root):
    engine, _, _ = lint_project(root)
    return answers(engine.project)[0]


def _story(tmp_path, **changes):
    files = dict(GIBLET)
    for name, (old, new) in changes.items():
        assert old in files[name], (name, old)
        files[name] = files[name].replace(old, new)
    write_project(tmp_path, files)
    return _answer(tmp_path)


def test_a_class_re_exported_by_a_package_init_is_sized_with_the_yaml_values(tmp_path):
    found = _story(tmp_path)
    composite = found.training.composite
    parts = {p.name: p.params for p in composite.parts}
    # the YAML's bottleneck_dim 2048 and num_layers 4, not the constructor's 1024 and 2
    assert parts["bottleneck"] == 3584 * 2048 + 2048
    assert any("bottleneck_dim=2048) from the launch, not the constructor's default 1024" in n for n in found.inputs.assumptions)
    # the Whisper encoder is named as not counted, never dropped without a word
    assert parts["audio"] is None and "MultimodalEncoder.audio" in found.uncounted
    assert found.verdict == DOES_NOT_FIT and "a lower bound" in found.text


def test_the_bf16_guard_is_decided_by_the_target_gpu(tmp_path):
    on_a6000 = _story(tmp_path / "a6000")
    assert on_a6000.high.setup.weights == "bf16" and "supports bf16" in on_a6000.training.values["weights"].origin
    on_v100 = _story(tmp_path / "v100", **{"cfgfix.toml": ('"RTX A6000"', '"V100"')})
    assert on_v100.training.get("weights") is None  # the guard fails there: the load's dtype, not stated
    assert on_v100.high.setup.weights == "fp32"


def test_a_factory_function_is_followed_to_the_class(tmp_path):
    script = GIBLET["scripts/train.py"].replace("from giblet.models import MultimodalEncoder",
                                                "from giblet.models import create_encoder")
    write_project(tmp_path, {**GIBLET, "scripts/train.py": script.replace('model = MultimodalEncoder(**cfg["model"])',
                                                                          "model = create_encoder(cfg)")})
    found = _answer(tmp_path)
    assert found.training.composite is not None and found.training.composite.class_name == "MultimodalEncoder"
    parts = {p.name: p.params for p in found.training.composite.parts}
    assert parts["bottleneck"] == 3584 * 2048 + 2048  # the factory's **cfg["model"] read through


def test_an_unconditional_enable_gradient_checkpointing_counts(tmp_path):
    from test_memory_answer_parts import SDXL_STORY

    yaml = SDXL_STORY["configs/full_sdxl.yaml"].replace("  gradient_checkpointing: true\n", "")
    script = SDXL_STORY["scripts/train_lora_model.py"].replace(
        '    if cfg["hardware"]["gradient_checkpointing"]:\n        unet.enable_gradient_checkpointing()',
        "    unet.enable_gradient_checkpointing()")
    write_project(tmp_path / "on", {**SDXL_STORY, "configs/full_sdxl.yaml": yaml, "scripts/train_lora_model.py": script})
    assert _answer(tmp_path / "on").high.setup.checkpointing
    write_project(tmp_path / "off", {**SDXL_STORY, "configs/full_sdxl.yaml": yaml})
    assert not _answer(tmp_path / "off").high.setup.checkpointing  # under a branch cfgfix cannot decide


def test_model_params_in_the_settings_size_a_model_the_catalog_lacks(tmp_path):
    write_project(tmp_path, {
        "train.py": ("import torch\nfrom transformers import AutoModelForCausalLM\n"
                     "model = AutoModelForCausalLM.from_pretrained('acme/secret-8b', torch_dtype=torch.bfloat16)\n"
                     "optimizer = torch.optim.AdamW(model.parameters())\n"
                     "for b in loader:\n    model(**b).loss.backward()\n    optimizer.step()\n"),
        "run.sh": "python train.py --max_seq_length 1024\n",
        "cfgfix.toml": 'gpu = "RTX A6000"\n[model]\nparams = 8.5e9\n'})
    found = _answer(tmp_path)
    assert found.high.shape.params == 8_500_000_000 and found.verdict == DOES_NOT_FIT
    assert any("[tool.cfgfix.model] params" in a for a in found.inputs.assumptions)
