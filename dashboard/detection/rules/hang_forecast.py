"""hang_forecast: ranks wait in a collective of step N for ranks that have not reached it.

The late rank still heartbeats (the agent's sender is another thread), so `rank_silent` cannot see
this; the progress samples can: the waiting ranks' main threads sit in a collective (or in a DDP
backward, whose bucket all-reduces wait inside autograd) while the late ones compile, read data or
run Python. Warning once the wait passes `LOCKSTEP_HANG_WARN_AFTER` (or half the timeout, if
sooner), critical at half the collective timeout; the message says what the late ranks do and how
long until the timeout kills the job. It resolves as soon as no rank waits for another.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, RankProgress, RunView, ranks_text, rule

WAITING = ("collective", "backward")
LATES_TOLD = 8  # what each late rank is doing, for the first few: the message stays short at 1024 ranks


@rule("hang_forecast", RunView, subject=lambda v: subjects.HANG)
def hang_forecast(view: RunView) -> Iterator[Finding]:
    live = {
        r: p
        for r, p in view.progress.items()
        if r not in view.ranks.ended and view.ranks.quiet.get(r, 0.0) < view.silent_after  # not quiet: fresh
    }
    waiting, late = split(live)
    if not late:
        return
    step = max(p.step for p in waiting.values() if p.step is not None)  # each waiting rank has one
    wait = max(p.phase_s for p in waiting.values())
    timeout = view.collective_timeout_s
    half = 0.5 * timeout if timeout else float("inf")
    if wait < warn_after(view.hang_warn_after, timeout):
        return
    left = max(0.0, timeout - wait) if timeout else None
    first = min(waiting.values(), key=lambda p: -p.phase_s)
    compiling = [p.op for _, p in sorted(late.items()) if p.phase == "compiling" and p.op]
    yield Finding(
        severity="critical" if wait >= half else "warning",
        ranks=tuple(sorted(late)),
        step=step,
        frame=compiling[0] if compiling else None,
        message=_message(waiting, late, wait, first, step, timeout, left),
        details={
            "waiting": sorted(waiting),
            "wait_s": round(wait, 1),
            "collective": first.op or first.phase,
            "timeout_s": timeout,
            "left_s": round(left, 1) if left is not None else None,
            "late": {str(r): _facts(p) for r, p in sorted(late.items())},
        },
    )


def warn_after(hang_warn_after: float, timeout: float | None) -> float:
    """How long a rank waits in a collective before the forecast warns: the sweep loads every rank's
    progress only once some rank has waited that long (`runs.view_of`)."""
    return min(hang_warn_after, 0.5 * timeout) if timeout else hang_warn_after


def split(progress: dict[int, RankProgress]) -> tuple[dict[int, RankProgress], dict[int, RankProgress]]:
    """(waiting, late): ranks inside a collective of step N, and ranks not in one that have not passed N."""
    waiting = {r: p for r, p in progress.items() if p.phase in WAITING and p.step is not None}
    if not waiting:
        return {}, {}
    step = max(p.step for p in waiting.values() if p.step is not None)  # each waiting rank has one
    late = {r: p for r, p in progress.items() if p.phase not in WAITING and (p.step is None or p.step <= step)}
    return waiting, late


def doing(p: RankProgress) -> str:
    """What a late rank is doing, in words ("compiling model.py:88:forward for 212 s, recompile because of ...")."""
    at = f" at {p.where}" if p.where else ""
    if p.phase == "compiling":
        why = p.reason if p.reason == "first compile" else f"recompile because of {p.reason}"
        return f"compiling {p.op or '?'} for {p.phase_s:.0f} s ({why})"
    if p.phase == "data":
        return f"waiting in the data loader{at} for {p.phase_s:.0f} s"
    if p.phase == "step":
        return f"running Python{at} for {p.phase_s:.0f} s"
    return f"{p.phase}{at} for {p.phase_s:.0f} s"


def _message(
    waiting: dict[int, RankProgress],
    late: dict[int, RankProgress],
    wait: float,
    first: RankProgress,
    step: int,
    timeout: float | None,
    left: float | None,
) -> str:
    where = (
        f"in {first.op}"
        if first.phase == "collective" and first.op
        else "in backward (DDP's all-reduce)"
        if first.phase == "backward"
        else "in a collective"
    )
    told = sorted(late.items())[:LATES_TOLD]
    lates = "; ".join(f"{ranks_text([r])} is {doing(p)}" for r, p in told) + ("; …" if len(late) > LATES_TOLD else "")
    head = (
        f"{ranks_text(waiting).capitalize()} waited {wait:.0f} s {where} of step {step} for {ranks_text(late)}: {lates}"
    )
    if timeout is None:
        return head + "; the collective timeout is unknown"
    return head + f"; {left:.0f} s left before the {timeout:.0f} s collective timeout kills the job"


def _facts(p: RankProgress) -> dict[str, Any]:
    return {
        "phase": p.phase,
        "for_s": round(p.phase_s, 1),
        "step": p.step,
        "where": p.where,
        "op": p.op,
        "reason": p.reason,
        "doing": doing(p),
    }
