"""The before/after table and the JSON document of `cfgfix verify`."""

from __future__ import annotations

import json
import math

from .verdict import COVERAGE, peak_bytes


def to_json(context: dict, before, after, verdict) -> str:
    """context: command, steps, mode ("fixes" or "revisions"), fixes/refs, left_out."""
    return json.dumps(context | {
        "runs": {"before": before.to_dict(), "after": after.to_dict() if after is not None else None},
        "verdict": verdict.to_dict(),
    }, indent=2, default=str) + "\n"


def to_text(context: dict, before, after, verdict) -> str:
    lines = [f"cfgfix verify: {' '.join(context['command'])}  ({context['steps']} optimizer steps)"]
    if context.get("picked"):
        lines.append(f"launch picked (no command given): {context['picked']}")
    if context.get("fixes") is not None:
        fixes = context["fixes"]
        lines.append(f"fixes applied to the patched copy: {len(fixes)}")
        lines += [f"  {f['path']}:{f['line']} {f['code']}{'' if f['safe'] else ' (unsafe)'}" for f in fixes]
    else:
        lines.append(f"revisions: before {context['before_ref']}, after {context['after_ref']}")
    if context.get("left_out"):
        lines.append("not copied: " + ", ".join(context["left_out"]))
    lines.append("")
    names = ("original", "patched") if context.get("fixes") is not None else ("before", "after")
    after_procs = after.processes if after is not None else []
    for i, b in enumerate(before.processes or [None]):
        a = after_procs[i] if i < len(after_procs) else None
        if len(before.processes) > 1:
            lines.append(f"rank {b['rank']}" if b and b.get("rank") is not None else f"process {i}")
        lines += _table(names, b, a, before, after, context.get("predicted"))
        lines.append("")
    if context.get("predicted"):
        guess = context["predicted"]
        lines += [(f"predicted: cfgfix's memory answer for this launch (`cfgfix estimate`), per process; "
                   f"on the {guess['gpu']}: {guess['text']}"), ""]
    note = tracing_note(before, after)
    if note:
        lines += [f"note: {note}", ""]
    lines += coverage_lines(context.get("coverage"), names)
    for run in (before, after):
        if run is None:
            continue
        for p in run.processes:
            if p.get("error"):
                lines.append(f"{run.label} ({_who(p)}) crashed:")
                lines += ["  " + t for t in p["error"]["traceback"].rstrip().splitlines()[-12:]]
            if p.get("stack"):
                lines.append(f"{run.label} ({_who(p)}) timed out; stuck at:")
                lines += ["  " + t for t in p["stack"].rstrip().splitlines()[:24]]
            for note in p.get("notes") or []:
                lines.append(f"{run.label} ({_who(p)}) note: {note}")
        if run.status == "no report" and run.started:
            lines.append(f"{run.label}: Python processes it started (none reported a training step):")
            lines += [f"  pid {p.get('pid')} ({p.get('role')}): {' '.join(str(a) for a in p.get('argv') or [])[:160]}" for p in run.started[:8]]
        if run.status in ("no report", "could not start") and run.output_tail:
            lines.append(f"{run.label}: output (last lines):")
            lines += ["  " + t for t in run.output_tail.rstrip().splitlines()[-12:]]
    lines.append(_verdict_text(verdict, "fix" if context.get("fixes") is not None else "change"))
    return "\n".join(lines) + "\n"


_PREDICTED = {"parameters": "parameters", "gradients": "gradients", "optimizer state": "optimizer"}


def _table(names, b, a, before, after, predicted=None) -> list[str]:
    rows = [("status", _status(b, before), _status(a, after) if after is not None else "not run")]
    for label, get in _ROWS:
        cells = (_cell(get, b), _cell(get, a))
        if cells != ("-", "-"):  # a measure neither run has (CUDA rows on a CPU)
            key = _SERIES_ROWS.get(label)
            change = compare_series(b.get(key), a.get(key)) if key and b and a else ""
            if predicted and label in _PREDICTED:
                cells = (*cells[:2], f"{_mib(predicted[_PREDICTED[label]])} predicted")
                rows.append((label, cells[0], f"{cells[1]}  {cells[2]}", change))
                continue
            rows.append((label, *cells, change))
    peak_b, peak_a = (peak_bytes(p) if p else None for p in (b, a))
    what = (peak_b or peak_a or ("not measured", 0))[0]
    change = ""
    if peak_b and peak_a and peak_b[0] == peak_a[0] and peak_b[1]:
        saved = peak_b[1] - peak_a[1]
        change = f"{-saved / 2**20:+.2f} MiB ({-saved / peak_b[1]:+.1%})"
    after_peak = _mib(peak_a[1]) if peak_a else "-"
    if predicted:
        after_peak += f"  {_mib(predicted['peak'])} predicted ({predicted['peak_device']})"
    rows.append((f"peak ({what})", _mib(peak_b[1]) if peak_b else "-", after_peak, change))
    width = max(len(r[0]) for r in rows)
    col = max(18, *(len(r[1]) for r in rows))
    out = [f"  {'':{width}}  {names[0]:{col}}  {names[1]}"]
    for row in rows:
        line = f"  {row[0]:{width}}  {row[1]:{col}}  {row[2]}"
        if len(row) > 3 and row[3]:
            line += f"  {row[3]}"
        out.append(line.rstrip())
    return out


def _status(p, run) -> str:
    if p is None:
        return run.status if run is not None else "-"
    return f"{p['status']} ({p['steps']}/{p.get('target_steps') or '?'} steps)"


