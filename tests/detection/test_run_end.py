"""Truthful state at a run's end, through the real ingest endpoint, PostgreSQL and the periodic check
(`runs.check`): a rank left running alone is `lost` (never `running`), and once every rank ended the
run's open alerts end unresolved ("run ended": they still count), each a new revision, after their
firing was delivered."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from dashboard.detection import lifecycle, runs, settle
from dashboard.detection.models import Alert, Incident
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

RESET = {
    "t": "rank_end",
    "status": "error",
    "exit_code": 1,
    "exc_type": "RuntimeError",
    "reason": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
}


def job(post, key: str, ends: dict[int, dict | None], world_size: int = 3) -> Run:
    """Every rank reports step 0 (rank 1's gradients differ); ranks with an end in `ends` send it."""
    now = timezone.now().timestamp()
    for rank in range(world_size):
        events = [
            {"t": "rank_start", "host": "node1", "ts": now - 5},
            {"t": "grad", "step": 0, "fps": [1, 2 + (rank == 1)], "ts": now - 1},
        ]
        if ends.get(rank):
            events.append({**ends[rank], "ts": now})
        assert post(make_batch(run=key, rank=rank, world_size=world_size, events=events)).status_code == 200
    return Run.objects.get(key=key)


def age(run: Run, seconds: float, ranks: list[int] | None = None) -> None:
    """Move the run's (and its ranks') last reports back in time."""
    then = timezone.now() - timedelta(seconds=seconds)
    Rank.objects.filter(run=run, **({"rank__in": ranks} if ranks is not None else {})).update(last_seen=then)
    Run.objects.filter(id=run.id).update(last_seen=then)
    run.refresh_from_db()


def delivered(run: Run) -> None:
    """What delivery does after pushing an alert's revision (`notify.deliver`)."""
    for alert in Alert.objects.filter(run=run):
        lifecycle.mark_notified(alert)


def test_a_rank_left_running_alone_is_lost_and_shown_so(post, token):
    run = job(post, "killed", {0: RESET, 1: RESET})
    age(run, settings.LOCKSTEP_LOST_AFTER + 1, ranks=[2])
    runs.check(run)
    assert dict(Rank.objects.filter(run=run).values_list("rank", "status")) == {0: "error", 1: "error", 2: "lost"}
    silent = Alert.objects.get(kind="rank_silent")
    assert silent.ranks == [2] and silent.state == "firing"
    assert not Alert.objects.filter(kind="rank_crashed", ranks=[2]).exists()  # lost is rank_silent's, not a crash
    body = Client().get("/api/v1/runs/killed", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert {r["rank"]: r["status"] for r in body["ranks"]}[2] == "lost" and body["status"] == "failed"

    # a rank given up as lost that speaks again is running again
    assert (
        post(make_batch(run="killed", rank=2, world_size=3, seq=1, events=[{"t": "heartbeat", "step": 1}])).status_code
        == 200
    )
    assert Rank.objects.get(run=run, rank=2).status == "running"


def test_a_rank_silent_while_others_still_run_is_not_lost(post):
    run = job(post, "hung", {})
    age(run, settings.LOCKSTEP_SILENT_AFTER + 1, ranks=[2])
    runs.check(run)
    assert Rank.objects.get(run=run, rank=2).status == "running"


def test_the_end_of_a_run_closes_its_open_alerts_unresolved_once_delivered(post):
    run = job(
        post,
        "ended",
        {
            0: {"t": "rank_end", "status": "ok"},
            1: {"t": "rank_end", "status": "ok"},
            2: {"t": "rank_end", "status": "ok"},
        },
    )
    settle.settle_grad(GradSlot.objects.get(run=run, step=0).id)
    divergence = Alert.objects.get(kind="grad_divergence")
    assert divergence.state == "firing" and run in runs.active_runs()  # every rank ended; an alert is open
    first = divergence.revision

    runs.check(run)  # just ended: slots may still come in
    assert Alert.objects.get(id=divergence.id).state == "firing"
    age(run, settings.LOCKSTEP_SETTLE_TIMEOUT + 1)
    runs.check(run)  # its firing was never delivered: no resolve may overtake it
    assert Alert.objects.get(id=divergence.id).state == "firing"

    delivered(run)
    assert runs.check(run) == [divergence.id]
    divergence.refresh_from_db()
    assert (divergence.state, divergence.resolve_reason, divergence.revision) == (
        "ended_unresolved",
        "run ended",
        first + 1,
    )
    assert divergence.revision > divergence.notified_revision  # the close is pending for every sink
    assert Incident.objects.get(id=divergence.incident_id).state == "ended_unresolved"
    assert run not in runs.active_runs()


def test_after_the_end_a_lost_rank_stays_closed_with_its_quiet_time_frozen(post):
    run = job(post, "killed-end", {0: RESET, 1: RESET})
    age(run, settings.LOCKSTEP_SETTLE_TIMEOUT + settings.LOCKSTEP_LOST_AFTER)
    for slot in GradSlot.objects.filter(run=run):
        settle.settle_grad(slot.id)
    runs.check(run)  # rank 2 is lost, rank_silent fires (news: the run does not end in the same look)
    assert Alert.objects.filter(run=run, state="firing", kind="rank_silent").exists()
    delivered(run)
    runs.check(run)
    assert set(Alert.objects.filter(run=run).values_list("state", "resolve_reason")) == {
        ("ended_unresolved", "run ended")
    }
    silent = Alert.objects.get(run=run, kind="rank_silent")
    assert silent.message.startswith("Rank 2 sent nothing for the last 0 s before the run ended")  # not "for 16 s"
    for _ in range(2):  # the crash window keeps the run in the sweep: nothing fires again
        assert runs.check(run) == []
    assert not Alert.objects.filter(run=run, state="firing").exists()
    assert Alert.objects.get(id=silent.id).message == silent.message  # frozen: it no longer counts up


def test_a_stalled_run_its_launcher_killed_ends_with_its_silent_rank_unresolved(post):
    """Rank 2 hung; then the whole job was killed (nobody says goodbye): once every rank is quiet past
    LOCKSTEP_SILENT_AFTER the run is over, and rank_silent ends with it instead of firing for ever."""
    run = job(post, "stalled-killed", {})
    for slot in GradSlot.objects.filter(run=run):
        settle.settle_grad(slot.id)
    quiet = settings.LOCKSTEP_SILENT_AFTER
    age(run, 2 * quiet + 16, ranks=[2])
    age(run, quiet - 5, ranks=[0, 1])
    runs.check(run)
    silent = Alert.objects.get(run=run, kind="rank_silent")
    assert silent.state == "firing" and silent.ranks == [2]
    delivered(run)
    age(run, quiet + 1, ranks=[0, 1])  # the launcher killed the others too
    Rank.objects.filter(run=run, rank=2).update(last_seen=timezone.now() - timedelta(seconds=2 * quiet + 22))
    runs.check(run)
    silent.refresh_from_db()
    assert (silent.state, silent.resolve_reason) == ("ended_unresolved", "run ended")
    assert silent.message.startswith(f"Rank 2 sent nothing for the last {quiet + 21:.0f} s before the run ended")
    assert Incident.objects.get(id=silent.incident_id).state == "ended_unresolved"
