"""A run keeps its outcome after it ends, through the real ingest endpoint and settle: the runs API
and the run detail carry a verdict and still count what the run's end closed; `?verdict=` narrows
the list; the runs page shows the verdict with a filter on it, and an ended run's page says it ended,
with each incident's remedy."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F

from dashboard.detection import lifecycle, settle
from dashboard.detection.models import Alert
from dashboard.detection.rules import Finding
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
SAID = "diverged at step 0 (rank 2, grad_divergence)"


def job(post, key: str, odd: int | None, ended: bool = True) -> Run:
    """Three ranks report step 0 (rank `odd`'s gradients differ) and, where `ended`, end."""
    for rank in range(3):
        events = [{"t": "grad", "step": 0, "fps": [7 if rank == odd else 1]}]
        if ended:
            events.append({"t": "rank_end", "status": "ok"})
        assert post(make_batch(run=key, rank=rank, events=events)).status_code == 200
    settle.settle_grad(GradSlot.objects.get(run__key=key).id)
    return Run.objects.get(key=key)


def end(run: Run) -> None:
    Alert.objects.filter(run=run).update(notified_revision=F("revision"))  # delivered, as delivery marks it
    with transaction.atomic():
        lifecycle.end_of_run(run)


@pytest.fixture
def runs(post) -> dict[str, Run]:
    diverged = job(post, "ended-diverged", odd=2)
    end(diverged)
    return {"diverged": diverged, "clean": job(post, "ended-clean", odd=None)}


def bearer(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_the_runs_api_keeps_a_diverged_runs_outcome_after_it_ended(client, token, runs):
    assert set(Alert.objects.values_list("state", flat=True)) == {"ended_unresolved"}
    listed = {r["key"]: r for r in client.get("/api/v1/runs", **bearer(token)).json()["runs"]}
    diverged, clean = listed["ended-diverged"], listed["ended-clean"]
    assert diverged["alerts"] == {"critical": 1, "warning": 0}  # the end fixed nothing: it still counts
    assert diverged["verdict"] == {
        "kind": "diverged",
        "text": SAID,
        "step": 0,
        "ranks": [2],
        "cause": "grad_divergence",
        "incident": diverged["verdict"]["incident"],
        "more": 0,
    }
    assert clean["verdict"]["kind"] == "in_lockstep" and clean["alerts"] == {"critical": 0, "warning": 0}
    detail = client.get("/api/v1/runs/ended-diverged", **bearer(token)).json()
    assert detail["verdict"]["text"] == SAID and detail["alerts"]["critical"] == 1

    picked = client.get("/api/v1/runs?verdict=diverged", **bearer(token)).json()["runs"]
    assert [r["key"] for r in picked] == ["ended-diverged"]
    picked = client.get("/api/v1/runs?verdict=in_lockstep", **bearer(token)).json()["runs"]
    assert [r["key"] for r in picked] == ["ended-clean"]
    refused = client.get("/api/v1/runs?verdict=bogus", **bearer(token))
    assert refused.status_code == 400 and refused.json()["path"] == "verdict"


def test_the_incidents_api_says_ended_unresolved_and_what_to_do(client, token, runs):
    [incident] = client.get("/api/v1/runs/ended-diverged/incidents", **bearer(token)).json()["incidents"]
    assert incident["state"] == "ended_unresolved" and incident["unresolved"] is True
    assert (
        incident["remedy"]["doc"] == "docs/alerts.md#grad_divergence" and "deterministic" in incident["remedy"]["text"]
    )


def test_the_pages_show_the_verdict_and_an_ended_run_says_it_ended(client, project, runs, post):
    user = User.objects.create_user("browsing", password="pw-browsing-1")
    project.members.add(user)
    client.force_login(user)
    page = client.get("/").content.decode()
    assert f'data-verdict="diverged">{SAID}</span>' in page and 'data-verdict="in_lockstep">in lockstep</span>' in page
    assert '<select name="verdict"' in page and '<option value="diverged">diverged</option>' in page
    narrowed = client.get("/?verdict=diverged").content.decode()
    assert "ended-diverged" in narrowed and "ended-clean" not in narrowed
    assert client.get("/?verdict=bogus").status_code == 400

    run = client.get("/runs/ended-diverged/").content.decode()
    assert f'data-verdict="diverged">{SAID}</span>' in run
    assert 'data-over="true">ended</span>' in run and "No progress sample yet" not in run
    assert "The run ended after step 0" in run
    assert '<span class="state">ended unresolved</span>' in run and "docs/alerts.md#grad_divergence" in run
    # the remedy's pointer is a link to the reference the dashboard serves, where that kind has its section
    assert '<a href="/alerts/reference/#grad_divergence"><code>docs/alerts.md#grad_divergence</code></a>' in run
    reference = client.get("/alerts/reference/").content.decode()
    assert '<a id="grad_divergence"></a><code>grad_divergence</code>' in reference  # its row of docs/alerts.md

    job(post, "still-running", odd=None, ended=False)
    live = client.get("/runs/still-running/").content.decode()
    assert ">connecting…</span>" in live and "No progress sample yet" in live


KILLED = (
    "failed at step 8 (rank 2, vanished: killed or crashed in native code); "
    "2 more: param_divergence at step 4 (rank 0), compile_failure_divergence (rank 1)"
)


def killed_rank_run(project) -> Run:
    """The demo's killed-rank run as its incidents: rank 1's compiler fails, rank 0's weights drift at
    step 4, rank 2's process vanishes at step 8 (each its own cause)."""
    run = Run.objects.create(project=project, key="killed-rank", world_size=3)
    for rank in range(3):
        Rank.objects.create(run=run, rank=rank, status="vanished" if rank == 2 else "ok", host="node1")
    causes = [
        ("compile_failure_divergence", 1, None, "warning", {}),
        ("param_divergence", 0, 4, "critical", {}),
        ("rank_crashed", 2, 8, "critical", {"status": "vanished"}),
    ]
    for kind, rank, step, severity, details in causes:
        found = Finding(severity, (rank,), f"{kind} on rank {rank}", step, None, details, f"{kind}:{rank}", kind)
        with transaction.atomic():
            lifecycle.apply(run, [found], [], None)
    return run


def test_a_run_with_several_causes_leads_with_the_dead_rank_and_names_the_rest(client, token, project):
    killed_rank_run(project)
    [listed] = client.get("/api/v1/runs", **bearer(token)).json()["runs"]
    assert listed["verdict"]["kind"] == "failed" and listed["verdict"]["text"] == KILLED
    assert (listed["verdict"]["cause"], listed["verdict"]["step"], listed["verdict"]["more"]) == ("rank_crashed", 8, 2)
    assert client.get("/api/v1/runs/killed-rank", **bearer(token)).json()["verdict"]["text"] == KILLED

    user = User.objects.create_user("paged", password="pw-paged-1")
    project.members.add(user)
    client.force_login(user)
    said = f'data-verdict="failed">{KILLED}</span>'
    assert said in client.get("/").content.decode() and said in client.get("/runs/killed-rank/").content.decode()


def test_the_alerts_page_shows_what_check_counts_after_the_run_ended(client, project, runs):
    """By default the page lists unresolved alerts and incidents (firing, or ended unresolved), as
    `lockstep check` counts them: an ended run's divergence is not "No alerts match"."""
    user = User.objects.create_user("after-the-run", password="pw-after-1")
    project.members.add(user)
    client.force_login(user)
    [alert] = Alert.objects.filter(run=runs["diverged"])

    def listed(query: str) -> tuple[bool, bool]:
        page = client.get(f"/alerts/{query}").content.decode()
        return f'data-id="{alert.id}"' in page, f'id="incident-{alert.incident_id}"' in page

    page = client.get("/alerts/").content.decode()
    assert '<option value="unresolved" selected>' in page and "No alerts match." not in page
    assert listed("") == (True, True)
    assert listed("?state=unresolved") == (True, True)
    assert listed("?state=ended_unresolved") == (True, True)
    assert listed("?state=firing") == (False, False)
    assert listed("?state=resolved") == (False, False)
    assert listed("?state=all") == (True, True)
