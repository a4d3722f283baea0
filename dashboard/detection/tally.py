"""A run's compile totals over all its ranks (recompiles, graph breaks, seconds compiling), counted by
the periodic check (`runs.check`, every 2 s for active runs) and kept in `RunTally`.

The check sums the run's compile times anyway (the compile share of `recompile_storm`); the same
aggregate also counts recompiles, so keeping the totals costs one more count (graph breaks) and
one upsert per check. /metrics then reads one row per run, whatever its ranks and compiles.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q, Sum
from django.utils import timezone

from dashboard.detection.models import RunTally
from dashboard.tenancy.models import Run
from ingest.models import CompileEvent, GraphBreakEvent


@dataclass(frozen=True)
class CompileTotals:
    seconds: float
    recompiles: int


def compile_totals(run: Run) -> CompileTotals:
    """One aggregate over the run's compile events: seconds compiling and compiles past a frame's first."""
    row = CompileEvent.objects.filter(run=run).aggregate(s=Sum("compile_time"), n=Count("id", filter=Q(index__gt=0)))
    return CompileTotals(seconds=row["s"] or 0.0, recompiles=row["n"] or 0)


def record(run: Run, totals: CompileTotals) -> None:
    """Keep the run's totals (one INSERT ... ON CONFLICT UPDATE), graph breaks counted now."""
    breaks = GraphBreakEvent.objects.filter(run=run).count()
    RunTally.objects.bulk_create(
        [RunTally(run=run, recompiles=totals.recompiles, graph_breaks=breaks, compile_seconds=totals.seconds,
                  updated_at=timezone.now())],
        update_conflicts=True, unique_fields=["run"], update_fields=["recompiles", "graph_breaks", "compile_seconds",
                                                                     "updated_at"])
