"""The memory answer (training/memory_answer.py) of the launch `verify` runs, as its
predicted column: the parameters, gradients and optimizer states the estimate counts (what
the harness measures as state bytes, on any device) and the peak on the run's device.

Only for a project with a target GPU (the answer's verdict is against it) and one launch
that the command names: a launch script run with bash, or the training script itself."""

from __future__ import annotations

import os
from pathlib import Path


def predicted(folder: Path, command: list[str], device: str) -> dict | None:
    """{"gpu", "text", "parameters", "gradients", "optimizer", "peak", "peak_device"} or None."""
    from cfgfix.engine import Engine
    from cfgfix.settings import load_settings
    from cfgfix.training.memory_answer import answers
    from cfgfix.workspace import discover

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        settings = load_settings(folder)
        if not getattr(settings, "gpu", None):
            return None
        engine = Engine(settings, use_cache=False)
        files, _ = discover([Path(".")], settings)
        engine.run(files)
        found = [a for a in answers(engine.project) if a.estimated and a.gpu is not None and _named(a.training, command, folder)]
    finally:
        os.chdir(cwd)
    if len(found) != 1:
        return None
    return _figures(found[0], device)


def _named(setup, command: list[str], folder: Path) -> bool:
    named = {os.path.normpath(os.path.join(folder, word)) for word in command if word.endswith((".sh", ".bash", ".py"))}
    return bool(named & {os.path.normpath(str(setup.launch_file)), os.path.normpath(str(setup.script or ""))})


def _figures(found, device: str) -> dict:
    from cfgfix.memory.estimator import estimate
    from cfgfix.records import replace

    result = found.high
    sizes = {c.name: c.size for c in result.components}
    frozen = sum(params * nbytes for _, params, nbytes in result.setup.frozen)
    on_device = result if device == "cuda" else estimate(replace(result.setup, device="cpu"), result.shape)
    return {"gpu": found.gpu.name, "text": found.text, "parameters": sizes["weights"] - frozen,
            "gradients": sizes["gradients"], "optimizer": sizes["optimizer_states"] + sizes["master_weights"],
            "peak": on_device.peak, "peak_device": device}
