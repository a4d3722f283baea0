"""Run-level checks the periodic sweep makes: silent ranks and the share of time spent compiling."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from dashboard.detection import lifecycle
from dashboard.detection.rules import RunView, clean_subjects, evaluate
from dashboard.tenancy.models import Rank, Run
from ingest.models import CompileEvent

ACTIVE_WINDOW = timedelta(hours=1)


def active_runs() -> list[Run]:
    """Runs that reported recently and still have a rank that has not ended."""
    recent = Run.objects.filter(last_seen__gte=timezone.now() - ACTIVE_WINDOW)
    return list(recent.filter(ranks__status="running").distinct())


def rank_rows(run: Run) -> list[dict]:
    return list(Rank.objects.filter(run=run).values("rank", "last_step", "status"))


def view_of(run: Run) -> RunView:
    now = timezone.now()
    ranks = list(Rank.objects.filter(run=run).values_list("rank", "last_seen", "status"))
    compile_total = CompileEvent.objects.filter(run=run).aggregate(s=Sum("compile_time"))["s"] or 0.0
    return RunView(
        run_id=run.id,
        world_size=run.world_size,
        last_seen={r: (now - seen).total_seconds() for r, seen, _ in ranks},
        ended={r for r, _, status in ranks if status != "running"},
        silent_after=settings.LOCKSTEP_SILENT_AFTER,
        compile_seconds=compile_total / max(len(ranks), 1),
        wall_seconds=(now - run.started_at).total_seconds(),
    )


def check(run: Run) -> list[int]:
    with transaction.atomic():
        view = view_of(run)
        findings = evaluate(view)
        return lifecycle.apply(run, findings, clean_subjects(view, findings), None)
