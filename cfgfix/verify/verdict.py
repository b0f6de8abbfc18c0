"""The verdict on a fix, from the measures of the original and the patched run.

It holds when the patched run
- completed as many optimizer steps, in as many processes, as the original;
- has finite losses and finite parameters;
- has losses close to the original's, process by process and backward() by backward():
  identical (bit for bit) when only safe fixes were applied and both runs seed torch,
  else within LOSS_RTOL relative (two steps of a precision change, bf16 against fp32, move
  a tiny model's loss by well under 1%; an injected bug moves it by far more); not compared
  when a run does not seed (random weights differ from run to run);
- peaks no higher than the original on every process: CUDA `max_memory_allocated`, or on
  a CPU the live-tensor-bytes peak. A check whose measure is missing is reported as not
  checked and does not decide the verdict.
The original run must itself complete its steps, or there is nothing to compare: the
verdict is then "could not run" (exit 2).
"""

from __future__ import annotations

import math

from cfgfix.records import dataclass, field

LOSS_RTOL = 0.02
LOSS_ATOL = 1e-6


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
    def exit_code(self) -> int:
        return 2 if not self.could_run else (0 if self.holds else 1)

    def to_dict(self) -> dict:
        return {"could_run": self.could_run, "holds": self.holds, "exit_code": self.exit_code,
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


def judge(before, after, steps: int, safe_only: bool, rtol: float = LOSS_RTOL) -> Verdict:
    """`before`/`after`: runner.RunResult. `safe_only`: every applied change is a safe fix."""
    if before.status != "completed":
        return cannot_run(f"the original run did not complete {steps} steps: {describe(before)}")
    verdict = Verdict(True)
    verdict.checks.append(_steps(before, after, steps))
    verdict.checks.append(_finite(after))
    verdict.checks.append(_losses(before, after, safe_only, rtol))
    verdict.checks.append(_memory(before, after))
    return verdict


def describe(run) -> str:
    """One phrase for how a run ended, with the first process's error."""
    if run.launch_error:
        return f"could not start ({run.launch_error})"
    if not run.processes:
        return f"no process reported (exit code {run.returncode}); is it a Python launch?"
    worst = next((p for p in run.processes if p["status"] != "completed"), run.processes[0])
    text = f"{worst['status']} after {worst['steps']} step{'s' if worst['steps'] != 1 else ''}"
    if worst.get("rank") is not None:
        text += f" (rank {worst['rank']})"
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


def _losses(before, after, safe_only: bool, rtol: float) -> Check:
    name = "losses match"
    if after.status != "completed":
        return Check(name, None, "not compared: the patched run did not complete")
    pairs = list(zip(before.processes, after.processes))
    if not all(b.get("seeded") and a.get("seeded") for b, a in pairs):
        return Check(name, None, "not compared: the script does not call torch.manual_seed, so weights and data differ between runs")
    exact = safe_only
    worst = 0.0
    for b, a in pairs:
        lb, la = b.get("losses") or [], a.get("losses") or []
        if len(lb) != len(la):
            return Check(name, False, f"{_who(a)}: {len(la)} backward() calls, the original made {len(lb)}")
        for x, y in zip(lb, la):
            if exact and x != y:
                return Check(name, False, f"{_who(a)}: {y!r} against {x!r}; a safe fix must not change a seeded run's losses")
            if not math.isclose(x, y, rel_tol=rtol, abs_tol=LOSS_ATOL):
                return Check(name, False, f"{_who(a)}: {y:.6g} against {x:.6g} (tolerance {rtol:.0%} relative)")
            worst = max(worst, abs(y - x) / max(abs(x), LOSS_ATOL)) if math.isfinite(x) and math.isfinite(y) else worst
    if exact:
        return Check(name, True, "identical (safe fixes only, seeded runs)")
    if worst == 0.0:
        return Check(name, True, f"identical (tolerance {rtol:.0%} relative)")
    return Check(name, True, f"within {rtol:.0%} relative (largest difference {worst:.3%})")


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
