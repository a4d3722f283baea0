"""/metrics scrape time with active 1024-rank runs (issue 18, item 4: the scrape must stay cheap).

    python -m bench metrics [--runs 20] [--ranks 1024] [--steps 1000] [-n 15]

Fills its own database (`lockstep_bench_metrics`, kept between invocations; runs of other sizes are
dropped) with `--runs` active runs built as bench/pages.py builds its big run (every rank with rank_start info, 24 compiles and 4 graph breaks per rank,
a grad slot per step, firing alerts), then times GET /metrics in-process (the Django view,
prometheus_client rendering, every query of ingest's and detection's collectors) and detection's
collector alone: median and p90 of N calls after one warm-up. The runs default to LOCKSTEP_METRICS_RUNS, so every run gets
its per-run series.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench import pages
from bench.common import configure_in_process, p90, timed_get
from bench.results import markdown, record, rerun

BENCH_DB = "lockstep_bench_metrics"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("-n", type=int, default=15)
    args = parser.parse_args(argv)
    configure_in_process(BENCH_DB)  # bench/pages.py's data, in a database of this bench's own
    from django.test import Client
    from django.utils import timezone

    from dashboard.detection.metrics import HealthCollector
    from dashboard.evidence.models import CompileEvent
    from dashboard.tenancy.models import Rank, Run

    keys = [f"metrics-{args.ranks}-{i}" for i in range(args.runs)]
    Run.objects.filter(project__name="bench").exclude(key__in=keys).delete()
    start = time.perf_counter()
    for key in keys:
        if not Run.objects.filter(key=key).exists():
            pages.populate(key, args.ranks, args.steps, raw=False)
    Run.objects.filter(key__in=keys).update(last_seen=timezone.now())  # active (reported within the hour)
    Rank.objects.filter(run__key__in=keys).update(last_seen=timezone.now())
    print(f"prepared {args.runs} runs in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    client = Client()
    scrape = timed_get(client, "/metrics", args.n)
    health = sorted(_timed(lambda: list(HealthCollector().collect()), args.n))
    body = client.get("/metrics").content.decode()
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    print(
        f"/metrics with {args.runs} active runs of {args.ranks} ranks ({CompileEvent.objects.count():,} compile events, "
        f"{series} series, {len(body):,} bytes), ms, n={args.n}"
    )
    print(f"{'part':<28}{'median':>10}{'p90':>10}{'max':>10}")
    table = []
    for name, samples in (("GET /metrics (all of it)", scrape), ("detection health collector", health)):
        tail = p90(samples)
        print(f"{name:<28}{statistics.median(samples):>10.1f}{tail:>10.1f}{samples[-1]:>10.1f}")
        table.append((name, f"{statistics.median(samples):.1f}", f"{tail:.1f}", f"{samples[-1]:.1f}"))
    record(
        "metrics",
        markdown(("part", "median ms", "p90 ms", "max ms"), table),
        rerun("metrics", argv),
        f"/metrics with {args.runs} active runs of {args.ranks} ranks ({series} series, {len(body):,} bytes), n={args.n}.",
    )
    return 0


def _timed(call, n: int) -> list[float]:
    call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


if __name__ == "__main__":
    raise SystemExit(main())
