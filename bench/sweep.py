"""The periodic sweep's check of one large running run: the Celery worker does it every second for
every active run, so at 100,000 ranks its cost per run bounds how many such runs one worker follows.

    python -m bench sweep [--ranks 100000] [-n 7] [--rebuild]

Uses its own database (`lockstep_bench_sweep` on the DATABASE_URL server) and one run of the
"bench" project whose ranks are all running and fresh (reporting now). Times, in this process,
median (min-max) of N after one warm-up: `runs.view_of` (the ranks' ages and ends, crashes,
progress, the compile bill), the rules on that view (`rules.evaluate`), the subjects found clean
(`rules.clean_subjects`), and the whole `runs.check` (those, the compiled-work view, and the
alerts' lifecycle in one transaction).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from bench import common, results

BENCH_DB = "lockstep_bench_sweep"
T = TypeVar("T")
KEY = "sweep"


def populate(ranks: int) -> None:
    from django.db import connection, transaction

    from dashboard.tenancy.models import Rank

    run = common.fresh_run(KEY, ranks, 1000, "2.13.0+cpu")
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {Rank._meta.db_table} (run_id, rank, host, pid, info, status, last_step, last_seen)"
            " SELECT %s, r, 'node' || r / 8, 1000 + r, '{}', 'running', 999, now() FROM generate_series(0, %s - 1) r",
            [run.id, ranks],
        )
    common.analyze(Rank)


def timed(work: Callable[[], T], n: int) -> tuple[list[float], T]:
    """Seconds of each of `n` calls after one warm-up, and the last call's result."""
    out = work()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        out = work()
        samples.append(time.perf_counter() - start)
    return samples, out


def spread(samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{statistics.median(ms):.0f} ms ({min(ms):.0f}-{max(ms):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("-n", type=int, default=7)
    parser.add_argument("--rebuild", action="store_true", help="make the run anew even if it exists")
    args = parser.parse_args(argv)
    common.configure_in_process(BENCH_DB)
    from django.utils import timezone

    from dashboard.detection import runs
    from dashboard.detection.rules import clean_subjects, evaluate
    from dashboard.tenancy.models import Rank, Run

    common.populate_once(KEY, args.rebuild, lambda: populate(args.ranks))
    run = Run.objects.get(project__name="bench", key=KEY)
    ranks = Rank.objects.filter(run=run).count()

    def fresh() -> None:  # every rank reported just now: nothing silent, nothing to page
        Rank.objects.filter(run=run).update(last_seen=timezone.now())
        Run.objects.filter(id=run.id).update(last_seen=timezone.now())

    fresh()
    view_s, view = timed(lambda: runs.view_of(run), args.n)
    evaluate_s, findings = timed(lambda: evaluate(view), args.n)
    clean_s, clean = timed(lambda: clean_subjects(view, findings), args.n)
    fresh()
    check_s, _ = timed(lambda: runs.check(run), args.n)
    print(f"{ranks:,} ranks, {len(clean):,} clean subjects, {len(findings)} findings", file=sys.stderr)
    detail = f"{ranks:,} running ranks, median (min-max) of {args.n} after a warm-up, python_speed {common.python_speed():.2f} s"
    results.report(
        "sweep",
        argv,
        f"the sweep's check of one run of {ranks:,} ranks",
        [
            ("runs.view_of", spread(view_s), detail),
            ("rules.evaluate", spread(evaluate_s), f"{len(findings)} findings"),
            ("rules.clean_subjects", spread(clean_s), f"{len(clean):,} subjects found clean"),
            ("runs.check", spread(check_s), "the whole check, lifecycle included"),
        ],
    )
    return 0
