"""`cfgfix fix --fit`: for each launch that does not fit its target GPU, write the cheapest
plan that does (see `fit.py`) into the launch's files, with minimal edits.

Every edit is applied in memory first; the edited files must still parse, and the launch's
setup, resolved again from the edited files, must hold exactly the planned values. Only then
are files written (atomically), or, with `--diff`, shown. A step that cannot be written (an
optimizer built in code, a plain script with no DeepSpeed config to edit) is printed as
advice, and nothing of that launch is written: half a plan would not fit either.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

from cfgfix.fixing import apply_edits, create_atomically, sound, write_atomically
from cfgfix.records import dataclass, field
from cfgfix.training.fit import gib


@dataclass
class LaunchPlan:
    setup: object
    lines: list[str] = field(default_factory=list)
    edits: list = field(default_factory=list)
    created: dict[str, str] = field(default_factory=dict)
    written: list[tuple[str, object]] = field(default_factory=list)  # (setting, value) to check
    writable: bool = True
    estimated: bool = True  # False: no budget (no GPU, no training step, unknown model size)


def plan_launches(project, setups) -> list[LaunchPlan]:
    """Each launch's plan as its memory answer (training/memory_answer.py) holds it: made
    for the most-memory end of what the files leave open, and judged again after it."""
    from cfgfix.training.memory_answer import FITS, answer_for
    from cfgfix.training.write_setup import SetupWriter

    plans = []
    for setup in setups:
        head = f"{project.display(setup.launch_file)}:{setup.launch.span.line}: {setup.launch.launcher} {setup.launch.script or setup.launch.module}"
        launch_plan = LaunchPlan(setup, [head])
        plans.append(launch_plan)
        found = answer_for(project, setup)
        if found.plan is None:
            why = ("no target GPU (set `gpu` in [tool.cfgfix] or pass --gpu)" if found.gpu is None and setup.get("gpu") is None
                   else f"unknown GPU {setup.get('gpu')!r}" if found.gpu is None
                   else "the script shows no training step (backward(), a Trainer, deepspeed.initialize)"
                   if found.estimated else f"the model's size is unknown ({found.problem})")
            launch_plan.lines.append(f"  not estimated: {why}")
            launch_plan.writable = False
            launch_plan.estimated = False
            continue
        plan = found.plan
        launch_plan.lines.append(f"  now: {gib(found.peak)} per GPU (range {found.range_text()}); {found.text}")
        launch_plan.lines.extend(f"  open: {o.words}" for o in found.open)
        if not plan.rungs:
            launch_plan.lines.append("  nothing to change" if found.verdict == FITS
                                     else "  nothing in the ladder lowers the peak further (CFX702)" if not plan.fits
                                     else "  nothing to change in the config; state what is open above to settle it")
            launch_plan.writable = False
            continue
        if not plan.fits:
            launch_plan.lines.append(f"  even the whole ladder leaves {gib(plan.after.peak)} per GPU: nothing written (CFX702)")
            launch_plan.writable = False
            continue
        writer = SetupWriter(project, setup)
        final: dict = {}  # a later rung's value replaces an earlier one (micro batch 2, then 1)
        for rung in plan.rungs:
            launch_plan.lines.append(f"  + {rung.name}: {gib(rung.estimate.peak)} per GPU (cost: {rung.cost})")
            final.update(rung.settings)
        for setting, value in final.items():
            writer.reason = None
            change = writer.set(setting, value)
            if change is None:
                why = writer.reason or "no file of this launch states it in a form cfgfix can edit"
                launch_plan.lines.append(f"      advice only: {setting} = {value} ({why})")
                launch_plan.writable = False
                continue
            launch_plan.edits.extend(change.edits)
            launch_plan.created.update(change.created)
            launch_plan.written.append((setting, value))
            launch_plan.lines.extend(f"      {where}" for where in change.where)
        after = plan.after
        launch_plan.lines.append(f"  after: {gib(after.peak)} per GPU; {found.plan_verdict[2]}"
                                 + (f"; host RAM {gib(after.cpu_bytes)}" if after.cpu_bytes else ""))
        launch_plan.lines.extend(f"  {line}" for line in plan_notes(found))
    return plans


def plan_notes(found) -> list[str]:
    """What a plan needs besides GPU memory, and a cheaper road it leaves out: the host RAM
    offload holds and what every rank loads before sharding; QLoRA instead of ZeRO-3 on
    cards without NVLink."""
    from cfgfix.training.fit import pcie_only, what_would_fit

    plan, notes = found.plan, []
    after = plan.after.setup
    ranks = after.num_gpus
    if plan.after.cpu_bytes:
        notes.append(f"host RAM: the offloaded states take {gib(plan.after.cpu_bytes)} per node; check the machine has "
                     "it free besides the data loaders")
    integrated = found.training.trainer or found.training.launch.launcher == "accelerate"
    if ranks > 1 and (after.offload_optimizer or after.offload_params) and not (after.zero_stage == 3 and integrated):
        per_rank = plan.before.shape.params * (2 if after.weights in ("bf16", "fp16") else 4)
        notes.append(f"host RAM at load: each of the {ranks} processes loads the whole model before it is sharded, "
                     f"about {ranks} x {gib(per_rank)} = {gib(ranks * per_rank)} (only ZeRO-3's `zero.Init`, which the HF "
                     "integrations apply under a ZeRO-3 config, loads each rank's shard instead)")
    keys = [r.key for r in plan.rungs]
    if pcie_only(found.gpu) and "zero3" in keys and after.lora_rank is None:
        ideas = what_would_fit(plan.before.setup, plan.before.shape, found.gpu)
        qlora = [i for i in ideas if "LoRA" in i]
        if qlora:
            notes.append(f"consider: {qlora[0]} fits without ZeRO-3's PCIe traffic on the {found.gpu.name} "
                         "(it changes what is trained, so it is advice only)")
    return notes


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".py": "python", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix, "shell")


def apply_plans(project, plans, diff: bool, echo) -> int:
    """Write (or diff) every writable plan; 0 when all launches fit or were fixed, 1 when a
    launch still does not fit (or `--diff` would change files), 2 on an error."""
    status = 0
    written: set[str] = set()  # files this run already changed: a later plan's offsets are stale
    for launch_plan in plans:
        for line in launch_plan.lines:
            echo(line)
        shared = sorted({e.path for e in launch_plan.edits} & written)
        if shared and not diff:
            echo(f"  skipped: {', '.join(shared)} changed for a launch above; run `cfgfix fix --fit` again")
            echo("")
            status = max(status, 1)
            continue
        if not launch_plan.writable or not (launch_plan.edits or launch_plan.created):
            if any("does not fit" in line or "nothing written" in line or "advice only" in line
                   for line in launch_plan.lines):
                status = max(status, 1)
            echo("")
            continue
        texts: dict[str, tuple[str, str]] = {}  # display path -> (old, new)
        by_path: dict[str, list] = {}
        for edit in launch_plan.edits:
            by_path.setdefault(edit.path, []).append(edit)
        problem = _outside(project, [project.real_path(shown) for shown in by_path]
                           + [Path(os.path.realpath(shown)) for shown in launch_plan.created])
        for shown, edits in by_path.items():
            if problem is not None:
                break
            path = project.real_path(shown)
            try:
                old = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problem = f"cannot read {shown}: {exc}"
                break
            new = apply_edits(old, sorted(set(edits), key=lambda e: (e.start, e.end)))
            if _kind(path) != "shell" and not sound(_kind(path), old, new, edits):
                problem = f"the edit of {shown} would not parse, or would change more than planned; nothing written"
                break
            texts[shown] = (old, new)
        if problem is None:
            problem = _check_after(project, launch_plan, texts)
        if problem is not None:
            echo(f"  error: {problem}")
            echo("")
            status = 2
            continue
        for shown, content in list(launch_plan.created.items()):
            if not os.path.lexists(shown):
                continue
            try:
                same = Path(shown).read_text(encoding="utf-8") == content
            except (OSError, UnicodeDecodeError):
                same = False
            if not same:
                echo(f"  error: {shown} already exists with other content; not overwritten")
                status = 2
                break
            del launch_plan.created[shown]  # the same file, made for another launch: reference it
        else:
            if diff:
                for shown, (old, new) in texts.items():
                    echo("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{shown}", f"b/{shown}")), nl=False)
                for shown, content in launch_plan.created.items():
                    echo("".join(difflib.unified_diff([], content.splitlines(True), "/dev/null", f"b/{shown}")), nl=False)
                status = max(status, 1)
            else:
                try:
                    for shown, content in launch_plan.created.items():
                        create_atomically(Path(shown).resolve(), content.encode("utf-8"), project.root)
                    for shown, (_, new) in texts.items():
                        write_atomically(project.real_path(shown), new.encode("utf-8"), project.root)
                except Exception as exc:  # WriteError and OS errors: say which file, go on
                    echo(f"  error: {exc}")
                    status = 2
                    continue
                written.update(texts)
                echo(f"  written: {', '.join(list(launch_plan.created) + list(texts))}")
        echo("")
    return status


def _outside(project, paths: list[Path]) -> str | None:
    """A plan never writes outside the project: a launch that names its DeepSpeed JSON as
    `../shared/ds.json`, an absolute path or a link out of the tree gets advice, not an edit."""
    root = Path(os.path.realpath(project.root))
    for path in paths:
        real = Path(os.path.realpath(path))
        if real != root and root not in real.parents:
            return (f"{project.display(path)} is outside the project "
                    f"({real}); cfgfix never writes there: apply the plan above by hand")
    return None


def _check_after(project, launch_plan, texts) -> str | None:
    """Resolve the launch again from the edited texts: each written setting must read back
    as planned. Returns a problem, or None."""
    from cfgfix.training.resolve import training_setups

    setup = launch_plan.setup
    other = project
    for shown, (_, new) in texts.items():
        other = other.with_override(project.real_path(shown), new.encode("utf-8"))
    launch_text = texts.get(project.display(setup.launch_file))
    if launch_text is not None:
        other.launches = _reparsed(project, setup.launch_file, launch_text[1])
        if other.launches is None:
            return "the edited launch script no longer holds its launch"
    for shown, content in launch_plan.created.items():
        try:
            json.loads(content)
        except ValueError:
            return f"the new {shown} is not valid JSON"
    index = [i for i, (_, f) in enumerate(project.launches) if f == setup.launch_file].index(
        next(i for i, (launch, _) in enumerate(project.launches) if launch is setup.launch))
    again = [s for s in training_setups(other) if s.launch_file == setup.launch_file]
    if index >= len(again):
        return "the launch was not found again after the edit"
    resolved = again[index]
    created = bool(launch_plan.created)
    for setting, value in launch_plan.written:
        if created and setting in ("zero_stage", "offload_optimizer", "offload_param"):
            continue  # in the new DeepSpeed file, checked as JSON above
        got = resolved.get(setting)
        if setting == "mixed_precision":
            got = resolved.get("mixed_precision")
        if got != value:
            return f"after the edit {setting} reads {got!r}, not {value!r}; nothing written"
    return None


def _reparsed(project, launch_file: Path, text: str):
    """The project's launches with those of `launch_file` parsed again from `text`."""
    from cfgfix.documents.launches import find_launches
    from cfgfix.documents.shell import parse_shell
    from cfgfix.documents.text import SourceText
    from cfgfix.project import LaunchFacts

    document = parse_shell(SourceText(project.display(launch_file), text), "sh")
    fresh = [LaunchFacts.from_launch(launch) for launch in find_launches(document)]
    old = [launch for launch, f in project.launches if f == launch_file]
    if len(fresh) != len(old):
        return None
    replaced = iter(fresh)
    return [(next(replaced), f) if f == launch_file else (launch, f) for launch, f in project.launches]
