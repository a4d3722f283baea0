"""What detection and the pages read of the raw evidence, one function per question.

The readers ask here instead of querying the tables themselves, so the tables' shape (partition
key, JSON bodies, which index serves which question) stays this app's business; rows come back
as plain values, or as model instances where a reader shows many of their fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db.models import Avg, Count, FloatField, Max, Min, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Left

from dashboard.evidence.binary_copy import fetch_binary
from dashboard.evidence.models import (
    Blob,
    CollectiveWait,
    CompileAgreement,
    CompileEvent,
    EventLog,
    FlightRecord,
    GradReport,
    GraphBreakEvent,
    StepReport,
)
from dashboard.tenancy.models import Rank, Run

# --- one slot's reports ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompileReport:
    """What detection and the pages read of one compile, as every rank that compiled alike reported
    it: plain values, not ORM objects, one for all of those ranks (at 100,000 ranks a slot is a few
    such groups, and an object per rank cost most of its settle). What each rank reports of its own
    (its clock, its timings) is not in it: `CompileReports.times`. Read it, never change it."""

    run_id: int
    frame: str
    index: int
    compile_id: str
    step: int | None
    status: str
    fail_type: str | None
    fail_reason: str | None
    recompile_reason: str | None
    graph_raw: str
    graph_norm: str
    code_raw: str
    code_norm: str
    cache: dict[str, Any]
    detail: dict[str, Any]  # without `times`, each rank's own


@dataclass(frozen=True)
class CompileReports:
    """A compile slot's reports as agreement: the ranks that compiled alike, once each group."""

    groups: list[tuple[tuple[int, ...], CompileReport]]  # by their lowest rank
    times: dict[int, float]  # rank -> its compile's seconds (`entire_frame_compile_time_s`), where it sent them

    def by_rank(self) -> dict[int, CompileReport]:
        """rank -> its group's report, in rank order (shared objects: a dict entry per rank, no more)."""
        reports: dict[int, CompileReport] = {}
        for ranks, report in self.groups:
            reports.update(dict.fromkeys(ranks, report))
        return dict(sorted(reports.items()))


_ALIKE = [f for f in CompileReport.__slots__ if f not in ("run_id", "frame", "index", "cache", "detail")]


def compile_reports(run_id: int, frame: str, index: int) -> CompileReports:
    """The slot's reports as stored, a row per compile that ranks reported alike (`CompileAgreement`),
    rows alike across requests joined; a rank that reported the slot twice counts by its later report."""
    rows = fetch_binary(
        f"""
        SELECT ranks, times, {", ".join(_ALIKE)}, cache::text, (detail - 'times')::text
        FROM {CompileAgreement._meta.db_table} WHERE run_id = %s AND frame = %s AND index = %s ORDER BY id
        """,
        [run_id, frame, index],
    )
    bodies: dict[str, Any] = {}
    alike: dict[tuple[Any, ...], tuple[list[int], CompileReport]] = {}
    times: dict[int, float] = {}
    places = latest_places([row[0] for row in rows])
    for i, (ranks, seconds, *fields, cache, detail) in enumerate(rows):
        if places is not None:
            ranks, seconds = [ranks[j] for j in places[i]], [seconds[j] for j in places[i]]
        group = alike.get(key := (*fields, cache, detail))
        if group is None:
            fixed = dict(zip(_ALIKE, fields, strict=True))
            report = CompileReport(
                run_id, frame, index, **fixed, cache=_decoded(bodies, cache), detail=_decoded(bodies, detail)
            )
            group = alike[key] = ([], report)
        group[0].extend(ranks)
        times.update({r: t for r, t in zip(ranks, seconds, strict=True) if t is not None})
    groups = sorted(((tuple(sorted(ranks)), report) for ranks, report in alike.values() if ranks), key=lambda g: g[0])
    return CompileReports(groups, times)


