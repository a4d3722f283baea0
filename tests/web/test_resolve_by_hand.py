"""Resolution by hand: `POST /api/v1/alerts/<id>/resolve {"reason": ...}` by a person (session + CSRF)
or a project token, on a real divergence (ingest, settle). Who and why go on the alert, a new
revision waits for the sinks, the incident follows, and the alerts page shows it."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection import settle
from dashboard.detection.models import Alert, Incident
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import RESOLVE, Project, ProjectToken
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def alert(post) -> Alert:
    for rank in range(3):
        events = [{"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]}]
        assert post(make_batch(run="r-hand", rank=rank, events=events)).status_code == 200
    settle.settle_grad(GradSlot.objects.get().id)
    return Alert.objects.get()


def _resolve(client: Client, alert_id: int, body: object, **headers):
    return client.post(
        f"/api/v1/alerts/{alert_id}/resolve", json.dumps(body), content_type="application/json", **headers
    )


def test_a_person_resolves_with_who_and_why_and_the_page_shows_it(project, alert):
    user = User.objects.create_user("oncall", password="pw-oncall-123")
    project.members.add(user)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert _resolve(browser, alert.id, {"reason": "rank 2 restarted"}).status_code == 403  # no CSRF token
    browser.get("/alerts/")
    csrf = browser.cookies["csrftoken"].value
    revision = alert.revision
    response = _resolve(browser, alert.id, {"reason": "rank 2 restarted"}, HTTP_X_CSRFTOKEN=csrf)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "resolved" and body["resolved_by"] == "oncall"
    assert body["resolve_reason"] == "resolved by hand: rank 2 restarted"
    alert.refresh_from_db()
    assert alert.revision == revision + 1 and alert.notified_revision < alert.revision  # the sinks' resolve waits
    assert Incident.objects.get(id=alert.incident_id).state == "resolved"
    assert "resolved by hand: rank 2 restarted by oncall" in browser.get("/alerts/?state=resolved").content.decode()
    again = _resolve(browser, alert.id, {"reason": "twice"}, HTTP_X_CSRFTOKEN=csrf).json()
    assert again["resolve_reason"] == "resolved by hand: rank 2 restarted"  # resolved stays as it was


def test_a_project_token_resolves_in_its_projects_name_and_must_say_why(client, project, alert):
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {ProjectToken.issue(project, (RESOLVE,))}"}
    assert _resolve(client, alert.id, {}, **bearer).status_code == 400
    assert _resolve(client, alert.id, {"reason": "  "}, **bearer).status_code == 400
    other = ProjectToken.issue(Project.objects.create(name="other"), (RESOLVE,))
    assert _resolve(client, alert.id, {"reason": "not mine"}, HTTP_AUTHORIZATION=f"Bearer {other}").status_code == 404
    body = _resolve(client, alert.id, {"reason": "job requeued by CI"}, **bearer).json()
    assert body["state"] == "resolved" and body["resolved_by"] is None
    assert body["resolve_reason"] == f"resolved by hand: job requeued by CI (project token of {project.name})"
