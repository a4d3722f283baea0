"""Issue 39, item 1: every process holds at most a configured number of PostgreSQL connections.

A real uvicorn and Celery worker (with beat) on this test's database, started with the default pool
(no LOCKSTEP_DB_POOL in their environment), take a burst of 100 parallel authenticated API GETs and 40
of the login page, while a sampler counts this database's sessions in `pg_stat_activity` per process
(every session is labelled `lockstep:<role>:<pid>`, dashboard/apps.py); other engineers' test databases
on the same server are never counted. Then a server with a pool of 2 and a 1 s pool wait, whose two
connections are held by requests stuck on a table lock: every other request waits about that long and
gets a 503 with Retry-After and a JSON error, never a 500; a quiet server gives its connections back.
And no setting turns the pool off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
import requests

from dashboard.devstack.processes import descendants
from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import ROOT, Stack, database_url, free_port, spawn, started_stack, unique, uvicorn

pytestmark = [pytest.mark.e2e]

DEFAULT_POOL = 8  # LOCKSTEP_DB_POOL when unset (dashboard/settings.py, docs/operating.md)
WORKER_CONCURRENCY = 1  # the tests' worker (dashboard/devstack/processes.py: worker_command)
POOL_ENV = ("LOCKSTEP_DB_POOL", "LOCKSTEP_DB_POOL_TIMEOUT", "LOCKSTEP_DB_POOL_IDLE")


def _sessions(observer: psycopg.Connection, datname: str) -> Counter:
    """This database's client sessions now, by application name (the observer's own left out)."""
    return Counter(label for label, _ in _backends(observer, datname))


def _backends(observer: psycopg.Connection, datname: str) -> set[tuple[str, int]]:
    """(application name, backend pid) of this database's client sessions now, the observer's own left out."""
    rows = observer.execute(
        "SELECT application_name, pid FROM pg_stat_activity"
        " WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        [datname],
    ).fetchall()
    return {(label, pid) for label, pid in rows}


class Sampler:
    """Counts this database's sessions every 20 ms on a thread: the most each process held at once,
    and the most the processes `of` held together at once, unlabelled sessions counted with them (a
    pool's connection is labelled when it is first handed out). Sessions labelled by any other process
    (another test process of the run, say) are no part of the total. A session is held once two samples
    in a row saw its backend: a closed connection's backend exits after its client has let it go, and a
    Celery child that closes its pool after one task and connects for the next was once seen beside the
    backend it had just closed."""

    def __init__(self, url: str, datname: str, of: set[int] = frozenset()) -> None:
        self.url, self.datname = url, datname
        self.peak: Counter = Counter()  # label -> most sessions at once
        self.peak_total = 0
        self.samples = 0
        self._of = {str(pid) for pid in of}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seen: set[tuple[str, int]] = set()
        with psycopg.connect(self.url, autocommit=True) as observer:
            while not self._stop.is_set():
                backends = _backends(observer, self.datname)
                now = Counter(label for label, _ in backends & seen)
                seen = backends
                self.peak |= now
                ours = sum(n for label, n in now.items() if not label or label.rpartition(":")[2] in self._of)
                self.peak_total = max(self.peak_total, ours)
                self.samples += 1
                self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def _held_by(peak: Counter, pids: set[int]) -> int:
    """The most sessions the processes `pids` held (the sum of each one's most)."""
    return sum(n for label, n in peak.items() if label.rpartition(":")[2] in {str(pid) for pid in pids})


def _burst(stack_url: str, token: str, key: str) -> list[requests.Response]:
    """100 parallel authenticated API GETs and 40 of the login page, all at once."""
    bearer = {"Authorization": f"Bearer {token}"}
    paths = [("/api/v1/runs", bearer), (f"/api/v1/runs/{key}", bearer)] * 50 + [("/login/", {})] * 40
    start = threading.Barrier(len(paths))

    def get(path: str, headers: dict) -> requests.Response:
        start.wait(30)
        return requests.get(stack_url + path, headers=headers, timeout=30)

    with ThreadPoolExecutor(len(paths)) as pool:
        return list(pool.map(lambda p: get(*p), paths))


def _no_500(answers: list[requests.Response]) -> None:
    """Every answer a 200, or a 503 with Retry-After (JSON on the API)."""
    statuses = Counter(a.status_code for a in answers)
    assert set(statuses) <= {200, 503}, statuses
    for answer in answers:
        if answer.status_code == 503:
            assert answer.headers.get("Retry-After"), answer.text
            if "/api/" in answer.url:
                assert answer.json()["error"], answer.text


@pytest.fixture(scope="module")
def servers(stack_env, tmp_path_factory):
    """(the default stack, a lone uvicorn with a pool of 2 that waits 1 s for a connection), booted together."""
    logs = tmp_path_factory.mktemp("db-connections")
    env = {k: v for k, v in stack_env.items() if k not in POOL_ENV}
    small_env = {
        **env,
        "LOCKSTEP_DB_POOL": "2",
        "LOCKSTEP_DB_POOL_TIMEOUT": "1",
        "LOCKSTEP_DB_POOL_IDLE": "0.5",
        "LOCKSTEP_DB_LOCK_TIMEOUT": "10",
    }
    port = free_port()
    server = spawn("uvicorn-pool-2", uvicorn(port), small_env, logs)
    small = Stack(f"http://127.0.0.1:{port}", small_env, server, server)
    try:
        with started_stack(env, logs, "pool") as default:
            small.wait_http()
            yield default, small
    finally:
        server.stop()


@pytest.fixture(scope="module")
def default_stack(servers) -> Stack:
    return servers[0]


@pytest.fixture(scope="module")
def small_server(servers) -> Stack:
    return servers[1]


def _project_run(stack: Stack) -> tuple[str, str]:
    project, token = project_with_token("pool")
    key = unique("pool-run")
    answer = requests.post(
        f"{stack.url}/api/v1/ingest",
        json=make_batch(run=key, world_size=2),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return token, key


def test_a_burst_holds_no_more_connections_than_the_default_pool(default_stack, live_db, settings):
    token, key = _project_run(default_stack)
    db = settings.DATABASES["default"]
    server = default_stack.server.popen.pid
    worker = {default_stack.worker.popen.pid, *descendants(default_stack.worker.popen.pid)}
    with Sampler(database_url(db), db["NAME"], of={server, *worker}) as sampler:
        answers = _burst(default_stack.url, token, key)
        time.sleep(0.5)  # and just after it
    _no_500(answers)
    assert Counter(a.status_code for a in answers)[200] >= 100  # the pool queues a burst; it refuses little
    assert sampler.samples >= 5
    held = dict(sampler.peak)
    assert _held_by(sampler.peak, {server}) <= DEFAULT_POOL, held
    assert _held_by(sampler.peak, worker) <= WORKER_CONCURRENCY, held  # one per prefork child; beat none
    assert sampler.peak_total <= DEFAULT_POOL + WORKER_CONCURRENCY, held  # unlabelled ones included
    with psycopg.connect(database_url(db), autocommit=True) as observer:
        after = _sessions(observer, db["NAME"])
    assert sum(n for label, n in after.items() if label.endswith(f":{server}")) <= DEFAULT_POOL, after


@contextmanager
def _table_locked(url: str, table: str):
    """Another session holding an ACCESS EXCLUSIVE lock on `table` until the block ends."""
    with psycopg.connect(url) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            holder.rollback()


def test_past_the_pool_requests_wait_briefly_then_get_503_and_idle_connections_close(
    default_stack, small_server, live_db, settings
):
    """A pool of 2, both connections held by requests stuck on a locked table (for less than their
    lock timeout): the other requests wait the pool's 1 s, then get 503 + Retry-After, never a 500.
    Quiet again, the server closes its idle connections (LOCKSTEP_DB_POOL_IDLE)."""
    from dashboard.tenancy.models import Run

    token, key = _project_run(default_stack)
    db = settings.DATABASES["default"]
    pid = small_server.server.popen.pid
    bearer = {"Authorization": f"Bearer {token}"}
    gets = [(path, bearer) for path in ["/api/v1/runs", f"/api/v1/runs/{key}"] * 10] + [("/login/", {})] * 4
    with Sampler(database_url(db), db["NAME"]) as sampler, ThreadPoolExecutor(len(gets)) as pool:
        with _table_locked(database_url(db), Run._meta.db_table):
            futures = [pool.submit(requests.get, small_server.url + p, headers=h, timeout=30) for p, h in gets]
            time.sleep(3)  # well past the pool's wait, short of the lock timeout
        answers = [f.result(timeout=30) for f in futures]
    _no_500(answers)
    statuses = Counter(a.status_code for a in answers)
    refused = [a for a in answers if a.status_code == 503]
    assert len(refused) >= len(answers) - 2, statuses  # two held the pool's connections until the lock went
    assert {a.url.removeprefix(small_server.url) for a in refused} >= {"/api/v1/runs", "/login/"}, statuses
    assert all(0.9 < a.elapsed.total_seconds() < 3 for a in refused), [a.elapsed for a in refused]
    assert _held_by(sampler.peak, {pid}) == 2, dict(sampler.peak)
    # quiet: the pool closes an idle connection every LOCKSTEP_DB_POOL_IDLE
    deadline = time.monotonic() + 10
    with psycopg.connect(database_url(db), autocommit=True) as observer:
        while any(label.endswith(f":{pid}") for label in _sessions(observer, db["NAME"])):
            assert time.monotonic() < deadline, _sessions(observer, db["NAME"])
            time.sleep(0.1)


@pytest.mark.parametrize(("value", "size"), [(None, DEFAULT_POOL), ("0", DEFAULT_POOL), ("3", 3), ("-1", None)])
def test_every_process_gets_a_bounded_pool_and_0_means_the_default(value, size):
    """No setting turns the pool off: unset and 0 are the default size; a negative one refuses to start."""
    env = {k: v for k, v in os.environ.items() if k not in POOL_ENV}
    if value is not None:
        env["LOCKSTEP_DB_POOL"] = value
    probe = "from django.conf import settings as s; d = s.DATABASES['default']; print(d['OPTIONS']['pool']['max_size'], d['CONN_MAX_AGE'])"
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    if size is None:
        assert done.returncode != 0 and "LOCKSTEP_DB_POOL" in done.stderr, done.stderr
    else:
        assert done.stdout.split() == [str(size), "0"], done.stderr
