"""A run's ranks a page at a time (256) in the run API and on the run page, for a 300-rank run sent
through the real door as a node relay sends it."""

from __future__ import annotations

import gzip
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import protocol
from tests.conftest import make_batch
from tests.ingest.test_bulk import encoded

pytestmark = pytest.mark.django_db
RANKS = 300


@pytest.fixture
def wide_run(client, token) -> str:
    batches = [encoded(make_batch(run="wide", rank=r, world_size=RANKS)) for r in range(RANKS)]
    for chunk in (batches[:150], batches[150:]):
        answer = client.generic(
            "POST",
            "/api/v1/ingest/bulk",
            gzip.compress(protocol.bulk_body(chunk)),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
            HTTP_CONTENT_ENCODING="gzip",
        )
        assert answer.status_code == 200, answer.content
    return "wide"


def test_the_run_api_serves_ranks_a_page_at_a_time(client, token, wide_run):
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    first = client.get("/api/v1/runs/wide", **bearer).json()
    assert [r["rank"] for r in first["ranks"]] == list(range(256))
    assert first["ranks_page"] == {"page": 1, "pages": 2, "per_page": 256, "next": "/api/v1/runs/wide?page=2"}
    assert first["summary"]["ranks_reporting"] == RANKS and first["world_size"] == RANKS
    second = client.get(first["ranks_page"]["next"], **bearer).json()
    assert [r["rank"] for r in second["ranks"]] == list(range(256, RANKS)) and second["ranks_page"]["next"] is None
    assert client.get("/api/v1/runs/wide?page=3", **bearer).json()["ranks"] == []
    for bad in ("0", "x", "-1", "1e3"):
        refused = client.get(f"/api/v1/runs/wide?page={bad}", **bearer)
        assert refused.status_code == 400 and refused.json()["path"] == "page", bad


def test_the_run_page_shows_a_page_of_ranks_and_links_the_next(project, wide_run):
    user = User.objects.create_user("wide-viewer", password="pw-wide-123")
    project.members.add(user)
    browser = Client()
    browser.force_login(user)
    page = browser.get("/runs/wide/").content.decode()
    shown = [int(n) for n in re.findall(r'<a href="ranks/(\d+)/">', page)]
    assert shown == list(range(256)) and "1–256 of 300" in page and 'href="?page=2#ranks"' in page
    later = browser.get("/runs/wide/?page=2").content.decode()
    assert [int(n) for n in re.findall(r'<a href="ranks/(\d+)/">', later)] == list(range(256, RANKS))
    assert 'href="?page=1#ranks"' in later
    assert browser.get("/runs/wide/?page=x").status_code == 404
