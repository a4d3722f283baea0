"""The agents' door (ingest.door) and the group commit behind it (groupcommit.LoopCommitter,
groupcommit.write): the endpoints mounted by path ahead of Django, the header policy, refusals
before the body, shedding, one rate-limit count per group, groups formed on one loop."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connection
from django.test import Client
from prometheus_client import REGISTRY

from agents import protocol
from dashboard.evidence.models import GradReport, IngestSession
from dashboard.web.edge import BodyEdge
from ingest import admission, backpressure, bodies, collector, door, groupcommit, ratelimit, shed, validation, writers
from ingest.door import Door
from ingest.refusals import Refusal
from tests import claims
from tests.conftest import make_batch, per_rank
from tests.stack import database_url


def make_door() -> Door:
    """The HTTP application as dashboard/asgi.py builds it, with two door threads."""
    return Door(BodyEdge(get_asgi_application()), threads=ThreadPoolExecutor(2, thread_name_prefix="lockstep-door"))


def call(
    app, body: bytes, headers: dict[str, str], method: str = "POST", path: str = "/api/v1/ingest", chunks: int = 1
):
    return async_to_sync(acall)(app, body, headers, method, path, chunks)


async def acall(
    app,
    body: bytes,
    headers: dict[str, str],
    method: str = "POST",
    path: str = "/api/v1/ingest",
    chunks: int = 1,
    scheme: str = "http",
):
    """One request through the ASGI app on the running loop: (status, headers, body)."""
    comm = ApplicationCommunicator(app, _scope(method, path, headers, scheme))
    step = max(1, -(-len(body) // chunks))
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    for i, part in enumerate(parts):
        await comm.send_input({"type": "http.request", "body": part, "more_body": i < len(parts) - 1})
    start = await comm.receive_output(30)
    content = b""
    while True:
        message = await comm.receive_output(30)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, content


def _scope(method: str, path: str, headers: dict[str, str], scheme: str = "http") -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


def headers_for(token: str | None, content_type: str = "application/json", **extra) -> dict[str, str]:
    headers = {"Host": "127.0.0.1:8000", "Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra)
    return headers


def job(project, **kw) -> writers.Job:
    body = json.dumps(make_batch(**kw)).encode()
    return writers.Job(project, [(validation.decode(body), writers.digest(body))])


def bulk_job(project, ranks: list[int]) -> writers.Job:
    bodies = [json.dumps(make_batch(rank=r, world_size=8)).encode() for r in ranks]
    return writers.Job(project, [(validation.decode(b), writers.digest(b)) for b in bodies], bulk=True)


@pytest.mark.django_db
def test_a_group_counts_its_batches_once_and_refuses_those_past_the_limit_in_arrival_order(
    project, settings, monkeypatch
):
    settings.LOCKSTEP_RATE_LIMIT = 4
    counted: list[tuple[int, int]] = []
    real = ratelimit.count
    monkeypatch.setattr(ratelimit, "count", lambda pid, n: counted.append((pid, n)) or real(pid, n))
    monkeypatch.setattr(time, "time", lambda: 1_000_000.5)  # one rate window for the whole test
    answers = groupcommit.write(
        [
            job(project, rank=0, world_size=8),
            bulk_job(project, [1, 2]),
            bulk_job(project, [3, 4]),
            job(project, rank=5, world_size=8),
        ]
    )
    assert counted == [(project.id, 6)]  # one Redis round trip for the group's six batches
    assert [a[0].accepted for a in answers[:2]] == [1, 1]
    assert all(isinstance(a, Refusal) and a.status == 429 for a in answers[2:])  # batches 4-6 of a window of 4
    assert claims.ranks() == [0, 1, 2]


@pytest.mark.django_db
def test_redis_down_refuses_the_whole_group_unstored(project, settings, monkeypatch):
    def down(pid, n):
        raise ratelimit.BrokerDown("connection refused")

    monkeypatch.setattr(ratelimit, "count", down)
    answers = groupcommit.write([job(project, rank=0), job(project, rank=1)])
    assert all(isinstance(a, ratelimit.BrokerDown) for a in answers)
    assert admission.refusal(answers[0])[0] == 503 and not IngestSession.objects.exists()


@pytest.fixture
def app(settings):
    """One group writer: the tests below hold a group and watch what the next requests do meanwhile."""
    settings.LOCKSTEP_INGEST_WRITERS = 1
    made = make_door()
    yield made
    made.shutdown()


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
    locker.execute(f"LOCK TABLE {IngestSession._meta.db_table} IN EXCLUSIVE MODE")
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
    committer = app.committer
    observer = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    committed_before_answer: list[bool] = []

    async def send(rank: int) -> int:
        body = make_batch(rank=rank, world_size=8, events=[{"t": "grad", "step": 0, "fps": [5]}])
        status = (await acall(app, json.dumps(body).encode(), headers_for(token)))[0]
        seen = observer.execute(
            f"SELECT count(*) FROM {IngestSession._meta.db_table} WHERE rank = %s", [rank]
        ).fetchone()[0]
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


def _histogram(name: str) -> tuple[float, float]:
    """(observations, their sum) of one of ingest's histograms in this process."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(f"{name}_count") or 0.0, REGISTRY.get_sample_value(f"{name}_sum") or 0.0


