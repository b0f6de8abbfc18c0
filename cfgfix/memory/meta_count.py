"""Count a user's model class by building it on the meta device (no weights, no downloads):
`python -m cfgfix.memory.meta_count MODULE.py CLASS ARGS_JSON FOLDER...`, run in a subprocess
by `estimate --simulate` (it imports the user's module, as the simulator runs model code).

Every `from_pretrained(id)` is replaced by building the class from its config: a local
folder's `config.json`, else the cfgfix catalog's config for the id; an id neither knows
fails the count (nothing is downloaded). Prints one JSON object: {"params": N, "parts":
{attribute: N}} or {"error": "..."}.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys


def _config_for(model_id: str, folders: list[str]):
    from transformers import AutoConfig

    for base in folders:
        candidate = os.path.join(base, model_id)
        if os.path.isdir(candidate) and os.path.isfile(os.path.join(candidate, "config.json")):
            with open(os.path.join(candidate, "config.json"), encoding="utf-8") as f:
                data = json.load(f)
            return AutoConfig.for_model(data.pop("model_type"), **data)
    from cfgfix.memory.shapes import catalog_entry

    row = catalog_entry(model_id)
    if row is None or not isinstance(row.get("config"), dict) or "model_type" not in row["config"]:
        raise LookupError(f"{model_id}: no local config.json and not in the cfgfix catalog (nothing is downloaded)")
    data = dict(row["config"])
    return AutoConfig.for_model(data.pop("model_type"), **data)


def count(module_path: str, class_name: str, args: list, kwargs: dict, folders: list[str]) -> dict:
    import torch
    import transformers
    from transformers import PreTrainedModel

    def from_pretrained(cls, model_id, *unused, **options):
        config = _config_for(str(model_id), folders)
        if cls.__name__.startswith("Auto"):
            return cls.from_config(config)
        return cls(config)

    originals = {}
    for owner in [PreTrainedModel] + [getattr(transformers, n) for n in dir(transformers)
                                      if n.startswith("AutoModel") and hasattr(getattr(transformers, n), "from_pretrained")]:
        originals[owner] = owner.__dict__.get("from_pretrained")
        owner.from_pretrained = classmethod(from_pretrained)
    sys.path.insert(0, os.path.dirname(os.path.abspath(module_path)))
    spec = importlib.util.spec_from_file_location("_cfgfix_user_model", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        model = getattr(module, class_name)(*args, **kwargs)
    parts = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    return {"params": sum(p.numel() for p in model.parameters()), "parts": parts}


def main(argv: list[str]) -> int:
    module_path, class_name, raw = argv[:3]
    call = json.loads(raw)
    try:
        out = count(module_path, class_name, call.get("args", []), call.get("kwargs", {}), argv[3:])
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported, not raised
        out = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    from cfgfix.pool import die_with_parent

    die_with_parent(os.getppid())  # `estimate --simulate` killed: the user's module stops too
    raise SystemExit(main(sys.argv[1:]))
