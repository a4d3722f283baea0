"""Schema changes that move existing rows: run them forward and back on data."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE_RANKS = ("ingest", "0003_grad_watermark")
RANKS = ("ingest", "0004_grad_report_ranks")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def _query(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def test_grad_rows_keep_their_ranks_both_ways_across_0004():
    _migrate(BEFORE_RANKS)
    try:
        _query("INSERT INTO ingest_project (name, created_at) VALUES ('m', now())")
        _query("INSERT INTO ingest_run (key, name, world_size, meta, torch_version, started_at, last_seen, project_id)"
               " SELECT 'm', 'm', 3, '{}', '', now(), now(), id FROM ingest_project")
        insert = ("INSERT INTO ingest_gradreport (run_id, {col}, step, \"group\", fps, norm, nonfinite, ts)"
                  " SELECT id, %s, %s, 'ddp', %s, NULL, 0, now() FROM ingest_run")
        _query(insert.format(col="rank"), [1, 5, [7, 8]])

        _migrate(RANKS)
        assert _query("SELECT ranks, step, fps FROM ingest_gradreport") == [([1], 5, [7, 8])]
        _query(insert.format(col="ranks"), [[0, 2], 6, [9]])

        _migrate(BEFORE_RANKS)  # a shared row becomes one row per rank
        assert sorted(_query("SELECT rank, step, fps FROM ingest_gradreport")) == [(0, 6, [9]), (1, 5, [7, 8]), (2, 6, [9])]
    finally:
        _migrate(RANKS)
    assert sorted(_query("SELECT ranks, step FROM ingest_gradreport")) == [([0], 6), ([1], 5), ([2], 6)]
