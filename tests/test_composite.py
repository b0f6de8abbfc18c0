"""The script's own model class sized as the sum of its parts (issue 13, item 1): pretrained
backbones from the catalog or a config.json, standard torch layers from their constructor
arguments, unresolved parts listed, and the user's `[tool.cfgfix.model]` settings."""

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, lint_project, write_project
from test_training_setup import _setups

from cfgfix.memory.parts import torch_layer_params
from cfgfix.records import replace
from cfgfix.settings import SettingsError, load_settings
from cfgfix.training.memory_setup import memory_input

STORY = REPO / "fixtures" / "mm-encoder-8b" / "project"

LAYERS = [
    ("Linear", [1024, 3584], {}),
    ("Linear", [1024, 3584], {"bias": False}),
    ("Embedding", [32000, 512], {}),
    ("LayerNorm", [768], {}),
    ("LayerNorm", [768], {"bias": False}),
    ("Conv2d", [3, 64, 7], {"groups": 1}),
    ("Conv2d", [64, 64, 3], {"bias": False, "groups": 4}),
    ("MultiheadAttention", [512, 8], {}),
    ("TransformerEncoderLayer", [512, 8], {"dim_feedforward": 1024}),
    ("TransformerEncoderLayer", [256, 4], {"bias": False}),
    ("TransformerDecoderLayer", [256, 4], {"dim_feedforward": 512}),
    ("LSTM", [128, 256], {"num_layers": 2, "bidirectional": True}),
    ("GRU", [64, 32], {}),
    ("GELU", [], {}),
    ("GroupNorm", [8, 64], {}),
]


@pytest.mark.parametrize("kind,args,kwargs", LAYERS, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(LAYERS)])
def test_torch_layer_formulas_match_torch(kind, args, kwargs):
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        layer = getattr(torch.nn, kind)(*args, **kwargs)
    assert torch_layer_params(kind, list(args), dict(kwargs)) == sum(p.numel() for p in layer.parameters())


def test_unknown_dimension_is_none():
    assert torch_layer_params("Linear", [None, 10], {}) is None
    assert torch_layer_params("Frobnicator", [1], {}) is None


def _story_setup(root=STORY):
    return _setups(root)[0]


def test_story_is_sized_as_the_sum_of_its_parts():
    setup = _story_setup()
    sized = setup.composite
    parts = {p.name: p.params for p in sized.parts}
    # Qwen2.5-7B as AutoModel (no LM head), BERT-large with its pooler, CLIP ViT-L/14 from the
    # local config.json, and torch layers sized from the YAML and `self.text.config.hidden_size`
    assert parts == {"text": 7_070_619_136, "query": 335_141_888, "vision": 303_179_776, "query_proj": 3_673_600,
                     "vision_proj": 3_670_016, "fusion": 308_374_528, "norm": 7_168, "head": 3_673_090}
    assert not sized.unresolved
    inputs = memory_input(setup)
    assert inputs.shape.params == sum(parts.values())
    assert inputs.shape.family == "qwen2"  # the activation dimensions: the largest backbone's
    assert inputs.setup.head == "classification"
    # the other backbones keep their own activations: BERT at the run's 512 tokens, the ViT at
    # its 257 (16 x 16 patches + the class token)
    assert sorted((part.family, part.tokens) for part, _ in inputs.shape.other_parts) == [("bert", 0), ("clip_vision", 257)]
    result = __import__("cfgfix.memory.estimator", fromlist=["estimate"]).estimate(inputs.setup, inputs.shape)
    assert "other backbones bert" in result.component("activations").formula


def test_story_matches_a_meta_device_count():
    """The issue's check: the static sum within 10% of instantiating the class on the meta
    device (here: equal, part by part)."""
    pytest.importorskip("transformers")
    setup = _story_setup()
    cfg = __import__("yaml").safe_load((STORY / "configs" / "train.yaml").read_text())["model"]
    out = subprocess.run([sys.executable, "-m", "cfgfix.memory.meta_count", str(STORY / "model.py"), "MultimodalEncoder",
                          json.dumps({"args": [cfg]}), str(STORY)], capture_output=True, text=True, timeout=600,
                         check=False)
    meta = json.loads(out.stdout)
    assert "error" not in meta, meta
    static = {p.name: p.params for p in setup.composite.parts}
    assert static == meta["parts"]
    assert abs(setup.composite.shape.params - meta["params"]) <= 0.10 * meta["params"]


