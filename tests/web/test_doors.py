"""The API and the pages are two doors over one set of services: the same Refusal reaches the
caller as the API's JSON error or as a page's 404 / message, and the rules (same-project
baselines, alert writes through the lifecycle, one silence matcher) hold on both."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dashboard.detection import lifecycle, silences
from dashboard.detection.models import Alert, Baseline, Silence
from dashboard.detection.rules import Finding
from dashboard.tenancy.access import principal_for
from dashboard.tenancy.models import BASELINE, Project, ProjectToken, Run
from dashboard.web import services
from ingest.refusals import Refusal

pytestmark = pytest.mark.django_db


@pytest.fixture
def ours(project) -> tuple[Run, Run]:
    return (
        Run.objects.create(project=project, key="ours-1", world_size=2),
        Run.objects.create(project=project, key="ours-2", world_size=2),
    )


@pytest.fixture
def theirs() -> Run:
    return Run.objects.create(project=Project.objects.create(name="theirs"), key="theirs-1", world_size=2)


@pytest.fixture
def member(project) -> User:
    user = User.objects.create_user("mia")
    project.members.add(user)
    return user


@pytest.fixture
def browser(member) -> Client:
    client = Client()
    client.force_login(member)
    return client


def alert_on(run: Run, ranks: tuple[int, ...] = (1,)) -> Alert:
    finding = Finding("critical", ranks, "rank 1 diverged", step=0, kind="grad_divergence", subject="grad:ddp")
    return lifecycle.record(run, finding)[0]


def test_a_problem_is_an_exception_that_carries_status_message_and_path():
    problem = Refusal(400, "baseline must be a run key", path="baseline")
    assert isinstance(problem, Exception) and str(problem) == "baseline must be a run key"
    assert (problem.status, problem.message, problem.path) == (400, "baseline must be a run key", "baseline")
    assert Refusal(404, "no run 'x'").path is None


def test_a_missing_run_is_one_404_problem_json_on_the_api_and_a_404_page(member, browser, ours):
    with pytest.raises(Refusal) as raised:
        services.run_for(principal_for(member), "nope")
    assert (raised.value.status, raised.value.message) == (404, "no run 'nope'")
    for url in ("/api/v1/runs/nope", "/api/v1/runs/nope/alerts", "/api/v1/runs/nope/timeline"):
        response = browser.get(url)
        assert (response.status_code, response.content) == (404, b'{"error": "no run \'nope\'"}'), url
    for url in ("/runs/nope/", "/runs/nope/ranks/0/", "/runs/nope/frame/?f=x", "/compare/?runs=ours-1,nope"):
        assert browser.get(url).status_code == 404, url


def test_another_projects_run_is_the_same_404_as_a_missing_one_through_both_doors(member, browser, token, ours, theirs):
    """Nobody can probe which keys exist: another project's run answers exactly like a missing one."""
    with pytest.raises(Refusal) as raised:
        services.run_for(principal_for(member), "theirs-1")
    assert (raised.value.status, raised.value.message) == (404, "no run 'theirs-1'")
    expected = b'{"error": "no run \'theirs-1\'"}'
    for response in (
        browser.get("/api/v1/runs/theirs-1"),
        browser.get("/api/v1/runs/theirs-1/timeline"),
        browser.get("/api/v1/runs/theirs-1/alerts", HTTP_AUTHORIZATION=f"Bearer {token}"),
        browser.get("/api/v1/compare?runs=ours-1,theirs-1"),
    ):
        assert (response.status_code, response.content) == (404, expected)
    assert browser.get("/runs/theirs-1/").status_code == 404
    assert browser.get("/runs/theirs-1/").content.count(b"theirs-1") == 0
    alert = alert_on(theirs)
    assert browser.post(f"/api/v1/alerts/{alert.id}/ack").json() == {"error": f"no alert {alert.id}"}
    assert browser.post(f"/alerts/{alert.id}/ack/").status_code == 404
    assert browser.post(f"/alerts/{alert.id}/unack/").status_code == 404
    assert browser.post("/alerts/999999/ack/").status_code == 404
    assert browser.post("/api/v1/alerts/999999/ack").json() == {"error": "no alert 999999"}
    assert Alert.objects.get().acked_at is None


def test_an_input_problem_names_its_path_in_the_api_error(browser, ours):
    response = browser.post(
        "/api/v1/runs/ours-1/baseline", json.dumps({"baseline": 7}), content_type="application/json"
    )
    assert (response.status_code, response.content) == (
        400,
        b'{"error": "baseline must be a run key", "path": "baseline"}',
    )
    own = browser.post(
        "/api/v1/runs/ours-1/baseline", json.dumps({"baseline": "ours-1"}), content_type="application/json"
    )
    assert own.json() == {"error": "a run cannot be its own baseline", "path": "baseline"}
    assert not Baseline.objects.exists()


