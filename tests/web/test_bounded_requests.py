"""Unbounded work in requests, bounded (issue 17, item 5): a statement timeout for pages and the
read API, a runs list that counts only the runs it can show, step curves and diffs of bounded
size, and retention that never queues ingest behind its partition drop for long."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.utils import timezone

from dashboard.evidence import partitions, retention
from dashboard.evidence.models import IngestSession
from dashboard.tenancy.models import ProjectToken, Run
from dashboard.web.pages import frames
from tests.conftest import make_batch


def _holding(sql: str):
    """Another session that runs `sql` in an open transaction (holding its locks) until released."""
    other = connections.create_connection("default")
    other.ensure_connection()
    other.set_autocommit(False)
    with other.cursor() as cur:
        cur.execute(sql)
    return other


@pytest.mark.django_db(transaction=True)
def test_a_page_or_api_query_stuck_past_the_statement_timeout_is_a_503(project, settings):
    settings.LOCKSTEP_PAGE_STATEMENT_TIMEOUT = 0.5
    Run.objects.create(project=project, key="slow", world_size=1)
    token = ProjectToken.issue(project)
    user = User.objects.create_user("sam")
    project.members.add(user)
    browser = Client()
    browser.force_login(user)
    blocker = _holding(f"LOCK TABLE {Run._meta.db_table} IN ACCESS EXCLUSIVE MODE")
    try:
        started = time.monotonic()
        api = Client().get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}")
        page = browser.get("/")
        assert time.monotonic() - started < 5
    finally:
        blocker.rollback()
        blocker.close()
    assert api.status_code == 503 and api["Retry-After"] and "longer than 0.5 s" in api.json()["error"]
    assert page.status_code == 503
    assert Client().get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_partition_drop_waits_on_a_long_query_only_briefly_and_goes_later(post):
    assert post(make_batch()).status_code == 200
    old_day = timezone.now().date() - timedelta(days=30)
    partitions.ensure([old_day])
    old = f"evidence_stepreport_p{old_day:%Y%m%d}"
    reader = _holding(f'SELECT count(*) FROM "{old}"')  # a long page query on the old day
    try:
        started = time.monotonic()
        pruned = retention.prune(days=14)
        waited = time.monotonic() - started
    finally:
        reader.rollback()
        reader.close()
    assert old not in pruned.partitions and waited < 10
    assert old in retention.prune(days=14).partitions


@pytest.mark.django_db
def test_expired_batch_records_are_deleted_in_chunks(post, monkeypatch):
    for seq in range(5):
        assert post(make_batch(seq=seq)).status_code == 200
    IngestSession.objects.update(last_at=timezone.now() - timedelta(days=30))
    monkeypatch.setattr(retention, "CHUNK", 2)
    assert retention.prune(days=14).sessions == 1 and not IngestSession.objects.exists()


def test_texts_too_long_to_diff_in_a_request_are_not_diffed():
    big = "x = 1\n" * (frames.DIFF_MAX_CHARS // 6 + 1)
    started = time.monotonic()
    [note] = frames.unified_diff(big, big + "y = 2\n", "a", "b")
    assert note.kind == "note" and "too large" in note.text and time.monotonic() - started < 1
    assert [line.kind for line in frames.unified_diff("a\n", "b\n", "a", "b")][-2:] == ["del", "add"]


@pytest.mark.django_db
def test_the_runs_list_counts_only_its_window_of_newest_runs(project, monkeypatch):
    from dashboard.tenancy.auth import Principal
    from dashboard.web import services

    for i in range(4):
        Run.objects.create(project=project, key=f"w{i}", world_size=1)
    monkeypatch.setattr(services, "RUNS_WINDOW", 2)
    listed = services.runs_list(Principal(frozenset({project.id})))
    assert [r.key for r in listed] == ["w3", "w2"] and all(r.critical == 0 for r in listed)
