"""Run status derived from the rank rows (running / finished / failed / stalled): the same answer on
the runs list, the run page and the read API, a status filter on both doors, and a runs list whose
query count does not grow with the number of runs."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dashboard.tenancy.models import Project, ProjectToken, Rank, Run

pytestmark = pytest.mark.django_db

FRESH, QUIET = "fresh", "quiet"


def quiet_since() -> datetime:
    """A moment longer ago than LOCKSTEP_SILENT_AFTER."""
    return timezone.now() - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER + 5)


def make_run(
    project: Project, key: str, ranks: list[tuple[str, int | None, str]], world_size: int = 2, run_seen: str = FRESH
) -> Run:
    """A run with one Rank row per (status, exit_code, fresh|quiet); last_seen is auto_now, so quiet
    rows are moved back with update()."""
    run = Run.objects.create(project=project, key=key, world_size=world_size)
    for number, (status, exit_code, seen) in enumerate(ranks):
        Rank.objects.create(run=run, rank=number, status=status, exit_code=exit_code)
        if seen == QUIET:
            Rank.objects.filter(run=run, rank=number).update(last_seen=quiet_since())
    if run_seen == QUIET:
        Run.objects.filter(id=run.id).update(last_seen=quiet_since())
    return run


CASES = {
    "running": [
        ([("running", None, FRESH), ("running", None, FRESH)], FRESH),
        ([("ok", 0, FRESH), ("running", None, FRESH)], FRESH),
        ([("running", None, FRESH)], FRESH),  # rank 1 not reporting yet, the run is young
        ([], FRESH),
    ],
    "finished": [([("ok", 0, FRESH), ("ok", 0, QUIET)], QUIET), ([("ok", None, QUIET), ("ok", 0, QUIET)], QUIET)],
    "failed": [
        ([("ok", 0, FRESH), ("error", 1, FRESH)], FRESH),
        ([("signal", -9, FRESH), ("running", None, QUIET)], QUIET),  # failed outranks stalled
        ([("abort", None, FRESH), ("running", None, FRESH)], FRESH),
        ([("ok", 3, FRESH), ("ok", 0, FRESH)], FRESH),
    ],  # said ok, exited non-zero
    "stalled": [
        ([("running", None, QUIET), ("running", None, FRESH)], FRESH),  # frozen rank
        ([("ok", 0, FRESH), ("running", None, QUIET)], FRESH),  # killed rank never said goodbye
        ([("ok", 0, FRESH)], QUIET),  # rank 1 never reported
        ([], QUIET),
    ],
}
ALL_CASES = [(status, ranks, run_seen) for status, cases in CASES.items() for ranks, run_seen in cases]


@pytest.fixture
def token(project) -> str:
    return ProjectToken.issue(project)


@pytest.fixture
def api(client, token) -> Client:
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


@pytest.fixture
def browser(project) -> Client:
    user = User.objects.create_user("mia")
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def one_of_each(project) -> dict[str, Run]:
    """A run in every status, keyed by it."""
    return {
        status: make_run(project, f"r-{status}", ranks, run_seen=run_seen)
        for status, [(ranks, run_seen), *_] in CASES.items()
    }


@pytest.mark.parametrize(("status", "ranks", "run_seen"), ALL_CASES)
def test_status_is_derived_from_the_rank_rows(project, api, status, ranks, run_seen):
    run = make_run(project, "r-1", ranks, run_seen=run_seen)
    assert Run.objects.get(id=run.id).status == status
    assert api.get("/api/v1/runs").json()["runs"][0]["status"] == status
    assert api.get("/api/v1/runs/r-1").json()["status"] == status


def test_runs_list_and_run_page_show_the_status_badge(browser, one_of_each):
    listed = browser.get("/").content.decode()
    for status in CASES:
        assert f'<span class="badge status-{status}">{status}</span>' in listed
    page = browser.get("/runs/r-stalled/").content.decode()
    assert '<span class="badge status-stalled">stalled</span>' in page


@pytest.mark.parametrize("status", CASES)
def test_api_filters_runs_by_status(api, one_of_each, status):
    listed = api.get(f"/api/v1/runs?status={status}").json()["runs"]
    assert [(r["key"], r["status"]) for r in listed] == [(f"r-{status}", status)]


def test_api_without_a_status_lists_every_run(api, one_of_each):
    assert {r["key"] for r in api.get("/api/v1/runs?status=").json()["runs"]} == {f"r-{s}" for s in CASES}


@pytest.mark.parametrize("status", CASES)
def test_runs_page_filters_by_status(browser, one_of_each, status):
    page = browser.get(f"/?status={status}").content.decode()
    assert [s for s in CASES if f'href="/runs/r-{s}/"' in page] == [status]
    assert f'<option value="{status}" selected>' in page


def test_unknown_status_is_a_400_on_both_doors(api, browser, one_of_each):
    response = api.get("/api/v1/runs?status=crashed")
    assert response.status_code == 400
    assert response.json() == {
        "error": "unknown status 'crashed': use one of running, finished, failed, stalled",
        "path": "status",
    }
    page = browser.get("/?status=crashed")
    assert page.status_code == 400
    assert "unknown status &#x27;crashed&#x27;" in page.content.decode() and b"r-failed" not in page.content


@pytest.mark.parametrize("count", [2, 40])
def test_runs_list_query_count_does_not_grow_with_runs(project, api, browser, django_assert_max_num_queries, count):
    for n in range(count):
        make_run(project, f"r-{n}", CASES["stalled"][n % 4][0], run_seen=QUIET)
    with django_assert_max_num_queries(8):  # two set and reset the request's statement timeout; one reads verdicts
        assert len(browser.get("/?status=stalled").context["runs"]) == count
    with django_assert_max_num_queries(5):
        assert len(api.get("/api/v1/runs").json()["runs"]) == count
