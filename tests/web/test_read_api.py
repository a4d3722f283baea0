"""Read API v1: runs, one run, its alerts; bearer or session; never another project's data."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def diverged_run(post):
    for rank in range(3):
        events = [
            {"t": "rank_start", "host": f"node{rank}", "versions": {"torch": "2.13.0"}},
            {"t": "grad", "step": 0, "fps": [7 if rank == 2 else 1]},
        ]
        assert post(make_batch(run="r-api", rank=rank, events=events)).status_code == 200
    settle.settle_grad(GradSlot.objects.get().id)
    return Run.objects.get(key="r-api")


def run_page_as_member(client, run, name: str) -> str:
    """The run's page as a new member of its project sees it (the client stays logged in as them)."""
    member = User.objects.create_user(name, password="pw")
    run.project.members.add(member)
    client.force_login(member)
    return client.get(f"/runs/{run.key}/").content.decode()


def bearer(token):
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_runs_list(client, token, diverged_run):
    body = client.get("/api/v1/runs", **bearer(token)).json()
    [run] = body["runs"]
    assert set(run) == {
        "key",
        "name",
        "project",
        "world_size",
        "status",
        "torch_version",
        "started_at",
        "last_step",
        "alerts",
        "verdict",
    }
    assert (run["key"], run["world_size"], run["torch_version"], run["status"]) == ("r-api", 3, "2.13.0", "running")
    assert run["alerts"] == {"critical": 1, "warning": 0}


def test_run_detail_lists_ranks(client, token, diverged_run):
    body = client.get("/api/v1/runs/r-api", **bearer(token)).json()
    assert [r["rank"] for r in body["ranks"]] == [0, 1, 2]
    assert body["ranks"][1]["host"] == "node1"
    assert set(body["ranks"][0]) == {"rank", "host", "last_step", "last_seen", "status"}
    assert body["summary"]["grad_slots"] == 1


def test_what_the_agents_could_not_check_is_said_once_with_its_ranks_in_the_api_and_the_page(
    client, token, post, diverged_run
):
    """A compiled optimizer step has no gradient fingerprints: no silent gap, the run says so."""
    notice = {"t": "notice", "code": "compiled_optimizer_step", "text": "the optimizer step runs <compiled>"}
    for rank in (0, 2):
        assert post(make_batch(run="r-api", rank=rank, seq=1, events=[notice])).status_code == 200
    body = client.get("/api/v1/runs/r-api", **bearer(token)).json()
    assert body["notices"] == [
        {"code": "compiled_optimizer_step", "text": "the optimizer step runs <compiled>", "ranks": [0, 2]}
    ]
    page = run_page_as_member(client, diverged_run, "notice-reader")
    assert "Not checked on ranks 0, 2: the optimizer step runs &lt;compiled&gt;" in page


def test_run_alerts_fields(client, token, diverged_run):
    [alert] = client.get("/api/v1/runs/r-api/alerts", **bearer(token)).json()["alerts"]
    for field in (
        "id",
        "kind",
        "severity",
        "state",
        "ranks",
        "step",
        "frame",
        "message",
        "details",
        "first_seen",
        "last_seen",
        "acked_by",
    ):
        assert field in alert
    assert (alert["kind"], alert["ranks"], alert["step"], alert["frame"]) == ("grad_divergence", [2], 0, None)


def test_unauthenticated_is_401(client, diverged_run):
    assert client.get("/api/v1/runs").status_code == 401
    assert client.get("/api/v1/runs/r-api/alerts", HTTP_AUTHORIZATION="Bearer nope").status_code == 401


def test_other_projects_token_sees_nothing(client, diverged_run):
    other = ProjectToken.issue(Project.objects.create(name="other-team"))
    assert client.get("/api/v1/runs", **bearer(other)).json() == {"runs": []}
    assert client.get("/api/v1/runs/r-api", **bearer(other)).status_code == 404
    assert client.get("/api/v1/runs/r-api/alerts", **bearer(other)).status_code == 404


def test_session_user_sees_only_member_projects(client, project, diverged_run):
    member = User.objects.create_user("ann", password="pw")
    project.members.add(member)
    outsider = User.objects.create_user("bob", password="pw")
    client.force_login(member)
    assert [r["key"] for r in client.get("/api/v1/runs").json()["runs"]] == ["r-api"]
    client.force_login(outsider)
    assert client.get("/api/v1/runs").json() == {"runs": []}
    assert client.get("/api/v1/runs/r-api/alerts").status_code == 404


def test_missing_run_is_404(client, token, diverged_run):
    response = client.get("/api/v1/runs/nope", **bearer(token))
    assert response.status_code == 404
    assert "nope" in response.json()["error"]
    assert Alert.objects.count() == 1


def test_the_run_pages_graph_break_count_is_one_ranks_as_the_frames_list_them(client, post, diverged_run):
    """Every rank breaks alike: the headline counts one rank's breaks (the most any rank had), not
    their sum over ranks (which read 10 beside frames of 3 and 4)."""
    breaks = [{"t": "graph_break", "frame": "train.py:10:forward", "reason": f"call {n}"} for n in range(2)]
    for rank in range(3):
        assert post(make_batch(run="r-api", rank=rank, seq=2, events=breaks)).status_code == 200
    page = run_page_as_member(client, diverged_run, "break-reader")
    assert '<b data-count="graph_breaks">2</b> graph breaks' in page


def test_a_break_repeated_at_the_same_site_counts_once_as_the_frame_page_lists_it(client, post, diverged_run):
    """A frame that recompiles breaks again at the same site: the headline counts the distinct sites the
    frame page lists (2), on the page and in the live counts, not the break events (3)."""
    breaks = [{"t": "graph_break", "frame": "train.py:10:forward", "reason": f"call {n}"} for n in range(2)]
    for rank in range(2):
        assert post(make_batch(run="r-api", rank=rank, seq=2, events=breaks)).status_code == 200
    again = [{"t": "graph_break", "frame": "train.py:10:forward", "reason": "call 0", "step": 5}]
    assert post(make_batch(run="r-api", rank=1, seq=3, events=again)).status_code == 200
    page = run_page_as_member(client, diverged_run, "break-reader")
    assert '<b data-count="graph_breaks">2</b> graph breaks' in page and "distinct sites" in page
    frame = client.get("/runs/r-api/frame/", {"f": "train.py:10:forward"}).content.decode()
    assert frame.count('<li class="reason">call ') == 2
    from dashboard.web.pages.views import run_headline_counts  # what the live counts send, too (live.run_now)

    assert run_headline_counts(diverged_run)["graph_breaks"] == 2
