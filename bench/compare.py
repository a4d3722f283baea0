"""P9: compare page and `/api/v1/compare` server time for two runs of 1024 ranks x 10k steps
(target <= 500 ms).

    python -m bench compare [--ranks 1024] [--steps 10000] [-n 9] [--rebuild]

Uses its own database (`lockstep_bench_compare` on the DATABASE_URL server, default the local
PostgreSQL), filled once in SQL (generate_series) through the owning apps' models' tables: per run,
every rank's rank_start info (versions, settings), 10k settled grad slots, grad reports shared by
the 8 ranks of a node (1.28M rows, with norms), a step report with loss and step time per
rank-step (10.24M rows), 8 frames x 3 compiles per rank and graph breaks. Run B is "torch 2.11":
other versions, one setting changed, frame 3 compiling 1.4x slower, its loss drifting from step
6000. The views are timed in-process with Django's test client (middleware, auth, queries,
template or JSON): median and p90 of N calls after one warm-up.
"""

from __future__ import annotations

import os
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from bench import common
from bench.results import markdown, record, rerun

if TYPE_CHECKING:
    from django.db.models import Model

BENCH_DB = "lockstep_bench_compare"
TARGET_MS = 500


def configure() -> None:
    common.configure_in_process(BENCH_DB)


def models() -> dict[str, type[Model]]:
    """The models whose tables the bench fills, by a short name."""
    from dashboard.evidence.models import CompileAgreement, GradReport, GraphBreakEvent, StepReport
    from dashboard.ledger.models import CompileSlot, GradSlot
    from dashboard.tenancy.models import Rank

    return {
        "rank": Rank,
        "grad_slot": GradSlot,
        "compile_slot": CompileSlot,
        "compile": CompileAgreement,
        "grad": GradReport,
        "graph_break": GraphBreakEvent,
        "step": StepReport,
    }


def populate(key: str, ranks: int, steps: int, newer: bool) -> None:
    from django.db import connection, transaction

    torch = "2.11.0+cu130" if newer else "2.13.0+cpu"
    python = "3.12.3" if newer else "3.11.7"
    cudagraphs = "True" if newer else "False"
    run = common.fresh_run(key, ranks, steps, torch, name=key)
    filled = models()
    t = {name: model._meta.db_table for name, model in filled.items()}
    p: dict[str, Any] = {
        "run": run.id,
        "ranks": ranks,
        "steps": steps,
        "t0": time.time() - 7200,
        "slow": 1.4 if newer else 1.0,
        "drift": 1.0 if newer else 0.0,
    }
    with transaction.atomic(), connection.cursor() as cur:
        common.today_partitions()
        common.finished_ranks(
            run,
            {
                "versions": {"torch": torch, "python": python},
                "settings": {"inductor.triton.cudagraphs": cudagraphs},
                "config_hash": "cfg",
                "env": {"OMP_NUM_THREADS": "1"},
                "params": [f"ddp:layer{i}.weight" for i in range(64)],
            },
        )
        cur.execute(
            f"""
            INSERT INTO {t["grad_slot"]} (run_id, step, "group", reported, first_seen, settled_at, settled_n, dissenters, consensus)
            SELECT %(run)s, s, 'ddp', %(ranks)s, now(), now(), %(ranks)s, '{{}}'::int[],
                   jsonb_build_object('reference', jsonb_build_array(s + (%(drift)s * (s / 10))::bigint), 'tie', false)
            FROM generate_series(0, %(steps)s - 1) s""",
            p,
        )
        cur.execute(
            f"""
            INSERT INTO {t["grad"]} (run_id, ranks, step, "group", fps, norm, nonfinite, ts)
            SELECT %(run)s, ARRAY(SELECT generate_series(n * 8, n * 8 + 7)), s, 'ddp', ARRAY[s, n, s + n, 7]::bigint[],
                   1.0 / (s + 1) * (1 + %(drift)s * 1e-7 * s), 0, to_timestamp(%(t0)s + s * 0.5)
            FROM generate_series(0, %(steps)s - 1) s, generate_series(0, %(ranks)s / 8 - 1) n""",
            p,
        )
        cur.execute(
            f"""
            INSERT INTO {t["step"]} (run_id, rank, step, loss, step_time, ts)
            SELECT %(run)s, r, s, (2.0 / (s + 1)) * (1 + %(drift)s * CASE WHEN s >= 6000 THEN 1e-2 ELSE 1e-7 END), 0.2,
                   to_timestamp(%(t0)s + s * 0.5)
            FROM generate_series(0, %(steps)s - 1) s, generate_series(0, %(ranks)s - 1) r""",
            p,
        )
        cur.execute(
            f"""
            INSERT INTO {t["compile_slot"]} (run_id, frame, index, reported, first_seen, settled_at, settled_n, dissenters, consensus)
            SELECT %(run)s, 'model.py:' || (10 * f) || ':Block' || f || '.forward', i, %(ranks)s, now(), now(), %(ranks)s,
                   '{{}}'::int[], '{{"reference": "aa"}}'
            FROM generate_series(0, 7) f, generate_series(0, 2) i""",
            p,
        )
        cur.execute(
            f"""
            INSERT INTO {t["compile"]} (run_id, ranks, frame, index, compile_id, step, status, graph_raw, graph_norm, code_raw,
                                        code_norm, times, cache, detail, ends)
            SELECT %(run)s, ARRAY[r], 'model.py:' || (10 * f) || ':Block' || f || '.forward', i, f || '/' || i, i * 1000, 'ok',
                   'g' || f || i, 'g' || f || i, 'c', 'c',
                   ARRAY[(1.0 + (r %% 7) * 0.1) * CASE WHEN f = 3 THEN %(slow)s ELSE 1 END],
                   CASE WHEN (r + f) %% 5 = 0 THEN '{{"inductor": "miss"}}' ELSE '{{"inductor": "hit"}}' END::jsonb,
                   jsonb_build_object('counts', jsonb_build_object('graph_op_count', 40, 'guard_count', 90 + f,
                                                                   'kernel_count', 6 + f)),
                   ARRAY[to_timestamp(%(t0)s + f * 20 + i * 600)]
            FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, 7) f, generate_series(0, 2) i""",
            p,
        )
        common.graph_breaks(run, p["t0"], "model.py:10:Block1.forward")
    common.analyze(*filled.values())


