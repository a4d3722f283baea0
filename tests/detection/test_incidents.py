"""Incidents in PostgreSQL: findings -> lifecycle.apply -> one incident per cause, the right root."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from dashboard.detection import incidents, lifecycle
from dashboard.detection.models import Alert, Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.rules import findings_of, grad_view
from tests.rules.test_rank_crashed import crash, ended

pytestmark = pytest.mark.django_db
FRAME = "model.py:46:forward"


@pytest.fixture
def run(project) -> Run:
    return Run.objects.create(project=project, key="job-1", world_size=3)


def apply(run: Run, *findings: Finding, clean: list[tuple[str, str]] = ()) -> list[int]:
    with transaction.atomic():
        return lifecycle.apply(run, list(findings), list(clean), None)


def finding(
    kind: str,
    ranks: tuple[int, ...],
    subject: str,
    severity: str = "critical",
    frame: str | None = None,
    step: int | None = None,
    **details,
) -> Finding:
    return Finding(
        severity=severity,
        ranks=ranks,
        message=f"{kind} on {ranks}",
        frame=frame,
        step=step,
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


def test_a_cause_that_arrives_after_its_symptom_re_roots_that_incident(run):
    """The demo's rank 1 recompile came 10 s after the baseline divergence it explains: one page, updated."""
    apply(run, finding("baseline_divergence", (), "baseline:base-run:ddp", "warning", step=10))
    [incident] = pages(run)
    opened = incident.revision
    apply(run, finding("recompile_divergence", (1,), f"frame:{FRAME}", frame=FRAME, step=8))
    [incident] = pages(run)
    assert (incident.root.kind, incident.root.ranks, incident.severity) == ("recompile_divergence", [1], "critical")
    assert incident.revision > opened and incident.cause == "ranks:1"
    apply(run, finding("grad_divergence", (1,), "group:ddp", step=12))  # the same story goes on
    assert len(pages(run)) == 1


def test_a_symptom_that_arrives_after_its_cause_joins_it(run):
    apply(run, finding("graph_divergence", (1,), f"frame:{FRAME}", frame=FRAME, step=3))
    apply(run, finding("baseline_divergence", (), "baseline:base-run:ddp", "warning", step=3))
    apply(run, finding("grad_divergence", (0, 1), "group:ddp", step=4, tie=True))  # no majority: holds rank 1
    [incident] = pages(run)
    assert incident.root.kind == "graph_divergence" and incident.alerts.count() == 3


def test_a_recompile_after_the_divergence_explains_nothing(run):
    apply(run, finding("baseline_divergence", (), "baseline:base-run:ddp", "warning", step=5))
    apply(run, finding("recompile_divergence", (1,), f"frame:{FRAME}", frame=FRAME, step=9))
    assert [i.root.kind for i in pages(run)] == ["baseline_divergence", "recompile_divergence"]


def test_ranks_that_raised_the_same_error_are_one_incident_rooted_at_all_of_them(run):
    """Rank 0's crash is seen first, rank 1's (the same exception, the same step) a sweep later."""
    reason = "RuntimeError: Expected to have finished reduction in the prior iteration"
    crashes = {r: crash(reason=reason, ended_at=1000.0 + r) for r in (0, 1)}
    apply(run, *findings_of(ended({0: crashes[0]}, live={1: 1.0, 2: 1.0}), "rank_crashed"))
    apply(run, *findings_of(ended(crashes, live={2: 1.0}), "rank_crashed"))
    [incident] = pages(run)
    assert incident.as_json()["root"]["ranks"] == [0, 1] and incident.severity == "critical"
    assert incident.root.message.startswith(f"Ranks 0, 1 raised the same error: {reason}")


def test_nan_gradients_on_every_rank_are_one_critical_incident(run):
    for step in (7, 8):
        apply(
            run,
            *findings_of(
                grad_view({0: [1], 1: [1], 2: [1]}, step=step, nonfinite={0: 2, 1: 2, 2: 2}), "nonfinite_grad"
            ),
        )
    [incident] = pages(run)
    assert (incident.severity, incident.root.ranks) == ("critical", [0, 1, 2])
    assert incident.root.message.startswith("Gradients non-finite on all ranks from step 7")


