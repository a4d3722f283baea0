"""Detail requests: the server wants one rank's per-parameter fingerprints of one step.

Detection asks (`ask`) when a gradient divergence needs its parameters named; ingest hands the
requests out inside a rank's next batch statement (`handout_cte`, so a resent batch rolls the
hand-out back); a rank's `detail` events answer them (`answered`). Only this module writes them.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from dashboard.ledger import flight
from dashboard.ledger.models import DetailRequest

DETAIL = DetailRequest._meta.db_table
ASK_AGAIN_AFTER_S = 60  # an unanswered request is handed out again (its reply may have been lost) ...
MAX_ASKS = 5  # ... this many times in all: a step that left the agent's ring is never answered


def ask(run_id: int, ranks: set[int], step: int, group: str, alert_id: int) -> None:
    """Idempotent per (run, rank, step, group)."""
    for rank in sorted(ranks):
        DetailRequest.objects.get_or_create(run_id=run_id, rank=rank, step=step, group=group,
                                            defaults={"alert_id": alert_id})


def handout_cte() -> str:
    """CTE `asked`: the claim's ranks' (%(run)s, %(rank)s) requests not asked yet, or asked more than
    ASK_AGAIN_AFTER_S ago and still unanswered (the reply carrying them may have been lost), marked
    asked; returns (rank, step). Flight Recorder dump requests ride along as step `flight.HANDOUT_STEP`."""
    return f"""
            detail_asked AS (
              UPDATE {DETAIL} SET asked_at = now(), asks = asks + 1
              WHERE run_id = %(run)s::bigint AND rank = ANY(%(rank)s::int[]) AND answered_at IS NULL
                AND (asked_at IS NULL OR (asked_at < now() - interval '{ASK_AGAIN_AFTER_S} seconds' AND asks < {MAX_ASKS}))
              RETURNING rank, step
            ),{flight.unasked_cte()},
            asked AS (SELECT rank, step FROM detail_asked UNION ALL SELECT rank, step FROM fr_asked)"""


def askers(run_id: int, rank: int, steps: set[int]) -> set[int]:
    """Ids of the alerts that asked this rank for any of these steps."""
    return set(DetailRequest.objects.filter(run_id=run_id, rank=rank, step__in=steps).values_list("alert_id", flat=True))


def answered(run_id: int, rank: int, steps: set[int], alert_ids: set[int]) -> list[int]:
    """Record a rank's answers (in the caller's transaction); the alerts of `alert_ids` whose requests are now all answered."""
    assert transaction.get_connection().in_atomic_block
    DetailRequest.objects.filter(run_id=run_id, rank=rank, step__in=steps, answered_at__isnull=True).update(answered_at=timezone.now())
    return [a for a in alert_ids if not DetailRequest.objects.filter(alert_id=a, answered_at__isnull=True).exists()]


def of_alert(alert_id: int) -> list[DetailRequest]:
    return list(DetailRequest.objects.filter(alert_id=alert_id))