def main(argv: list[str] | None = None) -> int:
    parser = common.run_size_parser(__doc__.splitlines()[0], n=9, rebuild_help="regenerate the runs even if they exist")
    args = parser.parse_args(argv)
    configure()
    keys = [f"cmp-213-{args.ranks}x{args.steps}", f"cmp-211-{args.ranks}x{args.steps}"]
    for key, newer in zip(keys, (False, True)):
        common.populate_once(key, args.rebuild, partial(populate, key, args.ranks, args.steps, newer))
    client = common.member_client()
    runs = ",".join(keys)
    body = client.get(f"/api/v1/compare?runs={runs}").json()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"P9 (2 runs of {args.ranks} ranks x {args.steps} steps), server time in ms, n={args.n}, "
        f"load average {load} on {os.cpu_count()} cores"
    )
    print(f"{'endpoint':<16}{'median':>10}{'p90':>10}{'max':>10}{'target':>10}  ok")
    worst, table = 0.0, []
    for name, url in (("compare page", f"/compare/?runs={runs}"), ("compare API", f"/api/v1/compare?runs={runs}")):
        samples = common.timed_get(client, url, args.n)
        median, tail = statistics.median(samples), common.p90(samples)
        worst = max(worst, median)
        ok = "yes" if median <= TARGET_MS else "NO"
        print(f"{name:<16}{median:>10.1f}{tail:>10.1f}{samples[-1]:>10.1f}{TARGET_MS:>10}  {ok}")
        table.append((name, f"{median:.1f}", f"{tail:.1f}", f"{samples[-1]:.1f}", TARGET_MS, ok))
    loss = body["drift"]["vs"][0]["loss"]
    summary = (
        f"API payload {len(client.get(f'/api/v1/compare?runs={runs}').content) / 1024:.0f} KiB; loss drift past 1e-3 "
        f"at step {loss['first_over_tolerance']} of {loss['steps_compared']} compared; {body['verdict']['lines'][0]}"
    )
    print(summary)
    record(
        "compare",
        markdown(("endpoint", "median ms", "p90 ms", "max ms", "target ms", "ok"), table),
        rerun("compare", argv),
        f"P9: 2 runs of {args.ranks} ranks x {args.steps} steps, server time, n={args.n}, load average {load} on "
        f"{os.cpu_count()} cores. {summary}",
    )
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
