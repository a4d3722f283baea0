"""A run's aggregates over its compile rows, read again only once its compiles changed.

The periodic check (`runs.check`, every 2 s for every active run) sums the run's compile times,
counts its recompiles and graph breaks, and looks for ranks whose graphs are all empty: aggregates
over every compile row of the run. A job compiles at its start and when it recompiles, and a real
model at 100,000 ranks leaves millions of such rows (20 compiles a rank: about 1.1 s of a 1.4 s
check, `python -m bench sweep --compiles 20`). The run's compile slots say when they changed:
every batch that stores compiles counts once on each slot it reports (`ledger.slots.count_compiles`),
so the slots' number and their reports only grow while compiles arrive. What that misses (a count
lost to a process that stopped between its commit and its count, graph breaks that came without a
compile) is read at the latest REREAD_S later. Kept per process: another worker process that checks
the run reads once for itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dashboard.detection import tally
from dashboard.ledger import slots

REREAD_S = 30.0
KEPT_RUNS = 512  # past it, runs not read within REREAD_S are forgotten


@dataclass(frozen=True)
class Compiled:
    """What the check reads of a run's compile rows."""

    totals: tally.CompileTotals
    breaks: int
    empty: dict[int, dict[str, Any]]  # rank -> its compiles and where it stood, of the ranks whose graphs are all empty
    empty_frames: dict[int, list[str]]  # rank -> frames of its empty graphs, for the ranks above


_seen: dict[int, tuple[tuple[int, int], float, Compiled]] = {}


def of(run_id: int, read: Callable[[], Compiled]) -> Compiled:
    """The run's compile aggregates: those read before while its compile slots stand as they did
    then (and for REREAD_S at most), else `read()` now."""
    seen = _seen.get(run_id)
    if seen is not None and seen[0] == slots.compile_mark(run_id) and time.monotonic() - seen[1] < REREAD_S:
        return seen[2]
    return renew(run_id, read)


def renew(run_id: int, read: Callable[[], Compiled]) -> Compiled:
    """The run's compile aggregates read now, kept until its compile slots move (or REREAD_S)."""
    mark, now = slots.compile_mark(run_id), time.monotonic()
    if len(_seen) >= KEPT_RUNS:
        for stale in [r for r, (_, at, _) in _seen.items() if now - at >= REREAD_S]:
            del _seen[stale]
    compiled = read()
    _seen[run_id] = (mark, now, compiled)
    return compiled


def forget() -> None:
    """Read every run's anew (tests)."""
    _seen.clear()
