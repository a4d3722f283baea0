"""P5: long-term bytes per rank-step when all ranks agree, after raw rows expire.

Ingests N steps from R ranks (default 1024) in-process through the real writers (the recorded
compile burst, then compact `grads` batches), settles every slot through the real settle code,
drops the raw partitions through the real retention code, VACUUM FULLs what remains and
divides its size by the rank-steps. What remains is O(slots) (settled slots: consensus and
dissenters) plus O(ranks) (rank rows, watermarks), which the table separates. Sizes are growth
over the same tables freshly migrated (empty relations and indexes have fixed pages).

    python -m bench ingest_storage [--ranks 1024 --steps 128]
"""

from __future__ import annotations

import argparse
import time
import uuid

import msgspec

from bench.common import bench_env, compile_burst, fingerprints, fresh_database, recording, setup_django
from bench.results import report

LONG_TERM = {
    "O(slots)": (
        "ledger_gradslot",
        "ledger_compileslot",
        "detection_alert",
        "evidence_blob",
    ),
    "O(ranks)": ("tenancy_rank", "ledger_gradwatermark", "tenancy_run", "evidence_ingestsession"),
}


def ingest(ranks: int, steps: int, per_batch: int, buckets: int) -> None:
    from agents import protocol
    from dashboard.tenancy.models import Project
    from ingest import validation, writers

    project = Project.objects.create(name="storage-bench")
    run = protocol.RunInfo(key=f"storage-{uuid.uuid4().hex[:8]}", world_size=ranks)
    burst = [msgspec.convert(e, protocol.AnyEvent) for e in compile_burst(recording(), 0)]
    packed = [
        protocol.Grads.pack(first, [fingerprints(first + i, buckets) for i in range(per_batch)])
        for first in range(0, steps, per_batch)
    ]
    for rank in range(ranks):
        session = str(uuid.uuid4())
        for seq, events in enumerate([burst] + [[g] for g in packed]):
            body = protocol.encode(protocol.Batch(v=1, run=run, rank=rank, session=session, seq=seq, events=events))
            writers.store(validation.decode(body), project, writers.digest(body))


def settle_all() -> int:
    from dashboard.detection import settle
    from dashboard.ledger.models import CompileSlot, GradSlot

    for slot_id in CompileSlot.objects.values_list("id", flat=True):
        settle.settle_compile(slot_id)
    ids = list(GradSlot.objects.values_list("id", flat=True))
    for slot_id in ids:
        settle.settle_grad(slot_id)
    return len(ids)


def sizes() -> dict[str, int]:
    from django.db import connection

    tables = [t for group in LONG_TERM.values() for t in group]
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"VACUUM FULL {table}")
        cur.execute("SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)", [tables])
        return dict(cur.fetchall())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--steps-per-batch", type=int, default=64)
    parser.add_argument("--buckets", type=int, default=16)
    args = parser.parse_args(argv)
    env = bench_env("lockstep_bench_storage")
    fresh_database(env)
    setup_django(env)
    from dashboard.evidence import retention
    from dashboard.evidence.models import GradReport

    empty = sizes()  # every table and index has fixed pages even when empty: not per rank-step

    started = time.perf_counter()
    ingest(args.ranks, args.steps, args.steps_per_batch, args.buckets)
    raw_rows = GradReport.objects.count()
    slots = settle_all()
    pruned = retention.prune(days=-1)  # as if the retention period had passed
    measured = {t: size - empty.get(t, 0) for t, size in sizes().items()}
    rank_steps = args.ranks * args.steps
    per_group = {name: sum(measured.get(t, 0) for t in tables) for name, tables in LONG_TERM.items()}
    at_10k = per_group["O(slots)"] / rank_steps + per_group["O(ranks)"] / (args.ranks * 10_000)
    rows = [(t, f"{measured.get(t, 0):+,} B", group) for group, tables in LONG_TERM.items() for t in tables]
    rows += [
        ("raw grad rows before retention", f"{raw_rows:,}", f"{len(pruned.partitions)} partitions dropped"),
        ("grad slots settled", f"{slots:,}", f"{time.perf_counter() - started:.0f} s for the whole run"),
        (
            "P5 bytes per rank-step, this run",
            f"{sum(per_group.values()) / rank_steps:.2f}",
            f"{args.ranks} ranks x {args.steps} steps (target <= 8)",
        ),
        ("  of which O(slots)", f"{per_group['O(slots)'] / rank_steps:.2f}", "grows with steps"),
        ("  of which O(ranks)", f"{per_group['O(ranks)'] / rank_steps:.2f}", "fixed per rank, shrinks with steps"),
        ("P5 at 10k steps (extrapolated)", f"{at_10k:.2f}", "O(slots) per rank-step + O(ranks) / 10k steps"),
        ("anchor", "~1 KB", "one row per rank-bucket-step"),
    ]
    report(
        "ingest_storage",
        argv,
        f"storage bench: {args.ranks} ranks, {args.steps} steps, {args.buckets} buckets, all ranks agree",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
