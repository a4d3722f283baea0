"""graph_divergence: the normalized Dynamo graphs of one compile slot differ across ranks."""

from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.consensus import consensus
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule, with_settings


@rule("graph_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def graph_divergence(view: CompileSlotView):
    hashes = {r: e.graph_norm for r, e in view.reports.items() if e.graph_norm}
    if len(hashes) < 2:
        return
    verdict = consensus(hashes)
    if not verdict.dissenters:
        return
    message, settings = with_settings(
        f"{ranks_text(verdict.dissenters).capitalize()} traced another graph for {view.frame} (compile #{view.index})",
        view,
    )
    yield Finding(
        severity="critical",
        ranks=verdict.dissenters,
        step=first_step(view.reports, verdict.dissenters),
        frame=view.frame,
        message=message,
        details={
            "index": view.index,
            "tie": verdict.tie,
            "hashes": {str(r): h for r, h in sorted(hashes.items())},
            **settings,
        },
    )