@on_loop
def test_metrics_split_a_requests_server_time_into_its_wait_for_a_writer_and_its_groups_write(app, token, lock):
    """While rank 0's group is held in PostgreSQL for HOLD_S, three requests queue for the one writer:
    /metrics counts each one's wait (at least the hold), two groups of 1 and 3 batches, and a write of
    the held group that lasted the hold."""
    hold_s = 0.3
    names = ("lockstep_ingest_queued_seconds", "lockstep_ingest_group_write_seconds", "lockstep_ingest_group_batches")
    before = {name: _histogram(name) for name in names}

    async def scenario() -> list[int]:
        def send(rank: int):
            body = make_batch(rank=rank, world_size=4, events=[{"t": "grad", "step": 0, "fps": [5]}])
            return asyncio.create_task(acall(app, json.dumps(body).encode(), headers_for(token)))

        first = send(0)
        await _until(lambda: app.committer.writing)
        rest = [send(r) for r in range(1, 4)]
        await _until(lambda: len(app.committer.queue) == 3)
        await asyncio.sleep(hold_s)
        lock.commit()
        return [(await t)[0] for t in [first, *rest]]

    assert async_to_sync(scenario)() == [200] * 4
    (queued, waited), (groups, wrote), (_, batches) = (
        tuple(a - b for a, b in zip(_histogram(name), before[name])) for name in names
    )
    assert queued == 4 and waited >= 3 * hold_s  # rank 0 went straight to the writer, the others waited the hold
    assert groups == 2 and wrote >= hold_s and batches == 4


