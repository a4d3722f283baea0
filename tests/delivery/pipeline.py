"""The delivery pipeline as the tests drive it: one local receiver per sink kind (the outside edge,
tests/delivery/receivers.py), a run, findings applied through `lifecycle.apply`, and `deliver`,
which does what the delivery tasks do. Shared by tests/delivery and tests/security."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from dashboard.delivery import mirror, notifications, notify
from dashboard.delivery.models import Webhook
from dashboard.detection import lifecycle
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.delivery.receivers import AlertmanagerReceiver, JsonReceiver, PagerDutyReceiver, SlackReceiver

ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"
LATER = timedelta(seconds=61)  # past the rate limit of count/message-only updates


@pytest.fixture
def sinks(project):
    """One receiver per kind, each a destination of the project."""
    found = {
        "slack": SlackReceiver(),
        "alertmanager": AlertmanagerReceiver(),
        "pagerduty": PagerDutyReceiver(ROUTING_KEY),
        "json": JsonReceiver(),
    }
    Webhook.objects.create(project=project, kind="slack", url=found["slack"].url + "/hook")
    Webhook.objects.create(project=project, kind="alertmanager", url=found["alertmanager"].url)
    Webhook.objects.create(
        project=project, kind="pagerduty", url=found["pagerduty"].url + "/v2/enqueue", secret=ROUTING_KEY
    )
    Webhook.objects.create(project=project, kind="json", url=found["json"].url + "/in", secret="s3cret")
    yield found
    for receiver in found.values():
        receiver.close()


@pytest.fixture
def run(project) -> Run:
    return Run.objects.create(project=project, key="job-1", world_size=3)


def apply(run: Run, *findings: Finding, clean: list[tuple[str, str]] = ()) -> None:
    with transaction.atomic():
        lifecycle.apply(run, list(findings), list(clean), None)


def crash(rank: int, cause: int | None = None, message: str = "") -> Finding:
    """A rank that died (`cause` None: it is the root) or lost its peer `cause` (a consequence)."""
    kind = "rank_silent" if cause is None else "rank_crashed"
    return Finding(
        severity="critical" if cause is None else "warning",
        ranks=(rank,),
        step=7,
        kind=kind,
        subject=f"rank:{rank}",
        message=message or f"rank {rank} {'went silent' if cause is None else 'lost its peer'}",
        details={} if cause is None else {"consequence_of": cause},
    )


def deliver(after: timedelta = timedelta(0)) -> list[int]:
    """What the delivery tasks do: every pending incident revision queued, then one attempt each of
    whatever is due `after` from now (notifications and Alertmanager silences)."""
    rows = []
    for alert_id in notify.pending():
        notify.deliver(alert_id)  # the alert lists' websocket messages
    for incident_id in notify.pending_incidents():
        rows += notify.deliver_incident(incident_id)[1]
    now = timezone.now() + after
    sent = [n for n in notifications.due(now) if notifications.send(n, now)]
    for row in rows + mirror.due(now):
        mirror.sync(row, now)
    return sent
