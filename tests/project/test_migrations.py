"""The schema: one initial migration per app that owns tables, then the migrations that carry rows
across a change, in step with the models, holding what Django cannot say itself (raw tables
partitioned by day, HOT-friendly fill factors), and undone and redone cleanly."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from dashboard.evidence.partitions import RAW_TABLES

pytestmark = pytest.mark.django_db(transaction=True)

APPS = ("tenancy", "ledger", "evidence", "detection", "delivery")


def _query(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def _schema() -> set[tuple]:
    """Every table of the apps with its kind (plain or partitioned) and options, and every index."""
    tables = _query(
        "SELECT relname, relkind, coalesce(reloptions, '{}') FROM pg_class"
        " WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')"
        " AND relname ~ %s AND relname !~ '_p[0-9]{8}$'",
        ["^(" + "|".join(APPS) + ")_"],
    )
    indexes = _query(
        "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename ~ %s"
        " AND tablename !~ '_p[0-9]{8}$'",  # a day's partition follows the clock: a redo after midnight adds one
        ["^(" + "|".join(APPS) + ")_"],
    )
    return {("table", name, kind, tuple(options)) for name, kind, options in tables} | {("index", *i) for i in indexes}


def test_each_app_starts_from_one_initial_migration_and_the_models_need_no_other():
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    nodes = sorted(graph.nodes)
    ours = [node for node in nodes if node[0] in APPS]
    assert sorted(n for n in graph.root_nodes() if n[0] in APPS) == sorted((app, "0001_initial") for app in APPS)
    assert ("evidence", "0002_claims_per_session") in ours  # the batch claims, carried to a row per session
    assert not [node for node in nodes if node[0] in ("dashboard", "ingest")]  # they own no table
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_raw_tables_are_partitioned_by_day_and_hot_tables_leave_room():
    partitioned = dict(
        _query(
            "SELECT c.relname, pg_get_partkeydef(c.oid) FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
        )
    )
    assert {t: partitioned.get(t) for t in RAW_TABLES} == {t: "RANGE (received)" for t in RAW_TABLES}
    keys = dict(
        _query(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE contype = 'p' AND conrelid::regclass::text = ANY(%s)",
            [list(RAW_TABLES)],
        )
    )
    assert set(keys.values()) == {"PRIMARY KEY (id, received)"}
    days = _query("SELECT count(*) FROM pg_class WHERE relname LIKE 'evidence\\_stepreport\\_p%%'")[0][0]
    assert days >= 8  # yesterday to a week ahead, ready before the first row
    options = dict(
        _query(
            "SELECT relname, reloptions FROM pg_class"
            " WHERE relname IN ('tenancy_rank', 'ledger_gradwatermark', 'evidence_ingestsession')"
        )
    )
    hot = {t: ["fillfactor=50"] for t in ("ledger_gradwatermark", "evidence_ingestsession")}
    assert options == {**hot, "tenancy_rank": ["fillfactor=50", "toast_tuple_target=512"]}  # a layout out of the row


def test_the_initial_migrations_undo_and_redo_to_the_same_schema():
    before = _schema()
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([(app, None) for app in reversed(APPS)])
        assert not [row for row in _schema() if row[0] == "table"]
        assert not _query("SELECT 1 FROM pg_proc WHERE proname = 'lockstep_raw_partition'")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _schema() == before
