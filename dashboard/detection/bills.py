"""Kept compile bills (`RunCost`): computed by the periodic check while a run is active and once more
at its end, summed for /metrics and the project's cost page, which so never recompute a run's bill
from its raw events.

The sweep recomputes a kept bill when the run's compile seconds changed since (new compiles) or it
is older than REFRESH_S (waits measured since), at most every MIN_AGE_S while compiles keep arriving
(1,024 ranks' compiles of one frame arrive over seconds), and bills an ended run once more on its
last look. A reader (API, pages) gets the kept bill: current when nothing reached the run since it
was computed, it is younger than MIN_AGE_S, or it is younger than REFRESH_S and no compile reached
the run since; else marked `stale` while the sweep still looks at the run (it refreshes it within
seconds). Only a run no sweep billed (an uploaded spool read before the sweep's next pass, a run
whose last look was missed) is computed by its reader, from its compile events and the waits in a
collective kept at the steps that compiled (`evidence.reads.collective_waits`): at 1,024 ranks x 10k
steps about 200 ms against about 10 for the kept bill (bench/cost.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from dashboard.detection import cost, tally
from dashboard.detection.models import RunCost
from dashboard.tenancy.models import Project, Run

MIN_AGE_S = 10.0
REFRESH_S = 60.0
SWEPT_S = 30.0  # runs.END_LOOK: a run that reported this recently is looked at by the sweep
FRAMES_KEPT = 50


def store(run: Run, bill: dict, now: datetime | None = None) -> RunCost:
    """Keep `bill`; each cause's counted seconds only ever grow."""
    now = now or timezone.now()
    old = RunCost.objects.filter(run=run).values_list("counted", flat=True).first() or {}
    counted = {c: max(float(old.get(c, 0.0)), bill["causes"].get(c, 0.0)) for c in cost.CAUSES}
    frames = [
        {
            "frame": f["frame"],
            "label": f["label"],
            "gpu_seconds": f["gpu_seconds"],
            **{k: f["lines"][0][k] for k in ("cause", "reason", "remedy")},
        }
        for f in bill["frames"][:FRAMES_KEPT]
    ]
    row = RunCost(
        run=run,
        gpu_seconds=bill["gpu_seconds"],
        counted=counted,
        frames=frames,
        bill=bill,
        compile_seconds=bill["compile_seconds"],
        computed_at=now,
    )
    row.save()
    return row


def summary_of(bill: dict) -> dict:
    top = bill["top"]
    return {
        "gpu_seconds": bill["gpu_seconds"],
        "wall_s": bill["wall_s"],
        "share": bill["share"],
        "world_size": bill["world_size"],
        "basis": bill["basis"],
        "top": {k: top[k] for k in ("frame", "label", "cause", "reason", "remedy", "gpu_seconds", "ranks", "basis")}
        if top
        else None,
    }


def fresh_bill(run: Run, now: datetime | None = None) -> dict:
    """The run's bill, computed now, and kept."""
    now = now or timezone.now()
    bill = cost.bill_of(run, now)
    store(run, bill, now)
    return {**bill, "computed_at": now.isoformat(), "stale": False}


def current_bill(run: Run, now: datetime | None = None) -> dict:
    """The kept bill while it is current (`is_current`) or while the sweep still looks at the run (it
    reported within SWEPT_S: the sweep refreshes the bill within MIN_AGE_S of new compiles, and bills an
    ended run once more, `final_bill`), marked `stale` in that case; else `fresh_bill`. Readers so never
    pay for a big run's bill while it trains, only for a run no sweep billed."""
    now = now or timezone.now()
    row = RunCost.objects.filter(run=run).values_list("bill", "computed_at", "compile_seconds").first()
    if row and row[0]:
        current = is_current(run, row[1], row[2], now)
        if current or (now - run.last_seen).total_seconds() < SWEPT_S:
            return {**row[0], "computed_at": row[1].isoformat(), "stale": not current}
    return fresh_bill(run, now)


