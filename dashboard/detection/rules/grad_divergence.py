"""grad_divergence: after the all-reduce, replicas must hold bitwise-identical gradients.

The message names the parameters (module paths, in module order) the differing buckets hold, from
the layout the ranks reported at their start; the per-parameter answers narrow it later
(`detail.explain`). Two ranks that differ have no majority: both are named, neither is blamed.
The update then makes the replicas' weights differ: the alert stays open until a later weight
fingerprint shows them agreeing again (`weights_agree`), or the run ends; the server asks every
rank for that fingerprint at once (`settle._ask_for_weights`)."""

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
from dashboard.detection.rules.param_divergence import is_param, weights_agree


@rule("grad_divergence", GradSlotView, subject=weights_agree)
def grad_divergence(view: GradSlotView) -> Iterator[Finding]:
    if is_param(view) or view.consensus is None or not view.consensus.dissenters:
        return
    ranks = at_fault(view.consensus, view.reports)
    buckets = differing_buckets(view)
    who = (
        f"Gradients of {disagree_text(ranks)}"
        if view.consensus.tie
        else f"Gradients of {ranks_text(ranks)} differ from the other replicas"
    )
    summary = f"{who} at step {view.step}"
    yield Finding(
        severity="critical",
        subject=subjects.group(view.group),
        ranks=ranks,
        step=view.step,
        message=f"{summary} ({where_text(view, buckets)})",
        details={
            "group": view.group,
            "buckets": buckets,
            "parameters": bucket_params(view, buckets)[:50],  # of the differing buckets, module order
            "summary": summary,
            "tie": view.consensus.tie,
        },
    )
