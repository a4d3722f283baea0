"""Each rule's own tests, on plain report objects: a rule is a pure function of one settled slot."""

import math
from types import SimpleNamespace

from dashboard.detection.consensus import consensus
from dashboard.detection.rules import CompileSlotView, GradSlotView, Liveness, RunView, evaluate, rank_silent

COMPILE_DEFAULTS = {
    "step": 3,
    "status": "ok",
    "fail_type": None,
    "fail_reason": None,
    "recompile_reason": None,
    "graph_norm": "a" * 16,
    "graph_raw": "a" * 16,
    "code_norm": "c" * 16,
    "code_raw": "c" * 16,
    "compile_time": 2.0,
    "cache": {},
    "detail": {"counts": {"graph_op_count": 12}},
}


def grad_view(
    fps_by_rank: dict[int, list[int]],
    step: int = 5,
    nonfinite: dict | None = None,
    group: str = "ddp",
    baseline: list[int] | None = None,
) -> GradSlotView:
    nonfinite = nonfinite or {}
    reports = {r: SimpleNamespace(fps=fps, nonfinite=nonfinite.get(r, 0)) for r, fps in fps_by_rank.items()}
    verdict = consensus({r: tuple(f) for r, f in fps_by_rank.items()})
    return GradSlotView(
        step,
        group,
        reports,
        verdict,
        len(reports),
        tuple(baseline) if baseline is not None else None,
        "base-run" if baseline is not None else None,
    )


def compile_view(
    reports: dict[int, dict],
    index: int = 1,
    accountable: set[int] | None = None,
    frame: str = "train.py:10:forward",
    rank_info: dict | None = None,
    graph_breaks: list | None = None,
) -> CompileSlotView:
    rows = {r: SimpleNamespace(**{**COMPILE_DEFAULTS, **fields}) for r, fields in reports.items()}
    return CompileSlotView(
        frame,
        index,
        rows,
        accountable if accountable is not None else set(rows),
        len(rows),
        rank_info or {},
        graph_breaks or [],
        {r: row.compile_time for r, row in rows.items() if row.compile_time is not None},
    )


def run_view(
    last_seen: dict[int, float],
    ended: set[int] | None = None,
    silent_after: float = 60,
    crashes: dict | None = None,
    progress: dict | None = None,
    timeout: float | None = None,
    warn_after: float = 10.0,
    lost_after: float = 12.0,
    now: float = 1100.0,
    compile_cost: dict | None = None,
    since_shed: float = math.inf,
    alerted: frozenset[int] = frozenset(),
) -> RunView:
    """`now` defaults to past the consequences' grace window of crashes ending near t=1000; `alerted`:
    ranks with a silence alert open."""
    return RunView(
        run_id=1,
        world_size=len(last_seen),
        ranks=liveness(last_seen, ended or set(), rank_silent.watch_after(silent_after, lost_after), alerted),
        silent_after=silent_after,
        crashes=crashes or {},
        progress=progress or {},
        collective_timeout_s=timeout,
        hang_warn_after=warn_after,
        lost_after=lost_after,
        now=now,
        compile_cost=compile_cost,
        since_shed=since_shed,
    )


def liveness(ages: dict[int, float], ended: set[int], watch_after: float, alerted: frozenset[int]) -> Liveness:
    """What `runs.liveness` reads from PostgreSQL, from every rank's age (rank -> seconds since its
    last report) and the ranks with a silence alert open."""
    live = [age for r, age in ages.items() if r not in ended]
    ended_ages = [age for r, age in ages.items() if r in ended]
    return Liveness(
        reported=len(ages),
        ended=set(ended) & set(ages),
        quiet={r: age for r, age in ages.items() if age >= watch_after or r in alerted},
        freshest=min(ages.values(), default=math.inf),
        freshest_live=min(live, default=math.inf),
        oldest_end=max(ended_ages, default=None),
    )


def findings_of(view, kind: str) -> list:
    return [f for f in evaluate(view) if f.kind == kind]
