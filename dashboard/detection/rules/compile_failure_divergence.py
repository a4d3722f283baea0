"""compile_failure_divergence: compilation failed (or fell back to eager) on some ranks only."""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule


@rule("compile_failure_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def compile_failure_divergence(view: CompileSlotView) -> Iterator[Finding]:
    failed = tuple(sorted(r for r, e in view.reports.items() if e.status != "ok"))
    if not failed or len(failed) == len(view.reports):
        return
    first = view.reports[failed[0]]
    why = ": ".join(x for x in (first.fail_type, first.fail_reason) if x)
    yield Finding(
        severity="warning",
        ranks=failed,
        step=first_step(view.reports, failed),
        frame=view.frame,
        message=f"Compiling {view.frame} failed on {ranks_text(failed)} only" + (f" ({why})" if why else ""),
        details={
            "index": view.index,
            "status": {str(r): view.reports[r].status for r in failed},
            "fail_type": first.fail_type,
            "fail_reason": first.fail_reason,
        },
    )
