"""nonfinite_grad: NaN/Inf gradients.

On some ranks only: their update puts NaN into those ranks' weights; like grad_divergence, only
agreeing weight fingerprints (or the run's end) resolve it.

On every rank: one rank's loss or local gradients went inf and DDP's all-reduce spread it to every
replica, so no rank differs from the others, yet every update now writes NaN into the weights. The
agents fingerprint gradients in the optimizer's step pre-hook, so a step AMP's GradScaler skipped
(inf gradients it recovers from) is never reported: a report is a step the optimizer really took.
Agreeing weights prove nothing here (all NaN agree); finite gradients on every rank resolve it.
Where the logged losses tell whose went NaN/inf first (the earliest step, and the only rank then:
the agent flags a non-finite loss, which JSON would carry as null), that rank is the root; else
every rank is.
"""

from __future__ import annotations

from collections.abc import Iterator

from dashboard.detection import subjects
from dashboard.detection.rules import Finding, GradSlotView, ranks_text, rule
from dashboard.detection.rules.param_divergence import is_param, weights_agree


def finite_everywhere(view: GradSlotView) -> list[str]:
    """The subject a gradient slot proves healthy again: every rank reported, none non-finite."""
    if is_param(view) or len(view.reports) < view.world_size or any(r.nonfinite for r in view.reports.values()):
        return []
    return [subjects.nonfinite_everywhere(view.group)]


def first_loss(view: GradSlotView) -> tuple[int, int] | None:
    """(rank, step) of the rank whose loss went non-finite first: the earliest step, and at that step
    the only one; None when no loss tells (not logged, or several ranks at once)."""
    firsts = view.nonfinite_losses
    if not firsts:
        return None
    earliest = min(firsts.values())
    ranks = [r for r, step in firsts.items() if step == earliest]
    return (ranks[0], earliest) if len(ranks) == 1 else None


@rule("nonfinite_grad", GradSlotView, subject=lambda v: weights_agree(v) + finite_everywhere(v))
def nonfinite_grad(view: GradSlotView) -> Iterator[Finding]:
    if is_param(view):
        return
    bad = tuple(sorted(r for r, report in view.reports.items() if report.nonfinite))
    if not bad:
        return
    counts = {r: view.reports[r].nonfinite for r in bad}
    if len(bad) == len(view.reports):
        first = first_loss(view)
        origin = (
            f"rank {first[0]}'s loss went non-finite first (step {first[1]}), and the all-reduce spread it"
            if first
            else "the all-reduce spread one rank's NaN/Inf to every replica"
        )
        yield Finding(
            severity="critical",
            subject=subjects.nonfinite_everywhere(view.group),
            ranks=(first[0],) if first else bad,
            step=view.step,
            message=f"Gradients non-finite on all ranks from step {view.step}: {origin}; each update writes it "
            "into the weights",
            details={
                "group": view.group,
                "nonfinite": counts,
                "everywhere": True,
                **({"loss_first": {"rank": first[0], "step": first[1]}} if first else {}),
            },
        )
        return
    yield Finding(
        severity="critical",
        subject=subjects.group(view.group),
        ranks=bad,
        step=view.step,
        message=f"NaN/Inf gradients on {ranks_text(bad)} at step {view.step}",
        details={"group": view.group, "nonfinite": counts},
    )
