"""The one writer of the raw per-rank rows and the batch claims: ingest decides what a group of
batches commits (`ingest.writers`), this module puts it into evidence's tables.

Rows go by binary COPY (`binary_copy`); the (session, seq) claim is a fragment of ingest's claim
statement, built here from this app's table, as tenancy and the ledger build theirs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec
from django.db import connection
from psycopg.types.json import Jsonb

from agents import protocol
from dashboard.evidence.binary_copy import (
    GRAD_COLUMNS,
    HEADER,
    TRAILER,
    GradEvents,
    copy_rows,
    copy_stream,
    grad_copy,
    when,
)
from dashboard.evidence.models import (
    RECENT_SEQS,
    CollectiveWait,
    CompileAgreement,
    EventLog,
    GradReport,
    GraphBreakEvent,
    IngestSession,
    StepReport,
)
from dashboard.tenancy.models import Run

Claim = Literal["same", "other", "none"]

SESSIONS = IngestSession._meta.db_table
K = RECENT_SEQS


def _digest_bits(expr: str) -> str:
    """SQL: the first 64 bits of a hex digest, as a bigint (what `IngestSession.recent` keeps)."""
    return f"('x' || substr({expr}, 1, 16))::bit(64)::bigint"


def claim_cte(batches: str, run: str = "%(run)s") -> str:
    """`claim AS (...)`: claim each row of CTE `batches` (session, seq, digest, rank, events; one row per
    session) as its session's next batch in the run, unless the session already holds its seq;
    returns the ranks it claimed. A session's first batch inserts its row, the later ones update it,
    in session order: two groups that hold batches of the same sessions lock their rows alike."""
    slot = f"EXCLUDED.high %% {K}"  # doubled: the statement takes parameters
    return f"""claim AS (
              INSERT INTO {SESSIONS} AS s (run_id, session, rank, seqs, high, recent, batches, events, first_at, last_at)
              SELECT {run}::bigint, session, rank, int8multirange(int8range(seq, seq, '[]')), seq,
                     array_fill(NULL::bigint, ARRAY[(seq %% {K})::int]) || {_digest_bits("digest")}
                       || array_fill(NULL::bigint, ARRAY[{K - 1} - (seq %% {K})::int]),
                     1, events, now(), now()
              FROM {batches} ORDER BY session
              ON CONFLICT (run_id, session) DO UPDATE SET
                seqs = s.seqs + EXCLUDED.seqs,
                high = greatest(s.high, EXCLUDED.high),
                recent = CASE WHEN EXCLUDED.high > greatest(s.high, EXCLUDED.high) - {K}
                              THEN s.recent[1:{slot}] || EXCLUDED.recent[{slot} + 1] || s.recent[{slot} + 2:{K}]
                              ELSE s.recent END,
                rank = EXCLUDED.rank,
                batches = s.batches + 1,
                events = s.events + EXCLUDED.events,
                last_at = EXCLUDED.last_at
              WHERE NOT s.seqs @> EXCLUDED.high
              RETURNING rank
            )"""


def claim_of(run: Run, session: str, seq: int, digest: str) -> Claim:
    """What a committed claim says of (session, seq) sent with `digest`: "same" (a resend: the digest
    it was claimed with, or a seq older than the session's latest RECENT_SEQS, whose digest is no
    longer kept), "other" (another body claimed it: a conflict) or "none" (nothing holds it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT seqs @> %(seq)s::bigint, %(seq)s::bigint > high - {K}, recent[%(seq)s::bigint %% {K} + 1]"
            f" FROM {SESSIONS} WHERE run_id = %(run)s AND session = %(session)s",
            {"seq": seq, "run": run.id, "session": session},
        )
        row = cursor.fetchone()
    if row is None or not row[0]:
        return "none"
    _, kept, bits = row
    return "other" if kept and bits != digest_bits(digest) else "same"


