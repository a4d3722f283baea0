"""cache_divergence: in one compile slot some ranks hit the compile cache and others missed."""
from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, cache_outcome, first_step, ranks_text, rule, with_settings


@rule("cache_divergence", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def cache_divergence(view: CompileSlotView):
    for stage in ("inductor", "aotautograd"):
        outcomes = {r: cache_outcome(e.cache or {}, stage) for r, e in view.reports.items()}
        outcomes = {r: o for r, o in outcomes.items() if o in ("hit", "miss")}
        hits = {r for r, o in outcomes.items() if o == "hit"}
        misses = set(outcomes) - hits
        if hits and misses:
            message, settings = with_settings(f"{ranks_text(misses).capitalize()} missed the {stage} cache for "
                                              f"{view.frame} while {ranks_text(hits)} hit it", view)
            yield Finding(
                severity="warning",
                ranks=tuple(sorted(misses)),
                step=first_step(view.reports, misses),
                frame=view.frame,
                message=message,
                details={"index": view.index, "stage": stage, "hit": sorted(hits), "miss": sorted(misses), **settings},
            )
            return
