"""While the workers are down the sweeps keep running; what they queue must expire instead of
piling up in the broker (issue 17, item 8). The broker is the real Redis of the suite."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.utils import timezone

from dashboard.detection import tasks
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def published():
    """Headers of the messages published to the real broker (a live stack's worker may take them off the
    queue before the test could read it)."""
    seen: list[dict] = []

    def keep(sender=None, headers=None, **_):
        seen.append(headers)

    before_task_publish.connect(keep, weak=False)
    yield seen
    before_task_publish.disconnect(keep)


def test_the_sweeps_settle_messages_expire(post, published):
    assert post(make_batch(world_size=2)).status_code == 200  # rank 1 never reports: the slot waits for the sweep
    GradSlot.objects.update(first_seen=timezone.now() - timedelta(hours=1))
    tasks.sweep()
    [headers] = [h for h in published if h["task"] == "dashboard.detection.tasks.settle_slots"]
    assert headers["expires"] is not None
    expires = timezone.datetime.fromisoformat(headers["expires"])
    assert expires - timezone.now() <= timedelta(seconds=tasks.SWEEP_EXPIRES_S)


def test_the_beat_sweeps_expire_within_their_interval():
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        if entry["schedule"] <= 60:
            assert entry["options"]["expires"] <= entry["schedule"]
