"""P-cost: server time of the compile bill API, GET /api/v1/runs/KEY/cost, for one run of 1024 ranks x
10k steps (target <= 300 ms).

    python -m bench cost [--ranks 1024] [--steps 10000] [--rebuild] [-n 15]

Uses its own database (`lockstep_bench_cost` on the DATABASE_URL server), fills it once with SQL
(generate_series), then times the view in-process (middleware, auth, queries, the bill, JSON) with the
test client, median and p90 of N calls after one warm-up, along the paths a reader takes today
(`bills.current_bill`; a read writes nothing): the bill computed on read, in memory, for a run no
sweep billed (no kept bill, none shared); the bill another reader computed within REFRESH_S, shared
through Redis, before the worker kept it; the kept bill once the product's worker has stored it (the
`keep_bills` messages those reads queued, run by a Celery worker in this process); and that kept bill
marked stale after a compile reached the run while it trains (the sweep refreshes it). The run's
compile history is a heavy one: 8 frames compiled by every rank before step 0, every rank recompiling
2 of them at 4 steps (another batch shape), 16 ranks recompiling one more every 500 steps, rank 517 a
straggler; cache outcomes mixed (every 5th rank-frame misses); 4 graph breaks per rank; and the
progress samples the agents send: one per rank per 5 s heartbeat over the run's 3,000 s, plus the
waits in a collective the other ranks report every 0.5 s while a recompile holds them up (the
"measured" steps), kept as ingest keeps them: the longest per rank and step.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from agents import protocol
from bench import common

if TYPE_CHECKING:
    from django.test import Client

BENCH_DB = "lockstep_bench_cost"
STEP_S = 0.3
HEARTBEAT_S = 5.0
ALL_RANK_RECOMPILES = (2000, 4000, 6000, 8000)
FEW_RANKS = 16
QUEUE = "lockstep-bench-cost"  # the bench's own Celery queue: its Redis database is not its alone


def populate(key: str, ranks: int, steps: int) -> None:
    from django.db import connection, transaction

    from dashboard.evidence.models import CollectiveWait, CompileAgreement, EventLog, GraphBreakEvent
    from dashboard.tenancy.models import Rank

    run = common.fresh_run(key, ranks, steps, "2.13.0+cpu")
    t0 = time.time() - steps * STEP_S - 600
    params: dict[str, Any] = {
        "run": run.id,
        "ranks": ranks,
        "steps": steps,
        "t0": t0,
        "step_s": STEP_S,
        "hb": HEARTBEAT_S,
        "all": list(ALL_RANK_RECOMPILES),
        "few": FEW_RANKS,
        "stuck": protocol.STUCK_S,
    }
    with transaction.atomic(), connection.cursor() as cur:
        common.today_partitions()
        common.finished_ranks(run, {"ts": t0, "versions": {"torch": "2.13.0+cpu"}})
        compile_sql = """
            INSERT INTO evidence_compileagreement (run_id, ranks, frame, index, compile_id, step, status,
                                                 recompile_reason, graph_raw, graph_norm, code_raw, code_norm, times, cache,
                                                 detail, ends)
            SELECT %(run)s, ARRAY[r], 'model.py:' || f || ':block' || f, i, f || '/' || i, {step}, 'ok', {reason},
                   'aa', 'aa', 'cc', 'cc', ARRAY[{seconds}],
                   jsonb_build_object('inductor', CASE WHEN (r + f + i) %% 5 = 0 THEN 'miss' ELSE 'hit' END),
                   jsonb_build_object('cache_keys', jsonb_build_object('inductor', 'fx' || f || '-' || i)),
                   ARRAY[to_timestamp({ts})]
            FROM {source}
        """
        cur.execute(
            compile_sql.format(  # first compiles, before step 0
                step="NULL",
                reason="NULL",
                seconds="4.0 + (r %% 7) * 0.3 + CASE WHEN r = 517 THEN 20 ELSE 0 END",
                ts="%(t0)s + 60 + f * 10",
                source="generate_series(0, %(ranks)s - 1) r, generate_series(0, 7) f, (SELECT 0 AS i) z",
            ),
            params,
        )
        cur.execute(
            compile_sql.format(  # every rank recompiles frames 0 and 1 at a few steps
                step="s",
                reason="'0/0: tensor ''x'' size mismatch at index 0. expected 16, actual ' || (16 + i)",
                seconds="2.0 + (r %% 5) * 0.2",
                ts="%(t0)s + 300 + s * %(step_s)s",
                source="generate_series(0, %(ranks)s - 1) r, generate_series(0, 1) f, "
                "unnest(%(all)s::int[]) WITH ORDINALITY AS x(s, i)",
            ),
            params,
        )
        cur.execute(
            compile_sql.format(  # a few ranks recompile frame 3 every 500 steps
                step="s",
                reason="'0/0: L[''n''] == ' || i",
                seconds="8.0",
                ts="%(t0)s + 300 + s * %(step_s)s",
                source="generate_series(0, %(few)s - 1) r, (SELECT 3 AS f) g, "
                "generate_series(250, %(steps)s - 1, 500) WITH ORDINALITY AS x(s, i)",
            ),
            params,
        )
        common.graph_breaks(run, t0, "model.py:1:block1")
        cur.execute(  # heartbeat samples: one per rank every HEARTBEAT_S
            """
            INSERT INTO evidence_eventlog (run_id, rank, t, body, ts)
            SELECT %(run)s, r, 'progress',
                   jsonb_build_object('t', 'progress', 'phase', 'step', 'phase_s', 0.01,
                                      'step', (k * %(hb)s / %(step_s)s)::bigint, 'ts', %(t0)s + 300 + k * %(hb)s),
                   to_timestamp(%(t0)s + 300 + k * %(hb)s)
            FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, (%(steps)s * %(step_s)s / %(hb)s)::int - 1) k
            """,
            params,
        )
        cur.execute(  # the waits of the ranks that did not recompile, sampled every 0.5 s past 5 s (measured): 7.5 s
            """
            INSERT INTO evidence_eventlog (run_id, rank, t, body, ts)
            SELECT %(run)s, r, 'progress',
                   jsonb_build_object('t', 'progress', 'phase', 'collective', 'phase_s', 5.0 + w * 0.5, 'step', s,
                                      'op', 'all_reduce', 'ts', %(t0)s + 300 + s * %(step_s)s + w * 0.5),
                   to_timestamp(%(t0)s + 300 + s * %(step_s)s + w * 0.5)
            FROM generate_series(%(few)s, %(ranks)s - 1) r, generate_series(250, %(steps)s - 1, 500) s,
                 generate_series(0, 5) w
            """,
            params,
        )
        cur.execute(  # the longest of those waits per rank and step, as ingest keeps them (`writes._write_progress`)
            """
            INSERT INTO evidence_collectivewait (run_id, rank, step, seconds, received)
            SELECT run_id, rank, (body ->> 'step')::bigint, max((body ->> 'phase_s')::float8), now()
            FROM evidence_eventlog
            WHERE run_id = %(run)s AND t = 'progress' AND body ->> 'phase' = 'collective'
              AND (body ->> 'phase_s')::float8 >= %(stuck)s
            GROUP BY 1, 2, 3
            """,
            params,
        )
        cur.execute(
            """
            INSERT INTO evidence_eventlog (run_id, rank, t, body, ts)
            SELECT %(run)s, r, 'rank_end', jsonb_build_object('t', 'rank_end', 'ts', %(t0)s + 600 + %(steps)s * %(step_s)s),
                   to_timestamp(%(t0)s + 600 + %(steps)s * %(step_s)s)
            FROM generate_series(0, %(ranks)s - 1) r
            """,
            params,
        )
    common.analyze(Rank, CompileAgreement, GraphBreakEvent, EventLog, CollectiveWait, vacuum=True)


def forget(key: str) -> None:
    """No bill for run `key`, kept or shared: the state of a run no sweep billed."""
    from dashboard.detection import bills
    from dashboard.detection.models import RunCost
    from dashboard.tenancy.models import Run
    from ingest import ratelimit

    RunCost.objects.filter(run__key=key).delete()
    ratelimit.client().delete(bills._name(Run.objects.get(key=key), "shared"))


def timed_computed(client: Client, url: str, key: str, n: int) -> list[float]:
    """Milliseconds of `n` GETs of a run without a kept or shared bill: the reader computes it from the
    raw events, in memory, shares it and queues its keeping (`tasks.keep_bills`), each time."""
    forget(key)
    client.get(url)  # warm-up
    samples = []
    for _ in range(n):
        forget(key)
        start = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200 and not response.json()["stale"]
    return sorted(samples)


def own_queue() -> None:
    """The bench's tasks go to, and its worker reads, QUEUE only: another stack's worker sharing the
    Redis database must not run them against its own database, nor the bench's worker theirs."""
    from dashboard.celery import app

    app.conf.task_default_queue = QUEUE


