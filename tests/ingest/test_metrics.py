"""/metrics: Prometheus text with request outcomes, events, slots waiting, settle latency, queue depth."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.detection import settle
from dashboard.ledger.models import GradSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def public_metrics(settings):
    """These tests read /metrics without a token (refusing it by default: tests/security/test_edge.py)."""
    settings.LOCKSTEP_METRICS_PUBLIC = True


def scrape(client) -> dict[tuple, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counts_accepted_and_rejected_batches_and_events(client, post):
    before = scrape(client)
    assert post(make_batch(events=[{"t": "grad", "step": 0, "fps": [1]}, {"t": "step", "step": 0}])).status_code == 200
    assert post(make_batch(rank=9)).status_code == 400
    after = scrape(client)
    accepted = {"endpoint": "ingest", "outcome": "accepted", "status": "200"}
    rejected = {"endpoint": "ingest", "outcome": "rejected", "status": "400"}
    assert (
        value(after, "lockstep_ingest_requests_total", **accepted)
        - value(before, "lockstep_ingest_requests_total", **accepted)
        == 1
    )
    assert (
        value(after, "lockstep_ingest_requests_total", **rejected)
        - value(before, "lockstep_ingest_requests_total", **rejected)
        == 1
    )
    for kind in ("grad", "step"):
        assert (
            value(after, "lockstep_ingest_events_total", type=kind)
            - value(before, "lockstep_ingest_events_total", type=kind)
            == 1
        )
    assert value(after, "lockstep_ingest_rank_steps_total") - value(before, "lockstep_ingest_rank_steps_total") == 1


def test_each_batch_of_a_bulk_request_counts(client, token):
    import json

    from agents import protocol

    body = protocol.bulk_body([json.dumps(make_batch(rank=r)).encode() for r in range(3)])
    before = scrape(client)
    response = client.generic(
        "POST", "/api/v1/ingest/bulk", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 200, response.content
    after = scrape(client)
    accepted = {"endpoint": "bulk", "outcome": "accepted", "status": "200"}
    assert (
        value(after, "lockstep_ingest_requests_total", **accepted)
        - value(before, "lockstep_ingest_requests_total", **accepted)
        == 3
    )
    assert value(after, "lockstep_ingest_rank_steps_total") - value(before, "lockstep_ingest_rank_steps_total") == 3


def test_slots_waiting_and_settle_latency(client, post):
    for rank in range(3):
        post(make_batch(rank=rank, events=[{"t": "grad", "step": s, "fps": [1]} for s in range(2)]))
    samples = scrape(client)
    assert value(samples, "lockstep_slots_pending", kind="grad") == 2
    assert ("lockstep_settle_queue_depth", ()) in samples
    for slot in GradSlot.objects.all():
        settle.settle_grad(slot.id)
    samples = scrape(client)
    assert value(samples, "lockstep_slots_pending", kind="grad") == 0
    assert value(samples, "lockstep_settle_latency_seconds", kind="grad", quantile="0.99") >= 0
    assert ("lockstep_settle_latency_seconds", (("kind", "grad"), ("quantile", "0.5"))) in samples


def test_metrics_token(client, settings):
    settings.LOCKSTEP_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
