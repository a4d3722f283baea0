"""A run's compile totals over all its ranks (recompiles, graph breaks, seconds compiling), counted by
the periodic check (`runs.check`, every 2 s for active runs) and kept in `RunTally`.

The check sums the run's compile times anyway (whether the kept compile bill is stale, `bills.py`); the same
aggregate also counts recompiles, so keeping the totals costs one more count (graph breaks) and
one upsert per check. /metrics then reads one row per run, whatever its ranks and compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from dashboard.detection.models import RunTally
from dashboard.evidence import reads
from dashboard.tenancy.models import Run


@dataclass(frozen=True)
class CompileTotals:
    seconds: float
    recompiles: int


def compile_totals(run: Run) -> CompileTotals:
    """One aggregate over the run's compile events: seconds compiling and compiles past a frame's first."""
    seconds, recompiles = reads.compile_totals(run.id)
    return CompileTotals(seconds=seconds, recompiles=recompiles)


def record(run: Run, totals: CompileTotals, breaks: int) -> None:
    """Keep the run's totals and its graph breaks (one INSERT ... ON CONFLICT UPDATE)."""
    RunTally.objects.bulk_create(
        [
            RunTally(
                run=run,
                recompiles=totals.recompiles,
                graph_breaks=breaks,
                compile_seconds=totals.seconds,
                updated_at=timezone.now(),
            )
        ],
        update_conflicts=True,
        unique_fields=["run"],
        update_fields=["recompiles", "graph_breaks", "compile_seconds", "updated_at"],
    )
