"""A group's statements read the rows of the ranks its batches report, never every rank of the run.

A young run's tables have statistics that call them nearly empty, and a group's batches reach
PostgreSQL as a function scan it guesses at 100 rows: the planner then joins them by hash to a scan
of the whole run. At 100,000 ranks that was 200,000 watermarks read by each of a step's 391 rack
requests; and through a job's start, each request asked whether every rank had passed the start's
compile by reading every rank present. Each statement of a real group is explained here (EXPLAIN ANALYZE, inside a savepoint,
before it runs) against a run of 16,384 ranks whose rows the statistics have never seen.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from agents import protocol
from dashboard.ledger.models import CompileSlot
from ingest import writers
from tests.ingest.test_blobs import compile_event

pytestmark = pytest.mark.django_db

WORLD = 16384
REPORTING = range(1000, 1256)  # one rack request's 256 ranks
PER_RANK_TABLES = ("ledger_gradwatermark", "tenancy_rank", "evidence_ingestsession")


def job(project, ranks: range, seq: int, events: list[dict]) -> writers.Job:
    """One relay request: a batch of each rank, as the door hands them to the writer."""
    items = []
    for rank in ranks:
        raw = json.dumps(
            {
                "v": 1,
                "run": {"key": "wide", "world_size": WORLD},
                "rank": rank,
                "session": f"session-{rank}",
                "seq": seq,
                "events": events,
            }
        ).encode()
        items.append((protocol.decode_batch(raw), writers.digest(raw)))
    return writers.Job(project, items, bulk=True)


def grads(step: int) -> list[dict]:
    return [{"t": "grad", "step": step, "fps": [1, 2, 3]}, {"t": "step", "step": step}]


def rows_read(plan: dict[str, Any], into: Counter[str]) -> None:
    """Rows each scan node of an EXPLAIN (ANALYZE, FORMAT JSON) plan read (returned or filtered out), by table."""
    if "Relation Name" in plan and "Scan" in plan["Node Type"]:
        read = (
            plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)
        )
        into[plan["Relation Name"]] += read * plan["Actual Loops"]
    for child in plan.get("Plans", ()):
        rows_read(child, into)


@pytest.fixture
def reads(monkeypatch) -> Iterator[Counter[str]]:
    """The most rows any one of the writer's statements read from each table, from here on: its
    prepared statements (`writers.query`) and those it runs through Django's cursor."""
    most: Counter[str] = Counter()

    def explain(sql: str, params: Any) -> None:
        raw = connection.connection
        seen: Counter[str] = Counter()
        with raw.transaction():  # a savepoint: what EXPLAIN ANALYZE wrote is rolled back
            with psycopg.ClientCursor(raw) as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                rows_read(cur.fetchone()[0][0]["Plan"], seen)
            raise psycopg.Rollback()
        for table, n in seen.items():
            most[table] = max(most[table], n)

    run_statement = writers.query

    def prepared(sql: str, params: dict[str, Any], rows: bool = True) -> list[tuple[Any, ...]]:
        explain(sql, params)
        return run_statement(sql, params, rows)

    def through_django(execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "INSERT")):
            explain(sql, params)
        return execute(sql, params, many, context)

    monkeypatch.setattr(writers, "query", prepared)
    with connection.execute_wrapper(through_django):
        yield most


def started(project) -> None:
    """Every rank of the run reported step 0 (the start: each rank's rows written once)."""
    for first in range(0, WORLD, 4096):
        [outcome] = writers.store_group([job(project, range(first, first + 4096), 0, grads(0))])
        assert not isinstance(outcome, Exception), outcome


def test_a_steady_group_reads_only_its_own_ranks_rows(project, reads):
    started(project)
    reads.clear()
    [outcome] = writers.store_group([job(project, REPORTING, 1, grads(1))])
    assert not isinstance(outcome, Exception) and len(outcome) == len(REPORTING)
    for table in PER_RANK_TABLES:
        assert reads[table] <= 2 * len(REPORTING), (table, reads)


def test_a_group_in_a_job_s_start_reads_only_its_own_ranks_rows(project, reads):
    """Half the racks started (compiled at step 0, now at step 5), the others not yet: the start's
    compile slot is open, so each request asks whether every rank has passed it."""
    started_racks = [range(first, first + 256) for first in range(0, WORLD, 512)]
    for seq, events in enumerate(([{**compile_event(), "step": 0}, *grads(0)], grads(5))):
        for racks in (started_racks[:16], started_racks[16:]):
            items = [item for rack in racks for item in job(project, rack, seq, events).items]
            writers.store_group([writers.Job(project, items, bulk=True)])
    reads.clear()
    [outcome] = writers.store_group([job(project, started_racks[2], 2, grads(6))])
    assert not isinstance(outcome, Exception) and len(outcome) == 256
    assert reads["tenancy_rank"] <= 2 * 256, reads
    assert CompileSlot.objects.get().reported == len(started_racks) * 256


def test_a_group_of_ending_ranks_reads_only_their_rows(project, reads):
    started(project)
    reads.clear()
    end = [{"t": "rank_end", "status": "ok", "exit_code": 0}]
    [outcome] = writers.store_group([job(project, REPORTING, 1, end)])
    assert not isinstance(outcome, Exception), outcome
    for table in PER_RANK_TABLES:
        assert reads[table] <= 2 * len(REPORTING), (table, reads)
