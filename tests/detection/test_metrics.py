"""/metrics per project and per run (issue 18, item 4), on data that came through the ingest view and
was settled by detection: firing alerts by kind and severity, recompiles, graph breaks, compile
seconds, silent ranks, settle lag; bounded labels (no rank label, per-run series only for active
runs, capped); and the Grafana dashboard in docs/grafana/ uses exactly names that /metrics serves."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.detection import lifecycle, runs, settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.tenancy.models import Project, ProjectToken, Rank, Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def public_metrics(settings):
    """These tests read /metrics without a token (refusing it by default: tests/security/test_edge.py)."""
    settings.LOCKSTEP_METRICS_PUBLIC = True


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "lockstep.json"
FRAME = "train.py:10:forward"


def scrape(client) -> list:
    response = client.get("/metrics")
    assert response.status_code == 200
    return [s for family in text_string_to_metric_families(response.content.decode()) for s in family.samples]


def value(samples, name: str, **labels) -> float | None:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1
    return found[0] if found else None


def job(post, run: str, ranks: int = 3, token: str | None = None) -> None:
    """Rank 1 recompiles the frame alone and rank 2's gradient dissents at step 0; two graph breaks a rank."""
    kw = {"token_": token} if token else {}
    for rank in range(ranks):
        events = [
            {"t": "rank_start", "host": f"h{rank}"},
            {"t": "compile", "frame": FRAME, "index": 0, "step": 0, "times": {"entire_frame_compile_time_s": 1.5}},
            {"t": "graph_break", "frame": FRAME, "reason": "print()"},
            {"t": "graph_break", "frame": FRAME, "reason": "data-dependent branch"},
            {"t": "grad", "step": 0, "fps": [1, 5 if rank == 2 else 0]},
        ]
        if rank == 1:
            events.append(
                {
                    "t": "compile",
                    "frame": FRAME,
                    "index": 1,
                    "step": 0,
                    "recompile_reason": "size mismatch",
                    "times": {"entire_frame_compile_time_s": 2.0},
                }
            )
        response = post(
            make_batch(run=run, rank=rank, world_size=ranks, session=f"sess-{run}-{rank}", events=events), **kw
        )
        assert response.status_code == 200, response.content
    for slot in GradSlot.objects.filter(run__key=run):
        settle.settle_grad(slot.id)
    for slot in CompileSlot.objects.filter(run__key=run):
        settle.settle_compile(slot.id)
    for active in Run.objects.filter(key=run):
        runs.check(active)  # what the 2 s sweep does for an active run


def test_health_per_project_and_per_run_from_real_reports(client, post, project, settings):
    job(post, "hot")
    run = Run.objects.get(key="hot")
    Rank.objects.filter(run=run, rank=1).update(
        last_seen=timezone.now() - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER + 5)
    )
    assert (
        post(
            make_batch(run="hot", rank=0, session="sess-hot-0", seq=1, events=[{"t": "grad", "step": 7, "fps": [1, 0]}])
        ).status_code
        == 200
    )
    GradSlot.objects.filter(run=run, step=7).update(first_seen=timezone.now() - timedelta(seconds=40))  # waiting 40 s

    samples = scrape(client)
    p, r = project.name, {"project": project.name, "run": "hot"}
    assert value(samples, "lockstep_alerts_firing", project=p, kind="grad_divergence", severity="critical") == 1
    assert value(samples, "lockstep_alerts_firing", project=p, kind="recompile_divergence", severity="critical") == 1
    assert value(samples, "lockstep_run_alerts_firing", **r, severity="critical") == 2
    assert value(samples, "lockstep_run_recompiles_total", **r) == 1
    assert value(samples, "lockstep_run_graph_breaks_total", **r) == 6
    assert value(samples, "lockstep_run_compile_seconds_total", **r) == pytest.approx(3 * 1.5 + 2.0)
    assert value(samples, "lockstep_run_ranks", **r) == 3
    assert value(samples, "lockstep_run_ranks_silent", **r) == 1 == value(samples, "lockstep_ranks_silent", project=p)
    assert value(samples, "lockstep_run_last_step", **r) == 7
    assert 40 <= value(samples, "lockstep_run_settle_lag_seconds", **r) < 120
    assert value(samples, "lockstep_settle_lag_seconds", project=p) == value(
        samples, "lockstep_run_settle_lag_seconds", **r
    )
    assert value(samples, "lockstep_runs_active", project=p) == 1
    assert all("rank" not in s.labels for s in samples)  # no per-rank series
    assert value(samples, "lockstep_ingest_requests_total", endpoint="ingest", outcome="accepted", status="200") >= 4


