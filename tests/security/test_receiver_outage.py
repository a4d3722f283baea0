"""A webhook receiver down for an hour (issue 17, item 4), time simulated: the notification is tried
with a backoff (a handful of attempts, not one per sweep), stays pending, and is delivered
exactly once when the receiver is back. The receiver is a local HTTP server (the outside edge)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.delivery import notifications, notify
from dashboard.delivery.models import Notification
from tests.delivery.test_notification_retries import incident, receiver, sweep  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_a_receiver_down_for_an_hour_gets_every_notification_once_when_it_returns(incident, receiver, record_property):
    notify.deliver_incident(incident.id)
    receiver.down = True
    start = now = timezone.now()
    while now < start + timedelta(hours=1):
        sweep(now)
        now += timedelta(seconds=2)  # the beat interval
    note = Notification.objects.get()
    assert note.state == "pending" and receiver.refused == note.attempts
    assert 8 <= note.attempts <= 10  # backoff, not 1800 attempts
    assert note.next_attempt_at - now <= notifications.BACKOFF_MAX
    receiver.down = False
    while Notification.objects.get().state == "pending":
        assert now < start + timedelta(hours=4), "not delivered after the receiver returned"
        sweep(now)
        now += timedelta(seconds=2)
    assert len(receiver.received) == 1 and Notification.objects.get().state == "sent"
    assert receiver.received[0]["lockstep"]["incident"] == incident.id
    attempts = Notification.objects.get().attempts
    record_property("attempts", attempts)
    print(f"\nreceiver down 1 h: {attempts} attempts ({receiver.refused} refused), 1 delivered, 0 lost")
