"""Daily partitions of the raw per-rank tables: made before rows arrive, dropped by retention.

`lockstep_raw_partition()` (this app's initial migration)
creates one table's partition for one UTC day and is safe to race between ingest processes. Ingest makes sure of today's and tomorrow's before it
opens the batch transaction, so partition DDL never runs while a batch holds row locks.
"""

from __future__ import annotations

import random
import re
import time
from datetime import date, datetime, timedelta

from django.db import OperationalError, connection, transaction

from dashboard.evidence.models import CompileAgreement, EventLog, GradReport, GraphBreakEvent, StepReport

RAW_TABLES = tuple(m._meta.db_table for m in (CompileAgreement, GraphBreakEvent, GradReport, StepReport, EventLog))
_SUFFIX = re.compile(r"_p(\d{8})$")


_known: set[date] = set()  # days this process has seen ready; partitions are only dropped once long past


def ensure(days: list[date]) -> None:
    """Create the partitions of every raw table for these UTC days (no-op where they exist)."""
    days = [d for d in days if d not in _known]
    if not days:
        return
    with connection.cursor() as cur:
        cur.execute(
            "SELECT lockstep_raw_partition(t, d) FROM unnest(%s::text[]) t, unnest(%s::date[]) d",
            [list(RAW_TABLES), days],
        )
    if not connection.in_atomic_block:  # committed: safe to remember (a rolled-back creation is not)
        _known.update(days)


def ensure_around(now: datetime, ahead: int = 1) -> None:
    """Today's partitions and the next `ahead` days': a batch arriving just after midnight finds its day ready."""
    today = now.date()
    ensure([today + timedelta(days=i) for i in range(ahead + 1)])


def existing(table: str) -> list[tuple[str, date]]:
    """(partition name, its UTC day) of one raw table, oldest first."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [table],
        )
        names = [row[0] for row in cur.fetchall()]
    found = [(name, datetime.strptime(m.group(1), "%Y%m%d").date()) for name in names if (m := _SUFFIX.search(name))]
    return sorted(found, key=lambda item: item[1])


DROP_LOCK_TIMEOUT = "1s"
DROP_ATTEMPTS = 3


def drop(name: str) -> bool:
    """Drop one raw partition: O(1), no dead tuples (retention; the name comes from `existing`, never from input).

    DROP needs an ACCESS EXCLUSIVE lock on the parent, and a waiting lock request queues every
    later ingest statement behind it: so it waits at most DROP_LOCK_TIMEOUT (behind a long page
    query, say), up to DROP_ATTEMPTS times; False when it never got the lock (the next hourly
    prune tries again)."""
    for _ in range(DROP_ATTEMPTS):
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                cur.execute(f'DROP TABLE IF EXISTS "{name}"')
            return True
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            time.sleep(random.uniform(0.1, 0.3))  # the queue behind our lock request drains meanwhile
    return False


LOCK_NOT_AVAILABLE = "55P03"
