"""Run-level checks the periodic sweep makes: silent ranks, crashed ranks and the share of time
spent compiling."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dashboard.detection import flight, lifecycle, tally
from dashboard.detection.models import Alert
from dashboard.detection.rules import RankProgress, RunView, clean_subjects, evaluate, hang_forecast
from dashboard.tenancy.models import Rank, Run, rank_failed
from ingest.models import CompileEvent, EventLog

ACTIVE_WINDOW = timedelta(hours=1)
CRASH_WINDOW = timedelta(minutes=10)
STRIP_RANKS = 64  # ranks in one progress message: those holding the others up come first


def active_runs() -> list[Run]:
    """Runs that reported recently and still have a rank that has not ended, or that ended with a
    crashed rank a moment ago: torchrun stops the others within seconds of a crash, often before
    the next sweep, and rank_crashed must still see it."""
    now = timezone.now()
    recent = Run.objects.filter(last_seen__gte=now - ACTIVE_WINDOW)
    just_crashed = Q(last_seen__gte=now - CRASH_WINDOW) & rank_failed("ranks__")
    return list(recent.filter(Q(ranks__status="running") | just_crashed).distinct())


def rank_rows(run: Run) -> list[dict]:
    return list(Rank.objects.filter(run=run).values("rank", "last_step", "status"))


def view_of(run: Run, totals: tally.CompileTotals | None = None) -> RunView:
    now = timezone.now()
    ranks = list(Rank.objects.filter(run=run).values_list("rank", "last_seen", "status", "info"))
    compile_total = (totals or tally.compile_totals(run)).seconds
    return RunView(
        run_id=run.id,
        world_size=run.world_size,
        last_seen={r: (now - seen).total_seconds() for r, seen, _, _ in ranks},
        ended={r for r, _, status, _ in ranks if status != "running"},
        silent_after=settings.LOCKSTEP_SILENT_AFTER,
        compile_seconds=compile_total / max(len(ranks), 1),
        wall_seconds=(now - run.started_at).total_seconds(),
        crashes=crash_facts(run),
        progress=progress_of(run),
        collective_timeout_s=min((t for *_, info in ranks if (t := (info or {}).get("collective_timeout_s"))),
                                 default=None),
        hang_warn_after=settings.LOCKSTEP_HANG_WARN_AFTER,
    )


def progress_of(run: Run) -> dict[int, RankProgress]:
    """Each rank's latest progress sample of the last `LOCKSTEP_SILENT_AFTER` seconds, carried forward
    to now by the server's clock (the time since ingest received it), so agents' clocks don't matter."""
    now = timezone.now()
    rows = (EventLog.objects.filter(run=run, t="progress", received__gte=now - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER))
            .order_by("rank", "-received", "-id").distinct("rank").values_list("rank", "body", "received"))
    return {rank: _progress(body, (now - received).total_seconds()) for rank, body, received in rows}


def _progress(body: dict, age: float) -> RankProgress:
    since = body.get("since_step_s")
    return RankProgress(phase=body.get("phase") or "other", phase_s=(body.get("phase_s") or 0.0) + age,
                        step=body.get("step"), since_step_s=since + age if since is not None else None,
                        where=body.get("where") or "", op=body.get("op") or "", reason=body.get("reason") or "")


def strip(run: Run) -> list[dict]:
    """The run page's per-rank strip: phase now and seconds since the last step, the ranks that hold
    the others up first (not in the collective the others wait in), then the longest since a step."""
    view = progress_of(run)
    late = hang_forecast.split(view)[1]
    rows = [{"rank": r, "phase": p.phase, "for_s": round(p.phase_s, 1), "step": p.step, "op": p.op[:200],
             "where": p.where[:200], "since_step_s": round(p.since_step_s, 1) if p.since_step_s is not None else None,
             "holding": r in late} for r, p in view.items()]
    rows.sort(key=lambda row: (not row["holding"], -(row["since_step_s"] or 0.0), row["rank"]))
    return rows[:STRIP_RANKS]



def crash_facts(run: Run) -> dict[int, dict]:
    """rank -> how it ended (status, exit code, the exception and where) and its last compile before."""
    rows = list(Rank.objects.filter(run=run).filter(rank_failed()).values("rank", "status", "exit_code", "last_step",
                                                                       "last_seen"))
    if not rows:
        return {}
    ranks = [row["rank"] for row in rows]
    ends = last_ends(run, ranks)
    compiles = last_compiles(run, ranks)
    return {row["rank"]: _crash(row, ends.get(row["rank"], {}), compiles.get(row["rank"])) for row in rows}


def _crash(row: dict, end: dict, compiled: CompileEvent | None) -> dict:
    """One crashed rank's facts as plain values. Status and exit code are the rank row's (ingest keeps
    them there); the exception comes from the rank_end body, absent where ingest kept none."""
    ended_at = end.get("ts") or row["last_seen"].timestamp()
    return {
        "status": row["status"], "exit_code": row["exit_code"],
        "reason": end.get("reason"), "exc_type": end.get("exc_type"), "where": end.get("where"),
        "ended_at": ended_at, "last_step": row["last_step"],
        "last_compile": _compile_facts(compiled, ended_at) if compiled else None,
    }


def _compile_facts(event: CompileEvent, ended_at: float) -> dict:
    keys = (event.detail or {}).get("cache_keys") or {}
    return {
        "frame": event.frame, "index": event.index, "step": event.step, "status": event.status,
        "cache": event.cache or {}, "cache_keys": keys, "seconds_before_end": round(ended_at - event.ts.timestamp(), 3),
    }


def last_ends(run: Run, ranks: list[int]) -> dict[int, dict]:
    """Each rank's latest rank_end event body, where ingest kept one."""
    rows = (EventLog.objects.filter(run=run, t="rank_end", rank__in=ranks)
            .order_by("rank", "-ts", "-id").distinct("rank").values_list("rank", "body"))
    return dict(rows)


def last_compiles(run: Run, ranks: list[int]) -> dict[int, CompileEvent]:
    """Each rank's last compile (by its own clock): what the rank did just before it ended."""
    events = CompileEvent.objects.filter(run=run, rank__in=ranks).order_by("rank", "-ts", "-id").distinct("rank")
    return {e.rank: e for e in events}


def ask_flight_records(run: Run, changed: list[int]) -> list[tuple[int, int]]:
    """Each hang_forecast alert that is news asks the run's live ranks for Flight Recorder dumps
    (once per revision); the (alert, revision) rounds asked."""
    rounds = []
    with transaction.atomic():
        live = set(Rank.objects.filter(run=run, status="running").values_list("rank", flat=True))
        for alert in Alert.objects.filter(id__in=changed, kind="hang_forecast", state=Alert.State.FIRING):
            if live and flight.ask(alert, live):
                rounds.append((alert.id, alert.revision))
    return rounds


def check(run: Run) -> list[int]:
    with transaction.atomic():
        totals = tally.compile_totals(run)
        view = view_of(run, totals)
        tally.record(run, totals)  # for /metrics (detection/metrics.py)
        findings = evaluate(view)
        return lifecycle.apply(run, findings, clean_subjects(view, findings), None)