def worker_keeps(key: str, timeout: float = 120.0) -> tuple[int, float]:
    """The product's worker (Celery, one thread of this process) runs the `keep_bills` messages the
    reads queued and keeps the run's bill, what readers get from then on: (messages, seconds it took)."""
    from celery.contrib.testing.worker import start_worker

    from dashboard.celery import app
    from dashboard.detection.models import RunCost
    from ingest import ratelimit

    redis = ratelimit.client()
    messages, start = redis.llen(QUEUE), time.perf_counter()
    logging.getLogger("celery").setLevel(logging.WARNING)  # a line per task otherwise
    with start_worker(app, perform_ping_check=False, shutdown_timeout=timeout, queues=[QUEUE]):
        while redis.llen(QUEUE) or not RunCost.objects.filter(run__key=key).exists():
            assert time.perf_counter() - start < timeout, "the worker kept no bill"
            time.sleep(0.05)
    return messages, time.perf_counter() - start


def timed_stale(client: Client, url: str, key: str, n: int) -> list[float]:
    """Milliseconds of `n` GETs right after a compile reached the run while it trains: the kept bill,
    marked stale (the sweep refreshes it), after one aggregate of the run's compile seconds."""
    from django.utils import timezone

    from dashboard.detection.models import RunCost
    from dashboard.tenancy.models import Run

    samples = []
    for _ in range(n):
        assert RunCost.objects.filter(run__key=key).update(
            compile_seconds=-1.0, computed_at=timezone.now() - timedelta(seconds=20)
        )
        Run.objects.filter(key=key).update(last_seen=timezone.now())
        start = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200 and response.json()["stale"]
    return sorted(samples)