@on_loop
def test_a_group_held_in_postgresql_does_not_hold_up_the_next_one(settings, token, groups):
    """With two writers, rank 0's group waits on a row lock another session holds (its session's
    claim) while rank 1's group is written and answered; rank 0 is answered once the lock goes. With
    one writer rank 1 would wait behind it."""
    settings.LOCKSTEP_INGEST_WRITERS = 2
    app = make_door()

    def batch(rank: int, seq: int) -> bytes:
        return json.dumps(make_batch(rank=rank, seq=seq, world_size=2)).encode()

    assert call(app, batch(0, 0), headers_for(token))[0] == 200  # rank 0's session row exists
    locker = psycopg.connect(database_url(connection.settings_dict))
    locker.execute(f"SELECT 1 FROM {IngestSession._meta.db_table} WHERE rank = 0 FOR UPDATE")
    order: list[int] = []

    async def send(rank: int, seq: int) -> int:
        status = (await acall(app, batch(rank, seq), headers_for(token)))[0]
        order.append(rank)
        return status

    async def scenario() -> list[int]:
        held = asyncio.create_task(send(0, 1))
        await _until(lambda: app.committer.writing)
        other = await send(1, 0)
        assert not held.done() and app.committer.writing
        locker.commit()
        return [await held, other]

    try:
        assert async_to_sync(scenario)() == [200, 200]
    finally:
        locker.close()
        app.shutdown()
    assert order == [1, 0] and groups == [1, 1, 1]
    assert claims.ranks() == [0, 0, 1]


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
    committer = app.committer

    def release() -> None:
        if threading.current_thread().name.startswith("lockstep-groupcommit"):  # not a token lookup's
            released.append(len(groups))

    monkeypatch.setattr(groupcommit, "release_connection", release)
    world = 2 + groupcommit.COALESCE_AFTER + 2

    def send(rank: int):
        return asyncio.create_task(
            acall(app, json.dumps(make_batch(rank=rank, world_size=world)).encode(), headers_for(token))
        )

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
def test_a_relays_request_of_many_batches_is_load_too(app, token, monkeypatch):
    """Load is counted in batches, not requests: a rack relay's one request of COALESCE_AFTER batches
    makes the collector's young generation large, as that many ranks posting at once do."""
    monkeypatch.setattr(collector, "IDLE_AFTER_S", 0.2)
    world = groupcommit.COALESCE_AFTER
    body = protocol.bulk_body([json.dumps(make_batch(rank=r, world_size=world)).encode() for r in range(world)])

    async def scenario() -> tuple[int, int]:
        status, _, _ = await acall(app, body, headers_for(token), path="/api/v1/ingest/bulk")
        return status, gc.get_threshold()[0]

    try:
        assert async_to_sync(scenario)() == (200, collector.LOADED_YOUNG)
    finally:
        gc.set_threshold(collector.IDLE_YOUNG, *gc.get_threshold()[1:])


@on_loop
def test_a_large_body_is_decoded_off_the_loop(app, token, monkeypatch):
    monkeypatch.setattr(door, "DECODE_ON_LOOP_MAX", 100)
    threads: list[str] = []
    real = admission.job_of
    monkeypatch.setattr(admission, "job_of", lambda *a: threads.append(threading.current_thread().name) or real(*a))
    body = protocol.bulk_body([json.dumps(make_batch(rank=r)).encode() for r in range(3)])
    status, _, content = call(app, body, headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 200 and [r["accepted"] for r in json.loads(content)["results"]] == [1, 1, 1]
    small = json.dumps({"v": 1, "batches": [make_batch(rank=0, seq=1)]}).encode()[:100]
    assert call(app, small, headers_for(token), path="/api/v1/ingest/bulk")[0] == 400
    assert threads[0].startswith("lockstep-door") and not threads[1].startswith(
        "lockstep-door"
    )  # the small one on the loop


@on_loop
@pytest.mark.parametrize(
    "bounds",
    [
        {"MIN_QUEUED_BATCHES": 1, "MAX_QUEUED_BATCHES": 1},  # a batch queued is all it holds
        {"MAX_QUEUED_BYTES": 100},  # one queued body's bytes are (a batch's JSON is longer)
    ],
)
def test_past_the_queue_bound_a_request_is_refused_at_once_unstored(app, project, token, lock, monkeypatch, bounds):
    for name, value in bounds.items():
        monkeypatch.setattr(groupcommit.LoopCommitter, name, value)
    committer = app.committer
    before = _shed()

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
    assert claims.ranks() == [0, 1]
    assert _shed(before) == {"queue_full": 1, "waited": 0}  # /metrics says why
    # refused before its token was read: the silence of every project's ranks counts from here
    # (`rules.rank_silent`); the door records it on one of its threads, after answering
    deadline = time.monotonic() + 5
    while shed.seconds_since(project.id) > 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert shed.seconds_since(project.id) < 5


@on_loop
def test_a_writer_connection_broken_since_the_last_group_costs_no_503(app, token):
    """PostgreSQL restarted between two groups (here: the writer's backend terminated): the next
    group fails on the dead connection, which is replaced, and its requests are written again."""
    assert call(app, json.dumps(make_batch(rank=0)).encode(), headers_for(token))[0] == 200
    with connection.cursor() as cursor:  # the test's own session; the writer's is kept by the writer or the pool
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)",
            [own],
        ).fetchone()[0]
    assert ended >= 1
    status, _, content = call(app, json.dumps(make_batch(rank=1)).encode(), headers_for(token))
    assert status == 200 and json.loads(content)["duplicate"] is False
    assert claims.ranks() == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_the_writer_keeps_its_pooled_connection_while_groups_follow_and_gives_it_back_when_the_queue_is_dry(
    project, monkeypatch
):
    """A checkout from the pool costs a round trip per group; an idle process must hold none."""
    released: list[bool] = []
    monkeypatch.setattr(groupcommit, "release_connection", lambda: released.append(True))
    assert not isinstance(groupcommit._write_on_thread([job(project, rank=0)], keep=True)[0], Exception)
    assert released == []
    assert not isinstance(groupcommit._write_on_thread([job(project, rank=1)], keep=False)[0], Exception)
    assert released == [True]
    assert claims.ranks() == [0, 1]