def test_nan_on_one_rank_that_spreads_to_every_rank_is_one_incident_rooted_at_that_rank(run):
    """Rank 2's NaN weights go into the next all-reduce: every rank's gradients are NaN from then on."""
    apply(run, *findings_of(grad_view({0: [1], 1: [1], 2: [1]}, step=4, nonfinite={2: 1}), "nonfinite_grad"))
    apply(
        run, *findings_of(grad_view({0: [1], 1: [1], 2: [1]}, step=5, nonfinite={0: 2, 1: 2, 2: 2}), "nonfinite_grad")
    )
    [incident] = pages(run)
    assert (incident.root.ranks, incident.root.step, incident.alerts.count()) == ([2], 4, 2)


def test_nan_spread_settled_before_its_origin_is_still_one_incident_rooted_at_the_origin(run):
    """Slots settle in any order: step 5 (NaN everywhere) may settle before step 4, where rank 2's NaN
    gradients also differ from the others' (grad_divergence in the same settle). One incident, rooted
    at rank 2's step 4, whichever order the rules' findings came in."""
    apply(
        run, *findings_of(grad_view({0: [1], 1: [1], 2: [1]}, step=5, nonfinite={0: 2, 1: 2, 2: 2}), "nonfinite_grad")
    )
    origin = grad_view({0: [1], 1: [1], 2: [9]}, step=4, nonfinite={2: 1})
    apply(run, *findings_of(origin, "grad_divergence"), *findings_of(origin, "nonfinite_grad"))
    [incident] = pages(run)
    assert (incident.root.kind, incident.root.ranks, incident.root.step) == ("nonfinite_grad", [2], 4)
    assert sorted(incident.alerts.values_list("kind", flat=True)) == [
        "grad_divergence",
        "nonfinite_grad",
        "nonfinite_grad",
    ]


def test_a_divergence_on_every_rank_in_the_step_before_they_all_crash_alike_is_that_crash(run):
    """DDP with an unused parameter: step 0's reduction never finished (gradients of both ranks differ,
    no majority), then every rank raises "Expected to have finished reduction" in step 1."""
    two = Run.objects.create(project=run.project, key="job-2", world_size=2)
    reason = "RuntimeError: Expected to have finished reduction in the prior iteration"
    crashes = {r: crash(reason=reason, ended_at=1000.0 + r, last_step=0, compiled=None) for r in (0, 1)}
    apply(two, finding("grad_divergence", (0, 1), "group:ddp", step=0, tie=True))
    apply(two, *findings_of(ended({0: crashes[0]}, live={1: 1.0}), "rank_crashed"))  # rank 0's, seen alone
    apply(two, *findings_of(ended(crashes), "rank_crashed"))
    [incident] = pages(two)
    assert incident.root.kind == "rank_crashed" and incident.as_json()["root"]["ranks"] == [0, 1]
    assert sorted(a.kind for a in incident.alerts.all()) == ["grad_divergence", "rank_crashed"]


def test_a_divergence_steps_before_a_common_crash_is_its_own_incident(run):
    apply(run, finding("grad_divergence", (1,), "group:ddp", step=2))
    apply(run, finding("rank_crashed", (0, 1, 2), "error:9:RuntimeError", step=9, alike=[0, 1, 2]))
    assert sorted(i.root.kind for i in pages(run)) == ["grad_divergence", "rank_crashed"]


def test_past_the_runs_alert_cap_findings_are_counted_in_one_alert_per_kind(run, settings):
    """A flood of diverging frames keeps a bounded number of alerts: settling and the incident stay cheap."""
    settings.LOCKSTEP_ALERTS_PER_RUN = 3
    for n in range(10):
        apply(run, finding("graph_divergence", (1,), f"frame:gen.py:{n}:f", frame=f"gen.py:{n}:f", step=0))
    kept = Alert.objects.filter(run=run).exclude(subject__startswith="more:")
    assert kept.count() == 3
    overflow = Alert.objects.get(run=run, subject="more:graph_divergence")
    assert overflow.details["left_out"] == 7 and overflow.count == 7
    assert overflow.message.startswith("7 more graph_divergence past this run's alerts: graph_divergence on (1,)")
    apply(run, finding("graph_divergence", (1,), "frame:gen.py:0:f", frame="gen.py:0:f", step=0))  # a kept one
    assert Alert.objects.get(run=run, subject="frame:gen.py:0:f").count == 2
    [incident] = pages(run)  # one cause (rank 1): one page, the summary inside it
    assert incident.alerts.count() == 4
