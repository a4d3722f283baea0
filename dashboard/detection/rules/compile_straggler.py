"""compile_straggler: one rank compiles a slot much slower; the others wait in the first collective.

Warning at >= 10 s skew or >= 3x the median (with at least 1 s skew, so fast compiles stay quiet);
critical once the skew reaches half of the collective timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median

from dashboard.detection import subjects
from dashboard.detection.rules import CompileSlotView, Finding, first_step, ranks_text, rule

MIN_SKEW_S = 1.0
ABS_SKEW_S = 10.0
RATIO = 3.0


def straggles(seconds: float, mid: float) -> bool:
    """A compile of `seconds` straggles behind its slot's median `mid` (also the compile bill's measure)."""
    skew = seconds - mid
    return skew >= MIN_SKEW_S and (skew >= ABS_SKEW_S or seconds >= RATIO * max(mid, 1e-9))


@rule("compile_straggler", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def compile_straggler(view: CompileSlotView) -> Iterator[Finding]:
    times = view.times
    if len(times) < 2:
        return
    mid = median(times.values())
    slow = tuple(sorted(r for r, t in times.items() if straggles(t, mid)))
    if not slow:
        return
    skew = max(times[r] for r in slow) - mid
    timeout = min(
        (i.get("collective_timeout_s") or float("inf") for i in view.rank_info.values()), default=float("inf")
    )
    critical = skew >= 0.5 * timeout
    yield Finding(
        severity="critical" if critical else "warning",
        ranks=slow,
        step=first_step(view.reports, slow),
        frame=view.frame,
        message=f"{ranks_text(slow).capitalize()} compiled {view.frame} {skew:.1f} s slower than the median "
        f"({mid:.1f} s)" + (f", over half the {timeout:.0f} s collective timeout" if critical else ""),
        details={
            "index": view.index,
            "median_s": mid,
            "skew_s": skew,
            "times": {str(r): round(t, 3) for r, t in sorted(times.items())},
        },
    )
