"""The real stack as processes: uvicorn serving `dashboard.asgi:application` and a Celery worker
(with beat for the settle sweep), both on the test database and a dedicated Redis database.

Every process is started in its own process group and killed (group included) at teardown.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import requests

from dashboard.devstack.processes import stop_groups

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
    popen = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
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
    """Names for rows that outlive a test (live_db never truncates)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def live_db(django_db_setup, django_db_blocker):
    """Committed database access for tests that share data with the stack's processes.

    Unlike pytest-django's transactional_db there is no TRUNCATE at teardown: that TRUNCATE
    deadlocks with the Celery sweep, which keeps running. Tests use unique names instead.
    """
    with django_db_blocker.unblock():
        yield


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
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="session")
def stack(stack_env, tmp_path_factory) -> Stack:
    logdir = tmp_path_factory.mktemp("stack-logs")
    port = free_port()
    server = spawn("uvicorn", [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning"], stack_env, logdir)
    worker = spawn("celery", [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", "1",
                              "--loglevel", "info", "--schedule", str(logdir / "beat-schedule")], stack_env, logdir)
    running = Stack(f"http://127.0.0.1:{port}", stack_env, server, worker)
    try:
        running.wait_http()
        running.wait_worker()
        yield running
    finally:
        worker.stop()
        server.stop()
