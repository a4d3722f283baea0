"""Reading a bill writes nothing and computes it once: 50 parallel GET /api/v1/runs/KEY/cost of a
256-rank run no sweep billed, against the live stack (uvicorn + Celery worker), all get the one bill
a single reader computed (the others waited for it), the read stores nothing, and the worker keeps
that very bill afterwards. Each reader computing and storing its own took 13 s and computed 8 times on
a real 256-rank run; on this one it computed 4 times, and 4 readers got a 500 (two stores at once)."""

from __future__ import annotations

import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from agents import protocol
from dashboard.detection.models import RunCost
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.conftest import make_batch
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
WORLD, FRAMES, COMPILES, READERS = 256, 10, 10, 50


def compiles(rank: int) -> list[dict]:
    """Every frame compiled COMPILES times, one cache miss each, a second or two apiece."""
    return [
        {
            "t": "compile",
            "frame": f"model.py:{10 + f}:block{f}",
            "index": i,
            "step": i,
            "times": {"entire_frame_compile_time_s": 1.0 + (rank % 7) / 10},
            "cache": {"inductor": "miss"},
            "cache_keys": {"inductor": f"key-{f}-{i}"},
        }
        for f in range(FRAMES)
        for i in range(COMPILES)
    ]


def ingest(stack, token: str, key: str) -> None:
    for first in range(0, WORLD, 128):
        batches = [make_batch(run=key, rank=r, world_size=WORLD, events=compiles(r)) for r in range(first, first + 128)]
        body = protocol.bulk_body([json.dumps(b, separators=(",", ":")).encode() for b in batches])
        response = requests.post(
            f"{stack.url}/api/v1/ingest/bulk",
            data=gzip.compress(body),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Encoding": "gzip",
                "Content-Type": "application/json",
            },
            timeout=60,
        )
        assert response.status_code == 200, response.text


def test_parallel_reads_of_an_unbilled_run_compute_once_and_write_nothing(stack):
    project = Project.objects.create(name=unique("bills"))
    token, key = ProjectToken.issue(project), unique("wide-bill")
    ingest(stack, token, key)
    long_ago = timezone.now() - timedelta(hours=2)  # an old run no sweep looks at any more
    run = Run.objects.get(key=key)
    Run.objects.filter(id=run.id).update(last_seen=long_ago)
    time.sleep(3)  # a sweep that had the run in hand is done with it
    RunCost.objects.filter(run=run).delete()

    def read(_: int) -> requests.Response:
        return requests.get(
            f"{stack.url}/api/v1/runs/{key}/cost", headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    with ThreadPoolExecutor(READERS) as pool:
        responses = list(pool.map(read, range(READERS)))
    assert [r.status_code for r in responses] == [200] * READERS
    bills = [r.json() for r in responses]
    assert len({b["computed_at"] for b in bills}) == 1  # computed once, by one reader, for all of them
    assert bills[0]["world_size"] == WORLD and bills[0]["gpu_seconds"] > 0

    deadline = time.monotonic() + 90
    while not RunCost.objects.filter(run=run).exists() and time.monotonic() < deadline:
        time.sleep(0.5)  # the worker keeps it (tasks.keep_bills), not the readers
    kept = RunCost.objects.get(run=run)
    assert kept.computed_at.isoformat() == bills[0]["computed_at"]  # the readers' bill, not a second computation