def digest_bits(digest: str) -> int:
    """The first 64 bits of a hex digest as PostgreSQL's signed bigint holds them."""
    value = int(digest[:16], 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def write_grads(reports: list[tuple[int, int, GradEvents]], now: datetime) -> None:
    """One COPY of the grad rows of several batches: (run id, rank, its grad events) each."""
    parts = grad_copy(reports, now)
    if parts:
        copy_stream(GradReport._meta.db_table, GRAD_COLUMNS, [b"".join([HEADER, *parts, TRAILER])])


Rows = Iterable[tuple[object, ...]]


@dataclass(frozen=True)
class Table:
    """A raw table written by COPY: its columns and how a batch's events of one kind become rows."""

    name: str
    columns: tuple[tuple[str, str], ...]
    rows: Callable[[Run, int, Any, datetime], Rows]


def write_events(batches: Sequence[tuple[Run, int, Mapping[type, list[Any]]]], now: datetime) -> None:
    """Several batches' other events, one COPY per table for all of them (a job's start is every
    rank's compile events at once); kinds without a table of their own go to the log."""
    rows: dict[Table, list[Rows]] = {}
    compiles: list[tuple[Run, int, list[protocol.Compile]]] = []
    for run, rank, by_type in batches:
        for kind, events in by_type.items():
            if kind in FOLDED:
                continue
            if kind is protocol.Compile:
                compiles.append((run, rank, events))
                continue
            table = TABLES.get(kind, LOG)
            rows.setdefault(table, []).append(table.rows(run, rank, events, now))
            if kind is protocol.Progress:
                _keep_waits(run, rank, events, now)
    for table, parts in rows.items():
        copy_rows(table.name, table.columns, itertools.chain.from_iterable(parts))
    if compiles:
        copy_rows(CompileAgreement._meta.db_table, COMPILE_COLUMNS, _compile_rows(compiles, now))


COMPILE_COLUMNS = (
    ("run_id", "int8"),
    ("ranks", "int4[]"),
    ("frame", "text"),
    ("index", "int4"),
    ("compile_id", "text"),
    ("step", "int8"),
    ("status", "text"),
    ("fail_type", "text"),
    ("fail_reason", "text"),
    ("recompile_reason", "text"),
    ("graph_raw", "text"),
    ("graph_norm", "text"),
    ("code_raw", "text"),
    ("code_norm", "text"),
    ("times", "float8[]"),
    ("ends", "timestamptz[]"),
    ("cache", "jsonb"),
    ("detail", "jsonb"),
    ("received", "timestamptz"),
)
_alike_key = msgspec.json.Encoder(order="deterministic").encode


def _compile_rows(compiles: list[tuple[Run, int, list[protocol.Compile]]], now: datetime) -> Rows:
    """One row per compile that ranks of these batches reported alike (everything but a rank's clock
    and timings equal), with their ranks, each one's seconds and end in the same order; `detail`'s
    `times` are the first rank's."""
    alike: dict[tuple[Any, ...], tuple[protocol.Compile, list[int], list[float | None], list[datetime]]] = {}
    for run, rank, events in compiles:
        for e in events:
            key = (run.id, _alike_key(msgspec.structs.replace(e, ts=0.0, times={})))
            _, ranks, seconds, ends = alike.setdefault(key, (e, [], [], []))
            ranks.append(rank)
            seconds.append(e.times.get("entire_frame_compile_time_s"))
            ends.append(when(e.ts, now))
    for (run_id, _), (e, ranks, seconds, ends) in alike.items():
        dynamo, code = e.hashes.get("dynamo"), e.hashes.get("inductor")
        detail = {
            "times": e.times,
            "counts": e.counts,
            "cache_keys": e.cache_keys,
            "graph_breaks": e.graph_breaks,
            "hashes": msgspec.to_builtins(e.hashes),
        }
        yield (
            run_id,
            ranks,
            e.frame,
            e.index,
            e.compile_id,
            e.step,
            e.status,
            e.fail_type,
            e.fail_reason,
            e.recompile_reason,
            dynamo.raw if dynamo else "",
            dynamo.norm if dynamo else "",
            code.raw if code else "",
            code.norm if code else "",
            seconds,
            ends,
            Jsonb(e.cache),
            Jsonb(detail),
            now,
        )


def _step_rows(run: Run, rank: int, events: list[protocol.Step], now: datetime) -> Rows:
    return ((run.id, rank, e.step, _loss(e), e.step_time, when(e.ts, now), now) for e in events)


def _loss(event: protocol.Step) -> float | None:
    """A non-finite loss is stored as NaN (the agent flags it: JSON carries no NaN)."""
    return math.nan if event.nonfinite_loss else event.loss


def _break_rows(run: Run, rank: int, events: list[protocol.GraphBreak], now: datetime) -> Rows:
    return ((run.id, rank, e.frame, e.reason, e.step, when(e.ts, now), now) for e in events)


def _log_rows(run: Run, rank: int, events: Sequence[protocol.Event], now: datetime) -> Rows:
    return (
        (run.id, rank, type(e).__struct_config__.tag, Jsonb(msgspec.to_builtins(e)), when(e.ts, now), now)
        for e in events
    )


def _keep_waits(run: Run, rank: int, events: list[protocol.Progress], now: datetime) -> None:
    """Progress samples go to the log; the waits in a collective that lasted STUCK_S, the longest per
    step, to `CollectiveWait` as well: upsert (run, rank, step) -> the longest wait seen so far (a later
    flush reports the same wait longer), one statement, and only for a batch that has one."""
    longest: dict[int, float] = {}
    for e in events:
        if e.phase == "collective" and e.step is not None and e.phase_s >= protocol.STUCK_S:
            longest[e.step] = max(e.phase_s, longest.get(e.step, 0.0))
    if not longest:
        return
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO {CollectiveWait._meta.db_table} AS w (run_id, rank, step, seconds, received)
                SELECT %s, %s, step, seconds, %s FROM unnest(%s::int8[], %s::float8[]) AS u(step, seconds)
                ON CONFLICT (run_id, step, rank) DO UPDATE
                SET seconds = GREATEST(w.seconds, EXCLUDED.seconds), received = EXCLUDED.received""",
            [run.id, rank, now, list(longest), list(longest.values())],
        )


RAW = (("run_id", "int8"), ("rank", "int4"))  # the columns every raw table's rows begin with
LOG = Table(
    EventLog._meta.db_table,
    (*RAW, ("t", "text"), ("body", "jsonb"), ("ts", "timestamptz"), ("received", "timestamptz")),
    _log_rows,
)
TABLES: dict[type, Table] = {
    protocol.Step: Table(
        StepReport._meta.db_table,
        (
            *RAW,
            ("step", "int8"),
            ("loss", "float8"),
            ("step_time", "float8"),
            ("ts", "timestamptz"),
            ("received", "timestamptz"),
        ),
        _step_rows,
    ),
    protocol.GraphBreak: Table(
        GraphBreakEvent._meta.db_table,
        (
            *RAW,
            ("frame", "text"),
            ("reason", "text"),
            ("step", "int8"),
            ("ts", "timestamptz"),
            ("received", "timestamptz"),
        ),
        _break_rows,
    ),
    protocol.Progress: LOG,  # and the long waits in a collective (`_keep_waits`)
}
# Facts already folded into the rank row (start, heartbeat). A rank_end is kept verbatim as well: the
# row holds its status, the log its exception (type, message, frame) for rank_crashed.
FOLDED = frozenset({protocol.RankStart, protocol.Heartbeat})
