"""Write one validated batch: all-or-nothing, idempotent per (session, seq), raw rows by binary COPY.

One transaction per batch: the (session, seq) claim, the rank/run facts, every raw row and the
slot counters commit together or not at all, so a batch is either accepted whole or can be
resent whole. Grad rows (nearly all of the volume) are encoded by `ingest.pgcopy`; the rare
kinds go through psycopg's binary `write_row`.
"""
from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import NamedTuple

import msgspec
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from agents import protocol
from dashboard.detection import slots
from ingest import partitions, pgcopy
from ingest.models import IngestBatch, Project, Run
from ingest.validation import Rejection

def _when(ts: float, now: datetime) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc) if ts > 0 else now


class GradKey(NamedTuple):
    """What `slots.touch` reads of a grad report: one per rank-step, from either grad form."""

    step: int
    group: str


@dataclass
class Stored:
    accepted: int
    duplicate: bool = False
    ready: list[tuple[str, int]] = field(default_factory=list)
    graph_hashes: list[str] = field(default_factory=list)
    rank_steps: int = 0
    run_id: int | None = None


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def store(batch: protocol.Batch, project: Project, body_digest: str) -> Stored:
    now = datetime.now(timezone.utc)
    partitions.ensure_around(now)  # before the transaction: partition DDL never waits on row locks
    with transaction.atomic():
        run = _run(batch, project)
        by_type = defaultdict(list)
        for event in batch.events:
            by_type[type(event)].append(event)
        before = _claim(batch, run, body_digest, by_type)
        if before is None:
            return Stored(accepted=0, duplicate=True)
        grads = by_type.pop(protocol.Grad, []) + [_weights_as_grad(e) for e in by_type.pop(protocol.Param, [])]
        grad_keys = _write_grads(run, batch.rank, grads, by_type.pop(protocol.Grads, []), now)
        for kind, events in by_type.items():
            WRITERS.get(kind, _write_log)(run, batch.rank, events, now)
        compiles = by_type.get(protocol.Compile, [])
        ready = slots.touch(run, compiles, grad_keys, batch.rank)
    _touch_run(run, batch, by_type)
    ready += slots.grads_ready(run, before, {k.group for k in grad_keys if slots.replicated(k.group)})
    return Stored(accepted=len(batch.events), ready=ready, graph_hashes=_graph_hashes(compiles), rank_steps=len(grad_keys),
                  run_id=run.id)


def _weights_as_grad(e: protocol.Param) -> protocol.Grad:
    """Weight fingerprints ride the gradient pipeline (slots, consensus) in their own group."""
    return protocol.Grad(step=e.step, group=slots.PARAM_PREFIX + e.group, fps=e.fps, ts=e.ts)


def _graph_hashes(compiles: list[protocol.Compile]) -> list[str]:
    """Normalized artifact hashes in the content-address form (`protocol.blob_hash`) the blob store keys on."""
    return sorted({h.norm for e in compiles for h in e.hashes.values() if len(h.norm) == 32})


RUN_CACHE_S = 60.0
_runs: dict[str, tuple[float, Run]] = {}  # key -> (expires, run): project and world_size never change


def forget_runs() -> None:
    """After a database error: a cached run may be gone (deleted), so look every run up again."""
    _runs.clear()


def _run(batch: protocol.Batch, project: Project) -> Run:
    info = batch.run
    cached = _runs.get(info.key)
    if cached and cached[0] > time.monotonic():
        run = cached[1]
    else:
        run, _ = Run.objects.get_or_create(
            key=info.key,
            defaults={"project": project, "name": info.name or info.key, "world_size": info.world_size, "meta": info.meta},
        )
        # remembered once committed: a run created by a batch that then rolled back does not exist
        transaction.on_commit(lambda: _runs.__setitem__(info.key, (time.monotonic() + RUN_CACHE_S, run)))
    if run.project_id != project.id:
        raise Rejection(403, f"run {info.key!r} belongs to another project", "run.key")
    if run.world_size != info.world_size:
        raise Rejection(400, f"world_size changed from {run.world_size} to {info.world_size} within run", "run.world_size")
    return run


