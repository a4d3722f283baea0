"""Run-level checks the periodic sweep makes: silent ranks, crashed ranks and the share of time
spent compiling; ranks given up as lost, and the end of a run (its open alerts ended unresolved)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    Max,
    Min,
    OuterRef,
    Q,
    TextField,
    Value,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Now
from django.utils import timezone

from dashboard.detection import bills, compile_marks, flight, lifecycle, locks, tally, text
from dashboard.detection.models import Alert
from dashboard.detection.rules import (
    CompiledWorkView,
    CompileFacts,
    Crash,
    Finding,
    Liveness,
    RankProgress,
    RankWork,
    RunView,
    clean_subjects,
    evaluate,
    hang_forecast,
)
from dashboard.detection.rules.rank_silent import LEFT_ALONE, ended_message, silent_ranks, watch_after
from dashboard.evidence import reads
from dashboard.ledger import slots
from dashboard.tenancy.models import LOST, Rank, Run, mark_lost, rank_ended, rank_failed
from ingest import shed

ACTIVE_WINDOW = timedelta(hours=1)
CRASH_WINDOW = timedelta(minutes=10)
END_LOOK = timedelta(seconds=bills.SWEPT_S)  # how long after its last report an ended run is judged once more
EMPTY_FRAMES_SHOWN = 20
STRIP_RANKS = 64  # ranks in one progress message: those holding the others up come first


def active_runs() -> list[Run]:
    """Runs that reported recently and still have a rank that has not ended, or that ended with a
    crashed rank a moment ago (torchrun stops the others within seconds of a crash, often before
    the next sweep, and rank_crashed must still see it), or that ended with alerts still open (the
    run's end closes them, `check`)."""
    now = timezone.now()
    ranks = Rank.objects.filter(run=OuterRef("pk"))
    running = Exists(ranks.filter(status="running"))
    just_crashed = Q(last_seen__gte=now - CRASH_WINDOW) & Exists(ranks.filter(rank_failed()))
    still_open = Exists(Alert.objects.filter(run=OuterRef("pk"), state=Alert.State.FIRING))
    return list(Run.objects.filter(last_seen__gte=now - ACTIVE_WINDOW).filter(running | just_crashed | still_open))


@dataclass(frozen=True)
class RankRows:
    """What the pages' progress pushes say of a run's ranks (`delivery.notify.push_progress`): counts
    and steps, and by name only the ranks no longer running, failed ones first, as many as the strip shows."""

    reporting: int
    running: int
    last_step: int | None
    min_step: int | None
    ended: list[dict[str, Any]]  # {"rank", "last_step", "status"}


def rank_rows(run: Run) -> RankRows:
    """The run's `RankRows` in two statements: the progress push goes out every 2 s for every active
    run, and reading 100,000 rank rows for it took 150 ms each time."""
    ranks = Rank.objects.filter(run=run)
    counts = ranks.aggregate(
        reporting=Count("id"),
        running=Count("id", filter=Q(status="running")),
        newest=Max("last_step"),
        oldest=Min("last_step"),
    )
    gone = (
        ranks.exclude(status="running")
        .annotate(ok=ExpressionWrapper(Q(status="ok"), BooleanField()))
        .order_by("ok", "rank")
        .values("rank", "last_step", "status")[:STRIP_RANKS]
    )
    return RankRows(
        reporting=counts["reporting"],
        running=counts["running"],
        last_step=counts["newest"],
        min_step=counts["oldest"],
        ended=list(reads.plain(gone)),
    )


def view_of(run: Run, totals: tally.CompileTotals | None = None) -> RunView:
    """What the sweep's rules read of the run. Every rank's progress only while some rank has waited
    in a collective long enough for `hang_forecast` to warn, which one aggregate tells: the rule finds
    nothing otherwise, and at 100,000 ranks reading them all took seconds."""
    now = timezone.now()
    compile_total = (totals or tally.compile_totals(run)).seconds
    timeout = collective_timeout(run)
    waited = longest_wait(run) >= hang_forecast.warn_after(settings.LOCKSTEP_HANG_WARN_AFTER, timeout)
    return RunView(
        run_id=run.id,
        world_size=run.world_size,
        ranks=liveness(run, watch_after(settings.LOCKSTEP_SILENT_AFTER, settings.LOCKSTEP_LOST_AFTER)),
        silent_after=settings.LOCKSTEP_SILENT_AFTER,
        crashes=crash_facts(run),
        progress=progress_of(run) if waited else {},
        collective_timeout_s=timeout,
        hang_warn_after=settings.LOCKSTEP_HANG_WARN_AFTER,
        compile_cost=bills.for_sweep(run, compile_total, (now - run.started_at).total_seconds(), now),
        lost_after=settings.LOCKSTEP_LOST_AFTER,
        grace=settings.LOCKSTEP_CONSEQUENCE_GRACE,
        now=now.timestamp(),
        since_shed=shed.seconds_since(run.project_id),
    )


def _age(moment: Any) -> Func:
    """Seconds from `moment` to now, by PostgreSQL's clock (the transaction's start)."""
    return Func(Now() - moment, template="EXTRACT(EPOCH FROM %(expressions)s)", output_field=FloatField())


def liveness(run: Run, watch_after: float) -> Liveness:
    """The run's ranks' liveness (`rules.Liveness`) in one aggregate by PostgreSQL: counts and
    extremes, and by name only the ranks that ended, those quiet for `watch_after` and those with a
    silence alert open. A sweep runs every second; loading 100,000 ranks' ages cost it 0.5 s a run."""
    alerted = Alert.objects.filter(run=run, kind="rank_silent", state=Alert.State.FIRING).values("ranks__0")
    quiet = Q(last_seen__lte=Now() - timedelta(seconds=watch_after)) | Q(rank__in=alerted)
    ended = rank_ended()
    row = Rank.objects.filter(run=run).aggregate(
        reported=Count("id"),
        freshest=_age(Max("last_seen")),
        freshest_live=_age(Max("last_seen", filter=~ended)),
        oldest_end=_age(Min("last_seen", filter=ended)),
        ended=ArrayAgg("rank", filter=ended, default=[]),
        quiet=ArrayAgg("rank", filter=quiet, order_by="rank", default=[]),
        quiet_ages=ArrayAgg(_age(F("last_seen")), filter=quiet, order_by="rank", default=[]),
    )
    return Liveness(
        reported=row["reported"],
        ended=set(row["ended"]),
        quiet=dict(zip(row["quiet"], row["quiet_ages"], strict=True)),
        freshest=_or_inf(row["freshest"]),
        freshest_live=_or_inf(row["freshest_live"]),
        oldest_end=row["oldest_end"],
    )


def _or_inf(age: float | None) -> float:
    return math.inf if age is None else age


def collective_timeout(run: Run) -> float | None:
    """The shortest collective timeout a rank reported at its start, from its row's own column: a sweep
    runs every second, and every rank's start facts, out of line and compressed, cost 0.4 s of it at
    100,000 ranks."""
    shortest = Rank.objects.filter(run=run, collective_timeout_s__gt=0).aggregate(t=Min("collective_timeout_s"))["t"]
    return None if shortest is None else float(shortest)


def _sampled(run: Run) -> Q:
    """The run's ranks with a progress sample received within the last `LOCKSTEP_SILENT_AFTER` seconds."""
    return Q(run=run, progress_at__gte=Now() - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER))


