"""Shared fixtures: projects and tokens, and the real stack (uvicorn + Celery worker) as processes."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import uuid

import pytest

from dashboard.tenancy.models import Project, ProjectToken

pytest_plugins = ["tests.stack"]

_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="lockstep-tests-inductor-")


def pytest_configure(config) -> None:
    """The suite's compiles (in-process and in every job it starts) share an Inductor cache of its own:
    never one that other processes on the machine write at the same moment (a half-written artifact
    of theirs crashed a job here once), and cold on every run, as on a fresh CI machine."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR_CACHE)


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)


def per_rank(reports) -> list[tuple[int, int, list[int]]]:
    """(rank, step, fps) of every rank's report among GradReport rows (a row lists the ranks that sent it alike), sorted."""
    return sorted((rank, step, fps) for ranks, step, fps in reports.values_list("ranks", "step", "fps") for rank in ranks)


@pytest.fixture(autouse=True)
def _no_cached_runs():
    """Ingest caches runs by key for a minute; a test's database may have another project's run of that key."""
    from ingest import writers

    writers.forget_runs()


@pytest.fixture
def project(db) -> Project:
    return Project.objects.create(name=f"proj-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def token(project) -> str:
    return ProjectToken.issue(project)


def make_batch(run: str = "run-a", rank: int = 0, world_size: int = 3, seq: int = 0, session: str | None = None,
               events: list | None = None) -> dict:
    return {
        "v": 1,
        "run": {"key": run, "world_size": world_size},
        "rank": rank,
        "session": session or f"sess-{run}-{rank}",
        "seq": seq,
        "events": events if events is not None else [{"t": "grad", "step": 0, "fps": [1, 2, 3]}],
    }


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
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