def test_per_run_series_only_for_active_runs_capped_while_project_totals_cover_all(client, post, project, settings):
    other = Project.objects.create(name=f"{project.name}-b")
    job(post, "old")
    job(post, "new")
    job(post, "theirs", token=ProjectToken.issue(other))
    Run.objects.filter(key="old").update(last_seen=timezone.now() - timedelta(hours=2))  # inactive: no series at all
    settings.LOCKSTEP_METRICS_RUNS = 1

    samples = scrape(client)
    runs = {s.labels["run"] for s in samples if "run" in s.labels}
    assert len(runs) == 1 and runs <= {"new", "theirs"}  # the newest active run only
    assert value(samples, "lockstep_metrics_runs_omitted") == 1
    assert value(samples, "lockstep_runs_active", project=project.name) == 1
    assert value(samples, "lockstep_runs_active", project=other.name) == 1
    for name in (project.name, other.name):  # "old" fired too, but it is not active
        assert value(samples, "lockstep_alerts_firing", project=name, kind="grad_divergence", severity="critical") == 1


def expr_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: with strings, label matchers, ranges, grouping
    clauses, dashboard variables and function names removed, the names are what is left."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = re.sub(r"\b[A-Za-z_]\w*\s*\(", "(", text)
    return set(re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*", text)) - {"and", "or", "unless", "offset", "bool"}


def dashboard_exprs() -> list[str]:
    """Every panel target's expr, and the metric each query variable takes its values from."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"]).group(1))
    return exprs


def test_every_metric_of_the_grafana_dashboard_is_served(client, post, project):
    job(post, "graphed")
    served = {s.name for s in scrape(client)}
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    used = set().union(*map(expr_metric_names, exprs))
    assert used and all(name.startswith("lockstep_") for name in used), used
    assert used <= served, sorted(used - served)
    assert expr_metric_names('sum by (kind) (rate(lockstep_x_total{project=~"$project"}[5m])) / lockstep_y') == {
        "lockstep_x_total",
        "lockstep_y",
    }


def test_a_diverged_run_keeps_its_verdict_and_unresolved_alerts_after_it_ended(client, post, project):
    job(post, "over")
    run = Run.objects.get(key="over")
    Alert.objects.filter(run=run).update(notified_revision=F("revision"))  # delivered
    with transaction.atomic():
        lifecycle.end_of_run(run)
    assert not Alert.objects.filter(run=run, state="firing").exists()

    samples = scrape(client)
    r = {"project": project.name, "run": "over"}
    assert value(samples, "lockstep_run_alerts_firing", **r, severity="critical") is None
    assert value(samples, "lockstep_run_alerts_unresolved", **r, severity="critical") == 2  # they still count
    assert {s.labels["verdict"]: s.value for s in samples if s.name == "lockstep_run_verdict"} == {
        "in_lockstep": 0,
        "diverged": 1,
        "failed": 0,
        "stalled": 0,
        "recovered": 0,
    }
    assert value(samples, "lockstep_runs_by_verdict", project=project.name, verdict="diverged") == 1
    assert value(samples, "lockstep_runs_by_verdict", project=project.name, verdict="in_lockstep") == 0
