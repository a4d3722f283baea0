"""Write one validated batch: all-or-nothing, idempotent per (session, seq), raw rows through COPY."""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone

import msgspec
from django.db import connection, transaction

from agents import protocol
from dashboard.detection import slots
from ingest.models import IngestBatch, Project, Run
from ingest.validation import Rejection

_SIGN = 1 << 63


def to_signed(value: int) -> int:
    """u64 fingerprint -> PostgreSQL bigint (same bits)."""
    return value - (1 << 64) if value >= _SIGN else value


def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc) if ts > 0 else datetime.now(timezone.utc)


@dataclass
class Stored:
    accepted: int
    duplicate: bool = False
    ready: list[tuple[str, int]] = field(default_factory=list)


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def store(batch: protocol.Batch, project: Project, body_digest: str) -> Stored:
    with transaction.atomic():
        run = _run(batch, project)
        if not _claim(batch, run, body_digest):
            return Stored(accepted=0, duplicate=True)
        by_type = defaultdict(list)
        for event in batch.events:
            by_type[type(event)].append(event)
        _rank(run, batch, by_type)
        for kind, events in by_type.items():
            WRITERS.get(kind, _write_log)(run, batch.rank, events)
        ready = slots.touch(run, by_type.get(protocol.Compile, []), by_type.get(protocol.Grad, []))
    return Stored(accepted=len(batch.events), ready=ready)


def _run(batch: protocol.Batch, project: Project) -> Run:
    info = batch.run
    run, _ = Run.objects.get_or_create(
        key=info.key,
        defaults={"project": project, "name": info.name or info.key, "world_size": info.world_size, "meta": info.meta},
    )
    if run.project_id != project.id:
        raise Rejection(403, f"run {info.key!r} belongs to another project", "run.key")
    if run.world_size != info.world_size:
        raise Rejection(400, f"world_size changed from {run.world_size} to {info.world_size} within run", "run.world_size")
    return run


