"""Raw data retention: whole partitions older than LOCKSTEP_RAW_RETENTION_DAYS are dropped.

Dropping a partition is O(1) and leaves no dead tuples, unlike DELETE. What stays is O(slots):
runs, ranks, and the settled slots (consensus + dissenters, dashboard.ledger.models) that detection
keeps once raw per-rank rows are gone. An agent session's claims (`IngestSession`) expire once the
session sent nothing for as long: an agent never resends a batch that old (its spool is drained
long before); so do the kept
waits in a collective, a summary of raw progress samples the compile bill reads with the raw compiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from dashboard.evidence import blobs, partitions
from dashboard.evidence.models import CollectiveWait, IngestSession

PREPARE_DAYS = 7  # partitions made ahead, so ingest finds them ready


@dataclass
class Pruned:
    """What one prune removed (`manage.py prune_raw` prints it)."""

    partitions: list[str] = field(default_factory=list)
    sessions: int = 0
    waits: int = 0
    blobs: int = 0


def prune(days: float | None = None, now: datetime | None = None) -> Pruned:
    """Drop raw partitions that end before now - days; create the next days' partitions."""
    now = now or timezone.now()
    days = settings.LOCKSTEP_RAW_RETENTION_DAYS if days is None else days
    cutoff = now - timedelta(days=days)
    pruned = Pruned()
    for table in partitions.RAW_TABLES:
        for name, day in partitions.existing(table):
            if _end_of(day) <= cutoff and partitions.drop(name):
                pruned.partitions.append(name)
    pruned.sessions = _expire(IngestSession.objects.filter(last_at__lt=cutoff))
    pruned.waits = _expire(CollectiveWait.objects.filter(received__lt=cutoff))
    pruned.blobs = blobs.prune(now, timedelta(days=days))
    partitions.ensure_around(now, ahead=PREPARE_DAYS)
    return pruned


CHUNK = 5000  # rows deleted per statement: short row locks, short WAL bursts


def _expire(rows: QuerySet[Any]) -> int:
    """Delete `rows` a chunk per statement; how many."""
    expired = 0
    while True:
        chunk = list(rows.values_list("pk", flat=True)[:CHUNK])
        if not chunk:
            return expired
        rows.model.objects.filter(pk__in=chunk).delete()
        expired += len(chunk)


def _end_of(day: date) -> datetime:
    """A daily partition holds [day 00:00 UTC, next day 00:00 UTC)."""
    return datetime.combine(day + timedelta(days=1), time(), UTC)
