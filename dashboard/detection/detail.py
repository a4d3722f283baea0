"""Naming the parameters behind a gradient divergence, and asking for the weights it changed.

Buckets say *where* replicas disagree, and the reference rank's `rank_start` layout says at once
which parameters each bucket holds (`bucket_members`). The agents keep per-parameter fingerprints
of the last 128 steps. When grad_divergence fires, the dissenters and one reference rank are asked (in
their next ingest reply: `ingest.writers` hands the requests out inside the batch's own
statement) for that step's per-parameter values; when all have answered, the
differing parameters go into the alert.

A divergence of gradients (or NaN in some) changes the replicas' weights from the update on, and
only a weight fingerprint on which they agree again resolves it: every rank is asked to take one
right away (`ask_for_weights`) instead of at its next `LOCKSTEP_PARAM_EVERY` step, so that
`param_divergence` confirms the damage within a step or two.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction
from django.utils import timezone

from dashboard.detection import lifecycle
from dashboard.detection.models import Alert
from dashboard.detection.rules import module_path
from dashboard.evidence import reads
from dashboard.ledger import details
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run

MEMBERS_SHOWN = 20
# A request reaches every rank at its next flush after the settle (later while a loaded server doubles the
# flush interval); one that reaches a rank past its step is lost to that rank: ask this far past now.
WEIGHTS_LEAD_S = 3.0
PACE_SLOTS = 16  # the pace of a run: over its last this many gradient slots
MAX_LEAD_STEPS = 100_000


def bucket_members(info: dict[str, Any], group: str, buckets: list[int]) -> dict[str, list[str]]:
    """{bucket index: parameter names} of one comparison group, from a rank_start layout
    (`params` are "group:name", `buckets` index lists into them, each group's in order)."""
    params, layout = info.get("params") or [], info.get("buckets") or []
    prefix = f"{group}:"
    mine = [b for b in layout if b and all(0 <= i < len(params) for i in b) and params[b[0]].startswith(prefix)]
    return {str(k): [params[i][len(prefix) :] for i in mine[k][:MEMBERS_SHOWN]] for k in buckets if 0 <= k < len(mine)}


def name_buckets(alert: Alert, group: str, rank: int) -> None:
    """Put the parameters of the alert's differing buckets, from `rank`'s layout, into its details (once)."""
    if "bucket_params" in alert.details:
        return
    info = Rank.objects.filter(run_id=alert.run_id, rank=rank).values_list("info", flat=True).first() or {}
    members = bucket_members(info, group, alert.details.get("buckets") or [])
    if members:
        lifecycle.enrich(alert, {"bucket_params": members})


def request(alert: Alert, group: str, dissenters: tuple[int, ...], reference: int) -> None:
    """Ask the ranks of one divergent step (idempotent per run, rank, step, group), and say at once
    which parameters the differing buckets hold."""
    assert alert.step is not None  # a divergent step's alert names it
    details.ask(alert.run_id, {*dissenters, reference}, alert.step, group, alert.id)
    name_buckets(alert, group, reference)


def answered(run_id: int, rank: int, steps: set[int]) -> list[int]:
    """Record a rank's answers; return the ids of alerts whose requests are now all answered.

    The alerts are locked first: ranks answer at the same moment (they flush together), and
    without the lock each would see the other's answer still missing and neither would report
    the alert complete."""
    with transaction.atomic():
        alert_ids = details.askers(run_id, rank, steps)
        lifecycle.lock(alert_ids)
        return details.answered(run_id, rank, steps, alert_ids)


def explain(alert_id: int) -> bool:
    """Put the differing parameters into the alert; True when that changed it."""
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(id=alert_id).first()
        asks = details.of_alert(alert_id)
        if alert is None or not asks or "params" in alert.details:
            return False
        values = {ask.rank: _params(alert.run_id, ask.rank, ask.step, ask.group) for ask in asks}
        # a rank outside the alert, or (two ranks that disagree: the alert names both) the lowest
        anchor = min(set(values) - set(alert.ranks) or values)
        reference = values[anchor]
        order = {name: i for i, name in enumerate(alert.details.get("parameters") or [])}  # module order
        differing = sorted(
            {
                name
                for r in alert.ranks
                if r != anchor
                for name, fp in values.get(r, {}).items()
                if reference.get(name) != fp
            },
            key=lambda name: (order.get(name, len(order)), name),
        )
        headline = alert.details.get("summary") or alert.message  # the buckets' candidates give way to the answer
        message = (
            f"{headline}; parameters: {', '.join(map(module_path, differing[:5]))}"
            + (" …" if len(differing) > 5 else "")
            if differing
            else None
        )
        lifecycle.enrich(alert, {"params": differing[:50]}, message, news=True)
        return True


def _params(run_id: int, rank: int, step: int, group: str) -> dict[str, int]:
    for body in reads.detail_answers(run_id, rank, step):
        if body.get("group", "ddp") == group:
            return body.get("params") or {}
    return {}


def ask_for_weights(alert: Alert, group: str, slot: GradSlot) -> int:
    """Ask every rank for a weight fingerprint of `group` after one step to come, the same for all
    (a weight slot compares the ranks at one step): where the ranks will be WEIGHTS_LEAD_S from now
    at the run's pace, two steps past the furthest step known at least. Returns that step."""
    run = Run.objects.get(id=alert.run_id)
    ahead = (timezone.now() - slot.first_seen).total_seconds() + WEIGHTS_LEAD_S
    expected = slot.step + math.ceil(pace(slot) * ahead)
    step = min(max(expected, max(run.last_step or 0, slot.step) + 2), slot.step + MAX_LEAD_STEPS)
    details.ask_weights(run.id, step, group, alert.id)
    return step


def pace(slot: GradSlot) -> float:
    """Steps per second of the slot's run, from when its last PACE_SLOTS gradient slots first arrived."""
    earlier = (
        GradSlot.objects.filter(run_id=slot.run_id, group=slot.group, step__lt=slot.step)
        .order_by("-step")
        .values_list("step", "first_seen")[:PACE_SLOTS]
    )
    if not earlier:
        return 0.0
    step, seen = earlier[len(earlier) - 1]
    seconds = (slot.first_seen - seen).total_seconds()
    return (slot.step - step) / seconds if seconds > 0 else 0.0
