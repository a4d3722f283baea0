"""Group commit (ingest.groupcommit, writers.store_group): requests share a transaction, each keeps its own answer."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import DataError, connection

from agents import protocol
from dashboard.evidence.models import GradReport, IngestSession
from dashboard.tenancy.models import Project
from ingest import backpressure, groupcommit, validation, writers
from ingest.refusals import Refusal
from tests import claims
from tests.conftest import make_batch, per_rank


def job(project, bulk: bool = False, **batches) -> writers.Job:
    """A request of one batch (or, bulk, of several: `batches` as make_batch keyword sets)."""
    bodies = [json.dumps(make_batch(**kw)).encode() for kw in batches.values()]
    return writers.Job(project, [(validation.decode(b), writers.digest(b)) for b in bodies], bulk)


def grad(step: int, fps: list[int]) -> list[dict]:
    return [{"t": "grad", "step": step, "fps": fps}]


@pytest.mark.django_db
def test_a_group_answers_each_request_on_its_own(project):
    writers.store_group([job(project, a=dict(rank=2, events=grad(0, [7])))])
    before = GradReport.objects.count()
    outcomes = writers.store_group(
        [
            job(project, a=dict(rank=0, events=grad(0, [1]))),
            job(project, a=dict(rank=2, events=grad(0, [9]))),  # rank 2's seq 0 again, other content: 409
            job(project, a=dict(run="run-b", rank=1, events=grad(0, [2]))),
            job(project, a=dict(rank=2, events=grad(0, [7]))),  # an exact resend: a duplicate
            job(
                project, a=dict(rank=1, world_size=5, session="other-session", events=grad(0, [3]))
            ),  # run-a has 3 ranks: 400
        ]
    )
    assert [o[0].accepted for o in (outcomes[0], outcomes[2])] == [1, 1]
    assert isinstance(outcomes[1], Refusal) and (outcomes[1].status, outcomes[1].path) == (409, "seq")
    assert outcomes[3][0].duplicate is True
    assert isinstance(outcomes[4], Refusal) and (outcomes[4].status, outcomes[4].path) == (400, "run.world_size")
    assert GradReport.objects.count() == before + 2
    assert set(IngestSession.objects.values_list("session", flat=True)) == {
        "sess-run-a-0",
        "sess-run-a-2",
        "sess-run-b-1",
    }


@pytest.mark.django_db
def test_a_bulk_request_in_a_group_is_refused_whole_with_its_path(project):
    outcomes = writers.store_group(
        [
            job(project, a=dict(rank=0)),
            job(project, bulk=True, a=dict(rank=1), b=dict(rank=2, world_size=4, session="changed-session")),
        ]
    )
    assert outcomes[0][0].accepted == 1
    assert isinstance(outcomes[1], Refusal) and outcomes[1].path == "batches[1].run.world_size"
    assert claims.ranks() == [0]


@pytest.fixture
def refuses_session():
    """A trigger that makes PostgreSQL refuse one session's batch record with a data error (22003),
    as it would a value out of range: a batch no resend can cure, in a group with good ones."""
    with connection.cursor() as cur:
        cur.execute("""CREATE FUNCTION refuse_session() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.session = 'poison-session' THEN
              RAISE EXCEPTION 'value out of range (provoked)' USING ERRCODE = '22003'; END IF; RETURN NEW; END $$""")
        cur.execute(
            f"CREATE TRIGGER refuse_session BEFORE INSERT ON {IngestSession._meta.db_table} "
            "FOR EACH ROW EXECUTE FUNCTION refuse_session()"
        )
    yield
    with connection.cursor() as cur:
        cur.execute(f"DROP TRIGGER IF EXISTS refuse_session ON {IngestSession._meta.db_table}")
        cur.execute("DROP FUNCTION IF EXISTS refuse_session()")


@pytest.mark.django_db
def test_a_batch_the_database_refuses_does_not_take_its_neighbours_down(project, refuses_session):
    outcomes = writers.store_group(
        [
            job(project, a=dict(rank=0)),
            job(project, a=dict(rank=1, session="poison-session")),
            job(project, a=dict(rank=2)),
        ]
    )
    assert isinstance(outcomes[1], DataError)
    assert [outcomes[0][0].accepted, outcomes[2][0].accepted] == [1, 1]
    assert claims.ranks() == [0, 2]


@pytest.mark.django_db
def test_the_door_answers_the_refused_batch_422_and_stores_the_rest(post, refuses_session):
    assert post(make_batch(rank=1, session="poison-session")).status_code == 422
    assert post(make_batch(rank=0)).status_code == 200
    assert claims.ranks() == [0]


def test_the_flush_interval_doubles_with_the_load_and_goes_away_when_it_falls(monkeypatch):
    load = backpressure._Load()
    monkeypatch.setattr(backpressure, "_load", load)
    assert backpressure.flush_interval() is protocol.msgspec.UNSET
    load.average, load.at = 0.45, time.monotonic()  # answered within the agents' own interval
    assert backpressure.flush_interval() is protocol.msgspec.UNSET
    load.average = 1.8  # 3.6x the target: two doublings of the agent's 0.5 s
    assert backpressure.flush_interval() == 2.0 and backpressure.retry_after() == 2
    load.average = 1000.0
    assert backpressure.flush_interval() == backpressure.MAX_INTERVAL_S
    load.at = time.monotonic() - 30 * backpressure.TAU_S  # nothing observed for a minute: not loaded
    assert backpressure.flush_interval() is protocol.msgspec.UNSET


@pytest.mark.parametrize(
    ("group_seconds", "queued", "crowded"),
    [
        (None, groupcommit.LoopCommitter.MIN_QUEUED_BATCHES - 1, None),  # no group written yet: the least bound
        (None, groupcommit.LoopCommitter.MIN_QUEUED_BATCHES, "queue_full"),
        (0.05, 20_000, None),  # 5,120 batches/s a writer, two writers: 4 s is 40,960 batches
        (0.05, 40_000, None),
        (0.05, 41_000, "queue_full"),
        (0.2, groupcommit.LoopCommitter.MIN_QUEUED_BATCHES - 1, None),  # a slow pace: a burst still queues
        (0.2, groupcommit.LoopCommitter.MIN_QUEUED_BATCHES, "queue_full"),
        (0.001, groupcommit.LoopCommitter.MAX_QUEUED_BATCHES - 1, None),  # a fast one: memory bounds it
        (0.001, groupcommit.LoopCommitter.MAX_QUEUED_BATCHES, "queue_full"),
    ],
)
def test_a_request_is_refused_once_the_batches_ahead_would_take_past_the_shedding_bound(group_seconds, queued, crowded):
    """The queue's bound is what the process's writers take SHED_AFTER_S for, at the pace of their
    latest groups, between a 16k-rank job's burst and what memory allows."""
    writers_ = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
    try:
        committer = groupcommit.LoopCommitter(writers_)
        if group_seconds is not None:
            committer.pace.observe(256, group_seconds)
        committer.queued_batches = queued
        assert committer.crowded() == crowded
    finally:
        for w in writers_:
            w.shutdown()


