"""Requests reach their ranks: a detail request whose reply was lost is asked again (issue 17, item
8), a bounded number of times; a weights request, one row for every rank, is told to each rank below its step."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.ledger import details
from dashboard.ledger.models import DetailRequest, WeightsRequest
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _asked(post, seq: int) -> list[int]:
    response = post(make_batch(run="reask", rank=1, seq=seq, events=[{"t": "heartbeat", "step": seq}]))
    assert response.status_code == 200, response.content
    return response.json()["detail"]


def test_an_unanswered_request_is_handed_out_again_after_a_while_then_given_up(post):
    assert _asked(post, 0) == []
    details.ask(Run.objects.get(key="reask").id, {1}, step=7, group="ddp", alert_id=1)
    assert _asked(post, 1) == [7]  # this reply is lost on the way
    assert _asked(post, 2) == []  # not at once: the answer may be in flight
    for seq in range(3, 3 + details.MAX_ASKS - 1):
        DetailRequest.objects.update(asked_at=timezone.now() - timedelta(seconds=details.ASK_AGAIN_AFTER_S + 1))
        assert _asked(post, seq) == [7]
    DetailRequest.objects.update(asked_at=timezone.now() - timedelta(hours=1))
    assert _asked(post, 100) == [] and DetailRequest.objects.get().asks == details.MAX_ASKS


def test_asking_many_ranks_is_one_statement_and_asking_again_keeps_the_first_alert(post):
    """A tie asks every rank of it: one INSERT whatever their number (a row at a time kept a
    1,024-rank settle, and so the page, waiting over a second), idempotent per (rank, step, group)."""
    assert _asked(post, 0) == []
    run = Run.objects.get(key="reask").id
    with CaptureQueriesContext(connection) as queries:
        details.ask(run, set(range(1024)), step=7, group="ddp", alert_id=1)
    assert len(queries) == 1, [q["sql"][:80] for q in queries]
    details.ask(run, {0, 1, 1024}, step=7, group="ddp", alert_id=2)
    assert DetailRequest.objects.count() == 1025
    assert DetailRequest.objects.filter(alert_id=2).count() == 1 and DetailRequest.objects.get(rank=1024).alert_id == 2


def _weights(post, rank: int, seq: int, events: list[dict]) -> list[int] | None:
    response = post(make_batch(run="reask", rank=rank, seq=seq, events=events))
    assert response.status_code == 200, response.content
    return response.json().get("weights_at")


def test_a_weights_request_is_one_row_for_every_rank_and_told_while_a_rank_is_below_it(post):
    """One row whatever the job's size (100,000 rows held a full-size divergence's page); each batch
    of a rank still below the step is told (a lost reply is made good by the next), a batch at or
    past it is not; asking again keeps the first alert."""
    assert _weights(post, 0, 0, [{"t": "grad", "step": 3, "fps": [1]}]) is None
    run = Run.objects.get(key="reask").id
    with CaptureQueriesContext(connection) as queries:
        details.ask_weights(run, step=7, group="ddp", alert_id=1)
    assert len(queries) == 1, [q["sql"][:80] for q in queries]
    details.ask_weights(run, step=7, group="ddp", alert_id=2)
    assert list(WeightsRequest.objects.values_list("step", "alert_id")) == [(7, 1)]
    assert _weights(post, 0, 1, [{"t": "grad", "step": 4, "fps": [1]}]) == [7]
    assert _weights(post, 0, 2, [{"t": "grad", "step": 5, "fps": [1]}]) == [7]  # again: the last reply may be lost
    assert _weights(post, 2, 0, [{"t": "heartbeat", "step": 6}]) == [7]  # any rank: none is listed
    assert _weights(post, 0, 3, [{"t": "grad", "step": 7, "fps": [1]}]) is None  # its weights come with step 7
    details.ask_weights(run, step=12, group="ddp", alert_id=3)
    assert _weights(post, 0, 4, [{"t": "grad", "step": 8, "fps": [1]}]) == [12]


def test_the_upgrade_keeps_weights_requests_not_handed_out_as_one_row(project):
    """Weights requests stored a row per rank (group "param:<group>") become one row per (run, step,
    group) where a rank had yet to be told; the per-rank rows go, the per-parameter ones stay."""
    from django.db.migrations.executor import MigrationExecutor

    run = Run.reported(project, "r", "r", 3, {})
    executor = MigrationExecutor(connection)
    executor.migrate([("ledger", "0001_initial")])
    try:
        with connection.cursor() as cursor:
            for rank, step, group, answered in (
                (0, 9, "param:ddp", True),
                (1, 9, "param:ddp", False),
                (2, 9, "param:ddp", False),
                (0, 4, "param:ddp", True),
                (1, 3, "ddp", False),
            ):
                cursor.execute(
                    'INSERT INTO ledger_detailrequest (run_id, rank, step, "group", alert_id, asks, answered_at)'
                    " VALUES (%s, %s, %s, %s, 5, 0, CASE WHEN %s THEN now() END)",
                    [run.id, rank, step, group, answered],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(WeightsRequest.objects.values_list("run_id", "step", "group", "alert_id")) == [(run.id, 9, "ddp", 5)]
    assert list(DetailRequest.objects.values_list("rank", "step", "group")) == [(1, 3, "ddp")]
