"""Operators' view at /metrics (Prometheus text format).

Request counters live in each process; with several ASGI worker processes set
PROMETHEUS_MULTIPROC_DIR (an empty folder shared by them) and prometheus_client sums them.
Detection state (slots waiting to settle, settle latency, Celery queue depth) is read from
PostgreSQL and Redis at scrape time, so every process reports the same cluster-wide truth.
Events per second is `rate(lockstep_ingest_events_total[1m])`. Layers above ingest add theirs
through `register` (detection's per-project and per-run health: dashboard/detection/metrics.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis
from django.conf import settings
from django.db import connection
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dashboard.evidence import blobs
from dashboard.ledger.models import CompileSlot, GradSlot
from ingest import ratelimit

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "lockstep_ingest_requests",
    "Ingest batches (each one of a bulk request: endpoint=bulk) and blob "
    "uploads by outcome and HTTP status; a refused request counts once",
    ["endpoint", "outcome", "status"],
)
SHED = Counter(
    "lockstep_ingest_shed",
    "Requests answered 503 for load, unstored: the oldest queued one had waited past the shedding "
    "bound (why=waited), or the process's queue held what it writes within that bound, or its most "
    "batches (why=queue_full)",
    ["why"],
)
EVENTS = Counter("lockstep_ingest_events", "Events accepted (one entry of `events`)", ["type"])
RANK_STEPS = Counter("lockstep_ingest_rank_steps", "Grad rank-steps accepted (a `grads` event counts each step)")
SECONDS = Histogram(
    "lockstep_ingest_request_seconds",
    "Request handling time",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# where a stored request's server time goes: its wait for a free group writer, then its group's write
GROUP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8)
QUEUED = Histogram(
    "lockstep_ingest_queued_seconds",
    "Time a request's batches waited for a free group writer (a burst queues here)",
    buckets=GROUP_BUCKETS,
)
GROUP_WRITE = Histogram(
    "lockstep_ingest_group_write_seconds",
    "Time one group's write took on its writer (its statements, commit and after-commit work)",
    buckets=GROUP_BUCKETS,
)
GROUP_BATCHES = Histogram(
    "lockstep_ingest_group_batches",
    "Batches per group commit",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
# cluster-state collectors of the layers above ingest (detection's health), see `register`
COLLECTORS: list[Collector] = []
SETTLE_QUEUE = "celery"  # Celery's default queue: a Redis list the settle tasks wait in
LATENCY_WINDOW_S = 300


class DetectionState:
    """Cluster-wide gauges computed at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "lockstep_settle_queue_depth", "Tasks waiting in the Celery queue (Redis list length)"
        )
        try:
            depth.add_metric([], ratelimit.client().llen(SETTLE_QUEUE))
        except redis.RedisError:
            log.warning("redis unavailable for queue depth", exc_info=True)
        yield depth
        pending = GaugeMetricFamily("lockstep_slots_pending", "Slots reported but not yet settled", labels=["kind"])
        latency = GaugeMetricFamily(
            "lockstep_settle_latency_seconds",
            f"First report -> settled, slots settled in the last {LATENCY_WINDOW_S} s",
            labels=["kind", "quantile"],
        )
        with connection.cursor() as cur:
            for kind, model in (("compile", CompileSlot), ("grad", GradSlot)):
                pending.add_metric([kind], model.objects.filter(settled_at__isnull=True).count())
                table = model._meta.db_table  # the ledger's table, by its model's name
                cur.execute(
                    f"SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
                    f" (ORDER BY extract(epoch FROM settled_at - first_seen))"
                    f" FROM {table} WHERE settled_at > now() - make_interval(secs => %s)",
                    [LATENCY_WINDOW_S],
                )
                quantiles = cur.fetchone()[0] or []
                for q, value in zip(("0.5", "0.99"), quantiles):
                    latency.add_metric([kind, q], value)
        yield pending
        yield latency
        yield from _blob_usage()


def _blob_usage() -> Iterator[GaugeMetricFamily]:
    """Each project's graph-text bytes against its quotas (ingest/blobs.py)."""
    total = GaugeMetricFamily(
        "lockstep_blob_bytes",
        "Graph-text bytes a project's uploads stored (quota: LOCKSTEP_BLOB_QUOTA, the lockstep_blob_quota_bytes gauge)",
        labels=["project"],
    )
    day = GaugeMetricFamily(
        "lockstep_blob_bytes_day",
        "Of them, stored within the last day (quota: LOCKSTEP_BLOB_QUOTA_DAY)",
        labels=["project"],
    )
    for project, stored, recent in blobs.usage():
        total.add_metric([project], stored)
        day.add_metric([project], recent)
    quota = GaugeMetricFamily("lockstep_blob_quota_bytes", "Graph-text quotas per project", labels=["period"])
    quota.add_metric(["total"], settings.LOCKSTEP_BLOB_QUOTA)
    quota.add_metric(["day"], settings.LOCKSTEP_BLOB_QUOTA_DAY)
    yield from (total, day, quota)


def register(collector: Collector) -> None:
    """Add a collector of a layer that may read what ingest may not (alerts): the layer contract keeps
    ingest from importing it, so it registers itself here from its AppConfig.ready."""
    if collector not in COLLECTORS:
        COLLECTORS.append(collector)


def render() -> bytes:
    """This process's request counters (every process's, summed, under PROMETHEUS_MULTIPROC_DIR), then the cluster gauges."""
    if settings.PROMETHEUS_MULTIPROC_DIR:
        counters = CollectorRegistry()
        multiprocess.MultiProcessCollector(counters, path=settings.PROMETHEUS_MULTIPROC_DIR)  # type: ignore[no-untyped-call]  # prometheus_client leaves its __init__ unannotated
    else:
        counters = REGISTRY
    state = CollectorRegistry()
    state.register(DetectionState())
    for collector in COLLECTORS:
        state.register(collector)
    return generate_latest(counters) + generate_latest(state)
