"""Choosing a baseline (API and run page) and the baseline_divergence it yields."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection import baseline, settle
from dashboard.detection.models import Alert, Baseline
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import BASELINE, DEFAULT_SCOPES, Project, ProjectToken, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(project) -> str:
    """The job's token, made with the baseline scope as a CI step that chooses baselines would be."""
    return ProjectToken.issue(project, (*DEFAULT_SCOPES, BASELINE))


def run_of(post, key: str, fps_at: dict[int, int]) -> Run:
    """A 2-rank run whose ranks agree; step s carries fingerprint fps_at.get(s, s)."""
    for rank in (0, 1):
        events = [{"t": "grad", "step": s, "fps": [fps_at.get(s, s), 0]} for s in range(5)]
        assert post(make_batch(run=key, rank=rank, world_size=2, events=events)).status_code == 200
    for slot in GradSlot.objects.filter(run__key=key):
        settle.settle_grad(slot.id)
    return Run.objects.get(key=key)


def choose(client, token, key, base):
    return client.post(
        f"/api/v1/runs/{key}/baseline",
        json.dumps({"baseline": base}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_api_sets_the_baseline_and_the_first_differing_step_is_named(client, token, post):
    run_of(post, "torch-211", {})
    cand = run_of(post, "torch-213", {3: 99, 4: 98})
    response = choose(client, token, "torch-213", "torch-211")
    assert response.status_code == 201, response.content
    assert Baseline.objects.get(run=cand).baseline.key == "torch-211"
    baseline.compare(cand)
    alert = Alert.objects.get(kind="baseline_divergence")
    assert (alert.step, alert.details["buckets"], alert.run.key) == (3, [0], "torch-213")
    assert "torch-211" in alert.message


def test_switching_baseline_resolves_the_old_comparison(client, token, post):
    run_of(post, "a", {})
    run_of(post, "b", {1: 50})
    cand = run_of(post, "c", {1: 50})
    choose(client, token, "c", "a")
    baseline.compare(cand)
    assert Alert.objects.get(kind="baseline_divergence").state == "firing"
    choose(client, token, "c", "b")
    baseline.compare(cand)
    assert Alert.objects.get(kind="baseline_divergence").state == "resolved"


def test_bad_baseline_requests(client, token, post):
    run_of(post, "solo", {})
    assert choose(client, token, "solo", "solo").status_code == 400
    assert choose(client, token, "solo", "missing").status_code == 404
    assert choose(client, token, "missing", "solo").status_code == 404
    other = ProjectToken.issue(Project.objects.create(name="elsewhere"), (BASELINE,))
    assert choose(client, other, "solo", "solo").status_code == 404
    body = client.post(
        "/api/v1/runs/solo/baseline", "nope", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert body.status_code == 400
    assert not Baseline.objects.exists()


def test_session_needs_csrf_and_the_page_form_works(project, post):
    run_of(post, "p1", {})
    run_of(post, "p2", {})
    user = User.objects.create_user("bea", password="pw")
    project.members.add(user)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert (
        strict.post(
            "/api/v1/runs/p2/baseline", json.dumps({"baseline": "p1"}), content_type="application/json"
        ).status_code
        == 403
    )
    page = strict.get("/runs/p2/")
    assert b'name="baseline"' in page.content
    csrf = strict.cookies["csrftoken"].value
    response = strict.post("/runs/p2/baseline/", {"baseline": "p1", "csrfmiddlewaretoken": csrf})
    assert response.status_code == 302
    assert Baseline.objects.get(run__key="p2").baseline.key == "p1"
    assert b"p1</a>" in strict.get("/runs/p2/").content
