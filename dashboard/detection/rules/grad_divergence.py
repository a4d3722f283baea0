"""grad_divergence: after the all-reduce, replicas must hold bitwise-identical gradients."""
from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, differing_buckets, ranks_text, rule
from dashboard.detection.rules.param_divergence import is_param


@rule("grad_divergence", GradSlotView, subject=lambda v: subjects.group(v.group))
def grad_divergence(view: GradSlotView):
    if is_param(view) or view.consensus is None or not view.consensus.dissenters:
        return
    buckets = differing_buckets(view)
    tie = " (no majority: compared with the lowest rank)" if view.consensus.tie else ""
    yield Finding(
        severity="critical",
        ranks=view.consensus.dissenters,
        step=view.step,
        message=f"Gradients of {ranks_text(view.consensus.dissenters)} differ from the other replicas "
        f"at step {view.step} (buckets {', '.join(map(str, buckets))}){tie}",
        details={"group": view.group, "buckets": buckets, "tie": view.consensus.tie},
    )
