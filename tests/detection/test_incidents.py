"""Incidents in PostgreSQL: findings -> lifecycle.apply -> one incident per cause, the right root."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from dashboard.detection import incidents, lifecycle
from dashboard.detection.models import Alert, Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run

pytestmark = pytest.mark.django_db
FRAME = "model.py:46:forward"


@pytest.fixture
def run(project) -> Run:
    return Run.objects.create(project=project, key="job-1", world_size=3)


def apply(run: Run, *findings: Finding, clean: list[tuple[str, str]] = ()) -> list[int]:
    with transaction.atomic():
        return lifecycle.apply(run, list(findings), list(clean), None)


def finding(
    kind: str, ranks: tuple[int, ...], subject: str, severity: str = "critical", frame: str | None = None, **details
) -> Finding:
    return Finding(
        severity=severity,
        ranks=ranks,
        message=f"{kind} on {ranks}",
        frame=frame,
        details=details,
        subject=subject,
        kind=kind,
    )


def pages(run: Run) -> list[Incident]:
    return list(Incident.objects.filter(run=run).order_by("id"))


def test_a_rank_killed_outright_is_the_root_and_the_peers_that_lost_it_its_consequences(run):
    apply(
        run,
        finding("rank_crashed", (0,), "rank:0", "warning", consequence_of=2),
        finding("rank_crashed", (1,), "rank:1", "warning", consequence_of=2),
    )
    apply(run, finding("rank_silent", (2,), "rank:2"))
    [incident] = pages(run)
    assert incident.root.kind == "rank_silent" and incident.root.ranks == [2]
    assert incident.severity == "critical" and incident.state == "firing" and incident.cause == "ranks:2"
    body = incident.as_json()
    assert body["root"]["ranks"] == [2] and sorted(c["ranks"][0] for c in body["consequences"]) == [0, 1]
    assert sorted(body["alerts"]) == sorted(Alert.objects.filter(run=run).values_list("id", flat=True))


def test_the_cache_miss_of_a_lone_recompile_belongs_to_the_recompile(run):
    apply(run, finding("cache_divergence", (1,), f"frame:{FRAME}", "warning", frame=FRAME))
    apply(
        run,
        finding("recompile_divergence", (1,), f"frame:{FRAME}", frame=FRAME),
        finding("compile_cost", (0, 1, 2), "run", "warning", frame=FRAME),
    )
    [incident] = pages(run)
    assert incident.root.kind == "recompile_divergence" and incident.alerts.count() == 3


def test_a_hang_waiting_for_a_rank_joins_that_ranks_incident(run):
    apply(run, finding("hang_forecast", (2,), "hang", "warning"))
    apply(run, finding("rank_crashed", (2,), "rank:2"))
    [incident] = pages(run)
    assert incident.root.kind == "rank_crashed" and incident.severity == "critical"


def test_independent_causes_page_separately(run):
    apply(
        run,
        finding("graph_divergence", (1,), f"frame:{FRAME}", frame=FRAME),
        finding("nonfinite_grad", (2,), "group:ddp"),
    )
    assert [(i.root.kind, i.root.ranks) for i in pages(run)] == [("graph_divergence", [1]), ("nonfinite_grad", [2])]


def test_each_change_of_the_page_is_one_revision_and_it_resolves_with_its_last_alert(run):
    apply(run, finding("recompile_divergence", (1,), f"frame:{FRAME}", frame=FRAME))
    [incident] = pages(run)
    first = incident.revision
    apply(run, finding("recompile_divergence", (1,), f"frame:{FRAME}", frame=FRAME))  # a repeat: not news
    incident.refresh_from_db()
    assert incident.revision == first
    apply(run, finding("cache_divergence", (1,), f"frame:{FRAME}", "warning", frame=FRAME))  # grew
    incident.refresh_from_db()
    assert incident.revision == first + 1
    apply(run, clean=[("recompile_divergence", f"frame:{FRAME}")])
    incident.refresh_from_db()
    assert incident.state == "firing"  # the cache finding still fires
    apply(run, clean=[("cache_divergence", f"frame:{FRAME}")])
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_at is not None and incident.revision == first + 2
    assert incidents.open_roots(run) == []


def test_a_refiring_alert_reopens_its_incident(run):
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    apply(run, clean=[("grad_divergence", "group:ddp")])
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    [incident] = pages(run)
    assert incident.state == "firing" and incident.resolved_at is None


def test_an_acknowledged_incident_no_longer_fails_a_check(run, django_user_model):
    apply(run, finding("graph_divergence", (1,), f"frame:{FRAME}", frame=FRAME))
    [incident] = pages(run)
    assert incidents.open_roots(run) == [incident]
    with transaction.atomic():
        incidents.acknowledge(incident, django_user_model.objects.create(username="oncall"))
    assert incidents.open_roots(run) == []


def test_a_run_wide_finding_does_not_swallow_a_rank_that_dies_later(run):
    apply(run, finding("ineffective_compile", (0, 1, 2), "run", "warning"))
    apply(run, finding("rank_silent", (2,), "rank:2"))
    assert [(i.root.kind, i.root.ranks) for i in pages(run)] == [
        ("ineffective_compile", [0, 1, 2]),
        ("rank_silent", [2]),
    ]


def test_fewer_of_the_same_dissenters_join_their_incident(run):
    apply(run, finding("graph_divergence", (1, 2), f"frame:{FRAME}", frame=FRAME))
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    [incident] = pages(run)
    assert incident.root.kind == "graph_divergence"


def test_repeats_refresh_the_pages_counts_at_most_every_half_minute(run):
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    [incident] = pages(run)
    first = incident.revision
    apply(run, finding("grad_divergence", (2,), "group:ddp"))  # fresh page: the count waits
    incident.refresh_from_db()
    assert incident.revision == first
    Incident.objects.filter(id=incident.id).update(last_change=incident.last_change - timedelta(seconds=31))
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    incident.refresh_from_db()
    assert incident.revision == first + 1 and Alert.objects.get(kind="grad_divergence").count == 3


def test_an_incident_only_the_runs_end_closed_still_fails_the_check_until_acknowledged(run, django_user_model):
    apply(run, finding("grad_divergence", (2,), "group:ddp"))
    Alert.objects.update(notified_revision=10)  # its firing was delivered: the end may close it
    with transaction.atomic():
        lifecycle.end_of_run(run)
    [incident] = pages(run)
    assert incident.state == "ended_unresolved" and incident.as_json()["root"]["resolve_reason"] == "run ended"
    assert incidents.open_roots(run) == [incident]  # the diverged rank did not clear itself
    with transaction.atomic():
        lifecycle.acknowledge(incident.root, django_user_model.objects.create(username="oncall"))
    assert incidents.open_roots(run) == []


def test_an_alert_that_fires_again_forgets_why_it_was_resolved(run):
    apply(run, finding("graph_divergence", (1,), f"frame:{FRAME}", frame=FRAME))
    Alert.objects.update(notified_revision=10)
    with transaction.atomic():
        lifecycle.end_of_run(run)
    apply(run, finding("graph_divergence", (1,), f"frame:{FRAME}", frame=FRAME))
    alert = Alert.objects.get()
    assert alert.state == "firing" and alert.resolve_reason == "" and alert.resolved_by is None
