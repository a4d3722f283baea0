"""The run page as a paged engineer reads it, top down: the verdict, the incidents in step order with
what to do, the ranks now, the timeline and heatmap, then the compile bill, which says what its seconds
are of (a CPU job's bill is no GPU time) and what it measured versus assumed. The incidents API lists
a run's incidents in the same order."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from dashboard.detection import lifecycle
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Rank, Run

pytestmark = pytest.mark.django_db


def run_on(project, key: str, device: str) -> Run:
    run = Run.objects.create(project=project, key=key, world_size=3)
    for rank in range(3):
        Rank.objects.create(run=run, rank=rank, status="running", host="node1", info={"device": device})
    return run


def fire(run: Run, kind: str, rank: int, step: int | None) -> None:
    found = Finding("critical", (rank,), f"{kind} on rank {rank}", step, None, {}, f"{kind}:{rank}", kind)
    with transaction.atomic():
        lifecycle.apply(run, [found], [], None)


@pytest.fixture
def member(client, project) -> User:
    user = User.objects.create_user("paged-reader", password="pw-reader-1")
    project.members.add(user)
    client.force_login(user)
    return user


def test_incidents_read_in_step_order_on_the_run_page_and_in_its_api(client, token, project, member):
    """Opened step 12 first, then one with no step, then step 5: listed 5, 12, no step."""
    run = run_on(project, "demo-order", "cpu")
    fire(run, "grad_divergence", 2, 12)
    fire(run, "compile_failure_divergence", 1, None)
    fire(run, "param_divergence", 0, 5)
    found = client.get("/api/v1/runs/demo-order/incidents", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert [i["root"]["step"] for i in found["incidents"]] == [5, 12, None]
    html = client.get("/runs/demo-order/").content.decode()
    kinds = ['data-root-kind="param_divergence"', 'data-root-kind="grad_divergence"', 'data-root-kind="compile_failure']
    assert [html.index(k) for k in kinds] == sorted(html.index(k) for k in kinds)
    assert 'data-step="5"' in html and 'data-step="12"' in html


def test_the_run_page_puts_the_verdict_incidents_and_ranks_now_before_the_charts_and_the_bill(client, project, member):
    fire(run_on(project, "paged", "cuda:0"), "grad_divergence", 2, 3)
    html = client.get("/runs/paged/").content.decode()
    marks = ['class="verdict"', 'id="incidents"', 'class="remedy"', 'id="strip"', 'id="timeline"', 'id="heatmap"']
    marks += ['id="cost"', 'id="alerts"', 'id="ranks"']
    assert [html.index(m) for m in marks] == sorted(html.index(m) for m in marks)


def test_a_cpu_jobs_bill_says_device_time_and_what_it_measured_versus_assumed(client, project, member):
    run_on(project, "on-cpus", "cpu")
    html = client.get("/runs/on-cpus/").content.decode()
    assert 'data-device="device"' in html and "device time the ranks lost to compilation" in html
    bill = html.split('id="cost"')[1].split("</section>")[0]
    assert "<th>device-seconds</th>" in bill and "GPU-" not in bill and "GPU time" not in bill
    assert "Measured: where a rank's progress samples caught it waiting" in html and "Assumed, for every" in html
    assert "no GPU is assumed" in html

    run_on(project, "on-gpus", "cuda:0")
    html = client.get("/runs/on-gpus/").content.decode()
    assert 'data-device="GPU"' in html and "GPU time the ranks lost to compilation" in html
    assert "<th>GPU-seconds</th>" in html and "no GPU is assumed" not in html
