"""Shared fixtures: projects and tokens, and the real stack (uvicorn + Celery worker) as processes."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
import uuid

import pytest
import redis

from dashboard.tenancy.models import Project, ProjectToken

pytest_plugins = ["tests.stack"]


def pytest_configure(config) -> None:
    """The suite's compiles (in-process and in every job it starts) share an Inductor cache of its own:
    never one that other processes on the machine write at the same moment (a half-written artifact
    of theirs crashed a job here once), and cold on every run, as on a fresh CI machine. The run's
    first process makes it; pytest-xdist's workers inherit it, so they compile each graph once.

    One OpenMP thread and in-process Inductor compiles for the test processes and what they start
    (torchrun sets the first for its ranks, not for one): the pytest workers and their jobs already
    keep both cores busy, where spinning OpenMP threads and a pool of compile workers per process
    (each importing torch) only add work.

    TORCHINDUCTOR_VEC_ISA_OK=1: the ISAs this CPU reports are taken as usable. Otherwise every process
    that compiles re-proves it, building a probe per ISA into its cache dir and loading each in a child
    Python: about 1.4 CPU-seconds a warm rank and more on a cold cache, a tenth of the suite's CPU,
    proving the same thing a hundred times. Which ISA a rank compiles for still follows its
    ATEN_CPU_CAPABILITY (the shared-cache ISA tests rely on that)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        config._lockstep_inductor_cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(
            prefix="lockstep-tests-inductor-"
        )


def pytest_unconfigure(config) -> None:
    """Each process cleans what it made: the Inductor cache, the broker's keys in its Redis database."""
    from django.conf import settings

    from tests.stack import forget_broker_keys

    forget_broker_keys(settings.REDIS_URL)
    made = getattr(config, "_lockstep_inductor_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after pytest-django's ordering
def pytest_collection_modifyitems(session, config, items) -> None:
    """Files that start processes (the live stack, jobs) first. pytest-xdist hands out the files with
    the most tests first (its loadscope reorder) and keeps this order among files of one size: heavy
    and light files end up mixed on both workers, which keeps two multi-rank jobs from sharing the two
    cores for long (their timing-sensitive checks fail when they do; `--no-loadscope-reorder`, every
    heavy file first, ran slower and failed two of them here)."""
    heavy = {item.path for item in items if item.get_closest_marker("e2e") or STACK_FIXTURES & set(item.fixturenames)}
    items.sort(key=lambda item: item.path not in heavy)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The shared live stack stops once the next test of this process does not use it."""
    from tests.stack import stop_shared_stack  # a plugin of this conftest (pytest_plugins), imported by pytest first

    result = yield
    if "stack" in item.fixturenames and (nextitem is None or "stack" not in nextitem.fixturenames):
        stop_shared_stack()
    return result


def per_rank(reports) -> list[tuple[int, int, list[int]]]:
    """(rank, step, fps) of every rank's report among GradReport rows (a row lists the ranks that sent it alike), sorted."""
    return sorted(
        (rank, step, fps) for ranks, step, fps in reports.values_list("ranks", "step", "fps") for rank in ranks
    )


STACK_FIXTURES = {"live_db", "stack", "stack_env"}  # committed data, shared with processes
LIVE_FIXTURES = STACK_FIXTURES | {"django_db_setup"}
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "client", "admin_client"} | LIVE_FIXTURES
KEPT_TABLES = {"django_content_type", "auth_permission"}  # what migrations made, as in the fresh test database


@pytest.fixture(scope="module", autouse=True)
def _clean_start(request):
    """Every file that uses the database starts with an empty one, whatever ran before it in this
    process. Files that share data with processes (the live stack, jobs, server threads) commit
    their rows; an in-process test must never see them, in whatever order pytest-xdist hands a
    worker its files."""
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    if any(item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames) for item in items):
        request.getfixturevalue("django_db_setup")
        with request.getfixturevalue("django_db_blocker").unblock():
            _empty_if_used()
    yield