def progress_of(run: Run) -> dict[int, RankProgress]:
    """Each rank's latest progress sample of the last `LOCKSTEP_SILENT_AFTER` seconds, carried forward
    to now by the server's clock (the time since ingest received it), so agents' clocks don't matter."""
    rows = Rank.objects.filter(_sampled(run)).values_list("rank", "progress", _age(F("progress_at")))
    return {rank: _progress(body, age) for rank, body, age in rows}


def longest_wait(run: Run) -> float:
    """The longest a rank that has not ended has now waited in a collective (`hang_forecast.WAITING`),
    by its latest sample carried forward to now; 0 when none waits."""
    phase_s = Cast(KeyTextTransform("phase_s", "progress"), FloatField())
    waiting = Q(progress__phase__in=hang_forecast.WAITING) & ~rank_ended()
    wait = Rank.objects.filter(_sampled(run), waiting).aggregate(s=Max(phase_s + _age(F("progress_at"))))["s"]
    return wait or 0.0


def _progress(body: dict[str, Any], age: float) -> RankProgress:
    since = body.get("since_step_s")
    return RankProgress(
        phase=body.get("phase") or "other",
        phase_s=(body.get("phase_s") or 0.0) + age,
        step=body.get("step"),
        since_step_s=since + age if since is not None else None,
        where=body.get("where") or "",
        op=body.get("op") or "",
        reason=body.get("reason") or "",
    )


