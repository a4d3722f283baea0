"""An alert's way to its destinations passes every settle queued before it: the delivery tasks go at
the broker's top priority (`fairness.PAGES`), settling and everything else below (`fairness.TOP`),
through the real Redis broker and kombu's priority lists."""

from __future__ import annotations

import uuid

import pytest
from kombu import Queue

from dashboard.celery import app
from dashboard.delivery.tasks import deliver, send_webhook
from dashboard.detection import fairness
from dashboard.detection.tasks import settle_slots, sweep


@pytest.fixture
def queue():
    """A queue of this test's own on the broker (no worker consumes it), emptied afterwards."""
    name = f"lockstep-test-priority-{uuid.uuid4().hex[:8]}"
    declared = Queue(name, routing_key=name)
    with app.connection_for_write() as conn:
        declared.bind(conn.default_channel).declare()
        yield name, conn
        declared.bind(conn.default_channel).delete()


def test_a_page_queued_behind_settles_is_taken_first(queue):
    name, conn = queue
    with app.producer_or_acquire() as producer:
        for chunk in range(3):  # a run with little queued: settling's top priority
            settle_slots.apply_async(
                ("grad", [chunk], 7), priority=fairness.priority_for(0), queue=name, producer=producer
            )
        sweep.apply_async(queue=name, producer=producer)
        deliver.apply_async((11,), queue=name, producer=producer)
        send_webhook.apply_async((12,), queue=name, producer=producer)
    channel = conn.default_channel
    taken = []
    while (message := channel.basic_get(name, no_ack=True)) is not None:
        taken.append(message.headers["task"].rsplit(".", 1)[1])
    assert taken[:2] == ["deliver", "send_webhook"]
    assert taken[2:] == ["settle_slots"] * 3 + ["sweep"]  # the rest in the order queued
