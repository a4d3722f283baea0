"""grad_divergence: after the all-reduce, replicas must hold bitwise-identical gradients.

The update then makes the replicas' weights differ: the alert stays open until a later weight
fingerprint shows them agreeing again (`weights_agree`), or the run ends; the server asks every
rank for that fingerprint at once (`settle._ask_for_weights`)."""

from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, differing_buckets, ranks_text, rule
from dashboard.detection.rules.param_divergence import is_param, weights_agree


@rule("grad_divergence", GradSlotView, subject=weights_agree)
def grad_divergence(view: GradSlotView):
    if is_param(view) or view.consensus is None or not view.consensus.dissenters:
        return
    buckets = differing_buckets(view)
    tie = " (no majority: compared with the lowest rank)" if view.consensus.tie else ""
    yield Finding(
        severity="critical",
        subject=subjects.group(view.group),
        ranks=view.consensus.dissenters,
        step=view.step,
        message=f"Gradients of {ranks_text(view.consensus.dissenters)} differ from the other replicas "
        f"at step {view.step} (buckets {', '.join(map(str, buckets))}){tie}",
        details={"group": view.group, "buckets": buckets, "tie": view.consensus.tie},
    )
