"""A model built from parts: a user's `nn.Module` whose `__init__` loads pretrained backbones
and adds standard torch layers. Its size is the sum of its parts: each backbone's shape (the
catalog or its `config.json`) plus each torch layer's parameters, counted from the layer's
constructor arguments. Pure functions, no torch: the formulas follow the modules' own
`__init__` in torch/nn/modules (linear.py, sparse.py, normalization.py, conv.py,
activation.py MultiheadAttention, transformer.py), checked against torch on the meta device
in tests/test_composite.py.
"""

from __future__ import annotations

from cfgfix.memory.shapes import ModelShape
from cfgfix.records import dataclass, replace


@dataclass(frozen=True)
class Part:
    """One attribute of the user's model: `self.text = AutoModel.from_pretrained(...)`,
    `self.fusion = nn.TransformerEncoder(...)`. `params` is None when it could not be sized
    (then `problem` says why)."""

    name: str  # the attribute (`text`, `fusion`)
    what: str  # "Qwen/Qwen2.5-7B (catalog)", "nn.Linear(1024, 3584)"
    params: int | None
    shape: ModelShape | None = None  # a pretrained backbone's shape
    frozen: bool = False  # requires_grad_(False) in __init__
    problem: str | None = None
    stated: bool = False  # the size comes from the user's settings ([tool.cfgfix.model])


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def torch_layer_params(kind: str, args: list, kwargs: dict) -> int | None:
    """Parameters of one standard torch layer from its constructor arguments, None when an
    argument it needs is unknown or the layer is not one of these. `args`/`kwargs` hold
    Python values (ints, bools, floats) or None for what could not be resolved."""
    def arg(index: int, name: str, default=None):
        if name in kwargs:
            return kwargs[name]
        return args[index] if index < len(args) else default

    def flag(index: int, name: str, default: bool) -> bool | None:
        value = arg(index, name, default)
        return value if isinstance(value, bool) else None

    if kind in PARAMETER_FREE:
        return 0
    if kind == "Linear":  # weight out x in, bias out
        fin, fout, bias = _int(arg(0, "in_features")), _int(arg(1, "out_features")), flag(2, "bias", True)
        if None in (fin, fout, bias):
            return None
        return fin * fout + (fout if bias else 0)
    if kind == "Bilinear":
        a, b, out, bias = _int(arg(0, "in1_features")), _int(arg(1, "in2_features")), _int(arg(2, "out_features")), flag(3, "bias", True)
        if None in (a, b, out, bias):
            return None
        return a * b * out + (out if bias else 0)
    if kind == "Embedding":
        n, d = _int(arg(0, "num_embeddings")), _int(arg(1, "embedding_dim"))
        return None if None in (n, d) else n * d
    if kind in ("LayerNorm", "RMSNorm"):
        shape = arg(0, "normalized_shape")
        size = _numel(shape)
        affine = flag(2, "elementwise_affine", True)
        bias = flag(3, "bias", True) if kind == "LayerNorm" else False
        if size is None or affine is None or bias is None:
            return None
        return size * (1 + bool(bias)) if affine else 0
    if kind in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm"):
        channels = _int(arg(1, "num_channels")) if kind == "GroupNorm" else _int(arg(0, "num_features"))
        affine = flag(2, "affine", True)
        return None if channels is None or affine is None else (2 * channels if affine else 0)
    if kind in ("Conv1d", "Conv2d", "Conv3d"):
        cin, cout = _int(arg(0, "in_channels")), _int(arg(1, "out_channels"))
        k = arg(2, "kernel_size")
        dims = int(kind[4])
        kernel = _numel(k if isinstance(k, (list, tuple)) else ([k] * dims if _int(k) is not None else None))
        groups, bias = _int(arg(6, "groups", 1)), flag(7, "bias", True)
        if None in (cin, cout, kernel, groups, bias) or groups == 0:
            return None
        return cout * (cin // groups) * kernel + (cout if bias else 0)
    if kind == "MultiheadAttention":  # in_proj 3E x E (+3E), out_proj E x E (+E)
        e, bias = _int(arg(0, "embed_dim")), flag(3, "bias", True)
        kdim, vdim = arg(6, "kdim"), arg(7, "vdim")
        if e is None or bias is None or kdim not in (None, e) or vdim not in (None, e):
            return None if e is None or bias is None else e * e + e * (_int(kdim) or e) + e * (_int(vdim) or e) + (4 * e if bias else 0) + e * e
        return 4 * e * e + (4 * e if bias else 0)
    if kind in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
        d, ff = _int(arg(0, "d_model")), _int(arg(2, "dim_feedforward", 2048))
        bias = flag(99, "bias", True)
        if None in (d, ff, bias):
            return None
        attention = 4 * d * d + (4 * d if bias else 0)
        feedforward = 2 * d * ff + ((ff + d) if bias else 0)
        norms = 2 * d if bias else d
        if kind == "TransformerDecoderLayer":  # self- and cross-attention, three norms
            return 2 * attention + feedforward + 3 * norms
        return attention + feedforward + 2 * norms
    if kind in ("LSTM", "GRU", "RNN"):
        fin, h = _int(arg(0, "input_size")), _int(arg(1, "hidden_size"))
        layers, bias = _int(arg(2, "num_layers", 1)), flag(3 if kind != "RNN" else 4, "bias", True)
        bidir = flag(6 if kind != "RNN" else 7, "bidirectional", False)
        if None in (fin, h, layers, bias, bidir):
            return None
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
        directions = 2 if bidir else 1
        total = 0
        for layer in range(layers):
            width = fin if layer == 0 else h * directions
            total += directions * (gates * h * (width + h) + (2 * gates * h if bias else 0))
        return total
    return None


def _numel(shape) -> int | None:
    if _int(shape) is not None:
        return shape
    if isinstance(shape, (list, tuple)) and shape and all(_int(x) is not None for x in shape):
        total = 1
        for x in shape:
            total *= x
        return total
    return None


# Layers without parameters (activations, dropout, pooling, reshaping).
PARAMETER_FREE = frozenset({
    "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Mish", "LeakyReLU", "ELU", "Hardswish",
    "Dropout", "Dropout1d", "Dropout2d", "Identity", "Flatten", "Unflatten", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "AvgPool1d", "AvgPool2d", "MaxPool1d", "MaxPool2d", "Upsample", "CrossEntropyLoss", "MSELoss",
})
# Containers whose parameters are their children's.
CONTAINERS = frozenset({"Sequential", "ModuleList"})
TORCH_LAYERS = frozenset({
    "Linear", "Bilinear", "Embedding", "LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm",
    "Conv1d", "Conv2d", "Conv3d", "MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer",
    "LSTM", "GRU", "RNN",
}) | PARAMETER_FREE


def composite_shape(parts: list[Part], source: str, checkpointed: frozenset = frozenset()) -> ModelShape:
    """The shape of a model made of `parts`: its parameter count is their sum; the activation
    dimensions are those of the largest pretrained part, and the other backbones' activations
    are added to it (`other_parts`, with whether `checkpointed` names them); the torch layers
    between them keep activations that are not counted. The largest single module is the
    largest among the parts (ZeRO-3's gathered layer)."""
    sized = [p for p in parts if p.params is not None]
    total = sum(p.params for p in sized)
    backbones = [p for p in sized if p.shape is not None and p.shape.family != "params"]
    largest_module = max([p.shape.largest_module_params for p in backbones] + [p.params for p in sized if p.shape is None] + [0])
    notes = ("activations: every pretrained backbone's; the torch layers between them are not counted",)
    if backbones:
        main = max(backbones, key=lambda p: p.params)
        others = tuple((p.shape, p.name in checkpointed) for p in backbones if p is not main and p.shape.family != "unet")
        return replace(main.shape, params=total, largest_module_params=largest_module, source=source,
                       notes=main.shape.notes + notes, other_parts=others)
    return ModelShape(family="params", params=total, largest_module_params=largest_module, source=source, notes=notes)
