"""The pull-request comment of `cfgfix verify --post` / `--comment-file`: one comment per pull
request, found again by its hidden marker and updated in place.

The comment holds one section per kind of run, each between its own markers: `change` (the
pull request's own change, `--before BASE --after HEAD`) and `fixes` (cfgfix's suggested
fixes applied to the head, `verify` without --before/--after). A run replaces its own
section and keeps the other one when it belongs to the same head commit, so a job that runs
both gets one comment with both; a section from an older head commit is dropped.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from .report import compare_series, tracing_note
from .verdict import COVERAGE, peak_bytes

MARKER = "<!-- cfgfix-verify -->"
SECTIONS = ("change", "fixes")
TITLES = {"change": "The pull request's change", "fixes": "cfgfix's suggested fixes"}
_SECTION = re.compile(r"<!-- cfgfix-verify:section=(\w+) head=(\w*) -->\n(.*?)<!-- /cfgfix-verify:section=\1 -->\n?", re.DOTALL)
_STATE = {
    "holds": "✅ holds",
    "does not hold": "❌ does not hold",
    "not exercised": "⚠️ not exercised: the changed lines did not all run",
    "could not run": "⛔ could not verify",
    "nothing to verify": "➖ nothing to verify",
}
SERIES_SHOWN = 6


def section_name(context: dict) -> str:
    return "fixes" if context.get("fixes") is not None else "change"


def render_section(context: dict, before, after, verdict, nothing: str = "") -> str:
    """The markdown of one run (without its section markers)."""
    state = "nothing to verify" if verdict is None else verdict.state
    name = section_name(context)
    lines = [f"#### {TITLES[name]}: {_STATE[state]}", ""]
    lines.append(_summary_line(context, before, after))
    lines.append("")
    if verdict is None:
        lines.append(nothing)
        return "\n".join(lines) + "\n"
    if context.get("fixes"):
        lines.append("Fixes applied: " + ", ".join(
            f"`{f['code']}` {f['path']}:{f['line']}{'' if f['safe'] else ' (unsafe)'}" for f in context["fixes"]))
        lines.append("")
    if not verdict.could_run:
        lines += [f"**Could not verify:** {_escape(verdict.reason)}", ""]
    names = ("original", "patched") if name == "fixes" else ("base", "head")
    after_processes = after.processes if after is not None else []
    for i, b in enumerate(before.processes):
        a = after_processes[i] if i < len(after_processes) else None
        if len(before.processes) > 1:
            lines += [f"**{_who(b, i)}**", ""]
        lines += _table(names, b, a)
        lines.append("")
    note = tracing_note(before, after)
    if note:
        lines += [f"<sub>Note: {_escape(note)}.</sub>", ""]
    lines += _coverage(context.get("coverage"))
    if verdict.checks:
        lines.append("<details><summary>Checks</summary>")
        lines.append("")
        for check in verdict.checks:
            mark = {True: "✅", False: "⚠️" if check.name == COVERAGE else "❌", None: "➖"}[check.holds]
            lines.append(f"- {mark} **{check.name}**: {_escape(check.detail)}")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _summary_line(context: dict, before, after) -> str:
    parts = [f"`{_code(' '.join(context['command']))}`", f"{context['steps']} optimizer steps"]
    parts.append(_device(before, after))
    if context.get("before_commit"):
        parts.append(f"base `{context['before_commit'][:12]}` → head `{context['after_commit'][:12]}`")
    if context.get("picked"):
        parts.append("launch picked: " + _escape(context["picked"]))
    return " · ".join(parts)


def _device(before, after) -> str:
    processes = [p for run in (before, after) if run is not None for p in run.processes]
    names = sorted({p.get("device_name") for p in processes if p.get("device_name")})
    if any(p.get("device") == "cuda" for p in processes):
        return "CUDA" + (f" ({', '.join(names)})" if names else "")
    return "CPU run" if processes else "no process reported"


def _table(names, b: dict, a: dict | None) -> list[str]:
    rows = [("status", _status(b), _status(a), "")]
    rows.append(("time per step (mean after the first)", _secs(_step_time(b)), _secs(_step_time(a)),
                 _percent(_step_time(b), _step_time(a))))
    rows.append(("first step (with warm-up)", _secs(b.get("first_step_s")), _secs((a or {}).get("first_step_s")),
                 _percent(b.get("first_step_s"), (a or {}).get("first_step_s"))))
    for label, key in (("losses", "losses"), ("gradient norms (before clipping)", "grad_norms")):
        rows.append((label, _series(b.get(key)), _series((a or {}).get(key)),
                     compare_series(b.get(key), a.get(key)) if a else ""))
    pb, pa = peak_bytes(b), peak_bytes(a) if a else None
    what = (pb or pa or ("not measured", 0))[0]
    change = ""
    if pb and pa and pb[0] == pa[0] and pb[1]:
        change = f"{(pa[1] - pb[1]) / 2**20:+.2f} MiB ({(pa[1] - pb[1]) / pb[1]:+.1%})"
    rows.append((f"peak memory ({what})", _mib(pb), _mib(pa), change))
    out = [f"| | {names[0]} | {names[1]} | change |", "|---|---|---|---|"]
    out += [f"| {label} | {x} | {y} | {z} |" for label, x, y, z in rows if (x, y) != ("-", "-")]
    return out


def _coverage(change: dict | None) -> list[str]:
    if not change or not (change["units"] or change["other_files"]):
        return []
    units = [u for u in change["units"] if u["counts"]]
    ran = sum(1 for u in units if u["ran"])
    out = [f"**Changed lines**: {ran} of {len(units)} changed statement{'s' if len(units) != 1 else ''} ran", ""]
    for u in units:
        mark = {True: "✅", False: "⚠️", None: "➖"}[u["ran"]]
        where = f"{u['path']}:{u['lines'][0]}" + (f"-{u['lines'][-1]}" if len(u["lines"]) > 1 else "")
        line = f"- {mark} `{where}`{' (removed)' if u['side'] == 'before' else ''} `{_code(u['code'])}`"
        if u["ran"] is False and u.get("hint"):
            line += f": {_escape(u['hint'])}"
        out.append(line)
    for f in change["other_files"]:
        mark = {True: "✅", False: "⚠️", None: "➖"}[f["read"]]
        out.append(f"- {mark} `{f['path']}` ({'read by the launch' if f['read'] else 'not opened by the launch'}; not Python, lines not traced)")
    out.append("")
    return out


def _step_time(p: dict | None):
    if not p:
        return None
    return p.get("later_step_mean_s") if p.get("later_step_mean_s") is not None else p.get("first_step_s")


def _status(p: dict | None) -> str:
    if p is None:
        return "not run"
    return f"{p['status']} ({p['steps']}/{p.get('target_steps') or '?'})"


def _secs(x) -> str:
    return "-" if x is None else f"{x:.3f} s"


def _percent(x, y) -> str:
    return f"{(y - x) / x:+.1%}" if x and y is not None else ""


def _mib(peak) -> str:
    if peak is None:
        return "-"
    return f"{peak[1] / 2**20:.2f} MiB" if peak[1] >= 2**20 else f"{peak[1] / 2**10:.1f} KiB"


def _series(xs) -> str:
    if not xs:
        return "-"
    fmt = lambda x: "-" if x is None else f"{x:.4f}"
    if len(xs) <= SERIES_SHOWN:
        return ", ".join(fmt(x) for x in xs)
    return f"{len(xs)} values: {fmt(xs[0])} … {fmt(xs[-1])}"


def _who(p: dict, i: int) -> str:
    return f"rank {p['rank']}" if p.get("rank") is not None else f"process {i}"


def _code(text: str) -> str:
    # a changed line that holds `<!--` must not open a marker of this comment's sections
    return text.replace("`", "'").replace("\n", " ").replace("<!--", "<!-\u200b-")


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


# -- the whole comment ----------------------------------------------------------------------------
def merge(existing: str | None, name: str, head: str, section: str) -> str:
    """The comment with this run's section in place of its earlier one; the other section is
    kept when it is for the same head commit."""
    sections = {}
    for match in _SECTION.finditer(existing or ""):
        other, other_head, text = match.group(1), match.group(2), match.group(3)
        if other != name and other in SECTIONS and (other_head == head or not head):
            sections[other] = (other_head, text)
    sections[name] = (head, section)
    body = [MARKER, "### cfgfix verify", ""]
    for key in SECTIONS:
        if key in sections:
            section_head, text = sections[key]
            body.append(f"<!-- cfgfix-verify:section={key} head={section_head} -->\n{text.rstrip()}\n<!-- /cfgfix-verify:section={key} -->")
            body.append("")
    body.append("<sub>Real training steps run by `cfgfix verify` on this job's runner. "
                "Exit codes: 0 holds, 1 does not hold, 2 could not run, 3 not exercised.</sub>")
    return "\n".join(body) + "\n"


def head_commit(context: dict, environ=os.environ) -> str:
    """The commit the comment speaks for: the --after revision, else the pull request's head."""
    if context.get("after_commit"):
        return context["after_commit"]
    from cfgfix.review.post import event_head_sha

    sha = event_head_sha(environ)
    if sha:
        return sha
    import subprocess

    done = subprocess.run(["git", "-C", context["folder"], "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def publish(options, context: dict, before, after, verdict, err=None, nothing: str = "") -> bool:
    """Write the comment to --comment-file and post it with --post. False when posting failed."""
    err = err or sys.stderr
    name = section_name(context)
    head = re.sub(r"\W", "", head_commit(context))
    section = render_section(context, before, after, verdict, nothing)
    if options.comment_file is not None:
        path = Path(options.comment_file)
        try:
            existing = path.read_text(encoding="utf-8") if path.is_file() else None
        except OSError:
            existing = None
        body = merge(existing if existing and MARKER in existing else None, name, head, section)
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            err.write(f"cfgfix: error: cannot write the comment to {path}: {exc.strerror or exc}\n")
            return False
        err.write(f"cfgfix verify: wrote the pull-request comment to {path}\n")
    if not options.post:
        return True
    from cfgfix.review.post import Client, PostError, target_from_env, upsert_comment

    try:
        client = Client(target_from_env(options.pr), log=lambda m: err.write(f"cfgfix: {m}\n"))
        done = upsert_comment(client, MARKER, lambda existing: merge(existing, name, head, section))
    except PostError as exc:
        err.write(f"cfgfix: error: posting the verification comment failed: {exc}\n")
        return False
    err.write(f"cfgfix verify: {done}\n")
    return True