def _claim(batch: protocol.Batch, run: Run, body_digest: str, by_type: dict) -> dict[str, int] | None:
    """Claim (session, seq) and record the rank's facts in one round trip.

    Returns the rank's grad watermarks from before this batch, or None for an exact resend;
    raises 409 for a different body under the same (session, seq). The rank row is only
    updated when the claim succeeded (`WHERE EXISTS (SELECT 1 FROM claim)`).
    """
    last_step = _last_step(batch.events)
    start = by_type.get(protocol.RankStart, [None])[-1]
    end = by_type.get(protocol.RankEnd, [None])[-1]
    info = msgspec.to_builtins(start) if start else None
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH claim AS (
              INSERT INTO ingest_ingestbatch (session, seq, digest, run_id, rank, events, received_at)
              VALUES (%(session)s, %(seq)s, %(digest)s, %(run)s, %(rank)s, %(events)s, now())
              ON CONFLICT (session, seq) DO NOTHING RETURNING id
            ), ranked AS (
              INSERT INTO ingest_rank (run_id, rank, host, pid, info, status, exit_code, last_step, last_seen)
              SELECT %(run)s, %(rank)s, %(host)s, %(pid)s, COALESCE(%(info)s::jsonb, '{}'::jsonb), %(status)s, %(exit)s,
                     %(step)s, now()
              WHERE EXISTS (SELECT 1 FROM claim)
              ON CONFLICT (run_id, rank) DO UPDATE SET
                host = COALESCE(NULLIF(EXCLUDED.host, ''), ingest_rank.host),
                pid = COALESCE(EXCLUDED.pid, ingest_rank.pid),
                info = CASE WHEN %(has_info)s THEN EXCLUDED.info ELSE ingest_rank.info END,
                status = CASE WHEN %(ended)s THEN EXCLUDED.status ELSE ingest_rank.status END,
                exit_code = COALESCE(EXCLUDED.exit_code, ingest_rank.exit_code),
                last_step = GREATEST(ingest_rank.last_step, EXCLUDED.last_step),
                last_seen = now()
            )
            SELECT (SELECT id FROM claim),
                   (SELECT COALESCE(json_object_agg("group", step), '{}') FROM ingest_gradwatermark
                    WHERE run_id = %(run)s AND rank = %(rank)s)
            """,
            {
                "session": batch.session, "seq": batch.seq, "digest": body_digest, "run": run.id, "rank": batch.rank,
                "events": len(batch.events), "host": start.host if start else "", "pid": start.pid if start else None,
                "info": msgspec.json.encode(info).decode() if info else None, "has_info": info is not None,
                "status": end.status if end else "running", "ended": end is not None,
                "exit": end.exit_code if end else None, "step": last_step,
            },
        )
        claimed, watermarks = cur.fetchone()
    if claimed is not None:
        return watermarks
    previous = IngestBatch.objects.get(session=batch.session, seq=batch.seq)
    if previous.digest != body_digest:
        raise Rejection(409, f"batch seq {batch.seq} of session {batch.session} was already received with other content", "seq")
    return None


_PROGRESS = (protocol.Grad, protocol.Grads, protocol.Step, protocol.Param)


def _touch_run(run: Run, batch: protocol.Batch, by_type: dict) -> None:
    """Run liveness, after commit: every rank's batch touches this one row, so inside the batch
    transaction its row lock would serialize all ingest of a run. Skipped when nothing changes."""
    start = by_type.get(protocol.RankStart, [None])[-1]
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE ingest_run SET last_seen = now(), last_step = GREATEST(last_step, %(step)s),
              torch_version = COALESCE(NULLIF(%(torch)s, ''), torch_version)
            WHERE id = %(run)s AND (last_seen < now() - interval '1 second' OR last_step IS NULL
                                    OR last_step < %(step)s OR %(torch)s <> '')
            """,
            {"run": run.id, "step": _last_step(batch.events), "torch": start.versions.get("torch", "") if start else ""},
        )


def _last_step(events: list[protocol.Event]) -> int | None:
    """Last completed step: only progress events count (heartbeats carry the step in flight)."""
    steps = [e.step_numbers()[-1] if isinstance(e, protocol.Grads) else e.step
             for e in events if isinstance(e, _PROGRESS)]
    return max(steps) if steps else None


def _copy_stream(table: str, columns: tuple[str, ...], chunks) -> None:
    cols = ", ".join(f'"{c}"' for c in columns)
    with connection.connection.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
        for chunk in chunks:
            copy.write(chunk)


def _copy_rows(table: str, columns: tuple[tuple[str, str], ...], rows) -> None:
    """psycopg binary COPY with declared types, for the low-volume tables."""
    cols = ", ".join(f'"{name}"' for name, _ in columns)
    with connection.connection.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([kind for _, kind in columns])
        for row in rows:
            copy.write_row(row)


GRAD_COLUMNS = ("run_id", "rank", "step", "group", "fps", "norm", "nonfinite", "ts", "received")


