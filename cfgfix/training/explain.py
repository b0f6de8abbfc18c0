"""`cfgfix explain`: each launch's resolved training setup as a table (or JSON), with the
origin of every value, so a user can see which file set what before trusting a finding."""

from __future__ import annotations

import json

from cfgfix.training.resolve import LABELS, SETTINGS


def _shown(value) -> str:
    if value is None:
        return "unknown"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def _memory_lines(found) -> list[str]:
    """The launch's memory answer (training/memory_answer.py), as `estimate` gives it."""
    if found is None:
        return []
    if not found.estimated:
        return [f"  memory: not estimated ({found.problem})"]
    from cfgfix.training.fit import gib

    lines = [f"  memory: {gib(found.peak)} per GPU (range {found.range_text()})"
             + (f"; {found.text}" if found.text else "; no target GPU to judge against")]
    lines += [f"    open: {o.words}" for o in found.open]
    return lines


def render_text(setups, display, answers=()) -> str:
    if not setups:
        return "No training launch found (launch scripts, Makefiles, Dockerfiles, README shell blocks).\n"
    out: list[str] = []
    for setup in setups:
        launch = setup.launch
        head = f"{display(setup.launch_file)}:{launch.span.line}: {launch.launcher} {launch.script or launch.module or ''}".rstrip()
        out.append(head)
        for role, path in setup.files.items():
            out.append(f"  {role}: {display(path)}")
        rows = []
        for setting in SETTINGS:
            value = setup.values.get(setting)
            rows.append((LABELS[setting], _shown(value.value) if value else "unknown", _origin(value, display)))
        width = max(len(r[0]) for r in rows)
        value_width = min(max(len(r[1]) for r in rows), 40)
        for label, value, origin in rows:
            out.append(f"  {label:<{width}}  {value:<{value_width}}  {origin}".rstrip())
        out.extend(f"  conflict: {c}" for c in setup.conflicts)
        out.extend(_memory_lines(next((a for a in answers if a.training is setup), None)))
        out.append("")
    return "\n".join(out)


def _origin(value, display) -> str:
    if value is None:
        return ""
    if value.span is None:
        return value.origin
    return f"{value.origin} (line {value.span.line})"


def render_json(setups, display, answers=()) -> str:
    data = []
    for setup in setups:
        entry = setup.to_dict(display)
        found = next((a for a in answers if a.training is setup), None)
        if found is not None:
            entry["memory"] = found.to_dict() if found.estimated else {"verdict": None, "problem": found.problem}
        data.append(entry)
    return json.dumps(data, indent=2, default=str) + "\n"
