"""Where the ranks stand for a compile slot, and the start facts its rules read, as PostgreSQL works
them out (`detection.ranks`): by aggregate, never every rank's row or its whole start facts."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.detection import ranks, runs
from dashboard.detection.rules import RANK_FACTS
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

LAYOUT = {"params": ["ddp:net.0.weight", "ddp:net.0.bias"], "buckets": [[0, 1]]}


def start(rank: int, device: str, **shared) -> dict:
    """A rank_start: its own facts (node, GPU, pid, local rank, clock, its process's W&B run), then what
    the job's ranks share."""
    own = {"host": f"node{rank // 2}", "device": device, "pid": 100 + rank, "local_rank": rank % 2, "ts": 1.5 + rank}
    links = {"wandb": f"https://wandb.example/team/job/runs/r{rank}"}
    return {"t": "rank_start", **own, "links": links, "collective_timeout_s": 600.0, **LAYOUT, **shared}


def started(post, run: str, starts: dict[int, dict], world_size: int = 0) -> Run:
    for rank, event in starts.items():
        batch = make_batch(run=run, rank=rank, world_size=world_size or len(starts), events=[event])
        assert post(batch).status_code == 200
    return Run.objects.get(key=run)


def test_each_ranks_start_facts_without_the_parameter_layout(post, token):
    run = started(post, "facts", {r: start(r, "cuda:1" if r == 3 else "cuda:0") for r in range(4)})
    assert post(make_batch(run="facts", rank=0, world_size=4, seq=1, events=[{"t": "heartbeat"}])).status_code == 200
    info, kept, device = Rank.objects.filter(run=run, rank=0).values_list("info", "facts", "device").get()
    assert info["params"] == LAYOUT["params"] and kept == {k: v for k, v in info.items() if k not in LAYOUT}
    assert (kept["device"], device) == ("cuda:0", "cuda:0")  # a later batch without a start keeps them
    facts = ranks.start_facts(run)
    assert sorted(facts) == [0, 1, 2, 3]
    assert facts[0] == {"host": "node0", "device": "cuda:0", "collective_timeout_s": 600.0}
    assert facts[2] == {"host": "node1", "device": "cuda:0", "collective_timeout_s": 600.0}
    assert facts[3] == {"host": "node1", "device": "cuda:1", "collective_timeout_s": 600.0}
    assert set(facts[0]) <= set(RANK_FACTS)  # never the parameter layout, nor a rank's pid or clock


def test_ranks_that_share_their_start_facts_share_one_key_and_each_rank_keeps_its_own(post, token):
    """The key leaves out what is a rank's own (node, GPU, pid, local rank, clock): four ranks on two
    nodes share one, and a rank whose settings differ has its own, which a restart with the job's
    settings gives back; a rank that never started has none. Each rank's facts are its group's."""
    odd = {"settings": {"inductor.max_autotune": "True"}}
    starts = {r: start(r, f"cuda:{r % 2}", **(odd if r == 2 else {})) for r in range(4)}
    run = started(post, "keys", starts, world_size=5)
    keys = dict(Rank.objects.filter(run=run).values_list("rank", "facts_key"))
    assert keys[0] == keys[1] == keys[3] != keys[2] and len(keys[0]) == 32
    facts = ranks.start_facts(run)
    assert facts[2]["settings"] == odd["settings"] and "settings" not in facts[3]
    assert [facts[r]["device"] for r in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]

    again = make_batch(run="keys", rank=2, world_size=5, session="restarted", events=[start(2, "cuda:0")])
    assert post(again).status_code == 200
    assert Rank.objects.get(run=run, rank=2).facts_key == keys[0]
    assert "settings" not in ranks.start_facts(run)[2]

    silent = make_batch(run="keys", rank=4, world_size=5, events=[{"t": "heartbeat"}])
    assert post(silent).status_code == 200
    assert Rank.objects.filter(run=run, rank=4).values_list("facts_key", "device").get() == ("", "")
    assert ranks.start_facts(run)[4] == {}


def test_the_shortest_collective_timeout_of_the_ranks_groups(post, token):
    run = started(post, "timeouts", {r: start(r, "cuda:0") for r in range(3)})
    assert runs.collective_timeout(run) == 600.0
    shorter = start(1, "cuda:0") | {"collective_timeout_s": 120.0}
    assert (
        post(make_batch(run="timeouts", rank=1, world_size=3, session="restarted", events=[shorter])).status_code == 200
    )
    assert runs.collective_timeout(run) == 120.0
    unknown = started(post, "no-timeouts", {0: {"t": "rank_start", "host": "n", "collective_timeout_s": None}})
    assert runs.collective_timeout(unknown) is None


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


@pytest.mark.django_db(transaction=True)  # the migration alters the table: no test transaction around it
def test_the_upgrade_keys_the_ranks_already_stored_as_ingest_keys_them(post, token):
    """`tenancy.0004` fills the key and the device of the rows it finds with the statement ingest uses
    from then on: a rank stored before and a rank started after, alike, share one key."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    run = started(post, "upgraded", {0: start(0, "cuda:0")}, world_size=2)
    executor = MigrationExecutor(connection)
    executor.migrate([("tenancy", "0003_rank_progress")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO tenancy_rank (run_id, rank, host, pid, info, facts, status, last_step, last_seen)"
                " SELECT run_id, 1, 'node0', 7, info, %s::jsonb, 'running', 0, now() FROM tenancy_rank WHERE run_id = %s",
                [json.dumps({k: v for k, v in start(1, "cuda:1").items() if k not in LAYOUT}), run.id],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    rows = dict(Rank.objects.filter(run=run).values_list("rank", "facts_key"))
    assert rows[0] == rows[1] != ""
    assert Rank.objects.filter(run=run, rank=1).values_list("device", "collective_timeout_s").get() == ("cuda:1", 600.0)
    assert ranks.start_facts(run)[1] == {"host": "node0", "device": "cuda:1", "collective_timeout_s": 600.0}
