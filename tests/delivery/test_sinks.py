"""Alertmanager, PagerDuty and JSON webhooks behind the transport seam, each against a local receiver
that speaks its API (tests/delivery/receivers.py). Alerts are raised by the real pipeline: batches
through the ingest view, slots settled by detection, notifications queued and sent by delivery's
outbox (retries included). The same through a real Celery worker: tests/delivery/test_sinks_worker.py."""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dashboard.delivery import notifications, notify, transports
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection import settle
from dashboard.detection.models import Alert, Silence
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Run
from tests.conftest import make_batch
from tests.delivery.receivers import AlertmanagerReceiver, JsonReceiver, PagerDutyReceiver

pytestmark = pytest.mark.django_db

ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


@pytest.fixture
def alertmanager():
    r = AlertmanagerReceiver()
    yield r
    r.close()


@pytest.fixture
def pagerduty():
    r = PagerDutyReceiver(ROUTING_KEY)
    yield r
    r.close()


@pytest.fixture
def json_receiver():
    r = JsonReceiver()
    yield r
    r.close()


def steps(post, dissent: dict[int, set[int]], run: str = "sinks", world_size: int = 5) -> None:
    """Grad reports of `world_size` ranks for the steps in `dissent` (step -> ranks that differ), settled."""
    for rank in range(world_size):
        events = [{"t": "grad", "step": s, "fps": [s, 7 if rank in bad else 0]} for s, bad in dissent.items()]
        session = f"s-{run}-{rank}-{min(dissent)}"
        response = post(make_batch(run=run, rank=rank, events=events, world_size=world_size, session=session))
        assert response.status_code == 200, response.content
    for slot in GradSlot.objects.filter(run__key=run, settled_at__isnull=True).order_by("step"):
        settle.settle_grad(slot.id)


def deliver() -> list[int]:
    """What the delivery task does for every pending revision, then one attempt per notification."""
    notes = [n for alert_id in notify.pending() for n in notify.deliver(alert_id)]
    for note in notes:
        notifications.send(note)
    return notes


def retry_due(minutes: int = 1) -> None:
    """What the sweep does for notifications whose backoff has passed (time moved on `minutes`)."""
    later = timezone.now() + timedelta(minutes=minutes)
    for note in notifications.due(later):
        notifications.send(note, later)


def test_alertmanager_gets_routable_labels_a_changed_label_set_ended_and_endsAt_on_resolve(post, project, alertmanager,
                                                                                           settings):
    settings.LOCKSTEP_PUBLIC_URL = "https://lockstep.example"
    Webhook.objects.create(project=project, kind="alertmanager", url=alertmanager.url + "/")
    steps(post, {0: {1}})
    alertmanager.fail_next = 1
    [note] = deliver()
    assert Notification.objects.get(id=note).state == "pending" and not alertmanager.alerts  # refused: retried later
    retry_due()
    alert = Alert.objects.get(kind="grad_divergence")
    [firing] = alertmanager.active()
    assert firing["labels"] == {"alertname": "grad_divergence", "project": project.name, "run": "sinks",
                                "kind": "grad_divergence", "subject": alert.subject, "severity": "critical",
                                "ranks": "1"}
    assert firing["annotations"]["description"] == alert.message and firing["annotations"]["step"] == "0"
    assert firing["generatorURL"] == f"https://lockstep.example/runs/sinks/#alert-{alert.id}"
    first_request, retry = [b for _, _, b in alertmanager.requests]
    assert first_request == retry  # the retry is the same alert, byte for byte

    steps(post, {1: {1, 2}})  # rank 2 joins: a new revision with another label set
    deliver()
    [grown] = alertmanager.active()
    assert grown["labels"]["ranks"] == "1-2"
    assert len(alertmanager.alerts) == 2  # the old label set was ended, not left to linger

    steps(post, {2: set()})  # a clean step resolves it
    deliver()
    assert alertmanager.active() == []
    alert.refresh_from_db()
    resolved = alertmanager.alerts[frozenset(grown["labels"].items())]
    assert alert.state == "resolved" and resolved["endsAt"] == alert.resolved_at.isoformat().replace("+00:00", "Z")


def test_pagerduty_keeps_one_dedup_key_across_retries_revisions_and_the_resolve(post, project, pagerduty):
    Webhook.objects.create(project=project, kind="pagerduty", url=pagerduty.url + "/v2/enqueue", secret=ROUTING_KEY)
    steps(post, {0: {3}})
    pagerduty.fail_next, pagerduty.fail_status = 2, 429  # PagerDuty's rate limit: retried with backoff
    deliver()
    retry_due(1)
    retry_due(2)
    steps(post, {1: {3, 4}})
    deliver()
    steps(post, {2: set()})
    deliver()
    events = pagerduty.bodies()
    assert [e["event_action"] for e in events] == ["trigger"] * 4 + ["resolve"]
    assert len({e["dedup_key"] for e in events}) == 1
    [key] = pagerduty.incidents
    assert pagerduty.incidents[key] == "resolved"
    trigger = events[2]
    assert trigger["routing_key"] == ROUTING_KEY and trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["source"] == f"{project.name}/sinks" and trigger["payload"]["class"] == "grad_divergence"
    assert trigger["payload"]["custom_details"]["ranks"] == [3]
    assert events[3]["payload"]["custom_details"]["ranks"] == [3, 4]
    assert Notification.objects.filter(state="sent").count() == 3
    assert list(Notification.objects.values_list("receipt", flat=True)) == [{"dedup_key": key}] * 3


