"""recompile_divergence: some ranks compiled a frame more often than others, or for another reason.

A rank that went silent is not counted as "did not recompile" (that is rank_silent's business).
"""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.consensus import at_fault, changed_first, consensus, disagree_text
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule


@rule("recompile_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def recompile_divergence(view: CompileSlotView) -> Iterator[Finding]:
    if view.index == 0:
        return
    compiled = set(view.reports)
    skipped = view.accountable - compiled
    if skipped:
        yield _count_finding(view, compiled, skipped)
        return
    yield from _reason_finding(view)


def _count_finding(view: CompileSlotView, compiled: set[int], skipped: set[int]) -> Finding:
    minority = compiled if len(compiled) <= len(skipped) else skipped
    first = view.reports[min(compiled)]
    verb = "recompiled" if minority == compiled else "did not recompile"
    return Finding(
        severity="critical",
        ranks=tuple(sorted(minority)),
        step=first.step,
        frame=view.frame,
        message=f"{ranks_text(minority).capitalize()} {verb} {view.frame} (compile #{view.index})"
        + (f": {first.recompile_reason}" if first.recompile_reason else ""),
        details={
            "index": view.index,
            "compiled": sorted(compiled),
            "not_compiled": sorted(skipped),
            "reason": first.recompile_reason,
        },
    )


def _reason_finding(view: CompileSlotView) -> Iterator[Finding]:
    reasons = {r: (e.recompile_reason or "") for r, e in view.reports.items()}
    if len(set(reasons.values())) == 1:
        return
    verdict = consensus(reasons)
    changed = changed_first(verdict, {r: view.reports[r].step for r in reasons})
    odd = changed or at_fault(verdict, reasons)
    tie = verdict.tie and changed is None
    who = (
        f"{disagree_text(odd).capitalize()} on why they recompiled {view.frame}"
        if tie
        else f"{ranks_text(odd).capitalize()} recompiled {view.frame} for another reason"
    )
    yield Finding(
        severity="critical",
        ranks=odd,
        step=first_step(view.reports, odd),
        frame=view.frame,
        message=f"{who}: {reasons[odd[0]]}",
        details={"index": view.index, "reasons": {str(r): reasons[r] for r in sorted(reasons)}, "tie": tie},
    )
