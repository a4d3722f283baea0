"""Alert lifecycle in PostgreSQL: firing -> resolved, counts, ack expiry, silences, inhibition,
webhook notifications once per revision (against a tiny local HTTP receiver)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from dashboard.delivery import notifications, notify
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection import lifecycle, runs, settle
from dashboard.detection.models import Alert, Baseline, Silence
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def grads(post, run="life", steps=range(3), bad_steps=(1,), bad_rank=1, world_size=3, session_tag="", weights=()):
    """Each rank's grads (rank `bad_rank` dissenting at `bad_steps`) and, at the steps `weights`
    names, weight fingerprints that agree; every slot settled in step order."""
    for rank in range(world_size):
        events = [
            {"t": "grad", "step": s, "fps": [s, 7 if (rank == bad_rank and s in bad_steps) else 0]} for s in steps
        ]
        events += [{"t": "param", "step": s, "fps": [s, 1]} for s in weights]
        response = post(
            make_batch(
                run=run, rank=rank, seq=0, events=events, world_size=world_size, session=f"s-{run}-{rank}{session_tag}"
            )
        )
        assert response.status_code == 200, response.content
    for slot in GradSlot.objects.filter(run__key=run).order_by("step", "group"):
        settle.settle_grad(slot.id)


def test_a_clean_gradient_step_does_not_clear_a_divergence_agreeing_weights_do_and_it_refires_as_news(post):
    grads(post, steps=range(3), bad_steps=(1,))
    alert = Alert.objects.get(kind="grad_divergence")
    assert alert.state == "firing"  # rank 1 applied another gradient: its weights may differ from now on
    grads(post, steps=[3], bad_steps=(), weights=[3], session_tag="w")
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_at is not None
    revision = alert.revision
    grads(post, steps=range(4, 6), bad_steps=(5,), session_tag="b")
    alert.refresh_from_db()
    assert alert.state == "firing" and alert.revision == revision + 1 and alert.count == 2
    assert alert.step == 1  # first step involved stays the first


def test_an_earlier_clean_step_settling_late_does_not_resolve(post):
    grads(post, steps=[5], bad_steps=(5,))
    grads(post, steps=[4], bad_steps=(), session_tag="late")
    assert Alert.objects.get().state == "firing"


def test_ack_expires_on_resolve(post):
    grads(post, steps=[0], bad_steps=(0,))
    alert = Alert.objects.get()
    lifecycle.acknowledge(alert, User.objects.create_user("oncall"))
    assert Alert.objects.get().acked_by.username == "oncall"
    grads(post, steps=[1], bad_steps=(), weights=[1], session_tag="b")
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.acked_by is None and alert.acked_at is None


@pytest.fixture
def receiver(settings):
    """A tiny local webhook receiver: the one outside edge faked here (on 127.0.0.1, allowed)."""
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True
    received: list[dict] = []
    fail_first = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if fail_first["n"] > 0:
                fail_first["n"] -= 1
                self.send_response(503)
            else:
                received.append(body)
                self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received, fail_first
    server.shutdown()
    server.server_close()


def deliver_all() -> list[int]:
    """Alerts to websockets, then their incidents' pages (only incidents page)."""
    for alert_id in notify.pending():
        notify.deliver(alert_id)
    return [note for incident_id in notify.pending_incidents() for note in notify.deliver_incident(incident_id)[0]]


def test_webhook_gets_each_revision_once_even_when_retried(post, project, receiver):
    url, received, fail_first = receiver
    Webhook.objects.create(project=project, url=url)
    grads(post, steps=[0], bad_steps=(0,))
    notes = deliver_all()
    assert len(notes) == 1 and deliver_all() == []  # delivered revisions are not re-queued
    fail_first["n"] = 1
    assert notifications.send(notes[0]) is False  # rescheduled in its row, for the sweep
    failed = Notification.objects.get()
    assert failed.state == "pending" and failed.attempts == 1 and "503" in failed.last_error
    assert notifications.send(notes[0]) and notifications.send(
        notes[0]
    )  # retry delivers; a redelivered task is a no-op
    assert len(received) == 1
    assert received[0]["text"].startswith("[CRITICAL] grad_divergence on rank 1")
    assert Notification.objects.get().state == "sent"


