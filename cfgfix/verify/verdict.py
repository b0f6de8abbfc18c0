"""The verdict on a fix, from the measures of the original and the patched run.

It holds when the patched run
- completed as many optimizer steps, in as many processes, as the original;
- has finite losses and finite parameters;
- has losses close to the original's, process by process and backward() by backward():
  identical (bit for bit) when only safe fixes were applied and both runs seed torch,
  else within LOSS_RTOL relative (two steps of a precision change, bf16 against fp32, move
  a tiny model's loss by well under 1%; an injected bug moves it by far more); not compared
  when a run does not seed (random weights differ from run to run);
- has gradient norms (before clipping) close to the original's, step by step, by the same
  rule as the losses;
- peaks no higher than the original on every process: CUDA `max_memory_allocated`, or on
  a CPU the live-tensor-bytes peak. A check whose measure is missing is reported as not
  checked and does not decide the verdict;
- ran the changed lines (coverage.py). When every other check holds but a changed line did
  not run, the verdict is "not exercised" (exit 3, NOT_EXERCISED): the runs agree, but they
  prove nothing about the lines that did not run. A distinct code, not 1, so a CI job can
  tell "the fix broke training" from "run more steps / on a GPU"; not 0, so it never passes
  as proof.
The original run must itself complete its steps, or there is nothing to compare: the
verdict is then "could not run" (exit 2).
"""

from __future__ import annotations

import math

from cfgfix.records import dataclass, field

LOSS_RTOL = 0.02
LOSS_ATOL = 1e-6
NOT_EXERCISED = 3
COVERAGE = "changed lines ran"


@dataclass
class Check:
    name: str
    holds: bool | None  # None: not checked
    detail: str

    def to_dict(self) -> dict:
        return {"name": self.name, "holds": self.holds, "detail": self.detail}


@dataclass
class Verdict:
    could_run: bool
    checks: list[Check] = field(default_factory=list)
    reason: str = ""  # why it could not run

    @property
    def holds(self) -> bool:
        return self.could_run and all(c.holds is not False for c in self.checks)

    @property
    def state(self) -> str:
        """holds, does not hold, not exercised (the checks hold but a changed line did not
        run), could not run."""
        if not self.could_run:
            return "could not run"
        if any(c.holds is False for c in self.checks if c.name != COVERAGE):
            return "does not hold"
        return "holds" if self.holds else "not exercised"

    @property
    def exit_code(self) -> int:
        return {"holds": 0, "does not hold": 1, "could not run": 2, "not exercised": NOT_EXERCISED}[self.state]

    def to_dict(self) -> dict:
        return {"could_run": self.could_run, "holds": self.holds, "state": self.state, "exit_code": self.exit_code,
                "reason": self.reason, "checks": [c.to_dict() for c in self.checks]}


def peak_bytes(process: dict) -> tuple[str, int] | None:
    """(what was measured, bytes): the device peak of one process, if measured."""
    memory = process.get("memory") or {}
    if memory.get("cuda_max_allocated_bytes") is not None:
        return "CUDA max_memory_allocated", memory["cuda_max_allocated_bytes"]
    if memory.get("cpu_live_peak_bytes") is not None:
        return "CPU live tensor bytes", memory["cpu_live_peak_bytes"]
    return None


def cannot_run(reason: str) -> Verdict:
    return Verdict(False, reason=reason)


def judge(before, after, steps: int, safe_only: bool, rtol: float = LOSS_RTOL, change=None) -> Verdict:
    """`before`/`after`: runner.RunResult. `safe_only`: every applied change is a safe fix.
    `change`: coverage.Change with `ran` marked (None: coverage not recorded)."""
    if before.status != "completed":
        return cannot_run(f"the original run did not complete {steps} steps: {describe(before)}")
    verdict = Verdict(True)
    verdict.checks.append(_steps(before, after, steps))
    verdict.checks.append(_finite(after))
    losses = _series(before, after, safe_only, rtol, "losses")
    norms = _series(before, after, safe_only, rtol, "grad_norms")
    if losses.holds and norms.holds is not None and not norms.detail.startswith("identical") and losses.detail.startswith("identical"):
        losses.detail += "; the gradient norms are not (next line)"
    verdict.checks += [losses, norms]
    verdict.checks.append(_memory(before, after))
    if change is not None:
        verdict.checks.append(coverage_check(change, steps, _on_cpu(after)))
    return verdict