def test_a_queue_of_large_bodies_is_full_by_their_bytes_whatever_its_batches():
    writers_ = [ThreadPoolExecutor(1)]
    try:
        committer = groupcommit.LoopCommitter(writers_)
        committer.pace.observe(256, 0.001)
        committer.queued_batches, committer.queued_bytes = 64, groupcommit.LoopCommitter.MAX_QUEUED_BYTES - 1
        assert committer.crowded() is None
        committer.queued_bytes += 1  # 64 requests of 8 MiB each
        assert committer.crowded() == "queue_full"
    finally:
        writers_[0].shutdown()


def test_the_pace_follows_the_latest_groups():
    pace = groupcommit.Pace(writers=2)
    pace.observe(256, 0.1)  # 2,560 a second a writer
    assert pace.seconds_for(5_120) == pytest.approx(1.0)
    for _ in range(30):
        pace.observe(256, 0.025)  # four times faster since
    assert pace.seconds_for(5_120) == pytest.approx(0.25, rel=0.01)
    for _ in range(30):
        pace.observe(1, 0.005)  # lone batches between bursts: their groups' own cost, not the pace
    assert pace.seconds_for(5_120) == pytest.approx(0.25, rel=0.1)


@pytest.fixture
def other_project(db) -> Project:
    return Project.objects.create(name="project-b")


@pytest.mark.django_db
def test_a_resend_in_the_same_group_as_its_original_is_a_duplicate_and_the_group_commits(project, other_project):
    """A relay's retry or a timed-out agent can put a batch and its resend into one group: the later
    copy answers as a duplicate, the other requests (of any project) are stored."""
    original = job(project, a=dict(rank=0, events=grad(0, [1])))
    resend = job(project, a=dict(rank=0, events=grad(0, [1])))
    bystander = job(other_project, a=dict(rank=1, events=grad(0, [2])))
    outcomes = writers.store_group([original, bystander, resend])
    assert [o[0].duplicate for o in outcomes] == [False, False, True]
    assert [o[0].accepted for o in outcomes] == [1, 1, 0]
    assert per_rank(GradReport.objects) == [(0, 0, [1]), (1, 0, [2])]
    assert claims.count() == 2


@pytest.mark.django_db
def test_a_batch_twice_in_one_bulk_request_stores_once(project, other_project):
    twice = job(project, bulk=True, a=dict(rank=0, events=grad(0, [1])), b=dict(rank=0, events=grad(0, [1])))
    outcomes = writers.store_group([twice, job(other_project, a=dict(rank=1, events=grad(0, [2])))])
    assert [(s.accepted, s.duplicate) for s in outcomes[0]] == [(1, False), (0, True)]
    assert outcomes[1][0].accepted == 1
    assert per_rank(GradReport.objects) == [(0, 0, [1]), (1, 0, [2])]


@pytest.mark.django_db
def test_other_content_under_a_seq_of_the_same_group_refuses_only_its_request(project, other_project):
    outcomes = writers.store_group(
        [
            job(project, a=dict(rank=0, events=grad(0, [1]))),
            job(project, a=dict(rank=0, events=grad(0, [9]))),  # same session and seq, other content
            job(other_project, a=dict(rank=1, events=grad(0, [2]))),
        ]
    )
    assert isinstance(outcomes[1], Refusal) and (outcomes[1].status, outcomes[1].path) == (409, "seq")
    assert [outcomes[0][0].accepted, outcomes[2][0].accepted] == [1, 1]
    assert per_rank(GradReport.objects) == [(0, 0, [1]), (1, 0, [2])]
