"""A compile slot's reports are read as agreement: the ranks that compiled alike share one report, and
what each rank reports of its own (its compile's seconds) stays each rank's. Through the real door and
PostgreSQL."""

from __future__ import annotations

import pytest

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