def _on_cpu(run) -> bool:
    return run is not None and all(p.get("device") in (None, "cpu") for p in run.processes)


def coverage_check(change, steps: int, on_cpu: bool) -> Check:
    from .coverage import hint

    units = [u for u in change.units if u.counts]
    missed = [u for u in units if u.ran is False]
    unread = [f for f in change.other if f.read is False]
    traced = [u for u in units if u.ran is not None]
    parts = []
    if traced:
        ran = len(traced) - len(missed)
        parts.append(f"{ran} of {len(traced)} changed statement{'s' if len(traced) != 1 else ''} ran")
    if change.other:
        read = sum(1 for f in change.other if f.read)
        parts.append(f"{read} of {len(change.other)} changed non-Python file{'s' if len(change.other) != 1 else ''} read")
    if change.unparsed:
        parts.append("not traced (do not parse): " + ", ".join(change.unparsed))
    if not traced and not change.other:
        return Check(COVERAGE, None, "no changed line holds code" + (f" ({parts[0]})" if parts else ""))
    if not missed and not unread:
        return Check(COVERAGE, True, "; ".join(parts))
    for u in missed:
        u.hint = hint(u, steps, on_cpu)
    names = [f"{u.path}:{u.lines[0]}" for u in missed] + [f.path for f in unread]
    return Check(COVERAGE, False, "; ".join(parts) + "; did not run: " + ", ".join(names))


def describe(run) -> str:
    """One phrase for how a run ended, with the first process's error."""
    if run.launch_error:
        return f"could not start ({run.launch_error})"
    if not run.processes:
        return _no_report(run)
    worst = next((p for p in run.processes if p["status"] != "completed"), run.processes[0])
    text = f"{worst['status']} after {worst['steps']} step{'s' if worst['steps'] != 1 else ''}"
    if worst.get("rank") is not None:
        text += f" (rank {worst['rank']})"
    if not worst["steps"] and not worst.get("torch_imported") and not worst.get("error"):
        text += " (it never imported torch: the launch did not start training)"
    if worst.get("error"):
        text += f": {worst['error']['type']}: {worst['error']['message']}"
        if worst["error"]["type"] == "ModuleNotFoundError" and not worst.get("torch_imported"):
            text += " (the launch's Python lacks a package; for torch and friends: pip install 'cfgfix[verify]')"
    return text


def _steps(before, after, steps: int) -> Check:
    name = "completed steps"
    if after.status != "completed":
        return Check(name, False, f"the patched run {describe(after)}")
    if len(after.processes) != len(before.processes):
        return Check(name, False, f"{len(after.processes)} processes reported, the original had {len(before.processes)}")
    return Check(name, True, f"{steps} steps in {len(after.processes)} process{'es' if len(after.processes) != 1 else ''}, as the original")


def _finite(after) -> Check:
    name = "finite losses and parameters"
    bad = []
    for p in after.processes:
        who = _who(p)
        if p.get("losses_finite") is False:
            bad.append(f"{who}: a loss is not finite ({_fmt_losses(p['losses'])})")
        if p.get("params_finite") is False:
            bad.append(f"{who}: parameters are not finite after the last step")
    if bad:
        return Check(name, False, "; ".join(bad))
    if not any(p.get("losses") for p in after.processes):
        return Check(name, None, "no loss was seen (no backward() on a single-element tensor)")
    return Check(name, True, "all losses and parameters finite")


_SERIES = {  # report key: (check name, what one value is, how many of them)
    "losses": ("losses match", "loss", "backward() calls"),
    "grad_norms": ("gradient norms match", "gradient norm", "optimizer steps with a gradient norm"),
}


