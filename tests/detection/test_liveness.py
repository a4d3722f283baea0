"""The sweep's liveness of a run as PostgreSQL works it out (`runs.liveness`): counts and extremes by
aggregate, by name only the quiet ranks and those with a silence alert open. It must be what the
rules would see from every rank's age (`tests.rules.liveness`), without reading every rank."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.detection import runs
from dashboard.detection.models import Alert
from dashboard.tenancy.models import Rank, Run
from tests.detection.test_run_end import job
from tests.rules import liveness

pytestmark = pytest.mark.django_db

AGES = {0: 0.0, 1: 3.0, 2: 40.0, 3: 90.0, 4: 25.0, 5: 70.0}  # rank -> seconds since its last report
ENDED = {4, 5}
WATCH = 30.0


def aged(post, key: str) -> Run:
    run = job(post, key, {r: {"t": "rank_end", "status": "ok", "exit_code": 0} for r in ENDED}, world_size=len(AGES))
    now = timezone.now()
    for rank, age in AGES.items():
        Rank.objects.filter(run=run, rank=rank).update(last_seen=now - timedelta(seconds=age))
    return run


def test_liveness_is_what_every_ranks_age_says(post, token):
    run = aged(post, "liveness")
    Alert.objects.create(run=run, kind="rank_silent", subject="rank:1", severity="critical", ranks=[1], message="x")
    Alert.objects.create(  # resolved: nothing to resolve, not named
        run=run, kind="rank_silent", subject="rank:0", severity="critical", ranks=[0], message="x", state="resolved"
    )
    got = runs.liveness(run, WATCH)
    want = liveness(AGES, ENDED, WATCH, frozenset({1}))
    assert (got.reported, got.ended, sorted(got.quiet)) == (want.reported, want.ended, sorted(want.quiet))
    assert sorted(want.quiet) == [1, 2, 3, 5]  # quiet for 30 s or more, and rank 1 for its open alert
    for rank, age in want.quiet.items():
        assert got.quiet[rank] == pytest.approx(age, abs=2.0)
    for field in ("freshest", "freshest_live", "oldest_end"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), abs=2.0), field
    assert got.live == 4


def test_a_run_with_no_rank_yet(post, token):
    run = aged(post, "liveness-empty")
    Rank.objects.filter(run=run).delete()
    got = runs.liveness(run, WATCH)
    assert (got.reported, got.ended, got.quiet, got.oldest_end) == (0, set(), {}, None)
    assert got.freshest == got.freshest_live == float("inf")
