"""graph_divergence: the normalized Dynamo graphs of one compile slot differ across ranks. Two ranks
that differ have no majority: the one that traced its graph at an earlier step is named (the other
kept what it had then), both where they traced it in the same step."""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.consensus import at_fault, changed_first, consensus, disagree_text
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule, with_settings


@rule("graph_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def graph_divergence(view: CompileSlotView) -> Iterator[Finding]:
    hashes = {r: e.graph_norm for r, e in view.reports.items() if e.graph_norm}
    if len(hashes) < 2:
        return
    verdict = consensus(hashes)
    if not verdict.dissenters:
        return
    changed = changed_first(verdict, {r: view.reports[r].step for r in hashes})
    ranks = changed or at_fault(verdict, hashes)
    tie = verdict.tie and changed is None
    who = (
        f"{disagree_text(ranks).capitalize()} on the graph"
        if tie
        else f"{ranks_text(ranks).capitalize()} traced another graph"
        + (f" at step {first_step(view.reports, ranks)}, where the others kept theirs" if changed else "")
    )
    message, settings = with_settings(f"{who} for {view.frame} (compile #{view.index})", view)
    yield Finding(
        severity="critical",
        ranks=ranks,
        step=first_step(view.reports, ranks),
        frame=view.frame,
        message=message,
        details={
            "index": view.index,
            "tie": tie,
            "hashes": {str(r): h for r, h in sorted(hashes.items())},
            **settings,
        },
    )
