"""The agents' endpoints on the event loop (ingest.loop) and the group commit they share
(groupcommit.LoopCommitter, groupcommit.write): one rate-limit count per group, groups formed on
one loop, Django's own answers where the loop path does not serve a request."""
from __future__ import annotations

import asyncio
import gc
import json
import threading
import time

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.core.asgi import get_asgi_application
from django.db import connection

from agents import protocol
from ingest import collector, groupcommit, loop, ratelimit, validation, views, writers
from ingest.fastpath import LeanRoutes
from ingest.models import GradReport, IngestBatch
from ingest.validation import Rejection
from tests.conftest import make_batch
from tests.stack import database_url
from tests.test_ingest_fastpath import acall, call, headers_for


def job(project, **kw) -> writers.Job:
    body = json.dumps(make_batch(**kw)).encode()
    return writers.Job(project, [(validation.decode(body), writers.digest(body))])


def bulk_job(project, ranks: list[int]) -> writers.Job:
    bodies = [json.dumps(make_batch(rank=r, world_size=8)).encode() for r in ranks]
    return writers.Job(project, [(validation.decode(b), writers.digest(b)) for b in bodies], bulk=True)


@pytest.mark.django_db
def test_a_group_counts_its_batches_once_and_refuses_those_past_the_limit_in_arrival_order(project, settings, monkeypatch):
    settings.LOCKSTEP_RATE_LIMIT = 4
    counted: list[tuple[int, int]] = []
    real = ratelimit.count
    monkeypatch.setattr(ratelimit, "count", lambda pid, n: counted.append((pid, n)) or real(pid, n))
    monkeypatch.setattr(time, "time", lambda: 1_000_000.5)  # one rate window for the whole test
    answers = groupcommit.write([job(project, rank=0, world_size=8), bulk_job(project, [1, 2]), bulk_job(project, [3, 4]),
                                 job(project, rank=5, world_size=8)])
    assert counted == [(project.id, 6)]  # one Redis round trip for the group's six batches
    assert [a[0].accepted for a in answers[:2]] == [1, 1]
    assert all(isinstance(a, Rejection) and a.status == 429 for a in answers[2:])  # batches 4-6 of a window of 4
    assert sorted(IngestBatch.objects.values_list("rank", flat=True)) == [0, 1, 2]


@pytest.mark.django_db
def test_redis_down_refuses_the_whole_group_unstored(project, settings, monkeypatch):
    def down(pid, n):
        raise ratelimit.BrokerDown("connection refused")

    monkeypatch.setattr(ratelimit, "count", down)
    answers = groupcommit.write([job(project, rank=0), job(project, rank=1)])
    assert all(isinstance(a, ratelimit.BrokerDown) for a in answers)
    assert views.refusal(answers[0]).status_code == 503 and not IngestBatch.objects.exists()


@pytest.fixture
def app():
    routes = LeanRoutes(get_asgi_application(), threads=2)
    yield routes
    routes.shutdown()


on_loop = pytest.mark.django_db(transaction=True)  # the loop's writer thread commits on a connection of its own


@pytest.fixture
def groups(monkeypatch) -> list[int]:
    """The number of requests of each group written."""
    written: list[int] = []
    real = writers.store_group
    monkeypatch.setattr(writers, "store_group", lambda jobs: written.append(len(jobs)) or real(jobs))
    return written


@pytest.fixture
def lock():
    """Another session holding the batch table: a group's claim waits until the test calls `lock.commit()`."""
    locker = psycopg.connect(database_url(connection.settings_dict))
    locker.execute(f"LOCK TABLE {IngestBatch._meta.db_table} IN EXCLUSIVE MODE")
    yield locker
    locker.close()


