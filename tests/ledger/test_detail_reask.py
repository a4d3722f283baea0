"""A detail request whose reply was lost is asked again (issue 17, item 8), a bounded number of times."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.ledger import details
from dashboard.ledger.models import DetailRequest
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


def test_asking_every_rank_is_one_statement_and_asking_again_keeps_the_first_alert(post):
    """A weights request asks all the ranks of a run: one INSERT whatever their number (a row at a time
    kept a 1,024-rank settle, and so the page, waiting over a second), idempotent per (rank, step, group)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert _asked(post, 0) == []
    run = Run.objects.get(key="reask").id
    with CaptureQueriesContext(connection) as queries:
        details.ask_weights(run, set(range(1024)), step=7, group="ddp", alert_id=1)
    assert len(queries) == 1, [q["sql"][:80] for q in queries]
    details.ask_weights(run, {0, 1, 1024}, step=7, group="ddp", alert_id=2)
    assert DetailRequest.objects.count() == 1025
    assert DetailRequest.objects.filter(alert_id=2).count() == 1 and DetailRequest.objects.get(rank=1024).alert_id == 2
