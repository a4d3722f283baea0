"""The real stack as processes: uvicorn serving `dashboard.asgi:application` and a Celery worker
(with beat for the settle sweep), both on the test database and a dedicated Redis database.

Every process is started in its own process group and killed (group included) at teardown.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import requests

from dashboard.devstack.processes import server_command, stop_groups, worker_command

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(db_settings: dict) -> str:
    host = db_settings["HOST"] or "127.0.0.1"
    port = db_settings["PORT"] or "5432"
    auth = db_settings["USER"] + (f":{db_settings['PASSWORD']}" if db_settings["PASSWORD"] else "")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{db_settings['NAME']}?host={host}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{db_settings['NAME']}"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self) -> None:
        stop_groups([self.popen], grace=10)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


def spawn(name: str, args: list[str], env: dict, logdir: Path) -> Proc:
    log = logdir / f"{name}.log"
    popen = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    return Proc(name, popen, log)


@dataclass
class Stack:
    url: str
    env: dict
    server: Proc
    worker: Proc

    def wait_http(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.popen.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.server.tail()}")
            try:
                requests.get(self.url + "/login/", timeout=5)
                return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"server did not come up:\n{self.server.tail()}")

    def wait_worker(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker.popen.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.worker.tail()}")
            if "ready." in self.worker.log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker did not come up:\n{self.worker.tail()}")


def unique(prefix: str) -> str:
    """Names for rows that outlive a test (committed; the next file of the process starts empty)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def live_db(django_db_setup, django_db_blocker):
    """Committed database access for tests that share data with the stack's processes.

    Unlike pytest-django's transactional_db there is no TRUNCATE after each test (the stack's
    Celery sweep keeps running and would deadlock with it): tests use unique names, and the next
    file starts empty (tests/conftest.py, `_clean_start`, with a lock timeout and retries).
    """
    with django_db_blocker.unblock():
        yield


def forget_broker_keys(redis_url: str) -> None:
    """Delete the bindings kombu declares in a Redis database (`_kombu.binding.*`, for every queue a
    server published to or a worker read): the suite leaves nothing of its own behind."""
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter("_kombu.*"))
    if keys:
        client.delete(*keys)


@pytest.fixture(scope="session")
def stack_env(django_db_setup, django_db_blocker) -> dict:
    """Environment for child processes: the test database and a flushed Redis database."""
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(settings.DATABASES["default"]),
        REDIS_URL=settings.REDIS_URL,
        LOCKSTEP_SETTLE_TIMEOUT=str(settings.LOCKSTEP_SETTLE_TIMEOUT),
        LOCKSTEP_SILENT_AFTER="8",
        LOCKSTEP_SINKS_ALLOW_PRIVATE="1",  # the delivery tests' receivers listen on 127.0.0.1
        # The backpressure drill stalls PostgreSQL with a table lock for longer than the 2 s default
        # lock bound, to see requests queue behind a slow group (the bound's own drill runs its own
        # server with 1 s: tests/security/test_edge.py).
        LOCKSTEP_DB_LOCK_TIMEOUT="20",
        # Each pytest-xdist worker runs a test process and a stack on one PostgreSQL that other databases
        # share (max_connections 100): the servers here pool 4 connections and close idle ones within seconds.
        LOCKSTEP_DB_POOL="4",
        LOCKSTEP_DB_POOL_IDLE="5",
        PYTHONUNBUFFERED="1",
    )
    return env


def uvicorn(port: int, *options: str) -> list[str]:
    """The ASGI server's command line, as the tests start it (`options`: more of uvicorn's, e.g. --workers)."""
    return server_command("127.0.0.1", port, *options)


def celery_worker(schedule: Path) -> list[str]:
    """A Celery worker with beat (the settle sweep), one task at a time, its beat state at `schedule`."""
    return worker_command("--schedule", str(schedule), loglevel="info")


@contextlib.contextmanager
def started_stack(env: dict, logdir: Path, name: str = "") -> Iterator[Stack]:
    """uvicorn and a Celery worker with `env`, up and answering; both stopped on the way out."""
    port = free_port()
    suffix = f"-{name}" if name else ""
    server = spawn(f"uvicorn{suffix}", uvicorn(port), env, logdir)
    worker = spawn(f"celery{suffix}", celery_worker(logdir / "beat-schedule"), env, logdir)
    running = Stack(f"http://127.0.0.1:{port}", env, server, worker)
    try:
        running.wait_http()
        running.wait_worker()
        yield running
    finally:
        worker.stop()
        server.stop()


class SharedStack:
    """The stack the files of one pytest process share: started by the first file that asks for it,
    stopped once the next test of the process does not use it (`tests/conftest.py`), so no Celery
    sweep runs against the database while an in-process file flushes or migrates it; started again
    by the next file that asks."""

    def __init__(self, env: dict, logs: Path) -> None:
        self.env, self.logs = env, logs
        self.running: Stack | None = None
        self.exits = contextlib.ExitStack()
        self.starts = 0

    def get(self) -> Stack:
        if self.running is None or self.running.server.popen.poll() is not None:
            self.stop()
            self.running = self.exits.enter_context(started_stack(self.env, self.logs, str(self.starts or "")))
            self.starts += 1
        return self.running

    def stop(self) -> None:
        self.running = None
        self.exits.close()


_shared: list[SharedStack] = []


def stop_shared_stack() -> None:
    for shared in _shared:
        shared.stop()


@pytest.fixture(scope="session")
def shared_stack(stack_env, tmp_path_factory) -> Iterator[SharedStack]:
    _shared.append(SharedStack(stack_env, tmp_path_factory.mktemp("stack-logs")))
    yield _shared[-1]
    stop_shared_stack()
    _shared.clear()


@pytest.fixture(scope="module")
def stack(shared_stack) -> Stack:
    return shared_stack.get()
