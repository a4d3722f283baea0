"""Where the ranks stand for a compile slot, and the start facts its rules read, as PostgreSQL works
them out (`detection.ranks`): by aggregate, never every rank's row or its whole start facts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.detection import ranks
from dashboard.detection.rules import RANK_FACTS
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

LAYOUT = {"params": ["ddp:net.0.weight", "ddp:net.0.bias"], "buckets": [[0, 1]]}


def start(rank: int, device: str) -> dict:
    return {"t": "rank_start", "host": "node1", "device": device, "collective_timeout_s": 600.0, **LAYOUT}


def test_each_ranks_start_facts_without_the_parameter_layout(post, token):
    for rank in range(4):
        device = "cuda:1" if rank == 3 else "cuda:0"
        assert post(make_batch(run="facts", rank=rank, world_size=4, events=[start(rank, device)])).status_code == 200
    assert post(make_batch(run="facts", rank=0, world_size=4, seq=1, events=[{"t": "heartbeat"}])).status_code == 200
    run = Run.objects.get(key="facts")
    info, kept = Rank.objects.filter(run=run, rank=0).values_list("info", "facts").get()
    assert info["params"] == LAYOUT["params"] and kept == {k: v for k, v in info.items() if k not in LAYOUT}
    assert kept["device"] == "cuda:0"  # a later batch without a start keeps both
    facts = ranks.start_facts(run)
    assert sorted(facts) == [0, 1, 2, 3]
    assert facts[0] == facts[1] == facts[2] == {"host": "node1", "device": "cuda:0", "collective_timeout_s": 600.0}
    assert facts[3]["device"] == "cuda:1"
    assert set(facts[0]) <= set(RANK_FACTS)  # never the parameter layout


def test_who_is_accountable_for_a_slot_and_who_may_still_report_it(post, token):
    events = {
        0: [{"t": "grad", "step": 0, "fps": [1]}],  # passed step 0
        1: [{"t": "grad", "step": 1, "fps": [1]}],  # passed it too
        2: [{"t": "rank_end", "status": "ok", "exit_code": 0}],  # ended: its absence is an answer
        3: [{"t": "heartbeat"}],  # alive, not past step 0 yet: may still report
        4: [{"t": "heartbeat"}],  # not past it either, but silent: rank_silent's, not waited for
    }
    for rank, evs in events.items():
        assert post(make_batch(run="state", rank=rank, world_size=5, events=evs)).status_code == 200
    run = Run.objects.get(key="state")
    Rank.objects.filter(run=run, rank=4).update(last_seen=timezone.now() - timedelta(seconds=90))
    state = ranks.rank_state(run, 0, timezone.now() - timedelta(seconds=30), silent_after=60)
    assert (state.accountable, state.pending) == ({0, 1, 2}, {3})
    assert state.behind({3}) == set() and state.behind(set()) == {3}
    assert ranks.rank_state(run, 1, timezone.now(), silent_after=60).accountable == {1, 2}
    outside = ranks.rank_state(run, None, timezone.now() - timedelta(seconds=30), silent_after=60)
    assert (outside.accountable, outside.pending) == ({0, 1, 2, 3}, set())  # anything sent since the slot opened