def test_a_stalled_body_read_times_out_and_a_cancel_from_elsewhere_stays_a_cancel(settings):
    """One timer per process cuts body reads at LOCKSTEP_BODY_TIMEOUT (`bodies.BodyReader`); a
    cancel that is not its own (the server stopping) is not turned into a 408, and nothing is left
    pending once the reads are over."""
    settings.LOCKSTEP_BODY_TIMEOUT = 0.2
    reader = bodies.BodyReader()

    async def stalled() -> dict:
        await asyncio.sleep(3600)
        return {}

    async def arrived() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def scenario() -> tuple[float, bool, bytes, bool]:
        started = time.monotonic()
        with pytest.raises(Refusal) as timed_out:
            await reader.read(stalled, 100)
        assert timed_out.value.status == 408
        waited = time.monotonic() - started
        other = asyncio.create_task(reader.read(stalled, 100))
        await asyncio.sleep(0.05)
        other.cancel()  # before its deadline, by someone else
        with pytest.raises(asyncio.CancelledError):
            await other
        body = await reader.read(arrived, 100)
        await asyncio.sleep(2 * bodies.DEADLINE_TICK_S)
        return waited, other.cancelled(), body, reader.ticking

    waited, cancelled, body, ticking = async_to_sync(scenario)()
    assert 0.2 <= waited < 0.2 + 2 * bodies.DEADLINE_TICK_S + 0.2
    assert cancelled and body == b"{}"
    assert reader.reading == {} and not ticking


# what every endpoint answers, and where every other path goes ------------------------------------


SECURITY_HEADERS = {
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
    "x-frame-options",
    "strict-transport-security",
    "content-security-policy",
}


@on_loop
def test_accepts_and_stores_then_resend_is_duplicate(app, token):
    batch = make_batch(events=[{"t": "grad", "step": 0, "fps": [1, 2, 3]}, {"t": "grad", "step": 1, "fps": [4, 5, 6]}])
    body = json.dumps(batch).encode()
    status, headers, content = call(app, body, headers_for(token))
    assert status == 200, content
    assert json.loads(content) == {"accepted": 2, "duplicate": False, "want_blobs": [], "detail": []}
    assert headers["content-type"] == "application/json" and headers["content-length"] == str(len(content))
    assert GradReport.objects.count() == 2
    status, _, content = call(app, gzip.compress(body), headers_for(token, **{"Content-Encoding": "gzip"}), chunks=3)
    assert status == 200 and json.loads(content)["duplicate"] is True
    assert GradReport.objects.count() == 2 and claims.count() == 1


