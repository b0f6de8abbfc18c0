"""`cfgfix estimate [PATH]` with no model flags: the memory estimate of every launch of the
project, from its resolved training setup (`cfgfix explain` shows where each input came from)."""

from __future__ import annotations

import json

from cfgfix.memory.estimator import estimate, verdict


def project_estimates(setups, target_name: str | None):
    """(setup, MemoryInput, Estimate | None, Gpu | None, Verdict | None) per launch."""
    from cfgfix.memory.gpus import find_gpu
    from cfgfix.training.memory_setup import memory_input

    for setup in setups:
        name = target_name or setup.get("gpu")
        gpu = find_gpu(name) if name else None
        inputs = memory_input(setup)
        result = estimate(inputs.setup, inputs.shape) if inputs.shape is not None else None
        decision = verdict(result, gpu.usable_bytes, gpu.name) if result is not None and gpu is not None else None
        yield setup, inputs, result, gpu, decision


def exit_code(rows) -> int:
    """`estimate`'s exit code over the launches, as a CI gate reads it: 1 when a launch does
    not surely fit its GPU (the band's top over), else 2 when there is no launch or one was not
    estimated (the output says what is missing), else 0 (every launch fits, or there is no
    GPU to judge against)."""
    if any(d is not None and not (d.fits and d.certain) for *_, d in rows):
        return 1
    if not rows or any(result is None for _, _, result, _, _ in rows):
        return 2
    return 0


def render_text(rows, display, simulate: bool = False) -> str:
    from cfgfix.memory.render import render_text as render_one
    from cfgfix.memory.simulate_report import simulate_text

    out = []
    for setup, inputs, result, gpu, decision in rows:
        launch = setup.launch
        out.append(f"== {display(setup.launch_file)}:{launch.span.line}: {launch.launcher} {launch.script or launch.module or ''}".rstrip())
        if result is None:
            out.append(f"   not estimated: {inputs.model_problem}\n")
            continue
        if inputs.assumptions:
            out.append("   from the files, assumed: " + "; ".join(inputs.assumptions))
        if setup.trains is False:
            out.append("   note: the launched script shows no training step (backward(), a Trainer, "
                       "deepspeed.initialize); sized as if it trained")
        out.append(render_one(result, gpu.name if gpu else None, gpu.usable_bytes if gpu else None, decision))
        if simulate and getattr(setup, "composite", None) is not None:
            from cfgfix.training.custom_model import meta_comparison

            out.append(meta_comparison(setup.composite)[0])
        elif simulate:
            out.append(simulate_text(inputs.setup, inputs.setup.model, result.peak, inputs.shape))
    if not out:
        return "No training launch found.\n"
    return "\n".join(out)


def render_json(rows, display, simulate: bool = False) -> str:
    from cfgfix.memory.render import render_json as render_one
    from cfgfix.memory.simulate_report import simulate_json

    data = []
    for setup, inputs, result, gpu, decision in rows:
        entry = {
            "launch": {"path": display(setup.launch_file), "line": setup.launch.span.line,
                       "launcher": setup.launch.launcher, "script": setup.launch.script,
                       "module": setup.launch.module},
            "assumed": inputs.assumptions,
            "script_trains": setup.trains,
        }
        if result is None:
            entry["estimate"] = None
            entry["problem"] = inputs.model_problem
        else:
            entry["estimate"] = json.loads(render_one(result, gpu, decision))
            if simulate and getattr(setup, "composite", None) is not None:
                from cfgfix.training.custom_model import meta_comparison

                entry["meta_count"] = meta_comparison(setup.composite)[1]
            elif simulate:
                entry["simulation"] = simulate_json(inputs.setup, inputs.setup.model)
        data.append(entry)
    return json.dumps(data, indent=2) + "\n"