async def _until(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


@on_loop
def test_requests_arriving_while_a_group_is_written_share_the_next_one(app, token, groups, lock):
    """Rank 0's group is held in PostgreSQL (a table lock another session holds); seven requests
    queue on the loop meanwhile and are written as one group once it commits; each answer comes
    only after the commit that holds its batch."""
    committer = app.loop.committer
    observer = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    committed_before_answer: list[bool] = []

    async def send(rank: int) -> int:
        body = make_batch(rank=rank, world_size=8, events=[{"t": "grad", "step": 0, "fps": [5]}])
        status = (await acall(app, json.dumps(body).encode(), headers_for(token)))[0]
        seen = observer.execute(f"SELECT count(*) FROM {IngestBatch._meta.db_table} WHERE rank = %s", [rank]).fetchone()[0]
        committed_before_answer.append(seen == 1)
        return status

    async def scenario() -> list[int]:
        first = asyncio.create_task(send(0))
        await _until(lambda: committer.writing)
        rest = [asyncio.create_task(send(r)) for r in range(1, 8)]
        await _until(lambda: len(committer.queue) == 7)
        lock.commit()
        return [await first] + [await t for t in rest]

    try:
        statuses = async_to_sync(scenario)()
    finally:
        observer.close()
    assert statuses == [200] * 8 and groups == [1, 7]
    assert committed_before_answer == [True] * 8
    assert GradReport.objects.count() == 2  # rank 0 alone, then the seven agreeing ranks of one group share a row


@on_loop
def test_under_load_the_next_group_waits_a_moment_for_the_batches_on_their_way(app, token, groups, lock, monkeypatch):
    """After a group of COALESCE_AFTER requests, a lone request that arrives first does not go
    alone: the next group starts COALESCE_S later, with the ones that came meanwhile. Such a group
    also means load: the collector's young generation is large, and the writer keeps its pooled
    connection between groups, until the process is idle again."""
    monkeypatch.setattr(groupcommit, "COALESCE_S", 0.3)
    monkeypatch.setattr(collector, "IDLE_AFTER_S", 0.5)
    young: list[int] = []
    released: list[int] = []  # groups written when the writer gave its connection back
    committer = app.loop.committer

    def release() -> None:
        if threading.current_thread().name.startswith("lockstep-groupcommit"):  # not a token lookup's
            released.append(len(groups))

    monkeypatch.setattr(groupcommit, "release_connection", release)
    world = 2 + groupcommit.COALESCE_AFTER + 2

    def send(rank: int):
        return asyncio.create_task(acall(app, json.dumps(make_batch(rank=rank, world_size=world)).encode(), headers_for(token)))

    async def scenario() -> list[int]:
        held = send(0)
        await _until(lambda: committer.writing)
        load = [send(r) for r in range(1, 1 + groupcommit.COALESCE_AFTER)]
        await _until(lambda: len(committer.queue) == groupcommit.COALESCE_AFTER)
        young.append(gc.get_threshold()[0])
        lock.commit()
        answered = [await held] + [await t for t in load]
        young.append(gc.get_threshold()[0])
        late = [send(world - 2)]
        await asyncio.sleep(0.1)  # within the moment
        late.append(send(world - 1))
        answered += [await t for t in late]
        kept = list(released)
        await _until(lambda: not committer.young.loaded, timeout=5)
        young.append(gc.get_threshold()[0])
        await _until(lambda: len(released) > len(kept))
        return [a[0] for a in answered], kept

    try:
        statuses, kept = async_to_sync(scenario)()
    finally:
        gc.set_threshold(collector.IDLE_YOUNG, *gc.get_threshold()[1:])
    assert statuses == [200] * (3 + groupcommit.COALESCE_AFTER)
    assert groups == [1, groupcommit.COALESCE_AFTER, 2]
    assert young == [collector.IDLE_YOUNG, collector.LOADED_YOUNG, collector.IDLE_YOUNG]
    # given back after the first two groups (the queue ran dry before the process was known to be
    # loaded), kept after the late two (loaded), given back once the process fell idle
    assert kept == [1, 2] and released == [1, 2, 3]


@on_loop
def test_a_large_body_is_decoded_off_the_loop(app, token, monkeypatch):
    monkeypatch.setattr(loop, "DECODE_ON_LOOP_MAX", 100)
    threads: list[str] = []
    real = views.job_of
    monkeypatch.setattr(views, "job_of", lambda *a: threads.append(threading.current_thread().name) or real(*a))
    body = protocol.bulk_body([json.dumps(make_batch(rank=r)).encode() for r in range(3)])
    status, _, content = call(app, body, headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 200 and [r["accepted"] for r in json.loads(content)["results"]] == [1, 1, 1]
    small = json.dumps({"v": 1, "batches": [make_batch(rank=0, seq=1)]}).encode()[:100]
    assert call(app, small, headers_for(token), path="/api/v1/ingest/bulk")[0] == 400
    assert threads[0].startswith("lockstep-lean") and not threads[1].startswith("lockstep-lean")  # the small one on the loop


@on_loop
def test_https_answers_carry_the_chains_https_headers_and_a_redirect_stays_djangos(app, token, client, settings):
    """The chain's headers are learned per scheme: HSTS only over HTTPS, as Django's full handler
    adds it; with SECURE_SSL_REDIRECT a plain-HTTP batch gets Django's redirect, not a loop answer."""
    settings.SECURE_HSTS_SECONDS = 3600
    body = json.dumps(make_batch()).encode()

    async def over(scheme: str, rank: int):
        return await acall(app, json.dumps(make_batch(rank=rank)).encode(), headers_for(token), scheme=scheme)

    status, headers, _ = async_to_sync(over)("https", 0)
    assert status == 200 and headers["strict-transport-security"] == "max-age=3600"
    status, headers, _ = async_to_sync(over)("http", 1)
    assert status == 200 and "strict-transport-security" not in headers
    django = client.post("/api/v1/ingest", body, content_type="application/json", secure=True,
                         HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1:8000")
    assert django["Strict-Transport-Security"] == "max-age=3600"
    settings.SECURE_SSL_REDIRECT = True  # read when a process loads its middleware, as a deployment sets it
    redirecting = LeanRoutes(get_asgi_application(), threads=1)
    try:
        status, headers, _ = call(redirecting, json.dumps(make_batch(rank=2)).encode(), headers_for(token))
    finally:
        redirecting.shutdown()
    assert status == 301 and headers["location"].startswith("https://")
    assert sorted(IngestBatch.objects.values_list("rank", flat=True)) == [0, 1]


@on_loop
def test_past_the_queue_bound_a_request_is_refused_at_once_unstored(app, token, lock, monkeypatch):
    monkeypatch.setattr(groupcommit.LoopCommitter, "MAX_QUEUED_BATCHES", 1)
    committer = app.loop.committer

    def send(rank: int):
        return asyncio.create_task(acall(app, json.dumps(make_batch(rank=rank)).encode(), headers_for(token)))

    async def scenario():
        held = send(0)
        await _until(lambda: committer.writing)
        queued = send(1)
        await _until(lambda: committer.queue)
        refused = await send(2)
        lock.commit()
        return (await held)[0], (await queued)[0], refused

    held, queued, (status, headers, content) = async_to_sync(scenario)()
    assert (held, queued) == (200, 200)
    assert status == 503 and int(headers["retry-after"]) >= 1 and "overloaded" in json.loads(content)["error"]
    assert sorted(IngestBatch.objects.values_list("rank", flat=True)) == [0, 1]


@on_loop
def test_a_writer_connection_broken_since_the_last_group_costs_no_503(app, token):
    """PostgreSQL restarted between two groups (here: the writer's backend terminated): the next
    group fails on the dead connection, which is replaced, and its requests are written again."""
    assert call(app, json.dumps(make_batch(rank=0)).encode(), headers_for(token))[0] == 200
    writer_pid = app.loop.committer._writer.submit(lambda: connection.connection.info.backend_pid).result()
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [writer_pid]).fetchone()[0]
    status, _, content = call(app, json.dumps(make_batch(rank=1)).encode(), headers_for(token))
    assert status == 200 and json.loads(content)["duplicate"] is False
    assert sorted(IngestBatch.objects.values_list("rank", flat=True)) == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_the_writer_keeps_its_pooled_connection_while_groups_follow_and_gives_it_back_when_the_queue_is_dry(
        project, monkeypatch):
    """A checkout from the pool costs a round trip per group; an idle process must hold none."""
    released: list[bool] = []
    monkeypatch.setattr(groupcommit, "release_connection", lambda: released.append(True))
    assert not isinstance(groupcommit._write_on_thread([job(project, rank=0)], keep=True)[0], Exception)
    assert released == []
    assert not isinstance(groupcommit._write_on_thread([job(project, rank=1)], keep=False)[0], Exception)
    assert released == [True]
    assert sorted(IngestBatch.objects.values_list("rank", flat=True)) == [0, 1]


def test_a_stalled_body_read_times_out_and_a_cancel_from_elsewhere_stays_a_cancel(settings):
    """One timer per process cuts body reads at LOCKSTEP_BODY_TIMEOUT (`loop.BodyDeadlines`); a
    cancel that is not its own (the server stopping) is not turned into a 408, and nothing is left
    pending once the reads are over."""
    settings.LOCKSTEP_BODY_TIMEOUT = 0.2
    deadlines = loop.BodyDeadlines()

    async def stalled() -> dict:
        await asyncio.sleep(3600)
        return {}

    async def arrived() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def scenario() -> tuple[float, bool, bytes, bool]:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await deadlines.read(stalled)
        waited = time.monotonic() - started
        other = asyncio.create_task(deadlines.read(stalled))
        await asyncio.sleep(0.05)
        other.cancel()  # before its deadline, by someone else
        with pytest.raises(asyncio.CancelledError):
            await other
        body = (await deadlines.read(arrived)).getvalue()
        await asyncio.sleep(2 * loop.DEADLINE_TICK_S)
        return waited, other.cancelled(), body, deadlines.ticking

    waited, cancelled, body, ticking = async_to_sync(scenario)()
    assert 0.2 <= waited < 0.2 + 2 * loop.DEADLINE_TICK_S + 0.2
    assert cancelled and body == b"{}"
    assert deadlines.reading == {} and not ticking