@on_loop
def test_bulk_is_served_by_the_door_too(app, token):
    body = protocol.bulk_body([json.dumps(make_batch(rank=r)).encode() for r in range(2)])
    status, _, content = call(app, body, headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 200, content
    assert [r["accepted"] for r in json.loads(content)["results"]] == [1, 1]
    assert [rank for rank, _, _ in per_rank(GradReport.objects)] == [0, 1] and claims.count() == 2
    status, _, content = call(app, protocol.bulk_body([b"{}"]), headers_for(token), path="/api/v1/ingest/bulk")
    assert status == 400 and json.loads(content)["path"].startswith("batches[0].")


@on_loop
def test_the_header_policy_is_what_djangos_middleware_adds_to_a_json_answer(token, settings):
    """Every answer of the door, refusals too, carries the security headers Django's full chain
    adds to a JSON answer of the read API, and no others (no cookie, no Vary, no CSP: pages' only);
    over HTTPS the same plus HSTS."""
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    https = make_door()  # the policy is read when the process starts, as Django loads its middleware
    try:
        for scheme in ("http", "https"):
            django = Client().get("/api/v1/schema", secure=scheme == "https", HTTP_HOST="127.0.0.1:8000")
            expected = {k.lower(): v for k, v in django.headers.items() if k.lower() in SECURITY_HEADERS}
            assert "x-content-type-options" in expected and ("strict-transport-security" in expected) == (
                scheme == "https"
            )
            for token_, rank in ((token, 0 if scheme == "http" else 1), (None, 2)):
                status, headers, _ = async_to_sync(acall)(
                    https,
                    json.dumps(make_batch(rank=rank)).encode(),
                    headers_for(token_, Cookie="sessionid=forged; csrftoken=x"),  # no session, no CSRF check
                    scheme=scheme,
                )
                assert status == (200 if token_ else 401)
                assert {k: v for k, v in headers.items() if k in SECURITY_HEADERS} == expected
                assert set(headers) == set(expected) | {"content-type", "content-length"}
    finally:
        https.shutdown()
    assert expected["strict-transport-security"] == "max-age=3600; includeSubDomains"


@on_loop
def test_a_host_outside_allowed_hosts_is_a_400_and_other_methods_a_405(app, token, settings):
    status, headers, content = call(app, json.dumps(make_batch()).encode(), headers_for(token, Host="evil.example"))
    assert status == 400 and json.loads(content) == {"error": "invalid Host header"}
    assert headers["x-content-type-options"] == "nosniff"
    assert Client().get("/api/v1/schema", HTTP_HOST="evil.example").status_code == 400  # as Django answers
    status, headers, _ = call(app, b"", headers_for(token), method="GET")
    assert status == 405 and headers["allow"] == "POST"
    assert not IngestSession.objects.exists()


@on_loop
def test_every_other_path_goes_to_django_behind_the_edge(app, token, settings, monkeypatch):
    """Pages and the read API are Django's (with BodyEdge's limit); the door's paths are exact."""
    served: list[str] = []
    django = app.app

    async def spy(scope, receive, send):
        served.append(scope["path"])
        await django(scope, receive, send)

    monkeypatch.setattr(app, "app", spy)
    status, _, content = call(app, b"", headers_for(token), method="GET", path="/api/v1/schema")
    assert status == 200 and json.loads(content)["openapi"]
    assert call(app, b"", headers_for(token), method="GET", path="/no/such/route")[0] == 404
    assert call(app, b"{}", headers_for(token), path="/api/v1/ingest/")[0] == 404  # no Django route for it
    settings.LOCKSTEP_MAX_BODY = 10  # a route's own limit never exceeds it
    assert call(app, b"x" * 20, headers_for(token, **{"Transfer-Encoding": "chunked"}), path="/login/")[0] == 413
    assert served == ["/api/v1/schema", "/no/such/route", "/api/v1/ingest/", "/login/"]


@on_loop
def test_too_large_is_413_before_and_after_inflating(app, token, settings):
    settings.LOCKSTEP_MAX_BODY = 400
    raw = json.dumps(make_batch(events=[{"t": "grad", "step": 0, "fps": [1, 2, 3]}] * 100)).encode()
    assert len(gzip.compress(raw)) < 400 < len(raw)
    status, _, content = call(app, raw, headers_for(token), chunks=4)
    assert status == 413 and "exceeds" in json.loads(content)["error"]
    status, _, content = call(app, gzip.compress(raw), headers_for(token, **{"Content-Encoding": "gzip"}))
    assert status == 413 and "decompressed" in json.loads(content)["error"]


@on_loop
def test_rate_limit_keeps_retry_after(app, token, settings):
    settings.LOCKSTEP_RATE_LIMIT = 1
    answers = [call(app, json.dumps(make_batch(seq=i)).encode(), headers_for(token)) for i in range(3)]
    limited = [a for a in answers if a[0] == 429]
    assert limited and limited[0][1]["retry-after"] == "1"


def _unanswered_body(app, headers: dict[str, str], first: bytes | None = None, path: str = "/api/v1/ingest"):
    """Send the headers (and `first`, a part of a body that never ends) but never the rest: the
    answer must come without the body, or the call times out."""

    async def run():
        comm = ApplicationCommunicator(app, _scope("POST", path, headers))
        if first is not None:
            await comm.send_input({"type": "http.request", "body": first, "more_body": True})
        start = await comm.receive_output(10)
        body = await comm.receive_output(10)
        await comm.send_input({"type": "http.disconnect"})
        return start["status"], json.loads(body["body"])

    return async_to_sync(run)()


@on_loop
@pytest.mark.parametrize("path", list(door.ENDPOINTS))
def test_a_bad_token_or_an_oversized_length_is_refused_before_the_body_is_read(app, token, path, settings):
    """Nobody without a token makes the server hold (or wait for) 8 MiB, on any of the endpoints."""
    assert _unanswered_body(app, headers_for(None, **{"Content-Length": "8000000"}), path=path)[0] == 401
    assert _unanswered_body(app, headers_for("lst_forged", **{"Content-Length": "8000000"}), path=path)[0] == 401
    assert admission._cached_token("lst_forged") is None  # a bad token is remembered: no flood of queries
    too_long = {"Content-Length": str(settings.LOCKSTEP_MAX_BODY + 1)}
    assert _unanswered_body(app, headers_for(token, **too_long), path=path) == (
        413,
        {"error": f"body exceeds {settings.LOCKSTEP_MAX_BODY} bytes"},
    )
    assert _unanswered_body(app, headers_for("lst_forged", **too_long), path=path)[0] == 413  # the limit first
    assert _unanswered_body(app, headers_for(token, **{"Content-Length": "-1"}), path=path)[0] == 400


@on_loop
@pytest.mark.parametrize("path", list(door.ENDPOINTS))
def test_a_body_that_stalls_is_a_408_after_the_read_timeout(app, token, settings, path):
    settings.LOCKSTEP_BODY_TIMEOUT = 0.3
    status, answer = _unanswered_body(
        app, headers_for(token, **{"Content-Length": "5000"}), first=b'{"v": 1', path=path
    )
    assert status == 408 and "0.3 s" in answer["error"]
    assert not IngestSession.objects.exists()


@on_loop
def test_an_agents_route_and_a_django_route_get_413_and_408_from_one_reader_by_the_route_table(app, token, settings):
    """The door and the edge read bodies alike (`ingest.bodies`): a chunked body one byte past the
    route's limit in the table is a 413 with the same answer, one at the limit passes on, a stalled
    one is a 408."""
    settings.LOCKSTEP_MAX_BODY = 8000
    settings.LOCKSTEP_BODY_TIMEOUT = 0.3
    chunked = headers_for(token, **{"Transfer-Encoding": "chunked"})
    limits = {path: bodies.route_limit(path) for path in ("/api/v1/ingest", "/login/")}
    assert limits == {"/api/v1/ingest": 8000, "/login/": 4 * 1024}
    for path, limit in limits.items():
        status, _, content = call(app, b"x" * (limit + 1), chunked, path=path, chunks=3)
        assert (status, json.loads(content)) == (413, {"error": f"body exceeds {limit} bytes"}), path
        assert call(app, b"x" * limit, chunked, path=path, chunks=3)[0] in (400, 403), path  # read, then refused
        assert _unanswered_body(app, chunked, first=b"x", path=path) == (
            408,
            {"error": "body not received within 0.3 s"},
        ), path


@on_loop
def test_json_nested_too_deeply_is_a_400(app, token):
    body = b'{"v": 1, "run": {"key": "deep", "world_size": 1, "meta": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}}"
    status, _, content = call(app, body, headers_for(token))
    assert status == 400 and "error" in json.loads(content)


@on_loop
def test_blobs_and_flight_records_touch_the_database_on_a_door_thread(app, token, monkeypatch):
    threads: list[str] = []
    real = groupcommit.outside_request

    def spy(work, *args):
        threads.append(threading.current_thread().name)
        return real(work, *args)

    monkeypatch.setattr(groupcommit, "outside_request", spy)
    upload = {"v": 1, "blobs": [{"hash": protocol.blob_hash("graph"), "text": "graph"}]}
    status, _, content = call(app, json.dumps(upload).encode(), headers_for(token), path="/api/v1/blobs")
    assert status == 200 and json.loads(content) == {"stored": [], "known": [protocol.blob_hash("graph")]}
    body = json.dumps({"run": "none", "rank": 0, "session": "s", "ts": 0.0, "dump": {}}).encode()
    status, _, content = call(app, body, headers_for(token), path="/api/v1/flight-recorder")
    assert status in (400, 404) and "error" in json.loads(content)
    assert len(threads) >= 2 and all(t.startswith("lockstep-door") for t in threads)


@on_loop
def test_while_the_oldest_queued_request_is_past_shedding_a_new_one_is_refused_at_once(app, token, lock, monkeypatch):
    """One group held in PostgreSQL (a table lock another session holds); a second batch queues for
    the next group past SHED_AFTER_S; a third is answered 503 + Retry-After at once while the group
    is still held, its body unread, and the queued one is shed unstored when its turn comes. All on
    one event loop, as a server process runs them."""
    monkeypatch.setattr(backpressure, "SHED_AFTER_S", 0.3)
    committer = app.committer
    before = _shed()

    async def scenario():
        held = asyncio.create_task(acall(app, json.dumps(make_batch(rank=0)).encode(), headers_for(token)))
        await _until(lambda: committer.writing)
        waiting = asyncio.create_task(acall(app, json.dumps(make_batch(rank=1)).encode(), headers_for(token)))
        await _until(lambda: committer.queue)
        await asyncio.sleep(backpressure.SHED_AFTER_S + 0.2)
        refused = await acall(app, json.dumps(make_batch(rank=2)).encode(), headers_for(token))
        still_held = not held.done()
        lock.commit()
        return (await held)[0], (await waiting)[0], refused, still_held

    held, waiting, (status, headers, _), still_held = async_to_sync(scenario)()
    assert status == 503 and int(headers["retry-after"]) >= 1 and still_held  # answered without waiting for the group
    assert (held, waiting) == (200, 503)
    assert claims.ranks() == [0]
    assert _shed(before) == {"queue_full": 0, "waited": 2}  # the new one at the door, the queued one at its turn


def _shed(before: dict[str, float] | None = None) -> dict[str, float]:
    """/metrics' count of requests shed for load, by why (less `before`)."""
    now = {
        why: REGISTRY.get_sample_value("lockstep_ingest_shed_total", {"why": why}) or 0.0
        for why in ("queue_full", "waited")
    }
    return {why: n - (before or {}).get(why, 0.0) for why, n in now.items()}