def counts(key: str) -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT (SELECT count(*) FROM evidence_compileevent c WHERE c.run_id = r.id),"
            " (SELECT count(*) FROM evidence_eventlog e WHERE e.run_id = r.id AND e.t = 'progress')"
            " FROM tenancy_run r WHERE r.key = %s",
            [key],
        )
        return cur.fetchone()


def timed_paths(client: Client, url: str, key: str, n: int) -> tuple[list[tuple[str, list[float]]], str]:
    """The reader's paths, timed in the order a run no sweep billed goes through them, and what the
    worker did between them."""
    from dashboard.detection import bills

    computed = timed_computed(client, url, key, n)
    shared_at = client.get(url).json()["computed_at"]
    shared = common.timed_get(client, url, n)
    assert client.get(url).json()["computed_at"] == shared_at, "a reader computed the shared bill again"
    messages, seconds = worker_keeps(key)
    kept = common.timed_get(client, url, n)
    stale = timed_stale(client, url, key, n)
    rows = [
        ("computed on read (a run no sweep billed; the worker keeps it)", computed),
        (f"shared: computed by another reader within {bills.REFRESH_S:.0f} s, not kept yet", shared),
        ("kept bill, current (kept by the worker)", kept),
        ("kept bill, stale (a compile since; the sweep refreshes it)", stale),
    ]
    return (
        rows,
        f"the worker ran the {messages} queued messages (a bill computed on read queues one) in {seconds:.1f} s",
    )


def main(argv: list[str] | None = None) -> int:
    args = common.run_size_parser(__doc__.splitlines()[0], n=15).parse_args(argv)
    common.configure_in_process(BENCH_DB)
    own_queue()
    key = f"bench-cost-{args.ranks}x{args.steps}"
    common.populate_once(key, args.rebuild, partial(populate, key, args.ranks, args.steps))
    client = common.member_client()
    compiles, samples = counts(key)
    before = common.python_speed()
    url = f"/api/v1/runs/{key}/cost"
    rows, worker = timed_paths(client, url, key, args.n)
    bill = client.get(url).json()
    lines = [
        "| GET /api/v1/runs/KEY/cost | ranks x steps | compile events | progress samples | median ms | p90 ms "
        "| max ms | target | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, timings in rows:
        median, tail = statistics.median(timings), common.p90(timings)
        lines.append(
            f"| {name} | {args.ranks} x {args.steps} | {compiles:,} | {samples:,} | {median:.1f} | {tail:.1f} "
            f"| {timings[-1]:.1f} | 300 | {'yes' if median <= 300 else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    print(
        f"bill: {bill['gpu_seconds'] / 3600:.1f} GPU-hours, {bill['basis']['measured_units']} steps measured, "
        f"{bill['basis']['assumed_units']} assumed, {len(bill['lines'])} lines; top: {bill['top']['label']} "
        f"{bill['top']['cause']} ({bill['top']['reason']}); load average {os.getloadavg()[0]:.1f}"
    )
    from bench.results import record

    command = " ".join(sys.argv if argv is None else ["python -m bench cost", *argv])
    speeds = f"{before:.2f} CPU-s before the timings and {common.python_speed():.2f} after"
    print(f"python speed: the fixed loop of bench.common.python_speed took {speeds}; {worker}")
    note = (
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; the fixed Python loop took {speeds}; "
        f"{worker}"
    )
    record("cost", table, command, note=note)
    return 0 if max(statistics.median(timings) for _, timings in rows) <= 300 else 1


if __name__ == "__main__":
    raise SystemExit(main())
