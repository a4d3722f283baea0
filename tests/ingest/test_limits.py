"""Validation knows every stored limit, and only a transient database error is a 503 (issue 17, item 3).

A value that passes validation but not its column used to be answered "503 transient" forever:
the agent resent it, and every later batch of the rank waited behind it.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from dashboard.evidence.models import GradReport, IngestSession
from ingest import admission
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def test_a_param_group_that_fits_the_protocol_but_not_the_column_after_its_prefix_is_a_400(post):
    too_long = post(make_batch(events=[{"t": "param", "step": 0, "group": "g" * 60, "fps": [1]}]))
    assert too_long.status_code == 400, too_long.content
    assert too_long.json()["path"] == "events[0].group" and "58" in too_long.json()["error"]
    assert not IngestSession.objects.exists()
    fits = post(make_batch(events=[{"t": "param", "step": 0, "group": "g" * 58, "fps": [1]}], session="sess-fits"))
    assert fits.status_code == 200 and GradReport.objects.get().group == "param:" + "g" * 58


def test_a_torch_version_longer_than_its_column_is_a_400(post):
    start = {"t": "rank_start", "versions": {"torch": "2." + "9" * 80}}
    response = post(make_batch(events=[start]))
    assert (response.status_code, response.json()["path"]) == (400, "events[0].versions.torch")


def _refused(sql: str) -> tuple[int, dict, int | None]:
    """Run a real statement through ingest's error mapping, as a batch's write would."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:  # rolled back to its savepoint, as a batch is
            cursor.execute(sql)
    except DatabaseError as exc:
        return admission.refusal(exc)
    raise AssertionError("the statement was not refused")


def test_a_value_the_database_refuses_is_a_422_not_a_503_forever():
    status, body, retry_after = _refused("CREATE TEMP TABLE narrow (v varchar(2)); INSERT INTO narrow VALUES ('abc')")
    assert status == 422 and "22001" in body["error"]
    assert retry_after is None


def test_a_timeout_is_transient_503_with_retry_after():
    status, _, retry_after = _refused("SET LOCAL statement_timeout = '10ms'; SELECT pg_sleep(1)")
    assert status == 503 and retry_after
