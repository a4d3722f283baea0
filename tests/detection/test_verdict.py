"""A run's verdict from its incidents and status, in PostgreSQL: findings go through the lifecycle and
the grouping as in production; the run's end closes them as ended_unresolved, which still counts."""

from __future__ import annotations

import pytest
from django.db import transaction

from dashboard.detection import lifecycle, verdict
from dashboard.detection.models import Alert
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Rank, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(project) -> Run:
    made = Run.objects.create(project=project, key="judged", world_size=3)
    for rank in range(3):
        Rank.objects.create(run=made, rank=rank, status="ok", host="node1")
    return made


def fire(run: Run, kind: str, ranks: tuple[int, ...], step: int | None = None, severity="critical", **details):
    with transaction.atomic():
        lifecycle.apply(
            run,
            [Finding(severity, ranks, f"{kind} on {ranks}", step, None, details, f"{kind}:{ranks}", kind)],
            [],
            None,
        )


def end(run: Run) -> None:
    Alert.objects.update(notified_revision=100)  # delivered: the end may close them
    with transaction.atomic():
        lifecycle.end_of_run(run)


def test_a_run_without_incidents_is_in_lockstep(run):
    assert verdict.of_run(run) == verdict.Verdict("in_lockstep", "in lockstep")


def test_a_divergence_the_run_ended_with_still_says_diverged(run):
    fire(run, "grad_divergence", (2,), step=12)
    assert verdict.of_run(run).text == "diverged at step 12 (rank 2, grad_divergence)"
    end(run)
    judged = verdict.of_run(run)
    assert (judged.kind, judged.text, judged.step, judged.ranks) == (
        "diverged",
        "diverged at step 12 (rank 2, grad_divergence)",
        12,
        (2,),
    )


def test_a_crash_fails_the_run_naming_the_rank_and_its_error(run):
    Rank.objects.filter(run=run, rank=1).update(status="error", exit_code=1)
    fire(run, "rank_crashed", (1,), step=4, reason="RuntimeError: CUDA error: an illegal memory access\nmore")
    end(run)
    assert verdict.of_run(run).text == "failed at step 4 (rank 1, RuntimeError: CUDA error: an illegal memory access)"


def test_a_silent_rank_stalls_the_run_and_a_lost_one_fails_it(run, project):
    fire(run, "rank_silent", (2,))
    assert verdict.of_run(run).kind == "stalled"
    other = Run.objects.create(project=project, key="killed", world_size=2)
    fire(other, "rank_silent", (1,), lost=True)
    assert verdict.of_run(other).text == "failed (rank 1, lost: never ended)"


def test_incidents_that_all_got_better_make_it_recovered(run):
    fire(run, "grad_divergence", (2,), step=3)
    with transaction.atomic():
        lifecycle.apply(run, [], [("grad_divergence", "grad_divergence:(2,)")], 9)
    end(run)  # nothing fires any more: the end closes nothing
    assert verdict.of_run(run).text == "recovered (1 incident, all resolved)"


def test_what_compiling_costs_is_no_verdict(run):
    fire(run, "compile_cost", (), severity="warning")
    end(run)
    assert verdict.of_run(run).kind == "in_lockstep"


def test_the_most_severe_then_the_earliest_unresolved_incident_decides(run):
    fire(run, "baseline_divergence", (), step=1, severity="warning")
    fire(run, "grad_divergence", (1,), step=7)
    fire(run, "param_divergence", (0,), step=8)
    judged = verdict.of_run(run)
    assert judged.text == (
        "diverged at step 7 (rank 1, grad_divergence); "
        "2 more: baseline_divergence at step 1 (all ranks), param_divergence at step 8 (rank 0)"
    )
    assert judged.more == 2 and judged.as_json()["more"] == 2


def test_a_dead_rank_leads_the_verdict_and_the_other_incidents_follow_in_step_order(run):
    """The demo's killed-rank run: rank 1's compiler fails, rank 0's weights drift at step 4, rank 2's
    process vanishes at step 8. The run failed; it must not read as one divergence."""
    fire(run, "compile_failure_divergence", (1,), severity="warning")
    fire(run, "param_divergence", (0,), step=4)
    fire(run, "rank_crashed", (2,), step=8, status="vanished")
    end(run)
    judged = verdict.of_run(run)
    assert (judged.kind, judged.step, judged.ranks, judged.cause, judged.more) == ("failed", 8, (2,), "rank_crashed", 2)
    assert judged.text == (
        "failed at step 8 (rank 2, vanished: killed or crashed in native code); "
        "2 more: param_divergence at step 4 (rank 0), compile_failure_divergence (rank 1)"
    )


def test_a_silent_rank_outranks_an_earlier_divergence_and_many_more_are_counted(run):
    for rank in range(5):
        fire(run, "grad_divergence", (rank + 3,), step=rank, severity="warning" if rank else "critical")
    fire(run, "rank_silent", (2,))
    judged = verdict.of_run(run)
    assert judged.kind == "stalled" and judged.more == 5
    assert judged.text == (
        "stalled (rank 2, rank_silent); 5 more: grad_divergence at step 0 (rank 3), "
        "grad_divergence at step 1 (rank 4), grad_divergence at step 2 (rank 5), …"
    )


def test_a_failed_status_fails_the_run_without_an_incident(run):
    Rank.objects.filter(run=run, rank=0).update(status="error", exit_code=1)
    assert verdict.of_run(run) == verdict.Verdict("failed", "failed")


def test_a_person_closing_what_the_run_ended_with_makes_it_resolved_and_the_run_recovered(run):
    fire(run, "grad_divergence", (2,), step=5)
    end(run)
    with transaction.atomic():
        lifecycle.resolve_by_hand(Alert.objects.get(), None, "the node was replaced, the run restarted")
    alert = Alert.objects.select_related("incident").get()
    assert alert.state == "resolved" and alert.incident.state == "resolved"
    assert verdict.of_run(run).kind == "recovered"
