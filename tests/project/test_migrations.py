"""Schema changes that move existing rows: run them forward and back on data."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE_RANKS = ("ingest", "0003_grad_watermark")
RANKS = ("ingest", "0004_grad_report_ranks")


def _migrate(*targets: tuple[str, str | None]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(list(targets))


def _latest() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def _query(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_grad_rows_keep_their_ranks_both_ways_across_0004():
    _migrate(BEFORE_RANKS)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('m', now())")
        _query(
            "INSERT INTO ingest_run (key, name, world_size, meta, torch_version, started_at, last_seen, project_id)"
            " SELECT 'm', 'm', 3, '{}', '', now(), now(), id FROM ingest_project"
        )
        insert = (
            'INSERT INTO ingest_gradreport (run_id, {col}, step, "group", fps, norm, nonfinite, ts)'
            " SELECT id, %s, %s, 'ddp', %s, NULL, 0, now() FROM ingest_run"
        )
        _query(insert.format(col="rank"), [1, 5, [7, 8]])

        _migrate(RANKS)
        assert _query("SELECT ranks, step, fps FROM ingest_gradreport") == [([1], 5, [7, 8])]
        _query(insert.format(col="ranks"), [[0, 2], 6, [9]])

        _migrate(BEFORE_RANKS)  # a shared row becomes one row per rank
        assert sorted(_query("SELECT rank, step, fps FROM ingest_gradreport")) == [
            (0, 6, [9]),
            (1, 5, [7, 8]),
            (2, 6, [9]),
        ]
        _migrate(RANKS)
    finally:
        _latest()
    assert sorted(_query("SELECT ranks, step FROM evidence_gradreport")) == [([0], 6), ([1], 5), ([2], 6)]


BEFORE_SPLIT = [
    ("ingest", "0004_grad_report_ranks"),
    ("dashboard", "0004_settled_slot_index"),
    ("tenancy", None),
    ("ledger", None),
    ("detection", None),
    ("delivery", None),
]
MOVED = {
    "project": ("ingest", "tenancy"),
    "run": ("ingest", "tenancy"),
    "gradwatermark": ("ingest", "ledger"),
    "alert": ("dashboard", "detection"),
    "detailrequest": ("dashboard", "ledger"),
    "webhook": ("dashboard", "delivery"),
}


def _detail_alert_fk(detail: str = "dashboard_detailrequest", alert: str = "dashboard_alert") -> int:
    """Foreign keys from detail requests to alerts (the tables' names as of the state migrated to)."""
    return _query(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND confrelid = %s::regclass AND contype = 'f'",
        [detail, alert],
    )[0][0]


def _labels() -> dict[str, str]:
    rows = _query("SELECT model, app_label FROM django_content_type WHERE model = ANY(%s)", [list(MOVED)])
    return dict(rows)


def test_the_split_into_apps_keeps_every_row_both_ways():
    """0005 of `dashboard` and `ingest` hand their models to tenancy, ledger, detection and delivery
    without touching a row; the one schema change (a detail request's alert id loses its foreign
    key) and the content types go back too."""
    from dashboard.detection.models import Alert
    from dashboard.ledger.models import DetailRequest, GradWatermark
    from dashboard.tenancy.models import Project

    _migrate(*BEFORE_SPLIT)
    try:
        _query(
            "INSERT INTO django_content_type (app_label, model) VALUES "
            + ", ".join(f"('{old}', '{model}')" for model, (old, _) in MOVED.items())
            + " ON CONFLICT DO NOTHING"
        )
        _query(
            "DELETE FROM auth_permission WHERE content_type_id IN (SELECT id FROM django_content_type WHERE app_label IN"
            " ('tenancy', 'ledger', 'detection', 'delivery'))"
        )  # models born after the split (FlightRecorderRequest)
        _query("DELETE FROM django_content_type WHERE app_label IN ('tenancy', 'ledger', 'detection', 'delivery')")
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('split', now())")
        _query(
            "INSERT INTO ingest_run (key, name, world_size, meta, torch_version, started_at, last_seen, project_id)"
            " SELECT 'split-run', 'split', 2, '{}', '2.13', now(), now(), id FROM ingest_project"
        )
        _query(
            "INSERT INTO ingest_gradwatermark (run_id, \"group\", rank, step) SELECT id, 'ddp', 1, 41 FROM ingest_run"
        )
        _query(
            "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
            " first_seen, last_seen, revision, notified_revision) SELECT id, 'grad_divergence', 'group:ddp', 'critical',"
            " 'firing', '{1}', 'm', '{}', 1, now(), now(), 1, 0 FROM ingest_run"
        )
        _query(
            'INSERT INTO dashboard_detailrequest (run_id, rank, step, "group", alert_id)'
            " SELECT run_id, 1, 41, 'ddp', id FROM dashboard_alert"
        )
        assert _detail_alert_fk() == 1

        _latest()
        assert _detail_alert_fk("ledger_detailrequest", "detection_alert") == 0
        assert _labels() == {model: new for model, (_, new) in MOVED.items()}
        run = Project.objects.get(name="split").runs.get()
        alert = Alert.objects.get(run=run)
        assert (alert.kind, alert.ranks) == ("grad_divergence", [1])
        assert DetailRequest.objects.get(run=run).alert_id == alert.id
        assert GradWatermark.objects.get(run=run).step == 41

        _migrate(*BEFORE_SPLIT)
        assert _detail_alert_fk() == 1
        assert _labels() == {model: old for model, (old, _) in MOVED.items()}
        assert _query(
            "SELECT r.key, a.kind, d.step FROM ingest_run r JOIN dashboard_alert a ON a.run_id = r.id"
            " JOIN dashboard_detailrequest d ON d.alert_id = a.id"
        ) == [("split-run", "grad_divergence", 41)]
    finally:
        _latest()


GLOBAL_KEYS = ("tenancy", "0001_initial")
KEYS_PER_PROJECT = ("tenancy", "0002_run_key_per_project")


def _insert_run(project: str, key: str) -> None:
    _query(
        "INSERT INTO ingest_run (key, name, world_size, meta, torch_version, started_at, last_seen, project_id)"
        " SELECT %s, %s, 2, '{}', '', now(), now(), id FROM ingest_project WHERE name = %s",
        [key, key, project],
    )


def test_run_keys_become_unique_per_project_and_back():
    """0002 of tenancy keeps every run; afterwards two projects may share a key, one project may not;
    going back restores the global constraint over the runs that satisfy it."""
    from django.db import IntegrityError, transaction

    _migrate(GLOBAL_KEYS)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('ka', now()), ('kb', now())")
        _insert_run("ka", "job-77")
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert_run("kb", "job-77")

        _migrate(KEYS_PER_PROJECT)
        assert _query(
            "SELECT r.key FROM ingest_run r JOIN ingest_project p ON p.id = r.project_id WHERE p.name = 'ka'"
        ) == [("job-77",)]
        _insert_run("kb", "job-77")
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert_run("kb", "job-77")
        _query("DELETE FROM ingest_run r USING ingest_project p WHERE p.id = r.project_id AND p.name = 'kb'")

        _migrate(GLOBAL_KEYS)
        assert _query("SELECT key FROM ingest_run") == [("job-77",)]
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert_run("kb", "job-77")
    finally:
        _latest()
    assert _query("SELECT key FROM tenancy_run") == [("job-77",)]


BEFORE_RETRIES = ("delivery", "0001_initial")
RETRIES = ("delivery", "0002_notification_retries")


def test_notifications_stuck_pending_become_due_at_once_and_back():
    """0002 of delivery: a row Celery gave up on (pending, 10 attempts) is due for the sweep; back, it keeps its row."""
    _migrate(BEFORE_RETRIES)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('n', now())")
        _insert_run("n", "n-run")
        _query(
            "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
            " first_seen, last_seen, revision, notified_revision, resolve_reason) SELECT id, 'grad_divergence',"
            " 'group:ddp', 'critical', 'firing', '{1}', 'm', '{}', 1, now(), now(), 1, 1, '' FROM ingest_run"
        )
        _query(
            "INSERT INTO dashboard_webhook (project_id, url, active, created_at) SELECT id, 'http://h', true, now()"
            " FROM ingest_project"
        )
        _query(
            "INSERT INTO dashboard_notification (alert_id, webhook_id, revision, state, attempts, last_error)"
            " SELECT a.id, w.id, 1, 'pending', 10, 'HTTP 503' FROM dashboard_alert a, dashboard_webhook w"
        )

        _migrate(RETRIES)
        [(state, attempts, due)] = _query(
            "SELECT state, attempts, next_attempt_at <= now() FROM dashboard_notification"
        )
        assert (state, attempts, due) == ("pending", 10, True)

        _migrate(BEFORE_RETRIES)
        assert _query("SELECT state, attempts, last_error FROM dashboard_notification") == [("pending", 10, "HTTP 503")]
    finally:
        _latest()


def test_detail_requests_gain_their_ask_count_and_back():
    """0003 of ledger: a request asked and never answered (its reply lost) starts at 0 asks, so it is asked again."""
    _migrate(("ledger", "0002_flightrecorderrequest"))
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('d', now())")
        _insert_run("d", "d-run")
        _query(
            'INSERT INTO dashboard_detailrequest (run_id, rank, step, "group", alert_id, asked_at)'
            " SELECT id, 1, 7, 'ddp', 1, now() - interval '1 hour' FROM ingest_run"
        )
        _migrate(("ledger", "0003_detail_asked_again"))
        assert _query("SELECT step, asks, answered_at FROM dashboard_detailrequest") == [(7, 0, None)]
        _migrate(("ledger", "0002_flightrecorderrequest"))
        assert _query('SELECT step, "group" FROM dashboard_detailrequest') == [(7, "ddp")]
    finally:
        _latest()


def test_graph_texts_count_as_named_when_0007_runs_and_back():
    _migrate(("ingest", "0006_flightrecord"))
    try:
        _query(
            "INSERT INTO ingest_blob (hash, text, size, stored_at) VALUES (%s, 'g', 1, now() - interval '60 days')",
            ["a" * 32],
        )
        _migrate(("ingest", "0007_blob_named_at"))
        assert _query("SELECT text, named_at > now() - interval '1 minute' FROM ingest_blob") == [("g", True)]
        _migrate(("ingest", "0006_flightrecord"))
        assert _query("SELECT hash, text FROM ingest_blob") == [("a" * 32, "g")]
    finally:
        _latest()


BEFORE_EVIDENCE = [("ingest", "0011_blob_quota"), ("evidence", None)]
RAW = ("compileevent", "graphbreakevent", "gradreport", "stepreport", "eventlog")


def _relations(prefix: str) -> set[str]:
    """Tables, partitions, indexes and sequences whose names start with `prefix`."""
    rows = _query(
        "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relname LIKE %s",
        [prefix.replace("_", r"\_") + "%"],
    )
    return {row[0] for row in rows}


def test_raw_tables_take_the_evidence_names_with_their_partitions_and_back():
    """0002 of evidence renames the tables it took over from ingest, their partitions, indexes,
    sequences and constraints; rows stay, new partitions come under the new names, and back."""
    _migrate(*BEFORE_EVIDENCE)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('e', now())")
        _insert_run("e", "e-run")
        _query(
            'INSERT INTO ingest_gradreport (run_id, ranks, step, "group", fps, nonfinite, ts, received)'
            " SELECT id, '{0,1}', 3, 'ddp', '{5}', 0, now(), now() FROM ingest_run"
        )
        _query(
            "INSERT INTO ingest_ingestbatch (session, seq, digest, run_id, rank, events, received_at)"
            " SELECT 's', 1, 'd', id, 0, 1, now() FROM ingest_run"
        )
        before = _relations("ingest_gradreport")
        assert any("_p" in name for name in before)

        _latest()
        assert not any(_relations(f"ingest_{table}") for table in RAW)
        assert {name.replace("evidence_", "ingest_", 1) for name in _relations("evidence_gradreport")} >= before
        assert _query('SELECT ranks, step, "group" FROM evidence_gradreport') == [([0, 1], 3, "ddp")]
        assert _query("SELECT session, seq FROM evidence_ingestbatch") == [("s", 1)]
        assert {
            model: label
            for model, label in _query(
                "SELECT model, app_label FROM django_content_type WHERE model IN ('gradreport', 'blob')"
            )
        } == {"gradreport": "evidence", "blob": "evidence"}
        _query("SELECT lockstep_raw_partition('evidence_gradreport', '2031-01-02')")
        assert "evidence_gradreport_p20310102" in _relations("evidence_gradreport")

        _migrate(*BEFORE_EVIDENCE)
        assert not _relations("evidence_")
        assert _relations("ingest_gradreport") >= before | {"ingest_gradreport_p20310102"}
        assert _query("SELECT ranks FROM ingest_gradreport") == [([0, 1],)]
    finally:
        _latest()
    assert _query("SELECT step FROM evidence_gradreport") == [(3,)]


def test_collective_waits_are_kept_from_the_logged_samples_and_back():
    """0004 of evidence: the longest wait of STUCK_S or more per (run, rank, step), from the log."""
    _migrate(("evidence", "0003_collective_wait_index"))
    try:
        _query("SELECT lockstep_raw_partition('evidence_eventlog', current_date)")
        Run.objects.create(project=Project.objects.create(name="w"), key="w-run", world_size=2)  # tenancy as is
        samples = [(0, 250, "collective", 5.5), (0, 250, "collective", 7.0), (1, 250, "collective", 4.0)]
        samples += [(1, 750, "step", 9.0), (1, 750, "collective", 6.0)]
        for rank, step, phase, seconds in samples:
            _query(
                "INSERT INTO evidence_eventlog (run_id, rank, t, body, ts, received)"
                " SELECT id, %s, 'progress', jsonb_build_object('t', 'progress', 'phase', %s::text, 'step', %s::int,"
                " 'phase_s', %s::float8), now(), now() FROM tenancy_run",
                [rank, phase, step, seconds],
            )
        _migrate(("evidence", "0004_collective_waits_kept"))
        kept = _query("SELECT rank, step, seconds FROM evidence_collectivewait ORDER BY rank, step")
        assert kept == [(0, 250, 7.0), (1, 750, 6.0)]
        assert "eventlog_collective_step" not in _relations("eventlog_collective")
        _migrate(("evidence", "0003_collective_wait_index"))
        assert "eventlog_collective_step" in _relations("eventlog_collective")
        assert len(_query("SELECT 1 FROM evidence_eventlog WHERE t = 'progress'")) == 5
    finally:
        _latest()
