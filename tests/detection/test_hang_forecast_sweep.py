"""hang_forecast through the real ingest endpoint, PostgreSQL and the periodic check (`runs.check`):
progress samples stored, carried forward to now, escalated, resolved, inhibited, and the page strip."""

from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.detection import runs, silences
from dashboard.detection.models import Alert
from dashboard.detection.rules import hang_forecast
from dashboard.evidence.models import EventLog
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

FRAME = "model.py:88:forward"
GUARD = "tensor 'x' size mismatch at index 0. expected 16, actual 17"


def waiting(s: float, step: int = 4) -> dict:
    return {
        "t": "progress",
        "phase": "collective",
        "phase_s": s,
        "step": step,
        "since_step_s": s + 0.3,
        "where": "job.py:40:train",
        "op": "all_reduce",
    }


def compiling(s: float, step: int = 4) -> dict:
    return {
        "t": "progress",
        "phase": "compiling",
        "phase_s": s,
        "step": step,
        "since_step_s": s + 0.1,
        "where": "job.py:35:train",
        "op": FRAME,
        "compile_id": "0/1",
        "reason": GUARD,
    }


class Job:
    def __init__(self, post, world_size: int = 3):
        self.post, self.world_size, self.seq = post, world_size, {}

    def send(self, rank: int, *events: dict) -> None:
        now = timezone.now().timestamp()
        seq = self.seq.get(rank, 0)
        self.seq[rank] = seq + 1
        batch = make_batch(
            run="hangs", rank=rank, world_size=self.world_size, seq=seq, events=[{"ts": now, **e} for e in events]
        )
        response = self.post(batch)
        assert response.status_code == 200, response.content

    def start(self) -> Run:
        for rank in range(self.world_size):
            self.send(rank, {"t": "rank_start", "host": "node1", "collective_timeout_s": 60.0}, {"t": "heartbeat"})
        return Run.objects.get(key="hangs")


def test_forecast_warns_escalates_and_resolves_when_the_job_moves_on(post, settings):
    settings.LOCKSTEP_HANG_WARN_AFTER = 10
    job = Job(post)
    run = job.start()
    job.send(0, waiting(12)), job.send(1, compiling(13)), job.send(2, waiting(11))
    runs.check(run)
    alert = Alert.objects.get(kind="hang_forecast")
    assert (alert.severity, alert.ranks, alert.step, alert.frame, alert.subject) == ("warning", [1], 4, FRAME, "hang")
    assert alert.message.startswith(
        f"Ranks 0, 2 waited 12 s in all_reduce of step 4 for rank 1: rank 1 is compiling "
        f"{FRAME} for 13 s (recompile because of {GUARD})"
    )
    assert "48 s left before the 60 s collective timeout" in alert.message
    assert alert.details["waiting"] == [0, 2]
    revision = alert.revision

    job.send(0, waiting(31)), job.send(1, compiling(32)), job.send(2, waiting(30))
    runs.check(run)
    alert.refresh_from_db()
    assert alert.severity == "critical" and alert.revision == revision + 1  # escalation is news
    assert "29 s left" in alert.message

    strip = runs.strip(run)
    assert [row["rank"] for row in strip][0] == 1 and strip[0]["holding"] and strip[0]["phase"] == "compiling"
    assert {row["rank"]: row["holding"] for row in strip} == {1: True, 0: False, 2: False}
    assert strip[0]["op"] == FRAME and strip[0]["since_step_s"] >= 32

    moved = {
        "t": "progress",
        "phase": "step",
        "phase_s": 0.1,
        "step": 5,
        "since_step_s": 0.1,
        "where": "job.py:30:train",
    }
    for rank in range(3):
        job.send(rank, moved)
    runs.check(run)
    alert.refresh_from_db()
    assert alert.state == Alert.State.RESOLVED


def test_samples_are_carried_forward_by_the_server_clock(post, settings):
    settings.LOCKSTEP_HANG_WARN_AFTER = 10
    job = Job(post, world_size=2)
    run = job.start()
    job.send(0, waiting(8)), job.send(1, compiling(8))
    runs.check(run)
    assert not Alert.objects.filter(kind="hang_forecast").exists()
    Rank.objects.filter(run=run).update(progress_at=timezone.now() - timezone.timedelta(seconds=3))
    view = runs.view_of(run)
    assert 10.9 < view.progress[0].phase_s < 12 and view.collective_timeout_s == 60.0
    runs.check(run)
    assert Alert.objects.get(kind="hang_forecast").ranks == [1]


