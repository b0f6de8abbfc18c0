"""`cfgfix estimate [PATH]` with no model flags: the memory estimate of every launch of the
project, from its resolved training setup (`cfgfix explain` shows where each input came from)."""

from __future__ import annotations

import json


def project_answers(groups) -> list:
    """The memory answer (training/memory_answer.py) of every launch of [(project, setups)]."""
    from cfgfix.training.memory_answer import answer_for

    return [answer_for(project, setup) for project, setups in groups for setup in setups]


def exit_code(rows) -> int:
    """`estimate`'s exit code over the launches, as a CI gate reads it: 1 when a launch does
    not surely fit its GPU (does not fit, or fits only under a condition), else 2 when there
    is no launch or one was not estimated (the output says what is missing), else 0 (every
    launch fits, or there is no GPU to judge against)."""
    from cfgfix.training.memory_answer import FITS

    if any(a.verdict is not None and a.verdict != FITS for a in rows):
        return 1
    if not rows or any(not a.estimated for a in rows):
        return 2
    return 0


def render_text(rows, display, simulate: bool = False) -> str:
    out = []
    for found in rows:
        setup = found.training
        launch = setup.launch
        out.append(f"== {display(setup.launch_file)}:{launch.span.line}: {launch.launcher} {launch.script or launch.module or ''}".rstrip())
        if found.high is None:
            out.append(f"   not estimated: {found.problem}\n")
            continue
        out.extend(answer_lines(found, "from the files"))
        if setup.trains is False:
            out.append("   note: the launched script shows no training step (backward(), a Trainer, "
                       "deepspeed.initialize); sized as if it trained")
        out.append(answer_body(found, simulate))
    if not out:
        return "No training launch found.\n"
    return "\n".join(out)


def answer_lines(found, where: str) -> list[str]:
    """The lines above one answer's breakdown: what was assumed (`where`: "from the files",
    "from the flags") and the inputs left open, with the least-memory end."""
    out = []
    if found.inputs.assumptions:
        out.append(f"   {where}, assumed: " + "; ".join(found.inputs.assumptions))
    for item in found.open:
        out.append(f"   open: {item.words}")
    if found.open:
        out.append(f"   the figures below are at the most-memory end; at the least-memory end the peak is "
                   f"{found.low.peak / 1024**3:.2f} GiB (range {found.range_text()})")
    return out


def answer_body(found, simulate: bool = False) -> str:
    """One answer's breakdown, bar and verdict (memory/render.py), then the simulator's step
    or, for a model built from parts, the meta-device count."""
    from cfgfix.memory.render import render_text as render_one
    from cfgfix.memory.simulate_report import simulate_text

    inputs, result, gpu = found.inputs, found.high, found.gpu
    text = render_one(result, gpu.name if gpu else None, gpu.usable_bytes if gpu else None, _shown(found))
    composite = getattr(found.training, "composite", None)
    if simulate and composite is not None:
        from cfgfix.training.custom_model import meta_comparison

        text += "\n" + meta_comparison(composite)[0]
    elif simulate:
        from cfgfix.training.memory_answer import as_simulated

        text += "\n" + simulate_text(as_simulated(inputs.setup), inputs.setup.model, result.peak, inputs.shape)
    return text


def render_json(rows, display, simulate: bool = False) -> str:
    data = []
    for found in rows:
        setup = found.training
        entry = {
            "launch": {"path": display(setup.launch_file), "line": setup.launch.span.line,
                       "launcher": setup.launch.launcher, "script": setup.launch.script,
                       "module": setup.launch.module},
            "assumed": found.assumed,
            "script_trains": setup.trains,
        }
        if found.high is None:
            entry["estimate"] = None
            entry["problem"] = found.problem
        else:
            entry.update(answer_json(found, simulate))
        data.append(entry)
    return json.dumps(data, indent=2) + "\n"


def answer_json(found, simulate: bool = False) -> dict:
    """One answer as JSON: the breakdown at the most-memory end ("estimate", memory/render.py),
    the answer's verdict and ranges ("answer"), and the simulator's step or the meta count."""
    from cfgfix.memory.render import render_json as render_one
    from cfgfix.memory.simulate_report import simulate_json

    inputs = found.inputs
    entry = {"estimate": json.loads(render_one(found.high, found.gpu, _shown(found))), "answer": found.to_dict()}
    composite = getattr(found.training, "composite", None)
    if simulate and composite is not None:
        from cfgfix.training.custom_model import meta_comparison

        entry["meta_count"] = meta_comparison(composite)[1]
    elif simulate:
        from cfgfix.training.memory_answer import as_simulated

        entry["simulation"] = simulate_json(as_simulated(inputs.setup), inputs.setup.model)
    return entry


def _shown(found):
    """The answer's verdict in the estimator's `Verdict` form, for the shared renderers."""
    from cfgfix.memory.estimator import Verdict
    from cfgfix.training.memory_answer import DOES_NOT_FIT, FITS

    if found.verdict is None:
        return None
    usable = found.gpu.usable_bytes
    return Verdict(found.verdict == FITS, found.verdict in (FITS, DOES_NOT_FIT), usable - found.peak, usable, found.text)
