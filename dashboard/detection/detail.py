"""Naming the parameters behind a gradient divergence.

Buckets say *where* replicas disagree, and the reference rank's `rank_start` layout says at once
which parameters each bucket holds (`bucket_members`). The agents keep per-parameter fingerprints
of the last 128 steps. When grad_divergence fires, the dissenters and one reference rank are asked (in
their next ingest reply: `ingest.writers` hands the requests out inside the batch's own
statement) for that step's per-parameter values; when all have answered, the
differing parameters go into the alert.
"""
from __future__ import annotations

from django.db import transaction

from dashboard.detection import lifecycle
from dashboard.detection.models import Alert
from dashboard.ledger import details
from dashboard.tenancy.models import Rank
from ingest.models import EventLog

MEMBERS_SHOWN = 20


def bucket_members(info: dict, group: str, buckets: list[int]) -> dict[str, list[str]]:
    """{bucket index: parameter names} of one comparison group, from a rank_start layout
    (`params` are "group:name", `buckets` index lists into them, each group's in order)."""
    params, layout = info.get("params") or [], info.get("buckets") or []
    prefix = f"{group}:"
    mine = [b for b in layout if b and all(0 <= i < len(params) for i in b) and params[b[0]].startswith(prefix)]
    return {str(k): [params[i][len(prefix):] for i in mine[k][:MEMBERS_SHOWN]] for k in buckets if 0 <= k < len(mine)}


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
        reference = values[min(r for r in values if r not in alert.ranks)] if set(values) - set(alert.ranks) else {}
        differing = sorted({name for r in alert.ranks for name, fp in values.get(r, {}).items() if reference.get(name) != fp})
        message = f"{alert.message}; parameters: {', '.join(differing[:5])}" + (" …" if len(differing) > 5 else "") \
            if differing else None
        lifecycle.enrich(alert, {"params": differing[:50]}, message, news=True)
        return True


def _params(run_id: int, rank: int, step: int, group: str) -> dict[str, int]:
    rows = EventLog.objects.filter(run_id=run_id, rank=rank, t="detail", body__step=step).values_list("body", flat=True)
    for body in rows:
        if body.get("group", "ddp") == group:
            return body.get("params") or {}
    return {}
