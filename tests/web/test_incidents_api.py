"""Incidents API: a real divergence through ingest and settle, read as one incident per cause."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dashboard.detection import incidents, settle
from dashboard.detection.models import Alert, Incident
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Project, ProjectToken
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def diverged(post):
    for rank in range(3):
        events = [{"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]}]
        assert post(make_batch(run="r-inc", rank=rank, events=events)).status_code == 200
    settle.settle_grad(GradSlot.objects.get().id)


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_a_divergence_is_one_incident_naming_the_dissenting_rank(client, token, diverged):
    [incident] = client.get("/api/v1/runs/r-inc/incidents", **bearer(token)).json()["incidents"]
    assert set(incident) >= {"id", "state", "severity", "root", "alerts", "opened_at", "resolved_at"}
    assert incident["state"] == "firing" and incident["severity"] == "critical" and incident["resolved_at"] is None
    assert incident["root"]["kind"] == "grad_divergence" and incident["root"]["ranks"] == [2]
    assert incident["root"]["step"] == 0 and incident["root"]["frame"] is None and incident["root"]["message"]
    [alert] = client.get("/api/v1/runs/r-inc/alerts", **bearer(token)).json()["alerts"]
    assert incident["alerts"] == [alert["id"]] and alert["incident"] == incident["id"]


def test_another_projects_incidents_are_a_404(client, diverged):
    other = ProjectToken.issue(Project.objects.create(name="other"))
    assert client.get("/api/v1/runs/r-inc/incidents", **bearer(other)).status_code == 404
    incident = Incident.objects.get()
    assert client.post(f"/api/v1/incidents/{incident.id}/ack", **bearer(other)).status_code in (403, 404)
    incident.refresh_from_db()
    assert incident.acked_by is None


def test_a_person_acknowledges_an_incident_and_its_root(client, project, diverged):
    user = User.objects.create_user("oncall", password="pw-oncall-123")
    project.members.add(user)
    client.force_login(user)
    incident = Incident.objects.get()
    revision = incident.revision
    response = client.post(f"/api/v1/incidents/{incident.id}/ack")
    assert response.status_code == 200, response.content
    incident.refresh_from_db()
    assert incident.acked_by == user and incident.revision == revision + 1
    assert incident.root.acked_by == user


def test_the_run_and_alerts_pages_show_incidents_first_and_ack_them(client, project, diverged):
    user = User.objects.create_user("pages", password="pw-pages-123")
    project.members.add(user)
    client.force_login(user)
    incident = Incident.objects.get()
    html = client.get("/runs/r-inc/").content.decode()
    assert html.index('id="incidents"') < html.index('id="alerts"')
    assert f'id="incident-{incident.id}"' in html and "root: rank 2" in html
    page = client.get("/alerts/").content.decode()
    assert page.index('id="incidents"') < page.index("alert-table") and "root: rank 2" in page
    response = client.post(f"/incidents/{incident.id}/ack/", {"next": "/alerts/"})
    assert response.status_code == 302
    incident.refresh_from_db()
    assert incident.acked_by == user
    assert f"Acknowledge incident {incident.id}" not in client.get("/alerts/").content.decode()


def test_unresolved_while_firing_or_closed_only_by_the_runs_end(client, token, diverged):
    def unresolved() -> bool:
        [incident] = client.get("/api/v1/runs/r-inc/incidents", **bearer(token)).json()["incidents"]
        return incident["unresolved"]

    incident = Incident.objects.get()
    assert unresolved() is True  # firing
    Incident.objects.filter(id=incident.id).update(state="ended_unresolved")
    Alert.objects.filter(id=incident.root_id).update(state="ended_unresolved", resolve_reason=incidents.RUN_ENDED)
    assert unresolved() is True  # the job stopped; nothing said rank 2 agrees again
    Incident.objects.filter(id=incident.id).update(state="resolved")
    Alert.objects.filter(id=incident.root_id).update(state="resolved", resolve_reason="")
    assert unresolved() is False  # the evidence cleared it