def _empty_if_used() -> None:
    """TRUNCATE every table once a project or a user exists (rows hang off them). A running stack's
    Celery sweep may hold a row lock a moment: a short lock timeout, then again."""
    from django.contrib.auth.models import User
    from django.db import OperationalError, connection, transaction

    if not (Project.objects.exists() or User.objects.exists()):
        return
    tables = set(connection.introspection.django_table_names(only_existing=True, include_views=False)) - KEPT_TABLES
    statement = "TRUNCATE " + ", ".join(map(connection.ops.quote_name, sorted(tables))) + " CASCADE"
    for attempt in range(30):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '1s'")
                cursor.execute(statement)
            return
        except OperationalError:
            if attempt == 29:
                raise
            time.sleep(0.2)


def forget_shed() -> None:
    """No request was turned away for load (`ingest.shed`), in this process or the live stack's."""
    from ingest import ratelimit, shed

    shed._written_at.clear()
    try:
        client = ratelimit.client()
        client.delete(shed.KEY, *client.keys(f"{shed.KEY}:*"))
    except redis.RedisError:
        pass  # a test that stopped Redis: nothing was recorded there either


@pytest.fixture(autouse=True)
def _no_cached_runs():
    """Ingest caches runs by key for a minute; a test's database may have another project's run of that key.
    Its load average starts idle too: a slow request of an earlier test must not slow this test's agents,
    nor may an earlier test's 503 hold this test's silent ranks back.
    The partitions it knows are forgotten: a live stack's hourly prune drops old days behind its back;
    and so are the runs' compile aggregates the checks kept (a test may write compile rows directly),
    and the in-process channel layer."""
    from channels.layers import channel_layers

    from dashboard.detection import compile_marks
    from dashboard.evidence import partitions
    from ingest import backpressure, writers

    compile_marks.forget()
    writers.forget_runs()
    backpressure._load = backpressure._Load()
    forget_shed()
    partitions._known.clear()
    # Each test its own channel layer (in-process websocket consumers): channels_redis keeps a layer's
    # receive state bound to the event loop it ran in, and each test's async_to_sync runs another loop
    # (a test once failed with a receive lock "bound to a different event loop").
    channel_layers.backends.clear()


@pytest.fixture
def client():
    """Django's test client; the agents' endpoints go through the door (tests/door_client.py)."""
    from tests.door_client import DoorClient

    made = DoorClient()
    yield made
    made.close()


@pytest.fixture
def project(db) -> Project:
    return Project.objects.create(name=f"proj-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def token(project) -> str:
    return ProjectToken.issue(project)


def make_batch(
    run: str = "run-a",
    rank: int = 0,
    world_size: int = 3,
    seq: int = 0,
    session: str | None = None,
    events: list | None = None,
) -> dict:
    return {
        "v": 1,
        "run": {"key": run, "world_size": world_size},
        "rank": rank,
        "session": session or f"sess-{run}-{rank}",
        "seq": seq,
        "events": events if events is not None else [{"t": "grad", "step": 0, "fps": [1, 2, 3]}],
    }


def post_bulk(client, token: str, body: bytes):
    """A relay's request: a bulk body (`protocol.bulk_body`), gzipped, sent with the project's token."""
    return client.generic(
        "POST",
        "/api/v1/ingest/bulk",
        gzip.compress(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_CONTENT_ENCODING="gzip",
    )


@pytest.fixture
def post(client, token):
    """POST a batch (dict, or raw bytes) to the ingest endpoint as the project's agent."""

    def _post(body, *, token_=token, content_type="application/json", gzip_=False, headers=None):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token_}"} if token_ else {}
        if gzip_:
            raw = gzip.compress(raw)
            extra["HTTP_CONTENT_ENCODING"] = "gzip"
        extra.update(headers or {})
        return client.generic("POST", "/api/v1/ingest", raw, content_type=content_type, **extra)

    return _post


@pytest.fixture
def send(post):
    """Send one rank's events as its next batch of run-a (each rank's seqs in order); each must be accepted."""
    seqs: dict[int, int] = {}

    def _send(rank: int, *events: dict) -> None:
        seq = seqs[rank] = seqs.get(rank, -1) + 1
        response = post(make_batch(rank=rank, seq=seq, events=list(events)))
        assert response.status_code == 200, response.content

    return _send


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker):
    """The test database, always (pytest-django would skip it when only live_db tests run)."""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        _disconnect_others()
        teardown_databases(config, verbosity=0)


def _disconnect_others() -> None:
    """Sessions of killed stack processes can linger a moment and would block DROP DATABASE."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
