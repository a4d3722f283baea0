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
whose last look was missed) is computed for its reader, from its compile events and the waits in a
collective kept at the steps that compiled (`evidence.reads.collective_waits`): at 1,024 ranks x 10k
steps about 200 ms against about 10 for the kept bill (bench/cost.py).

A read never writes the database: the reader's bill is computed in memory and the keeping is the
worker's (`tasks.keep_bills`, queued by the reader that computed it). A run's bill is computed once
at a time (a Redis lock per run, `computing`): readers that arrive meanwhile wait for it and get the
same bill, shared through Redis for REFRESH_S (50 parallel reads of a 256-rank run computed it 8
times, 13 s, when each reader computed and stored its own), and the worker keeps that very bill
when nothing reached the run since.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dashboard.detection import cost, tally
from dashboard.detection.models import RunCost
from dashboard.tenancy.models import Project, Run
from ingest import ratelimit

MIN_AGE_S = 10.0
REFRESH_S = 60.0
SWEPT_S = 30.0  # runs.END_LOOK: a run that reported this recently is looked at by the sweep
FRAMES_KEPT = 50
LOCK_S = 120.0  # the lock of a computation whose process died frees itself after this
WAIT_S = 30.0  # a reader waits this long for another's computation, then computes its own

log = logging.getLogger(__name__)


def store(run: Run, bill: dict[str, Any], now: datetime | None = None) -> RunCost:
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


def summary_of(bill: dict[str, Any]) -> dict[str, Any]:
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


def fresh_bill(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """The run's bill as of now, and kept (the worker's: the sweep, `tasks.keep_bills`): the one a
    reader computed is kept as it is when nothing reached the run since, else it is computed."""
    now = now or timezone.now()
    with computing(run):
        shared = _shared(run)
        if shared is not None and shared[1] >= run.last_seen:
            bill, at = shared
        else:
            bill, at = cost.bill_of(run, now), now
        store(run, bill, at)
    return {**bill, "computed_at": at.isoformat(), "stale": False}


def current_bill(run: Run, now: datetime | None = None) -> dict[str, Any]:
    """A reader's bill; reading writes nothing. The kept bill while it is current (`is_current`) or
    while the sweep still looks at the run (it reported within SWEPT_S: the sweep refreshes the bill
    within MIN_AGE_S of new compiles, and bills an ended run once more, `final_bill`), marked `stale`
    in that case; else the bill computed in memory, once for all readers of the moment (`computing`),
    and kept later by the worker. Readers so never pay for a big run's bill while it trains, only for a
    run no sweep billed, and then once."""
    now = now or timezone.now()
    kept = _kept(run, now)
    if kept is not None:
        return kept
    with computing(run):
        kept, shared = _kept(run, now), _shared(run)
        if kept is not None:
            return kept
        if shared is not None and is_current(run, shared[1], shared[0]["compile_seconds"], now):
            bill, at = shared
        else:
            bill, at = cost.bill_of(run, now), now
            _share(run, bill, at)
            _keep_later(run)
    return {**bill, "computed_at": at.isoformat(), "stale": False}


def _kept(run: Run, now: datetime) -> dict[str, Any] | None:
    row = RunCost.objects.filter(run=run).values_list("bill", "computed_at", "compile_seconds").first()
    if row and row[0]:
        current = is_current(run, row[1], row[2], now)
        if current or (now - run.last_seen).total_seconds() < SWEPT_S:
            return {**row[0], "computed_at": row[1].isoformat(), "stale": not current}
    return None


def _name(run: Run, what: str) -> str:
    """A Redis key of this run (its id and start: test databases and servers may share one Redis)."""
    ident = hashlib.sha256(f"{run.id}:{run.key}:{run.started_at.isoformat()}".encode()).hexdigest()[:24]
    return f"lockstep:bill:{what}:{ident}"


@contextmanager
def computing(run: Run) -> Iterator[None]:
    """Hold the run's bill lock (Redis, across processes) while computing: one computation per run at
    a time. Without Redis, or after WAIT_S, the caller computes unlocked rather than fail a read."""
    lock = ratelimit.client().lock(_name(run, "lock"), timeout=LOCK_S, blocking_timeout=WAIT_S)
    try:
        held = lock.acquire()
    except redis.RedisError:
        log.warning("redis unavailable: run %s billed without its lock", run.id, exc_info=True)
        held = False
    try:
        yield
    finally:
        if held:
            try:
                lock.release()
            except redis.RedisError:  # expired (LOCK_S) or Redis gone: it frees itself
                log.warning("bill lock of run %s not released", run.id, exc_info=True)


def _share(run: Run, bill: dict[str, Any], at: datetime) -> None:
    """A bill a reader computed, for the other readers and the worker to keep, for REFRESH_S."""
    value = json.dumps({"bill": bill, "computed_at": at.isoformat()}, cls=DjangoJSONEncoder)
    try:
        ratelimit.client().set(_name(run, "shared"), value, ex=int(REFRESH_S))
    except redis.RedisError:
        log.warning("redis unavailable: the bill of run %s is not shared", run.id, exc_info=True)


def _shared(run: Run) -> tuple[dict[str, Any], datetime] | None:
    """The bill a reader computed within REFRESH_S, and when."""
    try:
        raw = ratelimit.client().get(_name(run, "shared"))
    except redis.RedisError:
        return None
    if raw is None:
        return None
    value = json.loads(raw)
    at = parse_datetime(value["computed_at"])
    return (value["bill"], at) if at is not None else None


def _keep_later(run: Run) -> None:
    """The worker keeps the bill a reader computed (a read never writes)."""
    from dashboard.detection.tasks import keep_bills  # the tasks module imports this one

    try:
        keep_bills.delay([run.id])
    except Exception:  # the broker is down: the next reader computes it again
        log.warning("broker unavailable: the bill of run %s is not kept", run.id, exc_info=True)


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


def for_sweep(run: Run, compile_seconds: float, wall_s: float, now: datetime | None = None) -> dict[str, Any] | None:
    """What the budget rule reads: the kept bill's summary, its share of the wall time as of now, the
    budget; recomputed first when stale (and not younger than MIN_AGE_S). None before the budget
    applies, or while even the most the bill could be (world x every compile second, over world x
    wall) stays under it."""
    now = now or timezone.now()
    row = RunCost.objects.filter(run=run).first()
    age = (now - row.computed_at).total_seconds() if row else float("inf")  # read only when there is a row
    stale = row is None or age >= REFRESH_S or abs(row.compile_seconds - compile_seconds) > 1e-3
    if stale and compile_seconds > 0 and (row is None or age >= MIN_AGE_S):
        row = store(run, cost.bill_of(run, now), now)
    budget, after = budget_of(run)
    if row is None or wall_s < after or compile_seconds <= budget * wall_s:
        return None
    share = row.gpu_seconds / (run.world_size * wall_s) if wall_s > 0 else None
    return {
        **summary_of(row.bill),
        "share": share,
        "wall_s": wall_s,
        "budget": budget,
        "after_s": after,
        "device": cost.devices(run),  # what the seconds are of, as the run page says it: GPU, or device
    }


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


def top_frames(project_id: int, days: int, now: datetime | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The frames that cost the project most over its runs of the last `days` days (kept bills),
    summed across runs by frame."""
    since = (now or timezone.now()) - timedelta(days=days)
    rows: dict[str, dict[str, Any]] = {}
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
