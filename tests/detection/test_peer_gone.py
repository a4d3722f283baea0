"""A rank its node's peers saw vanish (`peer_gone`) is a crash at the next sweep, rooted at that rank:
through the real ingest endpoint, PostgreSQL and the periodic check (`runs.check`)."""

from __future__ import annotations

import pytest

from dashboard.detection import runs
from dashboard.detection.models import Alert
from dashboard.tenancy.models import VANISHED, Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

PIDS = {0: 4100, 1: 4101, 2: 4102}


@pytest.fixture
def send(post):
    seqs: dict[int, int] = {}

    def _send(rank: int, *events: dict) -> None:
        seq = seqs[rank] = seqs.get(rank, -1) + 1
        response = post(make_batch(run="killed", rank=rank, seq=seq, events=list(events)))
        assert response.status_code == 200, response.content

    for rank, pid in PIDS.items():
        _send(rank, {"t": "rank_start", "host": "node1", "pid": pid}, {"t": "step", "step": 0})
    return _send


def statuses() -> dict[int, str]:
    return dict(Rank.objects.filter(run__key="killed").values_list("rank", "status"))


def test_a_vanished_peer_is_the_root_crash_at_the_next_sweep(send):
    send(0, {"t": "peer_gone", "rank": 2, "pid": PIDS[2]})
    assert statuses()[2] == VANISHED
    # torchrun then stops the others: their SIGTERM ends are consequences of rank 2
    for rank in (0, 1):
        send(rank, {"t": "rank_end", "status": "signal", "exit_code": 143, "reason": "SIGTERM"})
    runs.check(Run.objects.get(key="killed"))
    critical = Alert.objects.get(kind="rank_crashed", severity="critical")
    assert critical.ranks == [2]
    assert critical.message.startswith("Rank 2's process vanished without a word")
    stopped = Alert.objects.filter(kind="rank_crashed", severity="warning")
    assert sorted(a.ranks[0] for a in stopped) == [0, 1]
    assert all(a.details["consequence_of"] == 2 for a in stopped)
    assert not Alert.objects.filter(kind="rank_silent").exists()


def test_a_rank_that_said_goodbye_or_restarted_is_not_vanished(send):
    send(1, {"t": "rank_end", "status": "ok", "exit_code": 0})
    send(0, {"t": "peer_gone", "rank": 1, "pid": PIDS[1]}, {"t": "peer_gone", "rank": 2, "pid": 999})
    assert statuses() == {0: "running", 1: "ok", 2: "running"}