def latest_places(ranks_of_rows: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """For each stored row of a slot, in the order they came, the places of the ranks whose latest
    report it is, each rank once (a rank that reported the slot twice, a resend under a new seq, counts
    by its later report); None where no rank reported twice, the rows then counted as they are."""
    last: dict[int, int] = {}
    for i, ranks in enumerate(ranks_of_rows):
        last.update(dict.fromkeys(ranks, i))
    if len(last) == sum(len(ranks) for ranks in ranks_of_rows):
        return None
    return [list({r: j for j, r in enumerate(ranks) if last[r] == i}.values()) for i, ranks in enumerate(ranks_of_rows)]


def _decoded(seen: dict[str, Any], text: str) -> Any:
    """The JSON `text`, decoded once for all the rows that hold the same."""
    body = seen.get(text)
    if body is None:
        body = seen[text] = json.loads(text)
    return body


@dataclass(frozen=True)
class GradRow:
    """What the rules read of one rank's report: plain values, not ORM objects. Immutable, so the ranks
    of one stored row (the agreeing ranks of a relay's request) share one."""

    fps: tuple[int, ...]
    nonfinite: int
    norm: float | None


def grad_rows(run_id: int, step: int, group: str) -> list[tuple[tuple[int, ...], GradRow]]:
    """The slot's reports as stored, in the order they came: each row's ranks (the agreeing ranks of a
    request share one) and their report, a rank that reported twice in its later row only."""
    rows = (
        GradReport.objects.filter(run_id=run_id, step=step, group=group)
        .order_by("id")
        .values_list("ranks", "fps", "nonfinite", "norm")
    )
    stored = [(ranks, GradRow(tuple(fps), nonfinite, norm)) for ranks, fps, nonfinite, norm in rows]
    places = latest_places([ranks for ranks, _ in stored])
    if places is None:
        return [(tuple(ranks), row) for ranks, row in stored]
    return [(tuple(ranks[j] for j in kept), row) for (ranks, row), kept in zip(stored, places, strict=True) if kept]


def grad_reports(rows: list[tuple[tuple[int, ...], GradRow]]) -> dict[int, GradRow]:
    """rank -> its report (a rank reported twice: the later report). One `GradRow` per stored row, shared
    by its ranks: at 100,000 ranks a slot is a few hundred rows, and a row object per rank cost most
    of its settling."""
    reports: dict[int, GradRow] = {}
    for ranks, row in rows:
        reports.update(dict.fromkeys(ranks, row))
    return reports


def first_nonfinite_losses(run_id: int, until: int) -> dict[int, int]:
    """rank -> the first step, up to `until`, whose logged loss was NaN or inf (stored as NaN, which
    PostgreSQL, unlike IEEE, holds equal to itself)."""
    rows = (
        StepReport.objects.filter(run_id=run_id, step__lte=until, loss=float("nan"))
        .values("rank")
        .annotate(first=Min("step"))
        .values_list("rank", "first")
    )
    return dict(rows)


def break_reasons(run_id: int, frame: str, limit: int = 200) -> list[tuple[int, str]]:
    """(rank, reason) of the frame's graph breaks."""
    return list(GraphBreakEvent.objects.filter(run_id=run_id, frame=frame).values_list("rank", "reason")[:limit])


# --- a run's compiles --------------------------------------------------------------------


def compile_totals(run_id: int) -> tuple[float, int]:
    """(seconds compiling, compiles past a frame's first) of the run: one aggregate."""
    row = CompileEvent.objects.filter(run_id=run_id).aggregate(
        s=Sum("compile_time"), n=Count("id", filter=Q(index__gt=0))
    )
    return row["s"] or 0.0, row["n"] or 0


def break_count(run_id: int) -> int:
    return GraphBreakEvent.objects.filter(run_id=run_id).count()


def break_sites(run_id: int) -> list[tuple[str, str]]:
    """The run's graph breaks as distinct (frame, the head of the reason: where it broke and why,
    Dynamo's traceback left out): every rank that breaks alike is one row."""
    rows = (
        GraphBreakEvent.objects.filter(run_id=run_id)
        .order_by()
        .annotate(head=Left("reason", BREAK_HEAD_CHARS))
        .values_list("frame", "head")
        .distinct()
    )
    return [(frame, head) for frame, head in rows]


BREAK_HEAD_CHARS = 2000  # Dynamo's text says where and why in its first lines; its traceback follows


def compile_facts(run_id: int) -> list[tuple[Any, ...]]:
    """The run's compiles as (rank, frame, index, step, status, seconds, recompile reason, fail type,
    cache outcome, cache key, end as unix seconds), the cache outcome and key taken out of their
    JSON by PostgreSQL (one plain statement: at 1,024 ranks the ORM's per-row conversions cost
    more than the query)."""
    return fetch_binary(
        f"""
        SELECT rank, frame, index, step, status, coalesce(compile_time, 0), recompile_reason, fail_type,
               coalesce(cache->>'inductor', cache->>'aotautograd'),
               coalesce(detail->'cache_keys'->>'inductor', detail->'cache_keys'->>'aotautograd', ''),
               extract(epoch FROM ts)::float8
        FROM {CompileEvent._meta.db_table} WHERE run_id = %s
        """,
        [run_id],
    )


def keys_compiled(run_ids: QuerySet[Any, Any] | Iterable[int], keys: set[str]) -> set[str]:
    """Of the cache `keys`, those a successful compile of these runs had."""
    keyed = Coalesce(KT("detail__cache_keys__inductor"), KT("detail__cache_keys__aotautograd"))
    return set(
        CompileEvent.objects.filter(run_id__in=run_ids, status="ok")
        .annotate(ckey=keyed)
        .filter(ckey__in=sorted(keys))
        .values_list("ckey", flat=True)
        .distinct()
    )


def miss_seconds(run_ids: QuerySet[Any, Any] | Iterable[int], frames: set[str]) -> dict[str, float]:
    """Per frame, the mean compile time of its cache misses in these runs."""
    rows = (
        CompileEvent.objects.filter(run_id__in=run_ids, frame__in=sorted(frames), status="ok")
        .annotate(out=Coalesce(KT("cache__inductor"), KT("cache__aotautograd")))
        .filter(out__contains="miss")
        .order_by()
        .values("frame")
        .annotate(mean=Avg("compile_time"))
        .values_list("frame", "mean")
    )
    return {frame: mean for frame, mean in rows if mean is not None}


def last_compiles(run_id: int, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """Each rank's last compile (by its own clock): what the rank did just before it ended, as
    {frame, index, step, status, cache, detail, ts}."""
    events = (
        CompileEvent.objects.filter(run_id=run_id, rank__in=ranks)
        .order_by("rank", "-ts", "-id")
        .distinct("rank")
        .values("rank", "frame", "index", "step", "status", "cache", "detail", "ts")
    )
    return {e.pop("rank"): e for e in plain(events)}


def empty_graph_ranks(run_id: int) -> dict[int, dict[str, Any]]:
    """rank -> {graphs, empty, first_step, last_step, status} of the ranks whose compiles succeeded with
    empty graphs only (none holds an op): one aggregate, which returns no row for a run that compiles
    real graphs. Each rank's progress (`last_step`, `status`) comes from the same statement: a rank's
    batches commit in order, so the compiles read are every one the rank sent before the progress read
    (read apart, a rank could be seen past a step whose compiles the aggregate missed)."""
    has_ops = Q(detail__counts__graph_op_count__gt=0)
    state = Rank.objects.filter(run_id=run_id, rank=OuterRef("rank"))
    rows = (
        CompileEvent.objects.filter(run_id=run_id)
        .values("rank")
        .annotate(graphs=Count("id", filter=has_ops), empty=Count("id", filter=_EMPTY), first_step=Min("step"))
        .filter(graphs=0, empty__gt=0)
        .annotate(last_step=Subquery(state.values("last_step")[:1]), status=Subquery(state.values("status")[:1]))
    )
    return {row["rank"]: row for row in plain(rows)}


_EMPTY = Q(status="ok", detail__counts__graph_op_count=0)


def empty_graph_frames(run_id: int, ranks: list[int], limit: int) -> list[tuple[int, str]]:
    """(rank, frame) of these ranks' empty graphs, by rank and frame, at most `limit`."""
    found = (
        CompileEvent.objects.filter(_EMPTY, run_id=run_id, rank__in=ranks)
        .order_by("rank", "frame")
        .values_list("rank", "frame")
        .distinct()
    )
    return list(found[:limit])


def compile_finished(run_id: int, rank: int, since: datetime, until: datetime) -> Mapping[str, Any] | None:
    """The rank's last compile that ended (its clock) within [since, until]."""
    return (
        CompileEvent.objects.filter(run_id=run_id, rank=rank, ts__gte=since, ts__lte=until)
        .order_by("-ts", "-id")
        .values("frame", "index", "compile_id", "status", "compile_time", "recompile_reason")
        .first()
    )


def graph_texts(run_id: int, hashes: list[str]) -> dict[str, str]:
    """Normalized artifact texts by hash, of those the run's project stored."""
    project = Run.objects.filter(id=run_id).values("project_id")
    found = Blob.objects.filter(project_id=Subquery(project), hash__in=hashes, text__isnull=False)
    return {h: text for h, text in found.values_list("hash", "text") if text is not None}


# --- the event log -----------------------------------------------------------------------


def collective_waits(run_id: int, steps: list[int]) -> dict[int, dict[int, float]]:
    """step -> rank -> the longest wait in a collective the rank reported in that step (`CollectiveWait`:
    only waits of STUCK_S or more are kept), a row per step (1,024 ranks' waits come as two arrays)."""
    rows = fetch_binary(
        f"""
        SELECT step, array_agg(rank), array_agg(seconds) FROM {CollectiveWait._meta.db_table}
        WHERE run_id = %s AND step = ANY(%s) GROUP BY step
        """,
        [run_id, steps],
    )
    return {step: dict(zip(ranks, seconds, strict=True)) for step, ranks, seconds in rows}


def last_ends(run_id: int, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """Each rank's latest rank_end event body, where ingest kept one."""
    rows = (
        EventLog.objects.filter(run_id=run_id, t="rank_end", rank__in=ranks)
        .order_by("rank", "-ts", "-id")
        .distinct("rank")
        .values_list("rank", "body")
    )
    return dict(rows)


def agent_notices(run_id: int) -> list[dict[str, Any]]:
    """What the run's agents could not capture (`notice` events), once per kind and text, with the
    ranks that said it: each agent says a thing once, so this reads a handful of rows."""
    said: dict[tuple[str, str], set[int]] = {}
    for rank, body in EventLog.objects.filter(run_id=run_id, t="notice").values_list("rank", "body")[:10_000]:
        said.setdefault((str(body.get("code", "")), str(body.get("text", ""))), set()).add(rank)
    return [{"code": code, "text": text, "ranks": sorted(ranks)} for (code, text), ranks in sorted(said.items())]


def last_end_ts(run_id: int) -> float | None:
    """The agents' clock at the run's last rank_end."""
    last: float | None = (
        EventLog.objects.filter(run_id=run_id, t="rank_end")
        .order_by()
        .aggregate(last=Max(Cast(KT("body__ts"), FloatField())))["last"]
    )
    return last


def detail_answers(run_id: int, rank: int, step: int) -> list[dict[str, Any]]:
    """The bodies of the rank's `detail` answers for the step."""
    return list(
        EventLog.objects.filter(run_id=run_id, rank=rank, t="detail", body__step=step).values_list("body", flat=True)
    )


def compile_start(run_id: int, rank: int, since: datetime, until: datetime) -> dict[str, Any] | None:
    """The body of the rank's last compile_start received within [since, until]."""
    return (
        EventLog.objects.filter(run_id=run_id, rank=rank, t="compile_start", received__gte=since, received__lte=until)
        .order_by("-received", "-id")
        .values_list("body", flat=True)
        .first()
    )


def plain(rows: Iterable[Mapping[str, Any]]) -> Iterable[dict[str, Any]]:
    """`.values()` rows as what they are, plain dicts: django-stubs types each as a TypedDict of its
    columns, which may not be popped or handed on as a dict."""
    return cast("Iterable[dict[str, Any]]", rows)


# --- Flight Recorder dumps ---------------------------------------------------------------


def latest_flight_record(run_id: int, rank: int, since: datetime) -> FlightRecord | None:
    return (
        FlightRecord.objects.filter(run_id=run_id, rank=rank, received__gte=since).order_by("-received", "-id").first()
    )
