"""The partial index that serves the compile bill's collective waits: every daily partition has
it, and PostgreSQL uses it for the statement `reads.collective_waits` runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dashboard.evidence import partitions, reads
from dashboard.evidence.models import EventLog
from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db

INDEX = "eventlog_collective_step"


def _partition_indexes() -> dict[str, str]:
    """partition -> its index attached to INDEX."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT t.relname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_index x ON x.indexrelid = c.oid JOIN pg_class t ON t.oid = x.indrelid"
            " WHERE i.inhparent = %s::regclass",
            [INDEX],
        )
        return dict(cur.fetchall())


def test_every_partition_has_the_collective_wait_index_also_one_made_later():
    later = timezone.now().date() + timedelta(days=9)
    partitions.ensure([later])
    table = EventLog._meta.db_table
    assert {name for name, _ in partitions.existing(table)} <= set(_partition_indexes())
    assert f"{table}_p{later:%Y%m%d}" in _partition_indexes()


def test_collective_waits_reads_the_index_and_answers_the_longest_wait():
    run = Run.objects.create(project=Project.objects.create(name="p"), key="r", world_size=64)
    now = timezone.now()

    def sample(rank: int, step: int, phase: str, seconds: float) -> EventLog:
        body = {"t": "progress", "phase": phase, "step": step, "phase_s": seconds}
        return EventLog(run=run, rank=rank, t="progress", body=body, ts=now)

    rows = [sample(r, s, "step", 0.01) for r in range(64) for s in range(0, 1000, 10)]  # heartbeats
    rows += [sample(r, s, "collective", 5.0 + w) for r in range(1, 64) for s in (250, 750) for w in range(3)]
    rows += [sample(0, 500, "collective", 9.0), sample(0, 250, "step", 99.0)]  # another step; not a wait
    EventLog.objects.bulk_create(rows)
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {EventLog._meta.db_table}")

    waits = reads.collective_waits(run.id, [250, 750])
    assert waits == {(r, s): 7.0 for r in range(1, 64) for s in (250, 750)}
    with connection.cursor() as cur:
        cur.execute("SHOW enable_indexscan")
        assert cur.fetchone()[0] == "on"  # set back for what the transaction does next
        cur.execute("SET LOCAL enable_indexscan = off")  # as collective_waits runs it
        cur.execute("EXPLAIN " + reads.COLLECTIVE_WAITS, [run.id, ["250", "750"]])
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert any(index in plan for index in _partition_indexes().values()), plan
