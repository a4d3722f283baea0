"""Schema changes that move existing rows, walked once through the project's history: each change's
rows go in before it, are checked after it on the way forward, and again after it is undone on the
way back, then once more at the latest state.

One walk rather than a test per change: each of those went back across the split into apps, and
every crossing costs Django seconds of model-state rendering (about 7 s back and 4 s forward).
Rows of one change stay while the others run, so every check names its own project or run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db(transaction=True)

Target = tuple[str, str | None]


def _migrate(*targets: Target) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(list(targets))


def _forward(*targets: Target) -> None:
    """Migrate forward only: a step of the walk that undid a later change would test nothing it names."""
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(list(targets))
    assert not [m for m, backwards in plan if backwards], f"{targets} would undo {[m for m, b in plan if b]}"
    executor.migrate(list(targets), plan=plan)


def _latest() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def _query(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _relations(prefix: str) -> set[str]:
    """Tables, partitions, indexes and sequences whose names start with `prefix`."""
    rows = _query(
        "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relname LIKE %s",
        [prefix.replace("_", r"\_") + "%"],
    )
    return {row[0] for row in rows}


def _insert_run(project: str, key: str) -> None:
    _query(
        "INSERT INTO ingest_run (key, name, world_size, meta, torch_version, started_at, last_seen, project_id)"
        " SELECT %s, %s, 2, '{}', '', now(), now(), id FROM ingest_project WHERE name = %s",
        [key, key, project],
    )


def _nothing() -> None:
    """A change without a check at that point of the walk."""


@dataclass
class Change:
    """One migration that moves rows: its rows put in at `before`, checked at `after` (forward), at
    the latest state, back at `before` (backward), and at the latest state once the walk is over."""

    name: str
    before: list[Target]
    after: list[Target]
    plant: Callable[[], None]
    forward: Callable[[], None] = _nothing
    at_latest: Callable[[], None] = _nothing
    back: Callable[[], None] = _nothing
    again: Callable[[], None] = _nothing
    undone_at_once: bool = False  # undone and checked right away: a later migration drops its rows


# --- ingest 0004: a grad row holds the ranks that reported it alike ------------------------------

GRAD = (
    'INSERT INTO ingest_gradreport (run_id, {col}, step, "group", fps, norm, nonfinite, ts)'
    " SELECT id, %s, %s, 'ddp', %s, NULL, 0, now() FROM ingest_run WHERE key = 'm'"
)


def _grad_plant() -> None:
    _query("INSERT INTO ingest_project (name, created_at) VALUES ('m', now())")
    _insert_run("m", "m")
    _query(GRAD.format(col="rank"), [1, 5, [7, 8]])


def _grad_rows(table: str, columns: str) -> list[tuple]:
    runs = "ingest_run" if table.startswith("ingest") else "tenancy_run"
    return sorted(_query(f"SELECT {columns} FROM {table} g JOIN {runs} r ON r.id = g.run_id WHERE r.key = 'm'"))


def _grad_forward() -> None:
    assert _grad_rows("ingest_gradreport", "ranks, step, fps") == [([1], 5, [7, 8])]
    _query(GRAD.format(col="ranks"), [[0, 2], 6, [9]])


def _grad_back() -> None:  # a shared row becomes one row per rank
    assert _grad_rows("ingest_gradreport", "rank, step, fps") == [(0, 6, [9]), (1, 5, [7, 8]), (2, 6, [9])]


def _grad_again() -> None:
    assert _grad_rows("evidence_gradreport", "ranks, step") == [([0], 6), ([1], 5), ([2], 6)]


# --- the split into apps: dashboard and ingest hand their models to tenancy, ledger, detection, delivery

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
    return dict(_query("SELECT model, app_label FROM django_content_type WHERE model = ANY(%s)", [list(MOVED)]))


def _split_plant() -> None:
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
    _insert_run("split", "split-run")
    _query(
        "INSERT INTO ingest_gradwatermark (run_id, \"group\", rank, step) SELECT id, 'ddp', 1, 41 FROM ingest_run"
        " WHERE key = 'split-run'"
    )
    _query(
        "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
        " first_seen, last_seen, revision, notified_revision) SELECT id, 'grad_divergence', 'group:ddp', 'critical',"
        " 'firing', '{1}', 'm', '{}', 1, now(), now(), 1, 0 FROM ingest_run WHERE key = 'split-run'"
    )
    _query(
        'INSERT INTO dashboard_detailrequest (run_id, rank, step, "group", alert_id)'
        " SELECT run_id, 1, 41, 'ddp', id FROM dashboard_alert"
    )
    assert _detail_alert_fk() == 1


def _split_at_latest() -> None:
    from dashboard.detection.models import Alert
    from dashboard.ledger.models import DetailRequest, GradWatermark
    from dashboard.tenancy.models import Project

    assert _detail_alert_fk("ledger_detailrequest", "detection_alert") == 0
    assert _labels() == {model: new for model, (_, new) in MOVED.items()}
    run = Project.objects.get(name="split").runs.get()
    alert = Alert.objects.get(run=run)
    assert (alert.kind, alert.ranks) == ("grad_divergence", [1])
    assert DetailRequest.objects.get(run=run).alert_id == alert.id
    assert GradWatermark.objects.get(run=run).step == 41


def _split_back() -> None:
    assert _detail_alert_fk() == 1
    assert _labels() == {model: old for model, (old, _) in MOVED.items()}
    assert _query(
        "SELECT r.key, a.kind, d.step FROM ingest_run r JOIN dashboard_alert a ON a.run_id = r.id"
        " JOIN dashboard_detailrequest d ON d.alert_id = a.id AND d.run_id = r.id WHERE r.key = 'split-run'"
    ) == [("split-run", "grad_divergence", 41)]


# --- tenancy 0002: run keys unique per project, not globally --------------------------------------


def _raises_integrity(insert: Callable[[], None]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        insert()


def _keys_plant() -> None:
    _query("INSERT INTO ingest_project (name, created_at) VALUES ('ka', now()), ('kb', now())")
    _insert_run("ka", "job-77")
    _raises_integrity(lambda: _insert_run("kb", "job-77"))


def _keys_forward() -> None:
    assert _query(
        "SELECT r.key FROM ingest_run r JOIN ingest_project p ON p.id = r.project_id WHERE p.name = 'ka'"
    ) == [("job-77",)]
    _insert_run("kb", "job-77")
    _raises_integrity(lambda: _insert_run("kb", "job-77"))
    _query("DELETE FROM ingest_run r USING ingest_project p WHERE p.id = r.project_id AND p.name = 'kb'")


def _keys_back() -> None:
    assert _query("SELECT key FROM ingest_run WHERE key = 'job-77'") == [("job-77",)]
    _raises_integrity(lambda: _insert_run("kb", "job-77"))


def _keys_again() -> None:
    assert _query("SELECT key FROM tenancy_run WHERE key = 'job-77'") == [("job-77",)]


# --- ledger 0003: a detail request asked and never answered is asked again -------------------------


def _asks_plant() -> None:
    _query("INSERT INTO ingest_project (name, created_at) VALUES ('d', now())")
    _insert_run("d", "d-run")
    _query(
        'INSERT INTO dashboard_detailrequest (run_id, rank, step, "group", alert_id, asked_at)'
        " SELECT r.id, 1, 7, 'ddp', (SELECT min(id) FROM dashboard_alert), now() - interval '1 hour'"
        " FROM ingest_run r WHERE r.key = 'd-run'"
    )


def _asks_rows(columns: str) -> list[tuple]:
    return _query(
        f"SELECT {columns} FROM dashboard_detailrequest d JOIN ingest_run r ON r.id = d.run_id WHERE r.key = 'd-run'"
    )


def _asks_forward() -> None:
    assert _asks_rows("step, asks, answered_at") == [(7, 0, None)]


def _asks_back() -> None:
    assert _asks_rows('step, "group"') == [(7, "ddp")]


# --- ingest 0007: stored graph texts count as named when it runs ------------------------------------


def _named_plant() -> None:
    _query(
        "INSERT INTO ingest_blob (hash, text, size, stored_at) VALUES (%s, 'g', 1, now() - interval '60 days')",
        ["a" * 32],
    )


def _named_forward() -> None:
    assert _query(
        "SELECT text, named_at > now() - interval '1 minute' FROM ingest_blob WHERE hash = %s", ["a" * 32]
    ) == [("g", True)]


def _named_back() -> None:
    assert _query("SELECT hash, text FROM ingest_blob WHERE hash = %s", ["a" * 32]) == [("a" * 32, "g")]


# --- evidence 0002: the raw tables, partitions, indexes and sequences take the evidence names -------

RAW = ("compileevent", "graphbreakevent", "gradreport", "stepreport", "eventlog")
NAMES_BEFORE: set[str] = set()  # ingest_gradreport's relations when the rows went in


def _evidence_plant() -> None:
    _query("INSERT INTO ingest_project (name, created_at) VALUES ('e', now())")
    _insert_run("e", "e-run")
    _query(
        'INSERT INTO ingest_gradreport (run_id, ranks, step, "group", fps, nonfinite, ts, received)'
        " SELECT id, '{0,1}', 3, 'ddp', '{5}', 0, now(), now() FROM ingest_run WHERE key = 'e-run'"
    )
    _query(
        "INSERT INTO ingest_ingestbatch (session, seq, digest, run_id, rank, events, received_at)"
        " SELECT 's', 1, 'd', id, 0, 1, now() FROM ingest_run WHERE key = 'e-run'"
    )
    NAMES_BEFORE.update(_relations("ingest_gradreport"))
    assert any("_p" in name for name in NAMES_BEFORE)


def _evidence_rows(table: str, columns: str, runs: str = "ingest_run") -> list[tuple]:
    return _query(f"SELECT {columns} FROM {table} g JOIN {runs} r ON r.id = g.run_id WHERE r.key = 'e-run'")


def _evidence_forward() -> None:
    assert not any(_relations(f"ingest_{table}") for table in RAW)
    assert {name.replace("evidence_", "ingest_", 1) for name in _relations("evidence_gradreport")} >= NAMES_BEFORE
    assert _evidence_rows("evidence_gradreport", 'ranks, step, "group"') == [([0, 1], 3, "ddp")]
    assert _evidence_rows("evidence_ingestbatch", "session, seq") == [("s", 1)]
    labels = _query("SELECT model, app_label FROM django_content_type WHERE model IN ('gradreport', 'blob')")
    assert dict(labels) == {"gradreport": "evidence", "blob": "evidence"}
    _query("SELECT lockstep_raw_partition('evidence_gradreport', '2031-01-02')")
    assert "evidence_gradreport_p20310102" in _relations("evidence_gradreport")


def _evidence_back() -> None:
    assert not _relations("evidence_")
    assert _relations("ingest_gradreport") >= NAMES_BEFORE | {"ingest_gradreport_p20310102"}
    assert _evidence_rows("ingest_gradreport", "ranks") == [([0, 1],)]


def _evidence_again() -> None:
    # the walk went back past ingest 0004 since: the shared row came back as a row per rank
    assert sorted(_evidence_rows("evidence_gradreport", "ranks, step", "tenancy_run")) == [([0], 3), ([1], 3)]


# --- delivery 0002: a notification Celery gave up on is due for the sweep ----------------------------


def _retries_plant() -> None:
    _query("INSERT INTO ingest_project (name, created_at) VALUES ('n', now())")
    _insert_run("n", "n-run")
    _query(
        "INSERT INTO dashboard_alert (run_id, kind, subject, severity, state, ranks, message, details, count,"
        " first_seen, last_seen, revision, notified_revision, resolve_reason) SELECT id, 'grad_divergence',"
        " 'group:ddp', 'critical', 'firing', '{1}', 'm', '{}', 1, now(), now(), 1, 1, '' FROM ingest_run"
        " WHERE key = 'n-run'"
    )
    _query(
        "INSERT INTO dashboard_webhook (project_id, url, active, created_at) SELECT id, 'http://h', true, now()"
        " FROM ingest_project WHERE name = 'n'"
    )
    _query(
        "INSERT INTO dashboard_notification (alert_id, webhook_id, revision, state, attempts, last_error)"
        " SELECT a.id, w.id, 1, 'pending', 10, 'HTTP 503' FROM dashboard_alert a, dashboard_webhook w"
        " WHERE w.url = 'http://h' AND a.run_id = (SELECT id FROM ingest_run WHERE key = 'n-run')"
    )


def _retries_forward() -> None:
    [(state, attempts, due)] = _query("SELECT state, attempts, next_attempt_at <= now() FROM dashboard_notification")
    assert (state, attempts, due) == ("pending", 10, True)


def _retries_back() -> None:
    assert _query("SELECT state, attempts, last_error FROM dashboard_notification") == [("pending", 10, "HTTP 503")]


# --- evidence 0004: the long waits in a collective kept from the logged samples ----------------------


def _waits_plant() -> None:
    _query("SELECT lockstep_raw_partition('evidence_eventlog', current_date)")
    Run.objects.create(project=Project.objects.create(name="w"), key="w-run", world_size=2)  # tenancy is at its latest
    samples = [(0, 250, "collective", 5.5), (0, 250, "collective", 7.0), (1, 250, "collective", 4.0)]
    samples += [(1, 750, "step", 9.0), (1, 750, "collective", 6.0)]
    for rank, step, phase, seconds in samples:
        _query(
            "INSERT INTO evidence_eventlog (run_id, rank, t, body, ts, received)"
            " SELECT id, %s, 'progress', jsonb_build_object('t', 'progress', 'phase', %s::text, 'step', %s::int,"
            " 'phase_s', %s::float8), now(), now() FROM tenancy_run WHERE key = 'w-run'",
            [rank, phase, step, seconds],
        )


def _waits_forward() -> None:
    kept = _query("SELECT rank, step, seconds FROM evidence_collectivewait ORDER BY rank, step")
    assert kept == [(0, 250, 7.0), (1, 750, 6.0)]
    assert "eventlog_collective_step" not in _relations("eventlog_collective")


def _waits_back() -> None:
    assert "eventlog_collective_step" in _relations("eventlog_collective")
    assert len(_query("SELECT 1 FROM evidence_eventlog WHERE t = 'progress'")) == 5


BEFORE_SPLIT = [
    ("ingest", "0004_grad_report_ranks"),
    ("dashboard", "0004_settled_slot_index"),
    ("tenancy", None),
    ("ledger", None),
    ("detection", None),
    ("delivery", None),
]
CHANGES = [  # in the order of the history
    Change(
        "ingest 0004",
        [("ingest", "0003_grad_watermark")],
        [("ingest", "0004_grad_report_ranks")],
        _grad_plant,
        _grad_forward,
        back=_grad_back,
        again=_grad_again,
    ),
    Change(
        "the split into apps",
        BEFORE_SPLIT,
        [("dashboard", "0005_split_into_apps")],
        _split_plant,
        at_latest=_split_at_latest,
        back=_split_back,
    ),
    Change(
        "tenancy 0002",
        [("tenancy", "0001_initial")],
        [("tenancy", "0002_run_key_per_project")],
        _keys_plant,
        _keys_forward,
        back=_keys_back,
        again=_keys_again,
    ),
    Change(
        "ledger 0003",
        [("ledger", "0002_flightrecorderrequest")],
        [("ledger", "0003_detail_asked_again")],
        _asks_plant,
        _asks_forward,
        back=_asks_back,
    ),
    Change(
        "ingest 0007",
        [("ingest", "0006_flightrecord")],
        [("ingest", "0007_blob_named_at")],
        _named_plant,
        _named_forward,
        back=_named_back,
    ),
    Change(
        "evidence 0002",
        [("ingest", "0011_blob_quota"), ("evidence", None)],
        [("evidence", "0002_tables_named_for_evidence")],
        _evidence_plant,
        _evidence_forward,
        back=_evidence_back,
        again=_evidence_again,
    ),
    Change(
        "delivery 0002",
        [("delivery", "0001_initial"), ("detection", "0004_run_cost")],  # alerts as delivery 0002 found them
        [("delivery", "0002_notification_retries")],
        _retries_plant,
        _retries_forward,
        back=_retries_back,
        undone_at_once=True,  # delivery 0004 drops every notification of an alert, forward and back
    ),
    Change(
        "evidence 0004",
        [("evidence", "0003_collective_wait_index"), ("tenancy", "0005_tables_named_for_their_app")],
        [("evidence", "0004_collective_waits_kept")],
        _waits_plant,
        _waits_forward,
        back=_waits_back,
    ),
]


def test_every_change_keeps_its_rows_forward_and_back():
    _migrate(*CHANGES[0].before)
    try:
        for change in CHANGES:
            _forward(*change.before)
            change.plant()
            _forward(*change.after)
            change.forward()
            if change.undone_at_once:
                _migrate(*change.before)
                change.back()
                _forward(*change.after)
        _latest()
        for change in CHANGES:
            change.at_latest()
        for change in reversed([c for c in CHANGES if not c.undone_at_once]):
            _migrate(*change.after)
            _migrate(*change.before)
            change.back()
    finally:
        _latest()
    for change in CHANGES:
        change.again()
