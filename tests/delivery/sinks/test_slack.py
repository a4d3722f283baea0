"""The Slack sink against a tiny local receiver, the body pinned byte for byte (receivers parse it, and
the format must not drift when sinks are added or moved)."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from dashboard.delivery.models import Webhook
from dashboard.delivery.sinks.slack import SlackWebhook
from dashboard.delivery.transports import TransportError
from dashboard.detection import lifecycle
from dashboard.detection.models import Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.delivery.receivers import SlackReceiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    r = SlackReceiver()
    yield r
    r.close()


@pytest.fixture
def incident(project) -> Incident:
    """rank 2 went silent at step 12; rank 0 lost its connection to it."""
    run = Run.objects.create(project=project, key="r-1", world_size=3)
    with transaction.atomic():
        lifecycle.apply(
            run,
            [
                Finding(
                    "critical",
                    (2,),
                    "rank 2 went silent",
                    step=12,
                    frame="model.py:46:forward",
                    kind="rank_silent",
                    subject="rank:2",
                ),
                Finding(
                    "warning",
                    (0,),
                    "rank 0: Connection reset by peer",
                    step=12,
                    kind="rank_crashed",
                    subject="rank:0",
                    details={"consequence_of": 2},
                ),
            ],
            [],
            None,
        )
    return Incident.objects.select_related("run__project", "root").get(run=run)


def test_slack_posts_one_message_titled_by_the_root_with_the_consequences_folded(receiver, incident, settings):
    settings.LOCKSTEP_PUBLIC_URL = "https://lockstep.example"
    SlackWebhook(Webhook(url=receiver.url + "/hook")).notify(incident, "lockstep-incident-7-2")
    [(path, headers, body)] = receiver.requests
    assert path == "/hook" and headers["Idempotency-Key"] == "lockstep-incident-7-2"
    assert headers["Content-Type"] == "application/json"
    assert (
        body
        == json.dumps(
            {
                "text": "[CRITICAL] rank_silent on rank 2 in run r-1 (step 12) [+1 consequences]: rank 2 went silent",
                "attachments": [
                    {
                        "color": "#c62828",
                        "title": "rank_silent · ranks 2 · r-1",
                        "title_link": "https://lockstep.example/runs/r-1/",
                        "text": "rank 2 went silent",
                        "fields": [
                            {"title": "ranks", "value": "2", "short": True},
                            {"title": "step", "value": "12", "short": True},
                            {"title": "frame", "value": "model.py:46:forward", "short": False},
                            {
                                "title": "what to do",
                                "value": "look at that rank's host (py-spy, Flight Recorder): the other ranks wait"
                                " for it (https://lockstep.example/alerts/reference/#rank_silent)",
                                "short": False,
                            },
                            {
                                "title": "consequences (1)",
                                "value": "• rank_crashed on 0: rank 0: Connection reset by peer",
                                "short": False,
                            },
                        ],
                    }
                ],
                "lockstep": {"incident": incident.id, "revision": incident.revision},
            }
        ).encode()
    )
    assert b'"title": "rank_silent \\u00b7 ranks 2 \\u00b7 r-1"' in body  # ASCII-escaped, default separators


def test_a_resolved_incident_without_public_url(receiver, incident, settings):
    settings.LOCKSTEP_PUBLIC_URL = ""
    incident.state = Incident.State.RESOLVED
    SlackWebhook(Webhook(url=receiver.url)).notify(incident, "k")
    sent = receiver.bodies()[0]
    assert sent["text"].startswith("[RESOLVED] rank_silent")
    assert sent["attachments"][0]["color"] == "#2e7d32" and sent["attachments"][0]["title_link"] == ""


def test_failing_receiver_raises_transport_error(receiver, incident):
    receiver.fail_next = 1
    with pytest.raises(TransportError, match="503"):
        SlackWebhook(Webhook(url=receiver.url)).notify(incident, "k")
    assert len(receiver.requests) == 1


def test_unreachable_receiver_raises_transport_error(incident):
    with pytest.raises(TransportError):
        SlackWebhook(Webhook(url="http://127.0.0.1:1/hook")).notify(incident, "k")  # nothing listens on port 1


def test_a_later_revision_of_a_page_slack_was_sent_says_it_updates_that_incident(incident):
    """A cause that arrives after its symptom re-roots the incident: the channel reads an update of the
    page it has, not a second page."""
    rerooted = SlackWebhook.payload(incident, {"page": {"root": incident.root_id + 100, "state": "firing"}})
    assert rerooted["text"].startswith(f"[CRITICAL] Update of incident #{incident.id}, its cause found: rank_silent")
    grown = SlackWebhook.payload(incident, {"page": {"root": incident.root_id, "state": "firing"}})
    assert grown["text"].startswith(f"[CRITICAL] Update of incident #{incident.id}: rank_silent")
    assert SlackWebhook.payload(incident)["text"].startswith("[CRITICAL] rank_silent")  # the first page


def test_slack_takes_no_secret_and_its_url_is_its_key():
    assert SlackWebhook.problem("https://hooks.example/x", "s") == {
        "secret": "a Slack-compatible webhook takes no secret"
    }
    assert SlackWebhook.problem("", "") == {"url": "a Slack-compatible webhook needs a URL"}
    assert SlackWebhook.url_is_credential and not SlackWebhook.stateful
