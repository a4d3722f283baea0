"""Ranks answering detail requests at the same moment: exactly one of them completes the alert."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from dashboard.detection import detail
from dashboard.detection.models import Alert
from dashboard.ledger.models import DetailRequest
from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_ranks_answering_at_once_complete_the_alert_once():
    run = Run.objects.create(project=Project.objects.create(name="answers"), key="answers", world_size=2)
    alert = Alert.objects.create(
        run=run, kind="grad_divergence", subject="ddp", severity="critical", ranks=[1], step=9, message="grads differ"
    )
    for rank in (0, 1):
        DetailRequest.objects.create(run=run, rank=rank, step=9, group="ddp", alert_id=alert.id)
    first_holds, release = threading.Event(), threading.Event()
    completed: dict[int, list[int]] = {}

    def answer(rank: int, hold: bool) -> None:
        try:
            with transaction.atomic():  # rank 0's answer is written but not yet committed while rank 1 answers
                completed[rank] = detail.answered(run.id, rank, {9})
                if hold:
                    first_holds.set()
                    release.wait(10)
        finally:
            connection.close()

    first = threading.Thread(target=answer, args=(0, True))
    first.start()
    assert first_holds.wait(10)
    second = threading.Thread(target=answer, args=(1, False))
    second.start()
    second.join(0.5)  # it waits for rank 0's transaction (alive), or, unlocked, finds rank 0 still missing
    release.set()
    first.join(10)
    second.join(10)
    assert sorted(completed) == [0, 1]
    assert completed[0] + completed[1] == [alert.id]
