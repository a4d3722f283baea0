"""param_divergence: weight fingerprints of replicas differ (reported every K steps as `param` events)."""

from __future__ import annotations

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, differing_buckets, ranks_text, rule
from dashboard.ledger.slots import PARAM_PREFIX


def is_param(view: GradSlotView) -> bool:
    return view.group.startswith(PARAM_PREFIX)


def weights_agree(view: GradSlotView) -> list[str]:
    """The subject a weight slot proves healthy again: every rank fingerprinted the group's weights
    and they agree. A divergence of gradients (or NaN in some) changes the weights from then on, so
    only this resolves it; a later clean gradient slot does not (the subject of those rules)."""
    if not is_param(view) or view.consensus is None or view.consensus.dissenters or len(view.reports) < view.world_size:
        return []
    return [subjects.group(view.group.removeprefix(PARAM_PREFIX))]


@rule("param_divergence", GradSlotView, subject=lambda v: subjects.group(v.group))
def param_divergence(view: GradSlotView):
    if not is_param(view) or view.consensus is None or not view.consensus.dissenters:
        return
    dissenters = view.consensus.dissenters
    buckets = differing_buckets(view)
    yield Finding(
        severity="critical",
        ranks=dissenters,
        step=view.step,
        message=f"Weights of {ranks_text(dissenters)} differ from the other replicas at step {view.step} "
        f"(buckets {', '.join(map(str, buckets))})",
        details={"group": view.group.removeprefix(PARAM_PREFIX), "buckets": buckets, "tie": view.consensus.tie},
    )
