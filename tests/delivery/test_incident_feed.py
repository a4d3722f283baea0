"""The websocket feeds carry incidents beside alerts: an alert revision is still `{"type": "alert"}`
(the pages' alert lists read it), and its incident's revision follows as `{"type": "incident"}` to
the run's and the project's groups. Real channel layer (Redis), real consumers."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import transaction

from dashboard.delivery import notify
from dashboard.detection import lifecycle
from dashboard.detection.models import Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.delivery.test_websocket_revocation import _open, _session_of

pytestmark = pytest.mark.django_db(transaction=True)


def _raise_and_deliver(run: Run) -> int:
    with transaction.atomic():
        [alert_id] = lifecycle.apply(
            run,
            [Finding("critical", (2,), "rank 2 went silent", step=3, kind="rank_silent", subject="rank:2")],
            [],
            None,
        )
    incident_id = notify.deliver(alert_id)
    notify.deliver_incident(incident_id)
    return incident_id


def test_both_feeds_get_the_alert_then_its_incident(project):
    run = Run.objects.create(project=project, key="fed", world_size=3)
    user = User.objects.create_user("ines")
    project.members.add(user)
    session = _session_of(user)

    async def scenario() -> list[dict]:
        feeds = [await _open("/ws/runs/fed/", session), await _open("/ws/alerts/", session)]
        await sync_to_async(_raise_and_deliver)(run)
        seen = [await ws.receive_json_from(timeout=10) for ws in feeds for _ in range(2)]
        for ws in feeds:
            await ws.disconnect()
        return seen

    seen = async_to_sync(scenario)()
    incident = Incident.objects.get(run=run)
    for alert_message, incident_message in (seen[0:2], seen[2:4]):
        assert alert_message["type"] == "alert" and alert_message["alert"]["kind"] == "rank_silent"
        assert incident_message == {"type": "incident", "incident": incident.as_json()}
        assert incident_message["incident"]["root"]["ranks"] == [2]
