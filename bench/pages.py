"""P6: run page and timeline API server time for one run of 1024 ranks x 10k steps (target <= 300 ms).

    python -m bench pages [--ranks 1024] [--steps 10000] [--rebuild] [--no-raw] [--screenshot PNG]

Uses its own database (`lockstep_bench_pages` on the DATABASE_URL server, default the local
PostgreSQL), fills it once with SQL (generate_series), then times the Django views in-process
(middleware, auth, queries, template/JSON) with the test client: median and p90 of N calls after
one warm-up. The run is realistic in size: every rank has rank_start info, 10k grad slots
(rank 517 dissents from step 7000; scattered one-step dissent), 24 compiles and 4 graph breaks
per rank, and (unless --no-raw) 10M step reports the pages must not scan.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from functools import partial

from bench import common
from bench.results import markdown, record, rerun

BENCH_DB = "lockstep_bench_pages"  # own name: other benchmarks recreate lockstep_bench


def configure() -> None:
    common.configure_in_process(BENCH_DB)


def populate(key: str, ranks: int, steps: int, raw: bool) -> None:
    from django.db import connection, transaction

    from dashboard.detection.models import Alert
    from dashboard.evidence.models import CompileAgreement, GraphBreakEvent, StepReport
    from dashboard.ledger.models import CompileSlot, GradSlot
    from dashboard.tenancy.models import Rank

    run = common.fresh_run(key, ranks, steps, "2.13.0+cpu")
    t0 = time.time() - 3600
    params = {"run": run.id, "ranks": ranks, "steps": steps, "t0": t0}
    with transaction.atomic(), connection.cursor() as cur:
        common.today_partitions()
        common.finished_ranks(
            run,
            {
                "versions": {"torch": "2.13.0+cpu", "python": "3.11.2"},
                "config_hash": "cfg",
                "env": {"OMP_NUM_THREADS": "1"},
            },
        )
        cur.execute(
            """
            INSERT INTO ledger_gradslot (run_id, step, "group", reported, first_seen, settled_at, settled_n, dissenters, consensus)
            SELECT %(run)s, s, 'ddp', %(ranks)s, now(), now(), %(ranks)s,
                   CASE WHEN s >= 7000 THEN ARRAY[517] WHEN s %% 997 = 0 THEN ARRAY[(s * 31) %% %(ranks)s] ELSE '{}'::int[] END,
                   jsonb_build_object('reference', jsonb_build_array(s, s + 1), 'tie', false)
            FROM generate_series(0, %(steps)s - 1) s
            """,
            params,
        )
        cur.execute(
            """
            INSERT INTO ledger_compileslot (run_id, frame, index, reported, first_seen, settled_at, settled_n, dissenters, consensus)
            SELECT %(run)s, 'model.py:' || f || ':block' || f, i, %(ranks)s, now(), now(), %(ranks)s,
                   CASE WHEN f = 3 AND i = 1 THEN ARRAY[12, 700] ELSE '{}'::int[] END, '{"reference": "aa"}'
            FROM generate_series(0, 7) f, generate_series(0, 2) i
            """,
            params,
        )
        cur.execute(
            """
            INSERT INTO evidence_compileagreement (run_id, ranks, frame, index, compile_id, step, status, graph_raw,
                                                 graph_norm, code_raw, code_norm, times, cache, detail, ends)
            SELECT %(run)s, ARRAY[r], 'model.py:' || f || ':block' || f, i, f || '/' || i, i * 1000, 'ok', 'aa', 'aa',
                   'cc', 'cc', ARRAY[1.0 + (r %% 7) * 0.1],
                   CASE WHEN (r + f) %% 5 = 0 THEN '{"inductor": "miss"}' ELSE '{"inductor": "hit"}' END::jsonb,
                   '{"counts": {"graph_op_count": 40}}'::jsonb,
                   ARRAY[to_timestamp(%(t0)s + f * 20 + i * 600 + (r %% 13) * 0.2)]
            FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, 7) f, generate_series(0, 2) i
            """,
            params,
        )
        common.graph_breaks(run, t0, "model.py:1:block1")
        if raw:
            cur.execute(
                """
                INSERT INTO evidence_stepreport (run_id, rank, step, loss, step_time, ts)
                SELECT %(run)s, r, s, 1.0 / (s + 1), 0.2, to_timestamp(%(t0)s + s * 0.3)
                FROM generate_series(0, %(steps)s - 1) s, generate_series(0, %(ranks)s - 1) r
                """,
                params,
            )
        alerts = (
            (
                "grad_divergence",
                "critical",
                [517],
                7000,
                None,
                "Gradients of rank 517 differ from the other replicas at step 7000",
            ),
            (
                "graph_divergence",
                "critical",
                [12, 700],
                1000,
                "model.py:3:block3",
                "Ranks 12, 700 traced another graph for model.py:3:block3",
            ),
            (
                "cache_divergence",
                "warning",
                [0, 5, 10],
                0,
                "model.py:0:block0",
                "Ranks 0, 5, 10 missed the inductor cache",
            ),
        )
        Alert.objects.bulk_create(
            Alert(
                run=run,
                kind=kind,
                subject=f"{kind}:{step}",
                severity=severity,
                ranks=alert_ranks,
                step=step,
                frame=frame,
                message=message,
                notified_revision=1,
            )
            for kind, severity, alert_ranks, step, frame, message in alerts
        )
    common.analyze(Rank, GradSlot, CompileSlot, CompileAgreement, GraphBreakEvent, StepReport, Alert)


def main(argv: list[str] | None = None) -> int:
    parser = common.run_size_parser(__doc__.splitlines()[0], n=15)
    parser.add_argument("--no-raw", action="store_true", help="skip the 10M step reports (faster setup)")
    parser.add_argument("--screenshot", metavar="PNG", help="also save the run page as seen in headless Chromium")
    args = parser.parse_args(argv)
    configure()
    from django.db import connection

    key = f"bench-{args.ranks}x{args.steps}"
    common.populate_once(key, args.rebuild, partial(populate, key, args.ranks, args.steps, raw=not args.no_raw))
    client = common.member_client()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM evidence_stepreport WHERE run_id = (SELECT id FROM tenancy_run WHERE key = %s)", [key]
        )
        step_rows = cur.fetchone()[0]
    rows = [("run page", f"/runs/{key}/"), ("timeline API", f"/api/v1/runs/{key}/timeline")]
    print(f"P6 ({args.ranks} ranks x {args.steps} steps, {step_rows:,} step reports), server time in ms, n={args.n}")
    print(f"{'endpoint':<16}{'median':>10}{'p90':>10}{'max':>10}{'target':>10}  ok")
    worst, table = 0.0, []
    for name, url in rows:
        samples = common.timed_get(client, url, args.n)
        tail = common.p90(samples)
        worst = max(worst, statistics.median(samples))
        ok = "yes" if statistics.median(samples) <= 300 else "NO"
        print(f"{name:<16}{statistics.median(samples):>10.1f}{tail:>10.1f}{samples[-1]:>10.1f}{300:>10}  {ok}")
        table.append((name, f"{statistics.median(samples):.1f}", f"{tail:.1f}", f"{samples[-1]:.1f}", 300, ok))
    body = client.get(f"/api/v1/runs/{key}/timeline").content
    print(f"timeline payload: {len(body) / 1024:.0f} KiB")
    record(
        "pages",
        markdown(("endpoint", "median ms", "p90 ms", "max ms", "target ms", "ok"), table),
        rerun("pages", argv),
        f"P6: {args.ranks} ranks x {args.steps} steps ({step_rows:,} step reports), server time, n={args.n}; "
        f"timeline payload {len(body) / 1024:.0f} KiB.",
    )
    if args.screenshot:
        screenshot(key, client.cookies["sessionid"].value, args.screenshot)
    return 0 if worst <= 300 else 1


def screenshot(key: str, session: str, path: str) -> None:
    """The run page of the big run in headless Chromium, served by uvicorn on the bench database."""
    import subprocess

    from tests.browser import chromium_page
    from tests.stack import free_port

    port = free_port()
    env = dict(os.environ, ALLOWED_HOSTS="127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--port", str(port), "--log-level", "warning"],
        env=env,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        with chromium_page(url, session) as page:
            page.set_viewport_size({"width": 1280, "height": 900})
            for _ in range(100):
                try:
                    page.goto(f"{url}/runs/{key}/")
                    break
                except Exception:
                    time.sleep(0.2)
            page.wait_for_selector("#heatmap canvas", timeout=30_000)
            time.sleep(1)
            page.screenshot(path=path, clip={"x": 0, "y": 0, "width": 1280, "height": 1500}, full_page=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