def test_story_gets_cfx701():
    _, _, result = lint_project(STORY)
    codes = [(f.code, f.path) for f in result.findings]
    assert ("CFX701", "scripts/train.sh") in codes
    message = next(f.message for f in result.findings if f.code == "CFX701")
    assert "MultimodalEncoder" in message and "8.03B" in message


def _copy(tmp_path):
    dest = tmp_path / "story"
    shutil.copytree(STORY, dest)
    return dest


def test_unresolved_part_is_listed_and_a_stated_size_fills_it(tmp_path):
    root = _copy(tmp_path)
    model = root / "model.py"
    text = model.read_text().replace(
        "        self.norm = nn.LayerNorm(hidden)\n",
        "        self.norm = nn.LayerNorm(hidden)\n        self.adapter = build_adapter(cfg)\n")
    model.write_text(text)
    inputs = memory_input(_story_setup(root))
    missing = [a for a in inputs.assumptions if "adapter" in a]
    assert missing and "not counted" in missing[0] and "[tool.cfgfix.model.modules] adapter" in missing[0]
    before = inputs.shape.params
    (root / "cfgfix.toml").write_text('gpu = "RTX A6000"\n[model.modules]\nadapter = 50_000_000\n')
    inputs = memory_input(_story_setup(root))
    assert not [a for a in inputs.assumptions if "adapter" in a]
    assert inputs.shape.params == before + 50_000_000


@pytest.mark.parametrize("edit", [
    lambda c: c.pop("num_hidden_layers"),  # a truncated or hand-edited config.json
    lambda c: c.update(num_hidden_layers="24"),
    lambda c: c.update(num_attention_heads=0),
])
def test_a_broken_part_config_is_an_unresolved_part_not_a_crash(tmp_path, edit):
    root = _copy(tmp_path)
    path = root / "models" / "vision_tower" / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    _, _, result = lint_project(root)
    assert not result.errors  # no rule stopped on it
    cfx701 = [f for f in result.findings if f.code == "CFX701"]
    assert cfx701 and "8.03B" not in cfx701[0].message  # sized without the tower