def is_current(run: Run, computed_at: datetime, compile_seconds: float, now: datetime) -> bool:
    """Nothing reached the run since the bill was computed; or it is younger than MIN_AGE_S; or younger
    than REFRESH_S with the run's compile seconds as they were (one aggregate, not the whole bill)."""
    age = (now - computed_at).total_seconds()
    if computed_at >= run.last_seen or age < MIN_AGE_S:
        return True
    return age < REFRESH_S and abs(tally.compile_totals(run).seconds - compile_seconds) <= 1e-3


def final_bill(run: Run, now: datetime | None = None) -> None:
    """The last look at an ended run: bill it once more if anything reached it since its kept bill."""
    now = now or timezone.now()
    computed_at = RunCost.objects.filter(run=run).values_list("computed_at", flat=True).first()
    if (computed_at is None or computed_at < run.last_seen) and tally.compile_totals(run).seconds > 0:
        fresh_bill(run, now)


def for_sweep(run: Run, compile_seconds: float, wall_s: float, now: datetime | None = None) -> dict | None:
    """What the budget rule reads: the kept bill's summary, its share of the wall time as of now, the
    budget; recomputed first when stale (and not younger than MIN_AGE_S). None before the budget
    applies, or while even the most the bill could be (world x every compile second, over world x
    wall) stays under it."""
    now = now or timezone.now()
    row = RunCost.objects.filter(run=run).first()
    age = (now - row.computed_at).total_seconds() if row else None
    stale = row is None or age >= REFRESH_S or abs(row.compile_seconds - compile_seconds) > 1e-3
    if stale and compile_seconds > 0 and (row is None or age >= MIN_AGE_S):
        row = store(run, cost.bill_of(run, now), now)
    budget, after = budget_of(run)
    if row is None or wall_s < after or compile_seconds <= budget * wall_s:
        return None
    share = row.gpu_seconds / (run.world_size * wall_s) if wall_s > 0 else None
    return {**summary_of(row.bill), "share": share, "wall_s": wall_s, "budget": budget, "after_s": after}


def budget_of(run: Run) -> tuple[float, float]:
    """(share, from what age in seconds): the project's own, else LOCKSTEP_COMPILE_BUDGET(_AFTER)."""
    budget, after = (
        Project.objects.filter(id=run.project_id).values_list("compile_budget", "compile_budget_after").get()
    )
    return (
        budget if budget is not None else settings.LOCKSTEP_COMPILE_BUDGET,
        after if after is not None else settings.LOCKSTEP_COMPILE_BUDGET_AFTER,
    )


def counted_by_project() -> dict[tuple[str, str], float]:
    """(project, cause) -> GPU-seconds over every kept bill: the counter /metrics serves."""
    totals: dict[tuple[str, str], float] = {}
    for project, counted in RunCost.objects.values_list("run__project__name", "counted"):
        for cause, seconds in (counted or {}).items():
            totals[(project, cause)] = totals.get((project, cause), 0.0) + float(seconds)
    return totals


def top_frames(project_id: int, days: int, now: datetime | None = None, limit: int = 20) -> list[dict]:
    """The frames that cost the project most over its runs of the last `days` days (kept bills),
    summed across runs by frame."""
    since = (now or timezone.now()) - timedelta(days=days)
    rows: dict[str, dict] = {}
    for key, frames in RunCost.objects.filter(run__project_id=project_id, run__started_at__gte=since).values_list(
        "run__key", "frames"
    ):
        for f in frames or ():
            row = rows.setdefault(
                f["frame"],
                {
                    "frame": f["frame"],
                    "label": f["label"],
                    "gpu_seconds": 0.0,
                    "runs": 0,
                    "worst_run": key,
                    "worst": 0.0,
                    "cause": f["cause"],
                    "reason": f["reason"],
                    "remedy": f["remedy"],
                },
            )
            row["gpu_seconds"] += f["gpu_seconds"]
            row["runs"] += 1
            if f["gpu_seconds"] > row["worst"]:
                row.update(
                    worst_run=key, worst=f["gpu_seconds"], cause=f["cause"], reason=f["reason"], remedy=f["remedy"]
                )
    ranked = sorted(rows.values(), key=lambda r: -r["gpu_seconds"])[:limit]
    for row in ranked:
        row["gpu_seconds"] = round(row["gpu_seconds"], 3)
        row["gpu_hours"] = round(row["gpu_seconds"] / 3600, 4)
    return ranked
