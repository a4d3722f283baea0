"""Which bill a reader gets (`bills.current_bill`): the kept one while no compile reached the run since
and it is younger than REFRESH_S, however often other events arrive; once a compile arrived (after
MIN_AGE_S) or it is older than REFRESH_S, the kept one marked stale while the sweep still looks at the
run, a new one after, computed in memory (the worker keeps it). An ended run's last sweep bills it once
more (`final_bill`). On the real H200 recording."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.detection import bills
from dashboard.detection.models import RunCost
from dashboard.tenancy.models import Project, Run
from tests.agents.test_fixtures_ingest import _unpack, _upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(post, tmp_path, project) -> Run:
    _upload(post, _unpack("ddp_h200_spool.tgz", tmp_path / "h200"))
    return Run.objects.get(key="h200-ddp-nccl")


def _read(run: Run, at) -> str:
    run.refresh_from_db()
    return bills.current_bill(run, at)["computed_at"]


def _stale(run: Run, at) -> bool:
    run.refresh_from_db()
    return bills.current_bill(run, at)["stale"]


def test_a_reader_gets_the_kept_bill_until_a_compile_arrives_or_it_is_older_than_refresh(run):
    kept_at = run.last_seen + timedelta(seconds=1)
    kept = bills.fresh_bill(run, kept_at)
    assert kept["gpu_seconds"] > 0

    later = kept_at + timedelta(seconds=bills.MIN_AGE_S + 5)
    Run.objects.filter(id=run.id).update(last_seen=later)  # progress, no compile: still the kept bill
    assert _read(run, later) == kept_at.isoformat()

    RunCost.objects.filter(run=run).update(compile_seconds=kept["compile_seconds"] - 1.0)  # a compile since
    assert _read(run, later) == kept_at.isoformat() and _stale(run, later)  # the sweep is on it
    unswept = later + timedelta(seconds=bills.SWEPT_S + 1)
    assert _read(run, unswept) == unswept.isoformat()  # nobody sweeps it any more: computed anew, in memory
    assert RunCost.objects.get(run=run).compile_seconds == pytest.approx(kept["compile_seconds"] - 1.0)  # not kept
    assert _read(run, unswept + timedelta(seconds=1)) == unswept.isoformat()  # the next reader gets that bill
    assert not _stale(run, unswept)
    bills.fresh_bill(run, unswept + timedelta(seconds=2))  # the worker keeps the very bill the reader computed
    row = RunCost.objects.get(run=run)
    assert row.computed_at == unswept and row.compile_seconds == pytest.approx(kept["compile_seconds"])

    stale = unswept + timedelta(seconds=bills.REFRESH_S + 1)
    Run.objects.filter(id=run.id).update(last_seen=stale)
    assert _read(run, stale) == unswept.isoformat() and _stale(run, stale)
    assert (
        _read(run, stale + timedelta(seconds=bills.SWEPT_S)) == (stale + timedelta(seconds=bills.SWEPT_S)).isoformat()
    )


def test_an_ended_runs_last_look_bills_it_once_more(run):
    kept_at = run.last_seen - timedelta(seconds=5)  # computed before the run's last events arrived
    bills.fresh_bill(run, kept_at)
    bills.final_bill(run, run.last_seen + timedelta(seconds=2))
    assert RunCost.objects.get(run=run).computed_at == run.last_seen + timedelta(seconds=2)
    bills.final_bill(run, run.last_seen + timedelta(seconds=4))  # current now: left as it is
    assert RunCost.objects.get(run=run).computed_at == run.last_seen + timedelta(seconds=2)


def test_a_run_nothing_reached_since_keeps_its_bill_however_old(run):
    kept_at = run.last_seen + timedelta(seconds=1)
    bills.fresh_bill(run, kept_at)
    assert _read(run, kept_at + timedelta(days=3)) == kept_at.isoformat()


def test_the_budget_applies_after_10_minutes_at_10_percent_unless_the_project_says_otherwise(run):
    """LOCKSTEP_COMPILE_BUDGET(_AFTER) default to 10 % after 600 s; a project's own budget wins."""
    now = run.last_seen + timedelta(seconds=1)
    seconds = bills.fresh_bill(run, now)["compile_seconds"]
    assert bills.budget_of(run) == (0.10, 600.0)
    assert bills.for_sweep(run, seconds, max(600.0, seconds / 0.10 + 1), now) is None  # under 10 %

    Project.objects.filter(id=run.project_id).update(compile_budget=0.001)  # the default 600 s still holds
    assert bills.budget_of(run) == (0.001, 600.0)
    assert bills.for_sweep(run, seconds, 599.0, now) is None  # not 10 minutes old yet
    past = bills.for_sweep(run, seconds, 600.0, now)
    assert (past["budget"], past["after_s"], past["wall_s"]) == (0.001, 600.0, 600.0) and past["top"]["remedy"]

    Project.objects.filter(id=run.project_id).update(compile_budget_after=60.0)
    assert bills.for_sweep(run, seconds, 120.0, now)["after_s"] == 60.0