def strip(run: Run) -> list[dict[str, Any]]:
    """The run page's per-rank strip: phase now and seconds since the last step, the ranks that hold
    the others up first (not in the collective the others wait in: `hang_forecast.split`), then the
    longest since a step; chosen by PostgreSQL, so a run of any size costs a page the same 64 rows."""
    sampled = Rank.objects.filter(_sampled(run)).annotate(
        phase=Coalesce(KeyTextTransform("phase", "progress"), Value("other"), output_field=TextField()),
        step=Cast(KeyTextTransform("step", "progress"), BigIntegerField()),
        age=_age(F("progress_at")),
    )
    held_at = sampled.filter(phase__in=hang_forecast.WAITING).aggregate(s=Max("step"))["s"]
    holding: Q | Value = (
        ~Q(phase__in=hang_forecast.WAITING) & (Q(step__isnull=True) | Q(step__lte=held_at))
        if held_at is not None
        else Value(False)
    )
    since = Coalesce(Cast(KeyTextTransform("since_step_s", "progress"), FloatField()) + F("age"), 0.0)
    rows = (
        sampled.annotate(holding=ExpressionWrapper(holding, BooleanField()), since=since)
        .order_by("-holding", "-since", "rank")
        .values_list("rank", "progress", "age", "holding")[:STRIP_RANKS]
    )
    return [_strip_row(rank, _progress(body or {}, age), holding) for rank, body, age, holding in rows]


def _strip_row(rank: int, p: RankProgress, holding: bool) -> dict[str, Any]:
    return {
        "rank": rank,
        "phase": p.phase,
        "for_s": round(p.phase_s, 1),
        "step": p.step,
        "op": p.op[:200],
        "where": p.where[:200],
        "since_step_s": round(p.since_step_s, 1) if p.since_step_s is not None else None,
        "holding": holding,
    }


def crash_facts(run: Run) -> dict[int, Crash]:
    """rank -> how it ended (status, exit code, the exception and where) and its last compile before."""
    rows = list(
        Rank.objects.filter(run=run)
        .filter(rank_failed())
        .exclude(status=LOST)  # lost: rank_silent's
        .values("rank", "status", "exit_code", "last_step", "last_seen")
    )
    if not rows:
        return {}
    ranks = [row["rank"] for row in rows]
    ends = reads.last_ends(run.id, ranks)
    compiles = reads.last_compiles(run.id, ranks)
    return {row["rank"]: _crash(row, ends.get(row["rank"], {}), compiles.get(row["rank"])) for row in rows}


