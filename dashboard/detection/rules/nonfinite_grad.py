"""nonfinite_grad: NaN/Inf gradients on some ranks only. Their update puts NaN into those ranks'
weights: like grad_divergence, only agreeing weight fingerprints (or the run's end) resolve it."""

from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, ranks_text, rule
from dashboard.detection.rules.param_divergence import is_param, weights_agree


@rule("nonfinite_grad", GradSlotView, subject=weights_agree)
def nonfinite_grad(view: GradSlotView):
    if is_param(view):
        return
    bad = tuple(sorted(r for r, report in view.reports.items() if report.nonfinite))
    if not bad or len(bad) == len(view.reports):
        return
    yield Finding(
        severity="critical",
        subject=subjects.group(view.group),
        ranks=bad,
        step=view.step,
        message=f"NaN/Inf gradients on {ranks_text(bad)} at step {view.step}",
        details={"group": view.group, "nonfinite": {r: view.reports[r].nonfinite for r in bad}},
    )
