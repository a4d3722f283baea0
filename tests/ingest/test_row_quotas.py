"""Rows a token can make, through the real door: new runs per hour per project (429 + Retry-After)
and ranks per run (400 naming the field); nothing of a refused batch is stored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import protocol
from dashboard.evidence.models import IngestSession
from dashboard.tenancy.models import Project, ProjectToken, Rank, Run
from tests import claims
from tests.conftest import make_batch, post_bulk
from tests.ingest.test_bulk import encoded

pytestmark = pytest.mark.django_db


def test_a_world_wider_than_max_ranks_is_a_400_naming_the_field_and_stores_nothing(post, client, token, settings):
    huge = post(make_batch(run="wide", world_size=1 << 20))  # the protocol's own bound: accepted before
    assert huge.status_code == 400 and huge.json()["path"] == "run.world_size"
    assert "LOCKSTEP_MAX_RANKS (131072): its operator sets LOCKSTEP_MAX_RANKS=1048576" in huge.json()["error"]
    settings.LOCKSTEP_MAX_RANKS = 8
    assert post(make_batch(run="wide", rank=8, world_size=9)).json()["path"] == "run.world_size"
    assert post(make_batch(run="wide", rank=8, world_size=8)).json()["path"] == "rank"
    body = protocol.bulk_body([encoded(make_batch(run="ok", world_size=8)), encoded(make_batch(run="w", world_size=9))])
    relayed = post_bulk(client, token, body)
    assert relayed.status_code == 400 and relayed.json()["path"] == "batches[1].run.world_size"
    assert not Run.objects.exists() and not Rank.objects.exists() and not IngestSession.objects.exists()
    assert post(make_batch(run="wide", rank=7, world_size=8)).status_code == 200


def test_new_runs_past_the_hourly_quota_are_429_with_retry_after_and_the_made_ones_go_on(post, project, settings):
    settings.LOCKSTEP_RUNS_PER_HOUR = 3
    for n in range(3):
        assert post(make_batch(run=f"job-{n}")).status_code == 200
    refused = post(make_batch(run="job-3"))
    assert refused.status_code == 429 and refused.json()["path"] == "run.key"
    assert "made 3 runs within the hour (LOCKSTEP_RUNS_PER_HOUR)" in refused.json()["error"]
    assert 3500 <= int(refused["Retry-After"]) <= 3600  # when the oldest of the hour leaves the window
    assert not Run.objects.filter(key="job-3").exists() and claims.count() == 3
    assert post(make_batch(run="job-0", rank=1)).status_code == 200  # a run already made takes its ranks
    other = ProjectToken.issue(Project.objects.create(name="neighbour"))
    assert post(make_batch(run="job-3"), token_=other).status_code == 200  # per project
    Run.objects.filter(project=project, key="job-0").update(started_at=timezone.now() - timedelta(minutes=61))
    assert post(make_batch(run="job-3")).status_code == 200