def _crash(row: Mapping[str, Any], end: dict[str, Any], compiled: dict[str, Any] | None) -> Crash:
    """One crashed rank's facts as plain values. Status and exit code are the rank row's (ingest keeps
    them there); the exception comes from the rank_end body, absent where ingest kept none."""
    ended_at = end.get("ts") or row["last_seen"].timestamp()
    return {
        "status": row["status"],
        "exit_code": row["exit_code"],
        "reason": _printable(end.get("reason")),
        "exc_type": _printable(end.get("exc_type")),
        "where": _printable(end.get("where")),
        "ended_at": ended_at,
        "last_step": row["last_step"],
        "last_compile": _compile_facts(compiled, ended_at) if compiled else None,
    }


def _printable(value: str | None) -> str | None:
    return text.printable(value) if value else value


def _compile_facts(event: dict[str, Any], ended_at: float) -> CompileFacts:
    keys = (event["detail"] or {}).get("cache_keys") or {}
    return {
        "frame": event["frame"],
        "index": event["index"],
        "step": event["step"],
        "status": event["status"],
        "cache": event["cache"] or {},
        "cache_keys": keys,
        "seconds_before_end": round(ended_at - event["ts"].timestamp(), 3),
    }


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
    """The run's periodic rules; ranks left running alone become lost; once every rank ended (or
    was lost), nothing changed in this look, and the run's slots all settled, the run ends. A check
    of a large run can outlast the sweep's period: the next sweep's check of it, in another worker,
    skips it (`locks.RUN_CHECK`) rather than doing the same work twice and waiting on its rows."""
    with transaction.atomic():
        if not locks.try_hold(locks.RUN_CHECK, run.id):
            return []
        compiled = compile_marks.of(run.id, lambda: read_compiled(run))
        view = view_of(run, compiled.totals)
        tally.record(run, compiled.totals, compiled.breaks)  # for /metrics (detection/metrics.py)
        findings = evaluate(view)
        clean = clean_subjects(view, findings)
        work = compiled_work(run, compiled)
        eager = evaluate(work)
        findings, clean = findings + eager, clean | clean_subjects(work, eager)
        lost = lost_ranks(view)
        if lost:
            mark_lost(run.id, lost)
        over = is_over(view, lost)
        if over:
            findings = after_the_end(run, findings)
        changed = lifecycle.apply(run, findings, clean, None)
        if over and not changed and ended_long_enough(run):
            changed += lifecycle.end_of_run(run, last_words(run))
        return changed


def just_ended() -> list[Run]:
    """Runs whose every rank ended a moment ago: a short job or an uploaded spool can end before a
    sweep saw it run, and what is judged on the whole run (its compiled work) must still be judged."""
    ranks = Rank.objects.filter(run=OuterRef("pk"))
    recent = Run.objects.filter(last_seen__gte=timezone.now() - END_LOOK)
    return list(recent.filter(Exists(ranks)).exclude(Exists(ranks.filter(status="running"))))


def check_ended(run: Run) -> list[int]:
    """The last look at a run that ended: its compiled work (the other periodic rules are about live
    ranks) and its bill; an alert it raises keeps the run in `active_runs` until the run's end closes it."""
    bills.final_bill(run)
    with transaction.atomic():
        if not locks.try_hold(locks.RUN_CHECK, run.id):
            return []
        work = compiled_work(run, read_compiled(run))
        eager = evaluate(work)
        return lifecycle.apply(run, after_the_end(run, eager), clean_subjects(work, eager), None)


def read_compiled(run: Run) -> compile_marks.Compiled:
    """The check's aggregates over the run's compile rows (`compile_marks` keeps them while they hold)."""
    empty = reads.empty_graph_ranks(run.id)
    frames: dict[int, list[str]] = {}
    if empty:
        for rank, frame in reads.empty_graph_frames(run.id, list(empty), EMPTY_FRAMES_SHOWN * len(empty)):
            frames.setdefault(rank, []).append(frame)
    return compile_marks.Compiled(tally.compile_totals(run), reads.break_count(run.id), empty, frames)


