"""What a page says at every destination (issue 52, item 6): the incident's remedy, as the run page
says it, and an acknowledgement update that says who acknowledged (was: the same words as the page it
updated, under a new bracket)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from dashboard.detection import incidents
from dashboard.detection.models import Incident
from dashboard.detection.remedies import INCIDENT_REMEDIES
from tests.delivery.pipeline import apply, crash, deliver, run, sinks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

REMEDY = f"{INCIDENT_REMEDIES['rank_silent']} (docs/alerts.md#rank_silent)"


def slack_field(body: dict, title: str) -> str:
    return next(f["value"] for f in body["attachments"][0]["fields"] if f["title"] == title)


def test_every_sink_carries_the_remedy(run, sinks):
    apply(run, crash(2))
    assert len(deliver()) == 4
    [page] = sinks["slack"].bodies()
    assert slack_field(page, "what to do") == REMEDY
    assert sinks["alertmanager"].active()[0]["annotations"]["remedy"] == REMEDY
    [trigger] = sinks["pagerduty"].bodies()
    assert trigger["payload"]["custom_details"]["remedy"]["text"] == INCIDENT_REMEDIES["rank_silent"]
    assert sinks["json"].bodies()[0]["incident"]["remedy"]["doc"] == "docs/alerts.md#rank_silent"


def test_an_acknowledgement_update_says_who_acknowledged(run, sinks):
    apply(run, crash(2))
    deliver()
    incident = Incident.objects.get(run=run)
    with transaction.atomic():
        incidents.acknowledge(incident, User.objects.create_user("oncall"))
    deliver()
    with transaction.atomic():
        incidents.unacknowledge(Incident.objects.get(id=incident.id))
    deliver()
    opened, acked, unacked = (body["text"] for body in sinks["slack"].bodies())
    assert opened.startswith("[CRITICAL] rank_silent on rank 2")
    assert acked.startswith(f"[CRITICAL ACKED by oncall] oncall acknowledged incident #{incident.id}: rank_silent")
    assert unacked.startswith(f"[CRITICAL] Incident #{incident.id} is no longer acknowledged: rank_silent")


def test_with_a_public_url_every_sinks_remedy_links_to_its_kinds_section_of_the_served_reference(run, sinks, settings):
    """The pointer `docs/alerts.md#kind` is a file nobody paged has open: with LOCKSTEP_PUBLIC_URL set,
    the sinks give the section of the alert reference this server serves (docs/alerts.md, rendered)."""
    settings.LOCKSTEP_PUBLIC_URL = "https://lockstep.example"
    url = "https://lockstep.example/alerts/reference/#rank_silent"
    apply(run, crash(2))
    assert len(deliver()) == 4
    linked = f"{INCIDENT_REMEDIES['rank_silent']} ({url})"
    assert slack_field(sinks["slack"].bodies()[0], "what to do") == linked
    assert sinks["alertmanager"].active()[0]["annotations"]["remedy"] == linked
    assert sinks["pagerduty"].bodies()[0]["payload"]["custom_details"]["remedy"]["url"] == url
    assert sinks["json"].bodies()[0]["incident"]["remedy"] == {
        "text": INCIDENT_REMEDIES["rank_silent"],
        "doc": "docs/alerts.md#rank_silent",
        "url": url,
    }