def test_a_config_json_missing_a_dimension_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128}))
    done = subprocess.run([sys.executable, "-m", "cfgfix", "estimate", "--model", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    if importlib.util.find_spec("transformers") is not None:
        # estimate completes it from transformers' LlamaConfig defaults, and says so (issue 21)
        assert done.returncode == 0, done.stderr
        assert "taken from transformers' llama configuration defaults: vocab_size 32000" in done.stdout
    else:
        assert done.returncode == 2
        assert "no 'vocab_size' in the config" in done.stderr
    assert "Traceback" not in done.stderr
    # a dimension transformers has no default for either stays a clear error
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "intermediate_size": "wide"}))
    done = subprocess.run([sys.executable, "-m", "cfgfix", "estimate", "--model", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_stated_whole_model_count_wins(tmp_path):
    root = _copy(tmp_path)
    (root / "cfgfix.toml").write_text('gpu = "RTX A6000"\n[model]\nparams = 8.5e9\n')
    inputs = memory_input(_story_setup(root))
    assert inputs.shape.params == 8_500_000_000
    assert "stated in the cfgfix settings" in inputs.shape.source


def test_a_module_stated_as_a_model_id(tmp_path):
    root = _copy(tmp_path)
    (root / "cfgfix.toml").write_text('gpu = "RTX A6000"\n[model.modules]\nquery = "google-bert/bert-base-uncased"\n')
    parts = {p.name: p.params for p in _story_setup(root).composite.parts}
    assert parts["query"] == 109_482_240


def test_frozen_parts_are_said_to_be_counted_as_trained(tmp_path):
    root = _copy(tmp_path)
    model = root / "model.py"
    model.write_text(model.read_text().replace(
        "        hidden = self.text.config.hidden_size\n",
        "        self.vision.requires_grad_(False)\n        hidden = self.text.config.hidden_size\n"))
    inputs = memory_input(_story_setup(root))
    assert any("frozen parts (vision, 0.303B) keep their weights but no gradients" in a for a in inputs.assumptions)
    assert inputs.setup.frozen_params == 303_179_776
    from cfgfix.memory.estimator import estimate

    frozen = estimate(inputs.setup, inputs.shape)
    trained = estimate(replace(inputs.setup, frozen_params=0), inputs.shape)
    # fp32 weights under autocast: 4 B of gradient and 8 B of AdamW state fewer per frozen weight
    assert trained.model_states - frozen.model_states == 12 * 303_179_776
    assert frozen.trainable_params == inputs.shape.params - 303_179_776


def test_unknown_backbone_id_is_a_listed_part(tmp_path):
    root = _copy(tmp_path)
    yaml_path = root / "configs" / "train.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("google-bert/bert-large-uncased", "someorg/mystery-encoder"))
    inputs = memory_input(_story_setup(root))
    assert any(a.startswith("MultimodalEncoder.query not counted: unknown model 'someorg/mystery-encoder'")
               for a in inputs.assumptions)


def test_class_in_the_script_and_module_list(tmp_path):
    root = tmp_path
    write_project(root, {
        "train.py": (
            "import torch\nfrom torch import nn\nfrom transformers import AutoModel, Trainer, TrainingArguments\n\n"
            "class Tower(nn.Module):\n"
            "    def __init__(self, width, depth=3):\n"
            "        super().__init__()\n"
            "        self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])\n\n"
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.lm = AutoModel.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
            "        self.tower = Tower(self.lm.config.hidden_size)\n"
            "        self.out = nn.Linear(self.lm.config.hidden_size * 2, 10)\n\n"
            "model = Net()\n"
            "Trainer(model=model, args=TrainingArguments(output_dir='o', bf16=True)).train()\n"),
        "run.sh": "torchrun --nproc_per_node 2 train.py\n",
    })
    parts = {p.name: p.params for p in _setups(root)[0].composite.parts}
    assert parts["tower"] == 3 * (896 * 896 + 896)
    assert parts["out"] == 896 * 2 * 10 + 10


@pytest.mark.parametrize("table,message", [
    ("[model]\nparams = -3\n", "'model.params' must be a parameter count"),
    ("[model]\nparams = true\n", "'model.params' must be a parameter count"),
    ("[model]\nsize = 3\n", "unknown key 'model.size'"),
    ("model = 3\n", "'model' in settings must be a table"),
    ("[model.modules]\nadapter = 0\n", "'model.modules.adapter' must be a parameter count"),
    ("[model]\nmodules = 5\n", "'model.modules' must be a table"),
])
def test_model_settings_are_validated(tmp_path, table, message):
    (tmp_path / "cfgfix.toml").write_text(table)
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(tmp_path)


def test_model_settings_in_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.cfgfix.model]\nparams = 8.5e9\n[tool.cfgfix.model.modules]\nfusion = 12\n')
    settings = load_settings(tmp_path)
    assert settings.model_params == 8_500_000_000
    assert settings.model_modules == (("fusion", 12),)


def test_fit_writes_into_the_yaml_the_trainer_arguments_come_from(tmp_path):
    """`TrainingArguments(**cfg["training"])`: `fix --fit` adds `deepspeed:` to that mapping
    (comments, quoting and key order kept) and creates the DeepSpeed JSON; the checkpointing
    the Trainer cannot switch on for a plain nn.Module is already in __init__ here."""
    from click.testing import CliRunner

    from cfgfix.commands import cli

    root = _copy(tmp_path)
    shutil.copy(REPO / "fixtures" / "mm-encoder-8b" / "fixed" / "model.py", root / "model.py")
    before = (root / "configs" / "train.yaml").read_text()
    cwd = __import__("os").getcwd()
    __import__("os").chdir(root)
    try:
        result = CliRunner().invoke(cli, ["fix", "--fit"])
    finally:
        __import__("os").chdir(cwd)
    assert "written:" in result.output, result.output
    after = (root / "configs" / "train.yaml").read_text()
    assert after == before + "  deepspeed: scripts/ds_zero2.json\n"
    config = json.loads((root / "scripts" / "ds_zero2.json").read_text())
    assert config["zero_optimization"]["stage"] == 2
    _, _, checked = lint_project(root)
    assert not [f for f in checked.findings if f.code == "CFX701"]


def test_fit_gives_trainer_checkpointing_of_a_plain_module_as_advice(tmp_path):
    from click.testing import CliRunner

    from cfgfix.commands import cli

    root = _copy(tmp_path)
    cwd = __import__("os").getcwd()
    __import__("os").chdir(root)
    try:
        result = CliRunner().invoke(cli, ["fix", "--fit", "--diff"])
    finally:
        __import__("os").chdir(cwd)
    assert "advice only: gradient_checkpointing = True (MultimodalEncoder is a plain nn.Module" in result.output
    assert "self.text.gradient_checkpointing_enable()" in result.output


def test_hostile_classes_are_sized_or_listed_without_stalling(tmp_path):
    """A million-layer comprehension is one sum, not a list; huge powers, a zero division,
    negative or boolean dimensions, self-recursion and indexing are unresolved parts, not errors."""
    write_project(tmp_path, {
        "train.py": (
            "from torch import nn\n\n"
            "class Weird(nn.Module):\n"
            "    def __init__(self, cfg, *args, depth=2, **kw):\n"
            "        super().__init__()\n"
            "        self.a = nn.Linear(cfg['x'] ** 100, 3)\n"
            "        self.b = nn.Linear(cfg['x'] / 0, 3)\n"
            "        self.c = nn.Linear(-5, 3)\n"
            "        self.d = Weird(cfg)\n"
            "        self.e = nn.Sequential(*[nn.Linear(4, 4) for _ in range(1_000_000_000)])\n"
            "        self.f = nn.Linear(2 ** 10, 4)\n"
            "        self.g = nn.Linear(True, 4)\n"
            "        self.h = [nn.Linear(2, 2)][5]\n"
            "        self.i = nn.Conv2d(3, 8, (3, 'x'))\n\n"
            "model = Weird({'x': 3})\nloss.backward()\n"),
        "run.sh": "python train.py\n",
    })
    sized = _setups(tmp_path)[0].composite
    parts = {p.name: p.params for p in sized.parts}
    assert parts["e"] == 1_000_000_000 * 20 and parts["f"] == 1024 * 4 + 4
    assert all(parts[name] is None for name in ("a", "b", "c", "g", "i"))


def test_estimate_simulate_compares_with_a_meta_device_count():
    pytest.importorskip("transformers")
    from click.testing import CliRunner

    from cfgfix.commands import cli

    cwd = __import__("os").getcwd()
    __import__("os").chdir(STORY)
    try:
        result = CliRunner().invoke(cli, ["estimate", "--simulate", "--output-format", "json"])
    finally:
        __import__("os").chdir(cwd)
    entry = json.loads(result.output)[0]
    assert entry["meta_count"]["params"] == entry["meta_count"]["static"] == 8_028_339_202
    assert entry["meta_count"]["error"] == 0.0


def test_from_config_parts_as_in_the_bench_composite(tmp_path):
    """bench/gpu_memory.py's composite pattern: towers built with `AutoModel.from_config` from
    a config loaded by `AutoConfig.from_pretrained` (here a local folder), sized like the
    pretrained parts; a config computed at run time is an unresolved part, not a silent zero."""
    write_project(tmp_path, {
        "bert/config.json": json.dumps({"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 4,
                                        "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 512,
                                        "max_position_embeddings": 512, "type_vocab_size": 2}),
        "train.py": (
            "from torch import nn\nfrom transformers import AutoConfig, AutoModel\n\n"
            "class Composite(nn.Module):\n"
            "    def __init__(self, path):\n"
            "        super().__init__()\n"
            "        cfg = AutoConfig.from_pretrained(path)\n"
            "        self.text = AutoModel.from_config(cfg)\n"
            "        self.other = AutoModel.from_config(cfg)\n"
            "        self.fuse = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size)\n"
            "        self.mixer = nn.TransformerEncoderLayer(d_model=cfg.hidden_size, nhead=8, dim_feedforward=4 * cfg.hidden_size)\n"
            "        self.odd = AutoModel.from_config(make_config())\n\n"
            "model = Composite('./bert')\nloss.backward()\n"),
        "run.sh": "python train.py\n",
    })
    sized = _setups(tmp_path)[0].composite
    parts = {p.name: p.params for p in sized.parts}
    from cfgfix.memory.shapes import shape_from_config

    tower = shape_from_config(json.loads((tmp_path / "bert" / "config.json").read_text())).params
    assert parts["text"] == parts["other"] == tower
    assert parts["fuse"] == 2 * 256 * 256 + 256
    assert parts["odd"] is None and "not known statically" in next(p.problem for p in sized.parts if p.name == "odd")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        config = transformers.AutoConfig.for_model(**json.loads((tmp_path / "bert" / "config.json").read_text()))
        built = transformers.AutoModel.from_config(config)
    assert sum(p.numel() for p in built.parameters()) == tower
