"""Alertmanager against a local receiver that speaks its v2 API: short `endsAt` refreshed, changed label
sets ended, silences kept in step, rank labels bounded."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from dashboard.delivery import mirror, notifications, transports
from dashboard.delivery.sinks.alertmanager import Alertmanager
from dashboard.detection.models import Silence
from tests.delivery.pipeline import apply, crash, deliver, run, sinks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_a_silence_extended_in_alertmanager_is_replaced_only_when_alertmanager_no_longer_knows_it(run, sinks, project):
    am = sinks["alertmanager"]
    apply(run, crash(2))
    deliver()
    silence = Silence.objects.create(
        project=project, kind="rank_silent", comment="repair", expires_at=timezone.now() + timedelta(hours=1)
    )

    def after_backoff() -> datetime:  # past the failed attempt's backoff
        return timezone.now() + timedelta(minutes=5)

    def extend(hours: int) -> list[bool]:
        silence.expires_at = timezone.now() + timedelta(hours=hours)
        silence.save()
        return [mirror.sync(row) for row in mirror.plan_project(project.id)]

    assert extend(2) == [True] and len(am.silences) == 1
    [first] = am.silences
    am.fail_next = 1  # Alertmanager down for the update: retried later, never a second silence
    assert extend(3) == [False] and len(am.silences) == 1
    assert [mirror.sync(row, after_backoff()) for row in mirror.due(after_backoff())] == [True]
    assert len(am.silences) == 1 and am.active_silences()[0]["id"] == first

    am.silences[first]["status"] = "expired"  # deleted in Alertmanager by hand: its id is a 404 now
    assert extend(4) == [True]
    [kept] = am.active_silences()
    assert kept["id"] != first and len(am.silences) == 2


def test_alertmanager_gets_a_short_endsAt_refreshed_and_a_changed_label_set_ended(run, sinks):
    am = sinks["alertmanager"]
    apply(run, crash(0, cause=2))  # the consequence first: its own incident until the root is known
    deliver()
    [before] = am.active()
    assert before["labels"]["alertname"] == "rank_crashed" and before["labels"]["severity"] == "warning"
    apply(run, crash(2))  # the root arrives: re-rooted and escalated, sent at once
    deliver()
    [after] = am.active()
    assert (after["labels"]["alertname"], after["labels"]["severity"], after["labels"]["ranks"]) == (
        "rank_silent",
        "critical",
        "2",
    )
    assert after["labels"]["incident"] == before["labels"]["incident"] and len(am.alerts) == 2  # the old set ended

    later = timezone.now() + Alertmanager.refresh + timedelta(seconds=1)
    posts = len(am.requests)
    for note in notifications.refresh_due(later):
        assert notifications.refresh(note, later)
    assert len(am.requests) == posts + 1 and notifications.refresh_due(later) == []
    assert am.bodies()[-1][0]["endsAt"] > after["endsAt"]  # held a little longer, never a day


def test_rank_labels_are_ranges_cut_to_a_bounded_length():
    assert transports.rank_ranges([5, 1, 3, 2, 9, 8], 64) == "1-3,5,8-9"
    assert transports.rank_ranges([], 64) == ""
    label = transports.rank_ranges(list(range(0, 2048, 2)), 40)
    assert len(label) <= 48 and label.startswith("0,2,4,") and label.endswith(f",+{1024 - label.count(',')}")


def test_alertmanager_needs_a_url_and_takes_no_secret():
    assert Alertmanager.problem("", "") == {"url": "a Alertmanager (v2 API) needs a URL"}
    assert Alertmanager.problem("https://am.example", "k") == {"secret": "a Alertmanager (v2 API) takes no secret"}
    assert Alertmanager.problem("https://am.example", "") == {} and Alertmanager.stateful