def grad_rows(run_id: int, rank: int, grads: list[protocol.Grad], packed: list[protocol.Grads], now: datetime):
    """Binary COPY rows (without the field count) for both grad forms, and the slot key of each row."""
    head = pgcopy.int8(run_id) + pgcopy.int4(rank)
    received = pgcopy.timestamptz(now)
    rows, keys = [], []
    for e in packed:
        arrays = pgcopy.int8_arrays(e.fps, e.buckets)
        tail = pgcopy.timestamptz(_when(e.ts, now)) + received
        group = pgcopy.text(e.group)
        norms = e.norms or [None] * e.steps
        nonfinite = e.nonfinite or [0] * e.steps
        for i, step in enumerate(e.step_numbers()):
            rows.append(head + pgcopy.int8(step) + group + arrays[i] + pgcopy.float8(norms[i])
                        + pgcopy.int8(nonfinite[i]) + tail)
        keys.extend(GradKey(step, e.group) for step in e.step_numbers())
    for e in grads:
        array = pgcopy.int8_arrays(pgcopy.u64_list_bytes(e.fps), len(e.fps))[0] if e.fps else pgcopy.empty_int8_array()
        rows.append(head + pgcopy.int8(e.step) + pgcopy.text(e.group) + array + pgcopy.float8(e.norm)
                    + pgcopy.int8(e.nonfinite) + pgcopy.timestamptz(_when(e.ts, now)) + received)
        keys.append(GradKey(e.step, e.group))
    return rows, keys


def _write_grads(run: Run, rank: int, grads: list[protocol.Grad], packed: list[protocol.Grads], now: datetime) -> list[GradKey]:
    rows, keys = grad_rows(run.id, rank, grads, packed, now)
    if rows:
        _copy_stream("ingest_gradreport", GRAD_COLUMNS, [b"".join(pgcopy.stream(rows, len(GRAD_COLUMNS)))])
    return keys


def _write_compiles(run: Run, rank: int, events: list[protocol.Compile], now: datetime) -> None:
    def row(e: protocol.Compile):
        dynamo = e.hashes.get("dynamo")
        code = e.hashes.get("inductor")
        detail = {"times": e.times, "counts": e.counts, "cache_keys": e.cache_keys, "graph_breaks": e.graph_breaks,
                  "hashes": msgspec.to_builtins(e.hashes)}
        return (
            run.id, rank, e.frame, e.index, e.compile_id, e.step, e.status, e.fail_type, e.fail_reason,
            e.recompile_reason, dynamo.raw if dynamo else "", dynamo.norm if dynamo else "",
            code.raw if code else "", code.norm if code else "",
            e.times.get("entire_frame_compile_time_s"), Jsonb(e.cache), Jsonb(detail), _when(e.ts, now), now,
        )

    _copy_rows(
        "ingest_compileevent",
        (("run_id", "int8"), ("rank", "int4"), ("frame", "text"), ("index", "int4"), ("compile_id", "text"),
         ("step", "int8"), ("status", "text"), ("fail_type", "text"), ("fail_reason", "text"),
         ("recompile_reason", "text"), ("graph_raw", "text"), ("graph_norm", "text"), ("code_raw", "text"),
         ("code_norm", "text"), ("compile_time", "float8"), ("cache", "jsonb"), ("detail", "jsonb"),
         ("ts", "timestamptz"), ("received", "timestamptz")),
        map(row, events),
    )


def _write_steps(run: Run, rank: int, events: list[protocol.Step], now: datetime) -> None:
    _copy_rows(
        "ingest_stepreport",
        (("run_id", "int8"), ("rank", "int4"), ("step", "int8"), ("loss", "float8"), ("step_time", "float8"),
         ("ts", "timestamptz"), ("received", "timestamptz")),
        ((run.id, rank, e.step, e.loss, e.step_time, _when(e.ts, now), now) for e in events),
    )


def _write_breaks(run: Run, rank: int, events: list[protocol.GraphBreak], now: datetime) -> None:
    _copy_rows(
        "ingest_graphbreakevent",
        (("run_id", "int8"), ("rank", "int4"), ("frame", "text"), ("reason", "text"), ("step", "int8"),
         ("ts", "timestamptz"), ("received", "timestamptz")),
        ((run.id, rank, e.frame, e.reason, e.step, _when(e.ts, now), now) for e in events),
    )


def _write_log(run: Run, rank: int, events: list[protocol.Event], now: datetime) -> None:
    _copy_rows(
        "ingest_eventlog",
        (("run_id", "int8"), ("rank", "int4"), ("t", "text"), ("body", "jsonb"), ("ts", "timestamptz"),
         ("received", "timestamptz")),
        ((run.id, rank, type(e).__struct_config__.tag, Jsonb(msgspec.to_builtins(e)), _when(e.ts, now), now) for e in events),
    )


def _skip(run: Run, rank: int, events: list, now: datetime) -> None:
    """Facts already folded into the rank row (start, end, heartbeat)."""


WRITERS = {
    protocol.Compile: _write_compiles,
    protocol.Step: _write_steps,
    protocol.GraphBreak: _write_breaks,
    protocol.RankStart: _skip,
    protocol.RankEnd: _skip,
    protocol.Heartbeat: _skip,
}