def test_silenced_alerts_are_stored_but_not_sent(post, project, receiver):
    url, received, _ = receiver
    Webhook.objects.create(project=project, url=url)
    Silence.objects.create(
        project=project,
        kind="grad_divergence",
        rank=1,
        comment="known flaky node",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    grads(post, steps=[0], bad_steps=(0,))
    assert deliver_all() == []
    alert = Alert.objects.get()
    assert notify.message(alert)["alert"]["silenced"] is True


def test_expired_or_non_matching_silences_do_not_mute(post, project):
    Silence.objects.create(
        project=project, kind="grad_divergence", comment="old", expires_at=timezone.now() - timedelta(minutes=1)
    )
    Silence.objects.create(
        project=project, rank=2, comment="other rank", expires_at=timezone.now() + timedelta(hours=1)
    )
    grads(post, steps=[0], bad_steps=(0,))
    assert notify.message(Alert.objects.get())["alert"]["silenced"] is False


def test_silent_rank_is_flagged_inhibits_its_alerts_and_resolves_on_return(post, settings):
    grads(post, steps=[0], bad_steps=(0,))
    run = Run.objects.get(key="life")
    Rank.objects.filter(run=run, rank=1).update(
        last_seen=timezone.now() - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER + 5)
    )
    runs.check(run)
    silent = Alert.objects.get(kind="rank_silent")
    assert silent.ranks == [1] and silent.state == "firing"
    assert notify.message(Alert.objects.get(kind="grad_divergence"))["alert"]["inhibited"] is True
    assert (
        post(make_batch(run="life", rank=1, seq=1, session="s-life-1", events=[{"t": "heartbeat"}])).status_code == 200
    )
    runs.check(run)
    silent.refresh_from_db()
    assert silent.state == "resolved"


def test_baseline_divergence_names_the_first_differing_step(post):
    grads(post, run="base", steps=range(3), bad_steps=())
    grads(post, run="cand", steps=range(3), bad_steps=())
    GradSlot.objects.filter(run__key="base", step=2).update(consensus={"reference": [2, 99], "tie": False})
    GradSlot.objects.filter(run__key="cand").update(settled_at=None)
    Baseline.objects.create(run=Run.objects.get(key="cand"), baseline=Run.objects.get(key="base"))
    layout = {"params": ["ddp:a.weight", "ddp:b.weight", "ddp:b.bias"], "buckets": [[0], [1, 2]]}
    Rank.objects.filter(run__key="cand").update(info=layout)  # as the ranks' second rank_start leaves it
    for slot in GradSlot.objects.filter(run__key="cand").order_by("step"):
        settle.settle_grad(slot.id)
    alert = Alert.objects.get(kind="baseline_divergence")
    assert (alert.step, alert.details["buckets"], alert.details["baseline"]) == (2, [1], "base")
    assert alert.details["bucket_params"] == {"1": ["b.weight", "b.bias"]}


def test_a_sweep_that_clears_a_subject_per_rank_resolves_only_the_matching_firing_alerts_in_few_queries(
    post, django_assert_max_num_queries
):
    from django.db import transaction

    grads(post, steps=range(2), bad_steps=(1,))
    grads(post, run="other", steps=range(2), bad_steps=(0,))
    alert = Alert.objects.get(run__key="life", kind="grad_divergence")
    other = Alert.objects.get(run__key="other", kind="grad_divergence")
    run = Run.objects.get(key="life")
    clean = [("rank_silent", f"rank:{r}") for r in range(100_000)] + [("grad_divergence", "group:x")]
    with transaction.atomic(), django_assert_max_num_queries(1) as captured:  # nothing firing matches: one read
        assert lifecycle.resolve(run, clean, None) == []
    assert len(captured.captured_queries[0]["sql"]) < 1000  # not a condition per clean subject
    with transaction.atomic(), django_assert_max_num_queries(3):  # the read, the lock, the one update
        resolved = lifecycle.resolve(run, [*clean, (alert.kind, alert.subject)], None)
    assert [a.id for a in resolved] == [alert.id]
    alert.refresh_from_db()
    other.refresh_from_db()
    assert alert.state == "resolved" and other.state == "firing"  # another run's alert of that subject stays