def _claim(batch: protocol.Batch, run: Run, body_digest: str) -> bool:
    """True if (session, seq) is new; False for an exact resend; 409 for a different body under it."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO ingest_ingestbatch (session, seq, digest, run_id, rank, events, received_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (session, seq) DO NOTHING RETURNING id",
            [batch.session, batch.seq, body_digest, run.id, batch.rank, len(batch.events)],
        )
        if cur.fetchone():
            return True
    previous = IngestBatch.objects.get(session=batch.session, seq=batch.seq)
    if previous.digest != body_digest:
        raise Rejection(409, f"batch seq {batch.seq} of session {batch.session} was already received with other content", "seq")
    return False


def _rank(run: Run, batch: protocol.Batch, by_type: dict) -> None:
    """Keep the rank's liveness, last step and start/end facts current."""
    steps = [e.step for e in batch.events if getattr(e, "step", None) is not None]
    last_step = max(steps) if steps else None
    start = by_type.get(protocol.RankStart, [None])[-1]
    end = by_type.get(protocol.RankEnd, [None])[-1]
    info = msgspec.to_builtins(start) if start else None
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO ingest_rank (run_id, rank, host, pid, info, status, exit_code, last_step, last_seen)
            VALUES (%(run)s, %(rank)s, %(host)s, %(pid)s, COALESCE(%(info)s::jsonb, '{}'::jsonb), %(status)s, %(exit)s, %(step)s, now())
            ON CONFLICT (run_id, rank) DO UPDATE SET
              host = COALESCE(NULLIF(EXCLUDED.host, ''), ingest_rank.host),
              pid = COALESCE(EXCLUDED.pid, ingest_rank.pid),
              info = CASE WHEN %(has_info)s THEN EXCLUDED.info ELSE ingest_rank.info END,
              status = CASE WHEN %(ended)s THEN EXCLUDED.status ELSE ingest_rank.status END,
              exit_code = COALESCE(EXCLUDED.exit_code, ingest_rank.exit_code),
              last_step = GREATEST(ingest_rank.last_step, EXCLUDED.last_step),
              last_seen = now()
            """,
            {
                "run": run.id, "rank": batch.rank, "host": start.host if start else "",
                "pid": start.pid if start else None,
                "info": msgspec.json.encode(info).decode() if info else None, "has_info": info is not None,
                "status": end.status if end else "running", "ended": end is not None,
                "exit": end.exit_code if end else None, "step": last_step,
            },
        )
        cur.execute(
            """
            UPDATE ingest_run SET last_seen = now(),
              last_step = GREATEST(last_step, %(step)s),
              torch_version = COALESCE(NULLIF(%(torch)s, ''), torch_version)
            WHERE id = %(run)s
            """,
            {"run": run.id, "step": last_step, "torch": (start.versions.get("torch", "") if start else "")},
        )


def _copy(table: str, columns: tuple[str, ...], rows) -> None:
    cols = ", ".join(f'"{c}"' for c in columns)
    with connection.connection.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _write_compiles(run: Run, rank: int, events: list[protocol.Compile]) -> None:
    def row(e: protocol.Compile):
        dynamo = e.hashes.get("dynamo")
        code = e.hashes.get("inductor")
        detail = {"times": e.times, "counts": e.counts, "cache_keys": e.cache_keys, "graph_breaks": e.graph_breaks,
                  "hashes": msgspec.to_builtins(e.hashes)}
        return (
            run.id, rank, e.frame, e.index, e.compile_id, e.step, e.status, e.fail_type, e.fail_reason,
            e.recompile_reason, dynamo.raw if dynamo else "", dynamo.norm if dynamo else "",
            code.raw if code else "", code.norm if code else "",
            e.times.get("entire_frame_compile_time_s"), msgspec.json.encode(e.cache).decode(),
            msgspec.json.encode(detail).decode(), _when(e.ts),
        )

    _copy(
        "ingest_compileevent",
        ("run_id", "rank", "frame", "index", "compile_id", "step", "status", "fail_type", "fail_reason",
         "recompile_reason", "graph_raw", "graph_norm", "code_raw", "code_norm", "compile_time", "cache", "detail", "ts"),
        map(row, events),
    )


def _write_grads(run: Run, rank: int, events: list[protocol.Grad]) -> None:
    _copy(
        "ingest_gradreport",
        ("run_id", "rank", "step", "group", "fps", "norm", "nonfinite", "ts"),
        ((run.id, rank, e.step, e.group, [to_signed(f) for f in e.fps], e.norm, e.nonfinite, _when(e.ts)) for e in events),
    )


def _write_steps(run: Run, rank: int, events: list[protocol.Step]) -> None:
    _copy(
        "ingest_stepreport",
        ("run_id", "rank", "step", "loss", "step_time", "ts"),
        ((run.id, rank, e.step, e.loss, e.step_time, _when(e.ts)) for e in events),
    )


def _write_breaks(run: Run, rank: int, events: list[protocol.GraphBreak]) -> None:
    _copy(
        "ingest_graphbreakevent",
        ("run_id", "rank", "frame", "reason", "step", "ts"),
        ((run.id, rank, e.frame, e.reason, e.step, _when(e.ts)) for e in events),
    )


def _write_log(run: Run, rank: int, events: list[protocol.Event]) -> None:
    _copy(
        "ingest_eventlog",
        ("run_id", "rank", "t", "body", "ts"),
        ((run.id, rank, type(e).__struct_config__.tag, msgspec.json.encode(e).decode(), _when(e.ts)) for e in events),
    )


def _skip(run: Run, rank: int, events: list) -> None:
    """Facts already folded into the rank row (start, end, heartbeat)."""


WRITERS = {
    protocol.Compile: _write_compiles,
    protocol.Grad: _write_grads,
    protocol.Step: _write_steps,
    protocol.GraphBreak: _write_breaks,
    protocol.RankStart: _skip,
    protocol.RankEnd: _skip,
    protocol.Heartbeat: _skip,
}
