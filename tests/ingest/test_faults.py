"""Under load and faults: 413/429/503 answers, Redis or PostgreSQL down, several ASGI worker processes.

The outage test runs its own throwaway PostgreSQL (embedded, in a tmp dir): it never stops the
machine's servers.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import requests
from django.conf import settings as django_settings
from django.db import OperationalError, connection

from dashboard.devstack import embedded
from dashboard.evidence.models import GradReport, IngestSession
from ingest import ratelimit, retries, writers
from tests import claims
from tests.conftest import make_batch, per_rank
from tests.stack import ROOT, Stack, forget_broker_keys, free_port, spawn, uvicorn


@pytest.mark.django_db
def test_rate_limit_is_429_with_retry_after_and_stores_nothing(post, settings):
    settings.LOCKSTEP_RATE_LIMIT = 1
    answers = [post(make_batch(seq=i)) for i in range(3)]  # at least two fall in one second
    limited = [a for a in answers if a.status_code == 429]
    assert limited, [a.status_code for a in answers]
    assert limited[0]["Retry-After"] == "1" and "batches/s" in limited[0].json()["error"]
    assert claims.count() == 3 - len(limited)


@pytest.mark.django_db
def test_redis_down_is_503_with_retry_after_and_stores_nothing(post, settings, monkeypatch):
    settings.LOCKSTEP_RATE_LIMIT = 0  # the broker check does not depend on the limit being on
    redis_url = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    monkeypatch.setattr(ratelimit, "_client", None)
    started = time.monotonic()
    answers = [post(make_batch(seq=i)) for i in range(3)]
    assert [a.status_code for a in answers] == [503, 503, 503]
    assert answers[0]["Retry-After"] == str(settings.LOCKSTEP_RETRY_AFTER) and "broker" in answers[0].json()["error"]
    assert time.monotonic() - started < 5  # no retry backoff per request
    assert claims.count() == 0
    monkeypatch.undo()  # Redis is back: the resent batch is accepted once
    settings.REDIS_URL = redis_url
    assert post(make_batch(seq=0)).json()["duplicate"] is False
    assert claims.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "failure",
    [
        ValueError("I/O operation on closed file."),
        OSError(9, "Bad file descriptor"),
        AttributeError("'NoneType' object has no attribute 'readline'"),
    ],
)
def test_redis_client_torn_down_mid_request_is_503_not_500(post, settings, monkeypatch, failure):
    """What redis-py raised here when its connection timed out mid-handshake on a saturated host."""

    class Torn:
        connection_pool = redis.ConnectionPool()  # nothing connected: disconnect() is a no-op

        def pipeline(self, transaction=False):
            raise failure

    monkeypatch.setattr(ratelimit, "_client", Torn())
    response = post(make_batch())
    assert response.status_code == 503 and response["Retry-After"] == str(settings.LOCKSTEP_RETRY_AFTER)
    assert claims.count() == 0


@pytest.mark.django_db
def test_one_torn_redis_connection_is_retried_not_refused(post, monkeypatch):
    """CI saw one of four concurrent batches refused because one pooled socket died ("I/O operation
    on closed file"): a single torn connection is tried again on a fresh one, an outage is not."""
    real = redis.Redis.from_url(django_settings.REDIS_URL)
    torn = []

    class TornOnce:
        connection_pool = real.connection_pool

        def pipeline(self, transaction=False):
            if not torn:
                torn.append(1)
                raise ValueError("I/O operation on closed file.")
            return real.pipeline(transaction=transaction)

    monkeypatch.setattr(ratelimit, "_client", TornOnce())
    response = post(make_batch())
    assert response.status_code == 200, response.content
    assert torn and claims.count() == 1


@pytest.mark.django_db
def test_database_error_is_503_with_retry_after(post, settings, monkeypatch):
    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(writers, "store_group", down)
    response = post(make_batch())
    assert response.status_code == 503
    assert response["Retry-After"] == str(settings.LOCKSTEP_RETRY_AFTER)
    assert "retry" in response.json()["error"]


@pytest.fixture
def races_lost():
    """A trigger that makes PostgreSQL abort the first `n` batch claims as deadlocks, as it does to
    one of two batches that lock the same rows in opposite orders. Counted by a sequence, which a
    rollback does not undo."""

    def lose(n: int) -> None:
        with connection.cursor() as cur:
            cur.execute("CREATE SEQUENCE lost_races")
            cur.execute(f"""CREATE FUNCTION lose_race() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF nextval('lost_races') <= {n} THEN
                  RAISE EXCEPTION 'deadlock detected (provoked)' USING ERRCODE = '40P01'; END IF; RETURN NEW; END $$""")
            cur.execute(
                f"CREATE TRIGGER lose_race BEFORE INSERT ON {IngestSession._meta.db_table} "
                "FOR EACH ROW EXECUTE FUNCTION lose_race()"
            )

    yield lose
    with connection.cursor() as cur:
        cur.execute(f"DROP TRIGGER IF EXISTS lose_race ON {IngestSession._meta.db_table}")
        cur.execute("DROP FUNCTION IF EXISTS lose_race(); DROP SEQUENCE IF EXISTS lost_races")


def _claims_tried() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT last_value FROM lost_races")
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_lost_race_is_tried_again_inside_the_request(post, races_lost):
    races_lost(2)
    answer = post(
        make_batch(events=[{"t": "grad", "step": 0, "fps": [1, 2, 3]}, {"t": "step", "step": 0, "loss": 1.0}])
    )
    assert answer.status_code == 200 and answer.json()["accepted"] == 2
    assert _claims_tried() == 3 and claims.count() == 1
    assert [rank for rank, _, _ in per_rank(GradReport.objects)] == [0]  # the rolled-back attempts left nothing


@pytest.mark.django_db(transaction=True)
def test_races_lost_every_time_are_a_503_and_store_nothing(post, races_lost, settings):
    races_lost(100)
    answer = post(make_batch())
    assert answer.status_code == 503 and answer["Retry-After"] == str(settings.LOCKSTEP_RETRY_AFTER)
    assert _claims_tried() == retries.RACE_ATTEMPTS
    assert claims.count() == 0 and GradReport.objects.count() == 0


def _post(url: str, token: str, body: dict) -> requests.Response:
    return requests.post(
        url + "/api/v1/ingest",
        data=gzip.compress(json.dumps(body).encode()),
        timeout=30,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )


@pytest.fixture
def throwaway(tmp_path):
    """A PostgreSQL of this test's own, migrated, with two uvicorn worker processes in front of it.

    Its data folder is outside pytest's 0700 tmp tree: PostgreSQL runs as the `pgserver` user.
    """
    data = Path(tempfile.mkdtemp(prefix="lockstep-faults-"))
    data.chmod(0o755)
    database_url = embedded.postgres_url(data)
    env = {
        **subprocess.os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": "redis://127.0.0.1:6379/9",
        "LOCKSTEP_DB_POOL": "2",
        "LOCKSTEP_RETRY_AFTER": "2",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "LOCKSTEP_RATE_LIMIT": "0",
        "PYTHONUNBUFFERED": "1",
        "LOCKSTEP_METRICS_PUBLIC": "1",
    }
    manage = [sys.executable, "manage.py"]
    subprocess.run(manage + ["migrate", "-v", "0"], cwd=ROOT, env=env, check=True, capture_output=True)
    token = (
        subprocess.run(
            manage + ["createtoken", "faults"], cwd=ROOT, env=env, check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = free_port()
    server = spawn(
        "uvicorn-2w",
        uvicorn(port, "--workers", "2"),
        env,
        tmp_path,
    )
    stack = Stack(f"http://127.0.0.1:{port}", env, server, server)
    try:
        stack.wait_http(60)
        yield stack, token, data
    finally:
        server.stop()
        embedded.stop(data)
        shutil.rmtree(data, ignore_errors=True)
        forget_broker_keys(env["REDIS_URL"])


def test_two_workers_then_database_outage_then_recovery(throwaway, record_property):
    stack, token, data = throwaway
    run = f"faults-{uuid.uuid4().hex[:6]}"
    batches = [
        make_batch(run=run, rank=r, world_size=4, seq=s, session=f"s-{run}-{r}") for r in range(4) for s in range(5)
    ]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: _post(stack.url, token, b), batches))
    assert [a.status_code for a in answers] == [200] * 20, (
        [a.text for a in answers if a.status_code != 200],
        stack.server.tail(),
    )
    metrics = requests.get(stack.url + "/metrics", timeout=30).text
    assert 'lockstep_ingest_requests_total{endpoint="ingest",outcome="accepted",status="200"} 20.0' in metrics

    embedded.stop(data)  # PostgreSQL goes away mid-run
    retry = make_batch(run=run, rank=0, world_size=4, seq=5, session=f"s-{run}-0")
    down = _post(stack.url, token, retry)
    assert down.status_code == 503, down.text
    assert down.headers["Retry-After"] == "2" and down.json()["error"]

    embedded.postgres_url(data)  # back; the agent resends what was not accepted
    deadline = time.monotonic() + 30
    while (again := _post(stack.url, token, retry)).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert again.status_code == 200 and again.json()["duplicate"] is False
    resent = _post(stack.url, token, retry)  # perhaps to the other process, whose connection also died
    assert resent.status_code == 200 and resent.json()["duplicate"] is True, (resent.text, stack.server.tail())
    count = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            f"from tests import claims; print(claims.count(run__key='{run}'))",
        ],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    assert count == "21"  # every accepted batch, once
    record_property("accepted_batches", 21)
    record_property("accepted_batches_stored", int(count))
