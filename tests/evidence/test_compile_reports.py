"""A compile slot's reports are read as agreement: the ranks that compiled alike share one report, and
what each rank reports of its own (its compile's seconds) stays each rank's. Through the real door and
PostgreSQL."""

from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.evidence import reads
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

FRAME = "train.py:10:forward"


def compile_(seconds: float, graph: str = "a" * 16, cache: str = "hit") -> dict:
    return {
        "t": "compile",
        "frame": FRAME,
        "step": 0,
        "times": {"entire_frame_compile_time_s": seconds, "inductor_compile_time_s": seconds / 2},
        "hashes": {"dynamo": {"raw": graph, "norm": graph}},
        "cache": {"inductor": cache},
        "counts": {"graph_op_count": 12},
    }


def test_ranks_that_compiled_alike_share_one_report_and_keep_their_own_seconds(post):
    def send(rank: int, seq: int, event: dict) -> None:
        assert post(make_batch(rank=rank, world_size=5, seq=seq, events=[event])).status_code == 200

    for rank in range(5):
        send(rank, 0, compile_(1.0 + rank, cache="miss" if rank == 2 else "hit"))
    send(1, 1, compile_(9.0, graph="b" * 16))  # rank 1 reports the slot again: its later report counts
    run = Run.objects.get(key="run-a")

    stored = reads.compile_reports(run.id, FRAME, 0)

    assert [ranks for ranks, _ in stored.groups] == [(0, 3, 4), (1,), (2,)]
    (_, alike), (_, again), (_, missed) = stored.groups
    assert (alike.graph_norm, again.graph_norm, missed.graph_norm) == ("a" * 16, "b" * 16, "a" * 16)
    assert (alike.cache, missed.cache) == ({"inductor": "hit"}, {"inductor": "miss"})
    assert alike.detail["counts"] == {"graph_op_count": 12} and "times" not in alike.detail
    assert stored.times == {0: 1.0, 1: 9.0, 2: 3.0, 3: 4.0, 4: 5.0}
    by_rank = stored.by_rank()
    assert list(by_rank) == [0, 1, 2, 3, 4] and by_rank[0] is by_rank[4] is alike


def test_the_upgrade_carries_compiles_stored_a_row_per_rank_over(project):
    """Rows of the per-rank table become agreement rows of one rank each, in a renamed day partition
    that the partition function finds; the per-rank view reads them as they were, and back."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from dashboard.evidence import partitions
    from dashboard.evidence.models import CompileEvent

    run = Run.reported(project, "r", "r", 2, {})
    executor = MigrationExecutor(connection)
    executor.migrate([("evidence", "0002_claims_per_session")])
    try:
        partitions._known.clear()
        with connection.cursor() as cursor:
            cursor.execute("SELECT lockstep_raw_partition('evidence_compileevent', current_date)")
            for rank, seconds in ((0, 2.5), (1, 3.5)):
                cursor.execute(
                    "INSERT INTO evidence_compileevent (run_id, rank, frame, index, compile_id, step, status, graph_raw,"
                    " graph_norm, code_raw, code_norm, compile_time, cache, detail, ts, received)"
                    " VALUES (%s, %s, %s, 0, '0/0', 0, 'ok', 'g', 'g', 'c', 'c', %s, '{}', '{}', now(), now())",
                    [run.id, rank, FRAME, seconds],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        partitions._known.clear()
    assert sorted(CompileEvent.objects.filter(run=run).values_list("rank", "compile_time")) == [(0, 2.5), (1, 3.5)]
    stored = reads.compile_reports(run.id, FRAME, 0)
    assert [ranks for ranks, _ in stored.groups] == [(0, 1)] and stored.times == {0: 2.5, 1: 3.5}
    partitions.ensure_around(timezone.now())  # today's partition, renamed with its table, is found
