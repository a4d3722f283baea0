"""0003 and 0004 of delivery, forward and back on data: existing webhooks become Slack-compatible
destinations with no secret, sent notifications get an empty receipt; then notifications of alerts
are dropped (only incidents page) while the destinations stay; back, the destinations are kept."""

from __future__ import annotations

import pytest

from tests.project.test_migrations import _insert_run, _latest, _migrate, _query

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("delivery", "0002_notification_retries")
SINKS = ("delivery", "0003_sinks")
INCIDENT_PAGES = ("delivery", "0004_incident_pages")


def test_existing_webhooks_become_slack_destinations_and_back():
    _migrate(BEFORE)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('s', now())")
        _insert_run("s", "s-run")
        _query(
            "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
            " first_seen, last_seen, revision, notified_revision, resolve_reason) SELECT id, 'grad_divergence',"
            " 'group:ddp', 'critical', 'firing', '{1}', 'm', '{}', 1, now(), now(), 1, 1, '' FROM ingest_run"
        )
        _query(
            "INSERT INTO dashboard_webhook (project_id, url, active, created_at) SELECT id, 'http://h/x', true, now()"
            " FROM ingest_project"
        )
        _query(
            "INSERT INTO dashboard_notification (alert_id, webhook_id, revision, state, attempts, last_error,"
            " next_attempt_at) SELECT a.id, w.id, 1, 'sent', 1, '', now() FROM dashboard_alert a, dashboard_webhook w"
        )

        _migrate(SINKS)
        assert _query("SELECT kind, url, secret FROM dashboard_webhook") == [("slack", "http://h/x", "")]
        assert _query("SELECT state, receipt::text FROM dashboard_notification") == [("sent", "{}")]

        _migrate(INCIDENT_PAGES)
        assert _query("SELECT kind, url FROM dashboard_webhook") == [("slack", "http://h/x")]
        assert _query("SELECT count(*) FROM dashboard_notification") == [(0,)]

        _migrate(BEFORE)
        assert _query("SELECT url, active FROM dashboard_webhook") == [("http://h/x", True)]
    finally:
        _latest()
