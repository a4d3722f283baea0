"""recompile_storm: a frame recompiles until it hits the recompile limit (then runs eager), or >= 8
times. (What compiling costs the run as a share of its time is `compile_cost`'s.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule

if TYPE_CHECKING:
    from dashboard.evidence.reads import CompileReport

STORM_INDEX = 8


def hit_limit(event: CompileReport) -> bool:
    text = " ".join(x for x in (event.fail_reason, event.recompile_reason, event.fail_type) if x).lower()
    return "recompile_limit" in text or "cache_size_limit" in text or "recompile limit" in text


@rule("recompile_storm", CompileSlotView)
def recompile_storm(view: CompileSlotView) -> Iterator[Finding]:
    limited = {r for r, e in view.reports.items() if hit_limit(e)}
    if view.index + 1 < STORM_INDEX and not limited:
        return
    ranks = tuple(sorted(limited or view.reports))
    reasons = sorted({e.recompile_reason for e in view.reports.values() if e.recompile_reason})
    yield Finding(
        severity="warning",
        subject=subjects.frame(view.frame),
        ranks=ranks,
        step=first_step(view.reports, ranks),
        frame=view.frame,
        message=f"{view.frame} "
        + ("hit the recompile limit and falls back to eager" if limited else f"compiled {view.index + 1} times")
        + f" on {ranks_text(ranks)}"
        + (f"; last reason: {reasons[-1]}" if reasons else ""),
        details={"compiles": view.index + 1, "hit_limit": sorted(limited), "reasons": reasons[:5]},
    )
