"""PagerDuty Events v2 against a local receiver: one dedup key from trigger to resolve, retried alike."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.delivery.models import Notification
from dashboard.delivery.sinks.pagerduty import PagerDuty
from tests.delivery.pipeline import apply, crash, deliver, run, sinks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_pagerduty_refusing_an_event_is_retried_with_the_same_dedup_key(run, sinks):
    pd = sinks["pagerduty"]
    pd.fail_next, pd.fail_status = 1, 429
    apply(run, crash(1))
    deliver()
    note = Notification.objects.get(webhook__kind="pagerduty")
    assert note.state == "pending" and note.attempts == 1 and "429" in note.last_error
    deliver(timedelta(minutes=1))
    assert [e["event_action"] for e in pd.bodies()] == ["trigger", "trigger"] and len(
        {e["dedup_key"] for e in pd.bodies()}
    ) == 1
    assert Notification.objects.get(id=note.id).state == "sent"


def test_pagerduty_needs_a_routing_key_and_defaults_its_url():
    assert PagerDuty.problem("", "") == {"secret": "PagerDuty needs the integration's routing key"}
    assert PagerDuty.problem("", "key") == {} and PagerDuty.default_url.startswith("https://events.pagerduty.com/")
