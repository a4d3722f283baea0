"""PostgreSQL sessions carry their process's name, set once per session (pooled checkouts reconnect often)."""

from __future__ import annotations

import os

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.apps import _label_connection

pytestmark = pytest.mark.django_db


def test_labelled_once_per_session():
    connection.ensure_connection()
    connection.connection.lockstep_label = None  # as a fresh session
    with CaptureQueriesContext(connection) as first:
        _label_connection(None, connection)
    with CaptureQueriesContext(connection) as again:
        _label_connection(None, connection)
    assert len(first) == 1 and len(again) == 0
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('application_name')")
        assert cur.fetchone()[0].endswith(f":{os.getpid()}")
