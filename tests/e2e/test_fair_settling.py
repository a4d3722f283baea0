"""Fair settling (dashboard/detection/fairness.py) with the real Celery worker of the suite's stack:
one project floods the settle queue with thousands of compile slots, and another project's
divergence is still alerted within seconds, long before the flood has settled."""

from __future__ import annotations

import time

import pytest

from dashboard.detection.models import Alert
from dashboard.ledger.models import CompileSlot
from dashboard.tenancy.models import Run
from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

FLOOD = 4000  # compile slots of the flooding run, every one complete at once


def compile_event(frame: str, graph: str) -> dict:
    return {"t": "compile", "frame": frame, "index": 0, "step": 0, "hashes": {"dynamo": {"raw": graph, "norm": graph}}}


def send(client, token: str, run: str, rank: int, events: list[dict]) -> None:
    batch = make_batch(run=run, rank=rank, world_size=2, events=events)
    response = client.post(
        "/api/v1/ingest", batch, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 200, response.content


def test_a_projects_flood_does_not_hold_back_another_projects_alert(stack, client):
    _, flood_token = project_with_token(unique("flood"))
    _, token = project_with_token(unique("bystander"))
    flood = unique("flood-run")
    frames = [compile_event(f"gen.py:{i}:block{i}", "a" * 32) for i in range(FLOOD)]
    for rank in (0, 1):
        send(client, flood_token, flood, rank, frames)  # rank 1's batch completes all 4,000 slots at once
    victim = unique("victim-run")
    sent = time.monotonic()
    send(client, token, victim, 0, [compile_event("train.py:10:forward", "b" * 32)])
    send(client, token, victim, 1, [compile_event("train.py:10:forward", "c" * 32)])
    try:
        deadline = sent + 30
        while time.monotonic() < deadline and not Alert.objects.filter(run__key=victim).exists():
            time.sleep(0.1)
        waited = time.monotonic() - sent
        left = CompileSlot.objects.filter(run__key=flood, settled_at__isnull=True).count()
        assert Alert.objects.filter(run__key=victim, kind="graph_divergence").exists(), f"no alert in {waited:.1f} s"
        # seconds, not the flood's minutes (8.3 s once on a machine running at half its speed)
        assert waited < 12, waited
        assert left > FLOOD / 4, left  # the flood was still settling: the alert passed it
    finally:
        Run.objects.filter(key=flood).delete()  # what is left of the flood settles as nothing