@pytest.fixture
def two_projects(member, ours, theirs) -> tuple[Run, Run]:
    """The member sees both projects, so only the same-project rule stands between their runs."""
    theirs.project.members.add(member)
    return ours[0], theirs


def test_api_baseline_must_be_a_run_of_the_same_project(browser, member, two_projects):
    run, other = two_projects
    response = browser.post(
        "/api/v1/runs/ours-1/baseline", json.dumps({"baseline": "theirs-1"}), content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": f"baseline 'theirs-1' is not a run of project {run.project.name!r}",
        "path": "baseline",
    }
    with pytest.raises(Refusal) as raised:
        services.choose_baseline(principal_for(member), run, "theirs-1")
    assert (raised.value.status, raised.value.path) == (400, "baseline")
    assert not Baseline.objects.exists()
    ok = browser.post(
        "/api/v1/runs/ours-1/baseline", json.dumps({"baseline": "ours-2"}), content_type="application/json"
    )
    assert (ok.status_code, ok.json()) == (201, {"run": "ours-1", "baseline": "ours-2"})


def test_page_baseline_must_be_a_run_of_the_same_project(browser, two_projects):
    page = browser.get("/runs/ours-1/").content.decode()
    assert 'value="ours-2"' in page and 'value="theirs-1"' not in page  # only same-project choices are offered
    response = browser.post("/runs/ours-1/baseline/", {"baseline": "theirs-1"}, follow=True)
    assert "Choose another run of the same project as the baseline." in response.content.decode()
    assert not Baseline.objects.exists()
    response = browser.post("/runs/ours-1/baseline/", {"baseline": "ours-2"}, follow=True)
    assert "ours-2 is now the baseline of ours-1" in response.content.decode()
    assert Baseline.objects.get(run__key="ours-1").baseline.key == "ours-2"


def test_a_project_token_cannot_baseline_against_another_projects_run(client, project, ours, theirs):
    response = client.post(
        "/api/v1/runs/ours-1/baseline",
        json.dumps({"baseline": "theirs-1"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ProjectToken.issue(project, (BASELINE,))}",
    )
    assert response.status_code == 404 and not Baseline.objects.exists()


def test_unacknowledge_goes_through_the_lifecycle_and_clears_the_ack(browser, member, ours, monkeypatch):
    alert = alert_on(ours[0])
    assert browser.post(f"/alerts/{alert.id}/ack/", {"next": "/alerts/"}).status_code == 302
    alert.refresh_from_db()
    assert alert.acked_by == member and alert.acked_at is not None
    calls = []
    real = lifecycle.unacknowledge
    monkeypatch.setattr(lifecycle, "unacknowledge", lambda a: calls.append(a.id) or real(a))
    assert browser.post(f"/alerts/{alert.id}/unack/", {"next": "/alerts/"}).status_code == 302
    assert calls == [alert.id]
    alert.refresh_from_db()
    assert alert.acked_by is None and alert.acked_at is None


def test_silence_problems_reach_the_api_as_json_and_the_page_as_a_message(browser, ours, theirs):
    body = {"run": "theirs-1", "hours": 1, "comment": "x"}
    response = browser.post("/api/v1/silences", body, content_type="application/json")
    assert (response.status_code, response.json()) == (400, {"error": "no run 'theirs-1' in your projects"})
    page = browser.post("/silences/", {**body, "next": "/alerts/"}, follow=True).content.decode()
    assert "Silence not created: no run &#x27;theirs-1&#x27; in your projects" in page
    assert not Silence.objects.exists()
    foreign = Silence.objects.create(
        project=theirs.project, comment="theirs", expires_at=timezone.now() + timedelta(hours=1)
    )
    assert browser.post(f"/silences/{foreign.id}/expire/").status_code == 404
    foreign.refresh_from_db()
    assert foreign.expires_at > timezone.now()


def test_the_alerts_page_and_notifications_share_one_silence_matcher(browser, project, ours):
    alert = alert_on(ours[0], ranks=(1,))
    until = timezone.now() + timedelta(hours=1)
    other_rank = Silence.objects.create(project=project, rank=2, comment="rank 2", expires_at=until)
    assert not silences.covers(other_rank, alert) and silences.mute_state(alert)["silenced"] is False
    assert "silenced until" not in browser.get("/alerts/").content.decode()
    this_rank = Silence.objects.create(
        project=project, run=ours[0], kind="grad_divergence", rank=1, comment="rank 1", expires_at=until
    )
    assert silences.matching(alert) == [this_rank]
    assert silences.first_covering(alert, [other_rank, this_rank]) == this_rank
    assert "silenced until" in browser.get("/alerts/").content.decode()
