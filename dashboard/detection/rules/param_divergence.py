"""param_divergence: weight fingerprints of replicas differ (reported every K steps as `param` events).

Like grad_divergence, it names the parameters of the differing buckets, and two ranks that differ
are both named."""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.consensus import at_fault, disagree_text
from dashboard.detection.rules import (
    Finding,
    GradSlotView,
    bucket_params,
    differing_buckets,
    ranks_text,
    rule,
    where_text,
)
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
def param_divergence(view: GradSlotView) -> Iterator[Finding]:
    if not is_param(view) or view.consensus is None or not view.consensus.dissenters:
        return
    ranks = at_fault(view.consensus, view.reports)
    buckets = differing_buckets(view)
    who = (
        f"Weights of {disagree_text(ranks)}"
        if view.consensus.tie
        else f"Weights of {ranks_text(ranks)} differ from the other replicas"
    )
    yield Finding(
        severity="critical",
        ranks=ranks,
        step=view.step,
        message=f"{who} at step {view.step} ({where_text(view, buckets)})",
        details={
            "group": view.group.removeprefix(PARAM_PREFIX),
            "buckets": buckets,
            "parameters": bucket_params(view, buckets)[:50],  # of the differing buckets, module order
            "tie": view.consensus.tie,
        },
    )