def compiled_work(run: Run, compiled: compile_marks.Compiled) -> CompiledWorkView:
    """The ranks whose compiles succeeded with empty graphs only (none holds an op), judged on where
    they stood when their compiles were read (`reads.empty_graph_ranks`: one statement). Where one has
    moved on since (kept aggregates, `compile_marks`), its compiles are read again: those of the steps
    it has now passed may have come after the kept ones."""
    view = _work_view(run.id, compiled)
    if not view.work:
        return view
    now = _now(run, view)
    if any(now.known(r) and not view.known(r) for r in view.work):
        view = _work_view(run.id, compile_marks.renew(run.id, lambda: read_compiled(run)))
    return view


def _work_view(run_id: int, compiled: compile_marks.Compiled) -> CompiledWorkView:
    rows, frames = compiled.empty, compiled.empty_frames
    return CompiledWorkView(
        run_id=run_id,
        work={
            r: RankWork(row["graphs"], row["empty"], row["first_step"], tuple(frames.get(r, ())[:EMPTY_FRAMES_SHOWN]))
            for r, row in rows.items()
        },
        last_step={r: row["last_step"] for r, row in rows.items()},
        ended={r for r, row in rows.items() if row["status"] not in (None, "running")},  # ended, or lost
    )


def _now(run: Run, view: CompiledWorkView) -> CompiledWorkView:
    """The same ranks' work, with where they stand now."""
    ranks = list(Rank.objects.filter(run=run, rank__in=list(view.work)).values_list("rank", "last_step", "status"))
    return replace(view, last_step={r: step for r, step, _ in ranks}, ended={r for r, _, s in ranks if s != "running"})


def lost_ranks(view: RunView) -> set[int]:
    """Ranks that went silent while every other rank ended: they never will (killed outright)."""
    return {r for r, why in silent_ranks(view).items() if why == LEFT_ALONE}


def is_over(view: RunView, lost: set[int]) -> bool:
    """Every rank that reported ended or is lost, or none has said anything for
    LOCKSTEP_SILENT_AFTER (the launcher or the scheduler killed the whole job: nobody says goodbye)."""
    seen = view.ranks
    return seen.reported > 0 and (seen.live == len(lost) or seen.freshest >= view.silent_after)  # lost: live ranks


def after_the_end(run: Run, findings: list[Finding]) -> list[Finding]:
    """The run's end is final for the periodic rules: what it closed stays closed (a lost rank
    stays silent, a crash stays a crash; nothing new can be learnt from them)."""
    ended = set(Alert.objects.filter(run=run, state=Alert.State.ENDED_UNRESOLVED).values_list("kind", "subject"))
    return [f for f in findings if (f.kind, f.subject) not in ended]


def last_words(run: Run) -> dict[tuple[str, str], str]:
    """The messages that would count up with the clock, as they stand at the run's end: each silent
    rank's quiet time before the last report of the run (`lifecycle.end_of_run`)."""
    end = Rank.objects.filter(run=run).aggregate(end=Max("last_seen"))["end"]
    if end is None:
        return {}
    silent = list(Alert.objects.filter(run=run, kind="rank_silent", state=Alert.State.FIRING))
    seen = dict(
        Rank.objects.filter(run=run, rank__in=[a.ranks[0] for a in silent if a.ranks]).values_list("rank", "last_seen")
    )
    return {
        (a.kind, a.subject): ended_message(
            a.ranks[0], (end - seen[a.ranks[0]]).total_seconds(), bool((a.details or {}).get("lost"))
        )
        for a in silent
        if a.ranks and a.ranks[0] in seen
    }


def ended_long_enough(run: Run) -> bool:
    """The run's last report is older than the settle timeout and every slot it opened settled:
    no late slot re-fires what the end resolves."""
    quiet = timezone.now() - run.last_seen >= timedelta(seconds=settings.LOCKSTEP_SETTLE_TIMEOUT)
    return quiet and not slots.unsettled(run.id)