def test_pagerduty_refusing_an_event_is_retried_and_recorded(post, project, pagerduty):
    Webhook.objects.create(project=project, kind="pagerduty", url=pagerduty.url + "/v2/enqueue", secret="not-the-key")
    steps(post, {0: {1}})
    deliver()
    note = Notification.objects.get()
    assert note.state == "pending" and note.attempts == 1 and "400" in note.last_error and not pagerduty.incidents


def test_json_webhook_posts_the_alert_signed_with_one_idempotency_key_per_revision(post, project, json_receiver):
    Webhook.objects.create(project=project, kind="json", url=json_receiver.url + "/hooks/lockstep", secret="s3cret")
    steps(post, {0: {2}})
    json_receiver.fail_next = 1
    deliver()
    retry_due()
    steps(post, {1: set()})
    deliver()
    (path, h1, raw1), (_, h2, raw2), (_, h3, raw3) = json_receiver.requests
    alert = Alert.objects.get()
    assert path == "/hooks/lockstep"
    assert h1["Idempotency-Key"] == h2["Idempotency-Key"] == f"lockstep-{alert.id}-1" != h3["Idempotency-Key"]
    for headers, raw in ((h1, raw1), (h3, raw3)):
        assert headers["X-Lockstep-Signature"] == "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
    firing, resolved = json.loads(raw1), json.loads(raw3)
    assert firing["project"] == project.name and firing["revision"] == 1
    assert (firing["alert"]["kind"], firing["alert"]["state"], firing["alert"]["ranks"]) == ("grad_divergence", "firing", [2])
    assert resolved["alert"]["state"] == "resolved" and resolved["alert"]["id"] == alert.id


def test_a_resolve_reaches_the_destinations_told_it_fired_even_when_silenced_meanwhile(post, project, pagerduty,
                                                                                     json_receiver):
    Webhook.objects.create(project=project, kind="pagerduty", url=pagerduty.url + "/v2/enqueue", secret=ROUTING_KEY)
    steps(post, {0: {1}})
    deliver()
    Webhook.objects.create(project=project, kind="json", url=json_receiver.url)  # never told it fired
    Silence.objects.create(project=project, kind="grad_divergence", comment="known node",
                           expires_at=timezone.now() + timedelta(hours=1))
    steps(post, {1: {1, 2}})  # news, but silenced: nobody hears
    deliver()
    assert [e["event_action"] for e in pagerduty.bodies()] == ["trigger"]
    steps(post, {2: set()})
    deliver()
    assert [e["event_action"] for e in pagerduty.bodies()] == ["trigger", "resolve"]
    assert list(pagerduty.incidents.values()) == ["resolved"] and json_receiver.requests == []


def test_a_run_wide_alert_has_no_ranks_label(project):
    run_wide = Alert(run=Run(key="r", world_size=2, project=project), kind="recompile_storm", subject="compile-share",
                     severity="warning", ranks=[])
    labels = transports.Alertmanager(Webhook(kind="alertmanager")).labels(run_wide)
    assert "ranks" not in labels and labels["subject"] == "compile-share" and labels["severity"] == "warning"


def test_rank_labels_are_ranges_cut_to_a_bounded_length():
    assert transports.rank_ranges([5, 1, 3, 2, 9, 8], 64) == "1-3,5,8-9"
    assert transports.rank_ranges([], 64) == ""
    label = transports.rank_ranges(list(range(0, 2048, 2)), 40)
    assert len(label) <= 48 and label.startswith("0,2,4,") and label.endswith(f",+{1024 - label.count(',')}")


@pytest.mark.parametrize("fields, error", [
    ({"kind": "pagerduty"}, "routing key"),
    ({"kind": "alertmanager"}, "needs a URL"),
    ({"kind": "slack", "url": "https://hooks.example/x", "secret": "x"}, "takes no secret"),
])
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
    assert isinstance(transports.for_webhook(hook), transports.PagerDuty)
    cleared = {**form, "kind": "json", "url": "https://hooks.example/in", "secret": "", "clear_secret": "on"}
    assert client.post(f"/admin/delivery/webhook/{hook.id}/change/", cleared).status_code == 302
    hook.refresh_from_db()
    assert (hook.kind, hook.secret) == ("json", "")
    assert transports.PagerDuty(Webhook(kind="pagerduty")).webhook.url == "" and \
        transports.PagerDuty.EVENTS_URL == "https://events.pagerduty.com/v2/enqueue"