def _series(before, after, safe_only: bool, rtol: float, key: str) -> Check:
    """Losses or gradient norms, value by value: identical bit for bit when only safe fixes
    were applied to seeded runs, else within `rtol` relative."""
    name, what, count = _SERIES[key]
    if after.status != "completed":
        return Check(name, None, "not compared: the patched run did not complete")
    pairs = list(zip(before.processes, after.processes))
    if not all(b.get("seeded") and a.get("seeded") for b, a in pairs):
        return Check(name, None, "not compared: the script does not call torch.manual_seed, so weights and data differ between runs")
    exact = safe_only
    worst = 0.0
    seen = 0
    for b, a in pairs:
        lb, la = b.get(key) or [], a.get(key) or []
        if len(lb) != len(la):
            return Check(name, False, f"{_who(a)}: {len(la)} {count}, the original had {len(lb)}")
        for i, (x, y) in enumerate(zip(lb, la)):
            if x is None or y is None:
                if (x is None) != (y is None):
                    return Check(name, False, f"{_who(a)}: no {what} at step {i + 1} in {'the original' if x is None else 'the patched run'}")
                continue
            seen += 1
            where = f"{_who(a)}, {'step' if key == 'grad_norms' else 'value'} {i + 1}"
            if exact and x != y:
                return Check(name, False, f"{where}: {y!r} against {x!r}; a safe fix must not change a seeded run's {what}s")
            if not math.isclose(x, y, rel_tol=rtol, abs_tol=LOSS_ATOL):
                return Check(name, False, f"{where}: {y:.6g} against {x:.6g} (tolerance {rtol:.0%} relative)")
            worst = max(worst, abs(y - x) / max(abs(x), LOSS_ATOL)) if math.isfinite(x) and math.isfinite(y) else worst
    if not seen:
        return Check(name, None, f"no {what} was measured")
    if exact:
        return Check(name, True, "identical (safe fixes only, seeded runs)")
    if worst == 0.0:
        return Check(name, True, f"identical (tolerance {rtol:.0%} relative)")
    return Check(name, True, f"differ, within {rtol:.0%} relative (largest difference {worst:.3%})")


def _memory(before, after) -> Check:
    name = "peak memory"
    if after.status != "completed":
        return Check(name, None, "not compared: the patched run did not complete")
    details, holds = [], True
    for b, a in zip(before.processes, after.processes):
        pb, pa = peak_bytes(b), peak_bytes(a)
        if pb is None or pa is None or pb[0] != pa[0]:
            return Check(name, None, f"{_who(a)}: peak not measured in both runs (see notes)")
        saved = pb[1] - pa[1]
        percent = saved / pb[1] if pb[1] else 0.0
        holds = holds and saved >= 0
        change = f"saves {_mib(saved)} ({percent:.1%})" if saved >= 0 else f"grows by {_mib(-saved)} ({-percent:.1%})"
        details.append(f"{_who(a)}: {_mib(pa[1])} against {_mib(pb[1])} ({pa[0]}): {change}")
    return Check(name, holds, "; ".join(details))


def _who(process: dict) -> str:
    return f"rank {process['rank']}" if process.get("rank") is not None else "the process"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB ({nbytes:,} B)"


def _fmt_losses(losses: list) -> str:
    return ", ".join(f"{x:.4g}" for x in losses[:6]) + (", ..." if len(losses) > 6 else "")


def _no_report(run) -> str:
    """Why no process of the launch reported: nothing Python started under the harness, or
    Python processes started and none became a training process."""
    code = f"exit code {run.returncode}"
    if not run.started:
        return (f"the launch ended ({code}) without starting a Python process that cfgfix could see: "
                f"it ran no Python (check that its script and paths exist in the copy), or ran Python "
                f"with -I or -S, or with PYTHONPATH cleared, which keeps the harness out")
    roles = ", ".join(f"{s.get('role')} `{' '.join(str(a) for a in (s.get('argv') or [])[:4])}`" for s in run.started[:3])
    return (f"the launch ended ({code}) before any training process reached an optimizer step: "
            f"{len(run.started)} Python process{'es' if len(run.started) != 1 else ''} started ({roles}), none reported")