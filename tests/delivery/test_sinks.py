"""Only incidents page: Slack, Alertmanager, PagerDuty and JSON webhooks each against a local receiver
that speaks its API (tests/delivery/receivers.py). Incidents come from the real pipeline: findings
through `lifecycle.apply`, grouped by `incidents`, delivered by the outbox (`notify.deliver_incident`,
`notifications.send`, retries and the rate limit with simulated time), acks and silences mirrored to
Alertmanager (`mirror`), each sink's own behaviour in tests/delivery/sinks/. The same through a real Celery worker: tests/delivery/test_sinks_worker.py."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from dashboard.delivery import mirror, notify, transports
from dashboard.delivery import sinks as sinks_registry
from dashboard.delivery.models import Notification, Webhook
from dashboard.delivery.sinks.alertmanager import Alertmanager
from dashboard.delivery.sinks.pagerduty import PagerDuty
from dashboard.detection import incidents, lifecycle
from dashboard.detection.models import Alert, Incident, Silence
from tests.delivery.pipeline import LATER, ROUTING_KEY, apply, crash, deliver, run, sinks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_one_incident_with_three_alerts_is_one_page_per_sink_updated_as_it_grows(run, sinks, settings):
    settings.LOCKSTEP_PUBLIC_URL = "https://lockstep.example"
    apply(run, crash(2))
    assert len(deliver()) == 4  # opened: at once
    apply(run, crash(0, cause=2))
    assert deliver(timedelta(seconds=5)) == []  # growth only: rate-limited, not a page per alert
    apply(run, crash(1, cause=2))
    assert deliver(timedelta(seconds=5)) == []
    assert len(deliver(LATER)) == 4  # one update per sink, with both consequences
    [incident] = Incident.objects.filter(run=run)
    assert incident.alerts.count() == 3 and incident.root.kind == "rank_silent"

    slack, am, pd, js = (sinks[k] for k in ("slack", "alertmanager", "pagerduty", "json"))
    first, update = slack.bodies()
    assert first["text"].startswith("[CRITICAL] rank_silent on rank 2 in run job-1 (step 7): rank 2 went silent")
    assert "[+2 consequences]" in update["text"] and update["lockstep"] == {
        "incident": incident.id,
        "revision": incident.revision,
    }
    folded = next(f for f in update["attachments"][0]["fields"] if f["title"] == "consequences (2)")["value"]
    assert folded.count("• rank_crashed on ") == 2 and "lost its peer" in folded

    [firing] = am.active()
    assert len(am.alerts) == 1 and firing["labels"] == {
        "alertname": "rank_silent",
        "project": run.project.name,
        "run": "job-1",
        "incident": str(incident.id),
        "kind": "rank_silent",
        "severity": "critical",
        "ranks": "2",
    }
    assert firing["annotations"]["alerts"] == "3" and firing["annotations"]["consequences"].count("\n") == 1
    assert firing["generatorURL"] == f"https://lockstep.example/runs/job-1/#alert-{incident.root_id}"
    assert (
        timezone.now()
        < datetime.fromisoformat(firing["endsAt"].replace("Z", "+00:00"))
        <= timezone.now() + Alertmanager.HOLD
    )  # short: a Lockstep that stops leaves nothing held for a day

    assert [e["event_action"] for e in pd.bodies()] == ["trigger", "trigger"]
    assert {e["dedup_key"] for e in pd.bodies()} == {f"lockstep-incident-{incident.id}"}
    assert pd.bodies()[1]["payload"]["custom_details"]["consequences_total"] == 2

    assert [b["incident"]["id"] for b in js.bodies()] == [incident.id] * 2
    assert [h["Idempotency-Key"] for _, h, _ in js.requests] == [
        f"lockstep-incident-{incident.id}-{r}" for r in (incident.revision - 2, incident.revision)
    ]
    for _, headers, raw in js.requests:
        assert headers["X-Lockstep-Signature"] == "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
    assert Notification.objects.filter(state="superseded").count() == 4  # the first growth, replaced by the second


def test_ack_acknowledges_in_pagerduty_and_silences_in_alertmanager_and_one_dedup_key_to_the_resolve(run, sinks):
    am, pd = sinks["alertmanager"], sinks["pagerduty"]
    apply(run, crash(2))
    deliver()
    incident = Incident.objects.get(run=run)
    user = User.objects.create_user("oncall")
    with transaction.atomic():
        incidents.acknowledge(incident, user)
    deliver()  # an ack is a new page: at once, not rate-limited
    assert pd.incidents == {f"lockstep-incident-{incident.id}": "acknowledged"}
    [silence] = am.active_silences()
    assert {(m["name"], m["value"]) for m in silence["matchers"]} == {
        ("project", run.project.name),
        ("incident", str(incident.id)),
    }
    assert "acknowledged in Lockstep by oncall" in silence["comment"]
    assert am.active()[0]["annotations"]["acknowledged_by"] == "oncall"

    with transaction.atomic():
        incidents.unacknowledge(Incident.objects.get(id=incident.id))
    deliver()
    assert am.active_silences() == [] and am.deletes == [f"/api/v2/silence/{silence['id']}"]

    apply(run, clean=[("rank_silent", "rank:2")])  # the rank came back
    deliver()
    assert pd.incidents == {f"lockstep-incident-{incident.id}": "resolved"}
    actions = [(e["event_action"], e["dedup_key"]) for e in pd.bodies()]
    assert actions == [
        ("trigger", f"lockstep-incident-{incident.id}"),
        ("acknowledge", f"lockstep-incident-{incident.id}"),
        ("trigger", f"lockstep-incident-{incident.id}"),
        ("resolve", f"lockstep-incident-{incident.id}"),
    ]
    assert am.active() == [] and "[RESOLVED]" in sinks["slack"].bodies()[-1]["text"]


def test_a_lockstep_silence_is_mirrored_to_alertmanager_until_it_expires_and_resolves_still_reach_the_pager(
    run, sinks, project
):
    am, pd, slack = sinks["alertmanager"], sinks["pagerduty"], sinks["slack"]
    apply(run, crash(2))
    deliver()
    until = timezone.now() + timedelta(hours=2)
    silence = Silence.objects.create(project=project, kind="rank_silent", comment="node under repair", expires_at=until)
    for row in mirror.plan_project(project.id):  # what the silence's post_save queues after commit
        mirror.sync(row)
    [mirrored] = am.active_silences()
    assert mirrored["endsAt"] == transports.rfc3339(until) and "node under repair" in mirrored["comment"]

    apply(run, crash(0, cause=2))  # grows while silenced: Slack hears nothing, the pagers keep their object fresh
    deliver(LATER)
    assert len(slack.requests) == 1 and len(pd.requests) == 2

    silence.expires_at = timezone.now()  # expired early, by hand
    silence.save()
    for row in mirror.plan_project(project.id):
        mirror.sync(row)
    assert am.active_silences() == [] and len(am.deletes) == 1

    Silence.objects.create(project=project, kind="rank_silent", comment="again", expires_at=until)
    apply(run, clean=[("rank_silent", "rank:2"), ("rank_crashed", "rank:0")])
    deliver()  # silenced, but the resolve reaches every destination told it fired
    assert list(pd.incidents.values()) == ["resolved"] and am.active() == []
    assert "[RESOLVED]" in slack.bodies()[-1]["text"]


def test_the_end_of_a_run_closes_its_acknowledged_incident_at_every_sink_as_ended_unresolved(run, sinks):
    apply(run, crash(2))
    deliver()
    with transaction.atomic():
        incidents.acknowledge(Incident.objects.get(run=run), User.objects.create_user("oncall"))
    deliver()
    assert len(sinks["alertmanager"].active_silences()) == 1
    with transaction.atomic():
        lifecycle.end_of_run(run)
    deliver()
    incident = Incident.objects.get(run=run)
    assert incident.state == "ended_unresolved" and incident.root.resolve_reason == "run ended"
    assert list(sinks["pagerduty"].incidents.values()) == ["resolved"]  # nothing left to page about
    assert sinks["alertmanager"].active() == [] and sinks["alertmanager"].active_silences() == []
    assert "[CRITICAL, RUN ENDED UNRESOLVED]" in sinks["slack"].bodies()[-1]["text"]  # not "[RESOLVED]"
    assert sinks["json"].bodies()[-1]["incident"]["state"] == "ended_unresolved"


def test_alerts_themselves_page_nobody(run, sinks):
    alert, _ = lifecycle.record(run, crash(1))  # an alert outside any incident (not placed)
    assert notify.deliver(alert.id) is None and Alert.objects.get(id=alert.id).notified_revision == alert.revision
    assert deliver() == [] and all(not r.requests for r in sinks.values())


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"kind": "pagerduty"}, "routing key"),
        ({"kind": "alertmanager"}, "needs a URL"),
        ({"kind": "slack", "url": "https://hooks.example/x", "secret": "x"}, "takes no secret"),
    ],
)
def test_a_destination_missing_what_its_kind_needs_is_refused_in_the_admin(client, project, fields, error):
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    form = {"project": project.id, "url": "", "secret": "", "active": "on", **fields}
    response = client.post("/admin/delivery/webhook/add/", form)
    assert response.status_code == 200 and error in response.content.decode()
    assert not Webhook.objects.exists()


def test_the_admin_never_shows_a_secret_and_keeps_it_when_left_empty(client, project):
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    form = {"project": project.id, "kind": "pagerduty", "url": "", "secret": ROUTING_KEY, "active": "on"}
    assert client.post("/admin/delivery/webhook/add/", form).status_code == 302
    hook = Webhook.objects.get()
    assert hook.secret == ROUTING_KEY
    assert ROUTING_KEY not in client.get(f"/admin/delivery/webhook/{hook.id}/change/").content.decode()
    assert ROUTING_KEY not in client.get("/admin/delivery/webhook/").content.decode()
    assert client.post(f"/admin/delivery/webhook/{hook.id}/change/", {**form, "secret": ""}).status_code == 302
    hook.refresh_from_db()
    assert hook.secret == ROUTING_KEY
    assert isinstance(sinks_registry.for_webhook(hook), PagerDuty)
    cleared = {**form, "kind": "json", "url": "https://93.184.215.14/in", "secret": "", "clear_secret": "on"}
    assert client.post(f"/admin/delivery/webhook/{hook.id}/change/", cleared).status_code == 302
    hook.refresh_from_db()
    assert (hook.kind, hook.secret) == ("json", "")
    assert PagerDuty.default_url == "https://events.pagerduty.com/v2/enqueue"