def test_a_late_rank_that_went_silent_inhibits_the_forecast(post, settings):
    settings.LOCKSTEP_HANG_WARN_AFTER = 5
    job = Job(post)
    run = job.start()
    job.send(0, waiting(12)), job.send(1, compiling(12)), job.send(2, waiting(12))
    runs.check(run)
    forecast = Alert.objects.get(kind="hang_forecast")
    Alert.objects.create(run=run, kind="rank_silent", subject="rank:1", severity="critical", ranks=[1], message="quiet")
    assert silences.inhibited(forecast)


def test_agents_without_progress_still_ingest_and_raise_nothing(post):
    job = Job(post, world_size=2)
    run = job.start()
    job.send(0, {"t": "heartbeat", "step": 3}), job.send(1, {"t": "heartbeat", "step": 3})
    runs.check(run)
    assert runs.view_of(run).progress == {} and runs.strip(run) == []
    assert not Alert.objects.filter(kind="hang_forecast").exists()


def test_compile_start_is_kept_in_the_event_log(post):
    job = Job(post, world_size=1)
    run = job.start()
    job.send(0, {"t": "compile_start", "frame": FRAME, "compile_id": "0/1", "reason": GUARD, "step": 4})
    body = EventLog.objects.get(run=run, t="compile_start").body
    assert (body["frame"], body["compile_id"], body["reason"], body["step"]) == (FRAME, "0/1", GUARD, 4)


def test_each_rank_keeps_its_latest_sample_in_its_row(post, settings):
    """A batch without a sample keeps the rank's; the next sample replaces it; the log keeps them all."""
    job = Job(post, world_size=2)
    run = job.start()
    job.send(0, waiting(2, step=4)), job.send(1, compiling(3, step=4))
    job.send(0, {"t": "heartbeat", "step": 4})
    assert Rank.objects.get(run=run, rank=0).progress["phase"] == "collective"
    job.send(0, waiting(6, step=5))
    rows = {r.rank: r for r in Rank.objects.filter(run=run)}
    assert (rows[0].progress["phase_s"], rows[0].progress["step"], rows[1].progress["op"]) == (6, 5, FRAME)
    assert EventLog.objects.filter(run=run, t="progress").count() == 3
    Rank.objects.filter(run=run, rank=1).update(
        progress_at=timezone.now() - timezone.timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER + 1)
    )
    assert set(runs.progress_of(run)) == {0}  # a sample older than the silent window is no news of where rank 1 is


def test_the_sweep_reads_every_rank_only_once_a_wait_could_warn(post, settings):
    """Below the warning threshold one aggregate answers and the view carries no rank's progress; past
    it, every rank's. A rank that ended waiting counts for nothing."""
    settings.LOCKSTEP_HANG_WARN_AFTER = 10
    job = Job(post)
    run = job.start()
    job.send(0, waiting(9)), job.send(1, compiling(9)), job.send(2, waiting(4))
    assert 9 <= runs.longest_wait(run) < 10 and runs.view_of(run).progress == {}
    assert len(runs.progress_of(run)) == 3  # the samples are there, the sweep just did not need them
    job.send(2, waiting(10.5))
    assert set(runs.view_of(run).progress) == {0, 1, 2}
    job.send(2, waiting(11), {"t": "rank_end", "status": "ok"})
    assert 9 <= runs.longest_wait(run) < 10 and runs.view_of(run).progress == {}


def test_the_strip_is_the_first_64_ranks_as_the_rules_see_them(post):
    """PostgreSQL picks the page's ranks: the late ones first, then the longest since a step, as
    `hang_forecast.split` and a sort of every rank's carried-forward sample would."""
    job = Job(post, world_size=70)
    run = job.start()
    for rank in range(70):
        if rank % 7 == 3:  # late: compiling step 4 while the others wait in it
            job.send(rank, compiling(2.0 + rank / 10))
        elif rank % 11 == 5:
            job.send(rank, {"t": "progress", "phase": "data", "phase_s": 1.0, "step": 3, "where": "job.py:20:next"})
        else:
            job.send(rank, waiting(1.0 + rank / 100))
    view = runs.progress_of(run)
    late = hang_forecast.split(view)[1]
    reference = sorted(view, key=lambda r: (r not in late, -(view[r].since_step_s or 0.0), r))[: runs.STRIP_RANKS]
    strip = runs.strip(run)
    assert [row["rank"] for row in strip] == reference and len(strip) == 64
    assert (
        {row["rank"] for row in strip if row["holding"]}
        == set(late)
        == {r for r in range(70) if r % 7 == 3 or r % 11 == 5}
    )
