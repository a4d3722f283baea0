"""While the workers are down the sweeps keep running; what they queue must expire instead of
piling up in the broker (issue 17, item 8). The broker is the real Redis of the suite."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from dashboard.detection import tasks
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _queued(task: str) -> list[dict]:
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    messages = [json.loads(raw) for raw in broker.lrange("celery", 0, -1)]
    return [m for m in messages if m["headers"]["task"] == task]


def test_the_sweeps_settle_messages_expire(post):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("celery")
    assert post(make_batch(world_size=2)).status_code == 200  # rank 1 never reports: the slot waits for the sweep
    GradSlot.objects.update(first_seen=timezone.now() - timedelta(hours=1))
    tasks.sweep()
    [message] = _queued("dashboard.detection.tasks.settle_slots")
    assert message["headers"]["expires"] is not None
    expires = timezone.datetime.fromisoformat(message["headers"]["expires"])
    assert expires - timezone.now() <= timedelta(seconds=tasks.SWEEP_EXPIRES_S)


def test_the_beat_sweeps_expire_within_their_interval():
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        if entry["schedule"] <= 60:
            assert entry["options"]["expires"] <= entry["schedule"]
