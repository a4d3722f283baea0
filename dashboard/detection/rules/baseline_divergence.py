"""baseline_divergence: the run's agreed gradients differ from its baseline run's at the same step;
the message names the parameters the differing buckets hold, in module order."""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, bucket_params, rule, where_text


@rule("baseline_divergence", GradSlotView)
def baseline_divergence(view: GradSlotView) -> Iterator[Finding]:
    if (
        view.baseline is None
        or view.baseline_key is None
        or view.consensus is None
        or tuple(view.consensus.reference) == tuple(view.baseline)
    ):
        return
    buckets = [i for i, (a, b) in enumerate(zip(view.consensus.reference, view.baseline)) if a != b]
    if len(view.consensus.reference) != len(view.baseline):
        buckets = buckets or list(range(min(len(view.consensus.reference), len(view.baseline))))
    yield Finding(
        severity="warning",
        subject=subjects.baseline(view.baseline_key, view.group),
        ranks=(),
        step=view.step,
        message=f"Gradients differ from baseline run {view.baseline_key} from step {view.step} "
        f"({where_text(view, buckets)})",
        details={
            "baseline": view.baseline_key,
            "group": view.group,
            "buckets": buckets,
            "parameters": bucket_params(view, buckets)[:50],  # of the differing buckets, module order
        },
    )
