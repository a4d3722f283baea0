"""ineffective_compile: compiled frames produce 0-op graphs or are shredded by graph breaks, so the
model runs mostly eager while the user believes it is compiled (e.g. torch.compile(DDP(model)))."""
from __future__ import annotations

from collections import Counter

from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, ranks_text, rule

MANY_BREAKS = 8


def op_count(event) -> int | None:
    return ((event.detail or {}).get("counts") or {}).get("graph_op_count")


def headline(reason: str) -> str:
    """Dynamo's break text runs to pages; its first explanation line names the culprit."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    useful = [line for line in lines if line.startswith(("Explanation:", "Graph Break Reason:"))]
    return (useful[-1] if useful else (lines[0] if lines else ""))[:300]


@rule("ineffective_compile", CompileSlotView)
def ineffective_compile(view: CompileSlotView):
    empty = {r for r, e in view.reports.items() if e.status == "ok" and op_count(e) == 0}
    shredded = {r for r, e in view.reports.items() if ((e.detail or {}).get("graph_breaks") or 0) >= MANY_BREAKS}
    ranks = empty | shredded
    if not ranks:
        return
    reasons = Counter(headline(reason) for r, reason in view.graph_breaks if r in ranks)
    top = [reason for reason, _ in reasons.most_common(3)]
    what = "compiles to an empty graph" if empty else "is shredded by graph breaks"
    yield Finding(
        severity="warning",
        subject=subjects.RUN,
        ranks=tuple(sorted(ranks)),
        frame=view.frame,
        message=f"{view.frame} {what} on {ranks_text(ranks)}: the model runs mostly eager"
        + (f". Graph breaks: {'; '.join(top)}" if top else ""),
        details={"index": view.index, "empty_graph_ranks": sorted(empty), "shredded_ranks": sorted(shredded),
                 "break_reasons": top},
    )
