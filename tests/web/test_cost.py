"""Where the compile bill shows: GET /api/v1/runs/KEY/cost (404 for runs the caller cannot see), the run
page's panel (static JS, no inline script), the compare page side by side per aligned frame, the
project's cost page (members only), and the /metrics counter by project and cause, which never goes
down. The runs are the real recordings in tests/fixtures."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.detection import bills, tasks
from dashboard.detection.models import RunCost
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.agents.test_fixtures_ingest import _unpack, _upload

pytestmark = pytest.mark.django_db
H200, V211, V213 = "h200-ddp-nccl", "compare-211", "compare-213"


@pytest.fixture
def h200(post, tmp_path, project):
    project.gpu_hour_price = Decimal("3.50")
    project.save()
    _upload(post, _unpack("ddp_h200_spool.tgz", tmp_path / "h200"))


@pytest.fixture
def versions(post, tmp_path):
    for name in ("compare_211_spool.tgz", "compare_213_spool.tgz"):
        _upload(post, _unpack(name, tmp_path / name))


@pytest.fixture
def member(client, project):
    user = User.objects.create_user("bill-reader")
    project.members.add(user)
    client.force_login(user)
    return user


def test_cost_api_is_the_bill_with_money_and_404_elsewhere(client, token, h200):
    response = client.get(f"/api/v1/runs/{H200}/cost", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    bill = response.json()
    assert bill["run"] == H200 and bill["gpu_seconds"] == pytest.approx(2 * 2.687761 + 2 * 1.547599, abs=1e-3)
    assert bill["price_per_gpu_hour"] == 3.5 and bill["money"] == round(bill["gpu_seconds"] / 3600 * 3.5, 2)
    assert bill["top"]["remedy"] and bill["lines"][0]["remedy"]
    other = ProjectToken.issue(Project.objects.create(name="someone-else"))
    assert client.get(f"/api/v1/runs/{H200}/cost", HTTP_AUTHORIZATION=f"Bearer {other}").status_code == 404
    assert client.get("/api/v1/runs/nope/cost", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404
    assert client.get(f"/api/v1/runs/{H200}/cost").status_code == 401


def test_run_page_has_the_panel_fed_by_a_static_script(client, member, h200):
    html = client.get(f"/runs/{H200}/").content.decode()
    assert 'id="cost"' in html and f'data-url="/api/v1/runs/{H200}/cost"' in html
    assert "lockstep/cost.js" in html and "/projects/" in html
    assert "<script>" not in html  # every script is a static file (a Content-Security-Policy forbids inline ones)


def test_compare_shows_each_runs_bill_per_aligned_frame(client, token, member, versions):
    body = client.get(f"/api/v1/compare?runs={V211},{V213}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    cost = body["cost"]
    assert [r["key"] for r in cost["runs"]] == [V211, V213]
    forward = next(row for row in cost["frames"] if row["key"] == "compare_job.py:forward")
    assert all(forward["cells"]) and forward["cells"][1]["gpu_seconds"] < forward["cells"][0]["gpu_seconds"]
    page = client.get(f"/compare/?runs={V211},{V213}").content.decode()
    assert 'id="compile-cost"' in page and "compare_job.py:46 Net.forward" in page


def test_project_page_lists_the_costliest_frames_to_members_only(client, project, versions):
    url = f"/projects/{project.name}/cost/"
    assert client.get(url).status_code == 302  # login first
    stranger = User.objects.create_user("stranger")
    client.force_login(stranger)
    assert client.get(url).status_code == 404
    project.members.add(stranger)
    assert "2 runs are being billed" in client.get(url).content.decode()  # the view handed them to the worker
    tasks.keep_bills(list(Run.objects.values_list("id", flat=True)))  # as the worker runs it
    html = client.get(url).content.decode()
    assert 'id="cost-7d"' in html and 'id="cost-30d"' in html
    assert html.index("compare_job.py:46 Net.forward") < html.index(
        "compare_job.py:50 loss_fn"
    )  # 50-70 s compiles first
    assert "TORCHINDUCTOR_CACHE_DIR" in html and "compare-213" in html


def test_reading_a_bill_writes_nothing(client, token, project, member, versions):
    """The API, the compare page and the project's page on runs without a kept bill: each reader gets a
    bill computed in memory (or none yet, on the project's page) and the database is left as it was."""
    with CaptureQueriesContext(connection) as queries:
        cost = client.get(f"/api/v1/runs/{V211}/cost", HTTP_AUTHORIZATION=f"Bearer {token}")
        compare = client.get(f"/api/v1/compare?runs={V211},{V213}", HTTP_AUTHORIZATION=f"Bearer {token}")
        page = client.get(f"/projects/{project.name}/cost/")
    assert cost.status_code == compare.status_code == page.status_code == 200 and cost.json()["gpu_seconds"] > 0
    writes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert writes == [] and not RunCost.objects.exists()


def counter(client, project: str, cause: str) -> float:
    text = client.get("/metrics").content.decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "lockstep_compile_gpu_seconds_total" and s.labels == {"project": project, "cause": cause}:
                return s.value
    raise AssertionError(f"no sample for {project} {cause}")


def test_metrics_counter_sums_kept_bills_and_never_goes_down(client, settings, project, h200):
    from dashboard.detection import bills
    from dashboard.tenancy.models import Run

    settings.LOCKSTEP_METRICS_PUBLIC = True
    assert counter(client, project.name, "recompile") == 0
    kept = [bills.fresh_bill(Run.objects.get(key=H200))]
    expected = kept[0]["causes"]["recompile"]
    assert expected == pytest.approx(2 * 1.547599, abs=1e-3)
    assert counter(client, project.name, "recompile") == pytest.approx(expected, abs=1e-2)
    h200 = Run.objects.get(key=H200)
    bills.store(h200, {**kept[0], "causes": {**kept[0]["causes"], "recompile": 0.0}})  # a later look files it elsewhere
    assert counter(client, project.name, "recompile") == pytest.approx(expected, abs=1e-2)


def test_the_7_day_window_leaves_out_a_run_of_10_days_ago(client, project, member, versions):
    Run.objects.filter(key=V211).update(started_at=timezone.now() - timedelta(days=10))
    tasks.keep_bills(list(Run.objects.values_list("id", flat=True)))  # the worker bills them
    html = client.get(f"/projects/{project.name}/cost/").content.decode()
    week, month = html[html.index('id="cost-7d"') : html.index('id="cost-30d"')], html[html.index('id="cost-30d"') :]
    assert "compare-211" not in week and "compare-213" in week and "compare-211" in month
    forward = {
        days: next(f for f in bills.top_frames(project.id, days) if "Net.forward" in f["label"]) for days in (7, 30)
    }
    assert (forward[7]["runs"], forward[30]["runs"]) == (1, 2)
    assert forward[30]["gpu_seconds"] > forward[7]["gpu_seconds"] and forward[30]["worst_run"] == V211


def test_the_cost_api_of_a_run_of_4000_frames_lists_the_costliest_and_sums_the_rest(client, token, post, project):
    """Was: every frame with its lines, and every line again (40,000 frames: 17.5 MiB in 7.1 s, each read)."""
    from dashboard.detection import cost
    from tests.conftest import make_batch

    post(make_batch(run="many-frames", world_size=2))
    run = Run.objects.get(key="many-frames")
    compiles = [
        cost.Compile(rank=r, frame=f"model.py:{i}:f{i}", index=0, step=None, status="ok", seconds=1.0 + i / 1000)
        for i in range(4000)
        for r in range(2)
    ]
    bills.store(run, {"run": run.key, "project": project.name, **cost.compute(2, compiles, wall_s=3600)})
    response = client.get("/api/v1/runs/many-frames/cost", HTTP_AUTHORIZATION=f"Bearer {token}")
    bill = response.json()
    assert len(response.content) < 256 * 1024
    assert len(bill["frames"]) == len(bill["lines"]) == cost.BILL_ROWS
    assert bill["frames"][0]["frame"] == "model.py:3999:f3999"  # the costliest first
    assert bill["frames_left_out"]["count"] == bill["lines_left_out"]["count"] == 4000 - cost.BILL_ROWS
    shown = sum(f["gpu_seconds"] for f in bill["frames"])
    assert shown + bill["frames_left_out"]["gpu_seconds"] == pytest.approx(bill["gpu_seconds"], abs=0.01)


def test_every_bill_of_cpu_ranks_says_device_time_and_of_cuda_ranks_gpu_time(client, token, member, settings, versions):
    """The run page's word everywhere else (issue 52, item 2): the compare page, the project page, the
    cost API (and `lockstep cost` from it) and the compile_cost alert say "device" where the ranks did
    not all report a CUDA device (the compare recordings ran on CPUs), "GPU" only where they did."""
    from dashboard.detection import tally
    from dashboard.detection.rules.compile_cost import compile_cost
    from lockstep_cli.tables import cost as cost_text
    from tests.rules import run_view

    body = client.get(f"/api/v1/compare?runs={V211},{V213}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["cost"]["device"] == "device"
    page = client.get(f"/compare/?runs={V211},{V213}").content.decode()
    bill = page.split('id="compile-cost"')[1].split("</section>")[0]
    assert "device-seconds lost to compilation" in bill and " device-s" in bill and "% of device time" in bill
    assert "GPU-s" not in bill and "GPU time" not in bill and "no GPU is assumed" in bill

    tasks.keep_bills(list(Run.objects.values_list("id", flat=True)))
    html = client.get(f"/projects/{Project.objects.get(runs__key=V211).name}/cost/").content.decode()
    assert "device time the ranks lost" in html and "<th>device-hours</th>" in html and "GPU-hours</th>" not in html

    api = client.get(f"/api/v1/runs/{V211}/cost", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert api["device"] == "device"
    text = cost_text(api)
    assert " device-hours (" in text and "DEVICE_SECONDS" in text and "GPU" not in text

    run = Run.objects.get(key=V211)
    settings.LOCKSTEP_COMPILE_BUDGET, settings.LOCKSTEP_COMPILE_BUDGET_AFTER = 0.0001, 0
    view = run_view({0: 1})
    view.compile_cost = bills.for_sweep(run, tally.compile_totals(run).seconds, 1000.0)
    assert view.compile_cost and view.compile_cost["device"] == "device"
    [finding] = list(compile_cost(view))
    assert "of the run's device time (" in finding.message and "GPU" not in finding.message


def test_a_bill_of_cuda_ranks_says_gpu_time(client, token, h200):
    from lockstep_cli.tables import cost as cost_text

    api = client.get(f"/api/v1/runs/{H200}/cost", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert api["device"] == "GPU" and " GPU-hours (" in cost_text(api) and "GPU_SECONDS" in cost_text(api)
