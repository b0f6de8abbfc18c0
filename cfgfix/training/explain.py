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


def render_text(setups, display) -> str:
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
        out.append("")
    return "\n".join(out)


def _origin(value, display) -> str:
    if value is None:
        return ""
    if value.span is None:
        return value.origin
    return f"{value.origin} (line {value.span.line})"


def render_json(setups, display) -> str:
    return json.dumps([setup.to_dict(display) for setup in setups], indent=2, default=str) + "\n"
