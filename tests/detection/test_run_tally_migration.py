"""0002 of detection, both ways: the run tallies table comes and goes, alerts stay."""

from __future__ import annotations

import pytest

from tests.project.test_migrations import _insert_run, _latest, _migrate, _query

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_tallies_come_and_go_and_alerts_stay():
    _migrate(("detection", "0001_initial"))
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('t', now())")
        _insert_run("t", "t-run")
        _query(
            "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
            " first_seen, last_seen, revision, notified_revision) SELECT id, 'recompile_storm', 'run',"
            " 'warning', 'firing', '{}', 'm', '{}', 1, now(), now(), 1, 1 FROM ingest_run"
        )
        _migrate(("detection", "0002_run_tally"))
        _query(
            "INSERT INTO detection_runtally (run_id, recompiles, graph_breaks, compile_seconds, updated_at)"
            " SELECT id, 3, 4, 1.5, now() FROM ingest_run"
        )
        assert _query("SELECT recompiles, graph_breaks, compile_seconds FROM detection_runtally") == [(3, 4, 1.5)]
        _migrate(("detection", "0001_initial"))
        assert _query("SELECT to_regclass('detection_runtally')") == [(None,)]
        assert _query("SELECT kind FROM dashboard_alert") == [("recompile_storm",)]
    finally:
        _latest()