def _cell(get, p) -> str:
    if p is None:
        return "-"
    try:
        value = get(p)
    except (KeyError, TypeError, IndexError):
        return "-"
    return "-" if value is None else value


def _secs(x):
    return None if x is None else f"{x:.3f} s"


def _mib(n):
    return None if n is None else f"{n / 2**20:.2f} MiB"


def _yes(x):
    return None if x is None else ("yes" if x else "NO")


SERIES_SHOWN = 6  # a longer series is summarised in the text; JSON has every value


def _floats(xs):
    if not xs:
        return None
    if len(xs) <= SERIES_SHOWN:
        return ", ".join(_num(x) for x in xs)
    return f"{len(xs)} values: first {_num(xs[0])}, last {_num(xs[-1])}"


def _num(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def compare_series(before, after) -> str:
    """How two series differ, value by value: identical, or the largest absolute and relative
    difference and how many values differ."""
    if not before or not after:
        return ""
    if len(before) != len(after):
        return f"{len(after)} values against {len(before)}"
    pairs = [(x, y) for x, y in zip(before, after) if x is not None and y is not None]
    differ = [(x, y) for x, y in pairs if x != y]
    if not differ and len(pairs) == len(before):
        return "identical"
    if not differ:
        return "identical where both measured"
    finite = [(x, y) for x, y in differ if math.isfinite(x) and math.isfinite(y)]
    if not finite:
        return f"{len(differ)} of {len(before)} differ (not finite)"
    abs_diff = max(abs(y - x) for x, y in finite)
    rel_diff = max(abs(y - x) / max(abs(x), 1e-12) for x, y in finite)
    return f"{len(differ)} of {len(before)} differ, max {abs_diff:.4g} ({rel_diff:.2%})"


_ROWS = [
    ("first step", lambda p: _secs(p["first_step_s"])),
    ("later steps (mean)", lambda p: _secs(p["later_step_mean_s"])),
    ("losses", lambda p: _floats(p["losses"])),
    ("losses finite", lambda p: _yes(p["losses_finite"])),
    ("grad norm before clip", lambda p: _floats(p["grad_norms"])),
    ("params finite", lambda p: _yes(p["params_finite"])),
    ("parameters", lambda p: _mib(p["state_bytes"]["params"])),
    ("gradients", lambda p: _mib(p["state_bytes"]["grads"])),
    ("optimizer state", lambda p: _mib(p["state_bytes"]["optimizer"])),
    ("buffers", lambda p: f'{p["state_bytes"]["buffers"]:,} B'),
    ("CUDA max reserved", lambda p: _mib(p["memory"].get("cuda_max_reserved_bytes"))),
    ("peak RSS (host)", lambda p: _mib(p["memory"].get("rss_peak_bytes"))),
]


def _who(p) -> str:
    return f"rank {p['rank']}" if p.get("rank") is not None else f"pid {p['pid']}"


_SERIES_ROWS = {"losses": "losses", "grad norm before clip": "grad_norms"}

VERDICT_WORDS = {
    "holds": "the {what} holds",
    "does not hold": "the {what} does NOT hold",
    "not exercised": "NOT EXERCISED: the runs agree, but changed lines did not run, so they prove nothing about them",
}


def _verdict_text(verdict, what: str = "fix") -> str:
    if not verdict.could_run:
        return f"verdict: could not verify: {verdict.reason}"
    lines = [f"verdict: {VERDICT_WORDS[verdict.state].format(what=what)} (exit {verdict.exit_code})"]
    for check in verdict.checks:
        mark = {True: "ok  ", False: "MISS" if check.name == COVERAGE else "FAIL", None: "skip"}[check.holds]
        lines.append(f"  {mark} {check.name}: {check.detail}")
    return "\n".join(lines)


def coverage_lines(change: dict | None, names) -> list[str]:
    """The changed statements and whether each ran."""
    if not change or not (change["units"] or change["other_files"]):
        return []
    units = [u for u in change["units"] if u["counts"]]
    out = [f"changed lines ({names[1]} copy; removed ones in the {names[0]}):"]
    for u in units:
        mark = {True: "ran    ", False: "NOT RUN", None: "-      "}[u["ran"]]
        where = f"{u['path']}:{_lines(u['lines'])}" + (" (removed)" if u["side"] == "before" else "")
        out.append(f"  {mark} {where}  {u['code']}")
        if u["ran"] is False and u.get("hint"):
            out.append(f"          {u['hint']}")
    for f in change["other_files"]:
        mark = {True: "read   ", False: "NOT READ", None: "-      "}[f["read"]]
        out.append(f"  {mark} {f['path']} (not Python: whether a process opened it)")
    out.append("")
    return out


def _lines(lines: list[int]) -> str:
    return f"{lines[0]}" if len(lines) == 1 else f"{lines[0]}-{lines[-1]}" if lines == list(range(lines[0], lines[-1] + 1)) else ",".join(map(str, lines))


def tracing_note(before, after) -> str:
    """What coverage recording costs the step times, when it costs something: sys.settrace
    (Python < 3.12) slows Python code, in both runs alike."""
    started = [p for run in (before, after) if run is not None for p in run.started]
    versions = sorted({p.get("python") for p in started if p.get("tracer") == "settrace" and p.get("python")})
    if not versions:
        return ""
    return (f"the changed lines were watched with sys.settrace (Python {', '.join(versions)}), which slows "
            f"Python code in both runs alike: compare the two runs' step times with each other, not with a "
            f"run outside verify (Python 3.12+ uses sys.monitoring, at no lasting cost)")
