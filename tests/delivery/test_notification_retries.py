"""Webhook notifications are never lost (issue 17, item 4): the sweep re-queues every pending one
that is due, with attempts and a backoff up to hours, and one that gives up is `failed`, visible
on the incident's alerts. Time is simulated (`now=`); the drill of a receiver down for an hour is in
tests/security/test_receiver_outage.py."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from dashboard.delivery import notifications, notify
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection import lifecycle
from dashboard.detection.models import Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import ProjectToken, Run

pytestmark = pytest.mark.django_db


class Receiver:
    """A Slack-compatible receiver (the outside edge) that can be down: it answers 503 while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.received: list[dict] = []
        self.refused = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.down:
                    receiver.refused += 1
                    self.send_response(503)
                else:
                    receiver.received.append(body)
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True  # it listens on 127.0.0.1
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def incident(project, receiver) -> Incident:
    Webhook.objects.create(project=project, url=receiver.url)
    run = Run.objects.create(project=project, key="hooked", world_size=2)
    with transaction.atomic():
        lifecycle.apply(
            run,
            [Finding("critical", (1,), "rank 1 diverged", step=0, kind="grad_divergence", subject="grad:ddp")],
            [],
            None,
        )
    return Incident.objects.get(run=run)


def sweep(now) -> int:
    """What the beat sweep's webhook part does at `now` (the tasks run inline: one attempt each)."""
    ids = notifications.due(now)
    for note_id in ids:
        notifications.send(note_id, now)
    return len(ids)


def test_a_send_lost_after_commit_is_picked_up_by_the_sweep(incident, receiver):
    assert len(notify.deliver_incident(incident.id)[0]) == 1  # the notification row committed; its task never queued
    assert sweep(timezone.now()) == 1
    assert len(receiver.received) == 1 and Notification.objects.get().state == "sent"
    assert sweep(timezone.now() + timedelta(days=1)) == 0  # sent once, never again


def test_the_backoff_grows_to_hours_and_a_notification_that_gives_up_is_shown_failed(incident, receiver, project):
    assert notifications.backoff(1) == notifications.BACKOFF_FIRST
    assert notifications.backoff(30) == notifications.BACKOFF_MAX >= timedelta(hours=1)
    notify.deliver_incident(incident.id)
    receiver.down = True
    now = timezone.now()
    for _ in range(notifications.MAX_ATTEMPTS):
        now = Notification.objects.get().next_attempt_at
        assert sweep(now) == 1
    assert Notification.objects.get().state == "failed" and receiver.refused == notifications.MAX_ATTEMPTS
    assert sweep(now + timedelta(days=7)) == 0
    token = ProjectToken.issue(project)
    [shown] = Client().get("/api/v1/runs/hooked/alerts", HTTP_AUTHORIZATION=f"Bearer {token}").json()["alerts"]
    assert shown["webhooks"] == {"pending": 0, "sent": 0, "failed": 1}
    member = User.objects.create_user("hank")
    project.members.add(member)
    page = Client()
    page.force_login(member)
    assert "webhook delivery failed (1)" in page.get("/alerts/").content.decode()


def test_a_sweep_while_workers_are_down_queues_each_notification_once_a_lease(incident):
    notify.deliver_incident(incident.id)
    now = timezone.now()
    assert notifications.due(now) and not notifications.due(now + timedelta(seconds=2))
    assert notifications.due(now + notifications.QUEUE_LEASE + timedelta(seconds=1))
