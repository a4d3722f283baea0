"""collective_schedule_divergence: the ranks' compiled graphs issue different collective sequences,
so they will wait on each other forever (a hang in waiting)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from dashboard.detection import subjects
from dashboard.detection.consensus import at_fault, changed_first, consensus, disagree_text
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule

if TYPE_CHECKING:
    from dashboard.evidence.reads import CompileReport


def schedule(event: CompileReport) -> str | None:
    norm: str | None = (((event.detail or {}).get("hashes") or {}).get("collectives") or {}).get("norm")
    return norm


@rule("collective_schedule_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def collective_schedule_divergence(view: CompileSlotView) -> Iterator[Finding]:
    schedules = {r: schedule(e) or "" for r, e in view.reports.items()}
    if len(schedules) < 2 or not any(schedules.values()) or len(set(schedules.values())) == 1:
        return
    verdict = consensus(schedules)
    changed = changed_first(verdict, {r: view.reports[r].step for r in schedules})
    ranks = changed or at_fault(verdict, schedules)
    tie = verdict.tie and changed is None
    who = (
        f"{disagree_text(ranks).capitalize()} on the collective sequence"
        if tie
        else f"{ranks_text(ranks).capitalize()} compiled another collective sequence"
    )
    yield Finding(
        severity="critical",
        ranks=ranks,
        step=first_step(view.reports, ranks),
        frame=view.frame,
        message=f"{who} for {view.frame}: expect a hang at the next collective",
        details={
            "index": view.index,
            "tie": tie,
            "schedules": {str(r): s for r, s in sorted(schedules.items())},
        },
    )
