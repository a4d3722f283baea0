"""Detail requests: the server wants one rank's per-parameter fingerprints of one step, or every
rank's weight fingerprints after one step.

Detection asks (`ask`, `ask_weights`) when a gradient divergence needs its parameters named and its
damage confirmed; ingest hands the requests out inside a rank's next batch statement
(`handout_cte`, so a resent batch rolls the hand-out back); a rank's `detail` events answer the
first (`answered`), the weight slot of the asked step the second. Only this module writes them.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from dashboard.ledger import flight
from dashboard.ledger.models import DetailRequest, WeightsRequest

DETAIL = DetailRequest._meta.db_table
WEIGHTS = WeightsRequest._meta.db_table
ASK_AGAIN_AFTER_S = 60  # an unanswered request is handed out again (its reply may have been lost) ...
MAX_ASKS = 5  # ... this many times in all: a step that left the agent's ring is never answered
# A weights request ("fingerprint the weights after step S") rides in the `asked` CTE as
# WEIGHTS_HANDOUT - S: below every real step and flight.HANDOUT_STEP.
WEIGHTS_HANDOUT = flight.HANDOUT_STEP - 1


def ask(run_id: int, ranks: set[int], step: int, group: str, alert_id: int) -> None:
    """One statement for all the ranks, its rows made by PostgreSQL from one array. Idempotent per
    (run, rank, step, group): a request already there keeps its alert (`detail_once`)."""
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO {DETAIL} (run_id, rank, step, "group", alert_id, asks)
                SELECT %s, r, %s, %s, %s, 0 FROM unnest(%s::int[]) AS r ORDER BY r
                ON CONFLICT (run_id, rank, step, "group") DO NOTHING""",
            [run_id, step, group, alert_id, sorted(ranks)],
        )


def ask_weights(run_id: int, step: int, group: str, alert_id: int) -> None:
    """Every rank is to fingerprint its weights of `group` after step `step`'s update (a `param`
    event): one row for all of them (`WeightsRequest`), so that the settle that pages a divergence
    commits one row whatever the job's size. Idempotent per (run, step, group): the first alert keeps it."""
    WeightsRequest.objects.bulk_create(
        [WeightsRequest(run_id=run_id, step=step, group=group, alert_id=alert_id)], ignore_conflicts=True
    )


def weights_steps(asked: list[int]) -> list[int]:
    """The steps of the weights requests among a rank's `asked` values."""
    return sorted(WEIGHTS_HANDOUT - code for code in asked if code <= WEIGHTS_HANDOUT)


def handout_cte() -> str:
    """CTE `asked`: the claim's ranks' (%(run)s, %(rank)s) requests not asked yet, or asked more than
    ASK_AGAIN_AFTER_S ago and still unanswered (the reply carrying them may have been lost), marked
    asked; returns (rank, step). Flight Recorder dump requests ride along as step `flight.HANDOUT_STEP`,
    weights requests as WEIGHTS_HANDOUT - step, to every batch of CTE `b` (its `rank` and last
    completed `step`) whose rank is still below that step: the run's requests above the lowest of
    them are read once, by one index lookup."""
    return f"""
            detail_asked AS (
              UPDATE {DETAIL} SET asked_at = now(), asks = asks + 1
              WHERE run_id = %(run)s::bigint AND rank = ANY(%(rank)s::int[]) AND answered_at IS NULL
                AND (asked_at IS NULL OR (asked_at < now() - interval '{ASK_AGAIN_AFTER_S} seconds' AND asks < {MAX_ASKS}))
              RETURNING rank, step
            ),{flight.unasked_cte()},
            weights_due AS MATERIALIZED (
              SELECT step FROM {WEIGHTS}
              WHERE run_id = %(run)s::bigint AND step > (SELECT min(COALESCE(step, -1)) FROM b)
            ), weights_asked AS (
              SELECT b.rank, {WEIGHTS_HANDOUT} - w.step AS step FROM weights_due w JOIN b ON w.step > COALESCE(b.step, -1)
            ),
            asked AS (SELECT rank, step FROM detail_asked UNION ALL SELECT rank, step FROM fr_asked
                      UNION ALL SELECT rank, step FROM weights_asked)"""


def askers(run_id: int, rank: int, steps: set[int]) -> set[int]:
    """Ids of the alerts that asked this rank for any of these steps."""
    return set(
        DetailRequest.objects.filter(run_id=run_id, rank=rank, step__in=steps).values_list("alert_id", flat=True)
    )


def answered(run_id: int, rank: int, steps: set[int], alert_ids: set[int]) -> list[int]:
    """Record a rank's answers (in the caller's transaction); the alerts of `alert_ids` whose requests are now all answered."""
    assert transaction.get_connection().in_atomic_block
    DetailRequest.objects.filter(run_id=run_id, rank=rank, step__in=steps, answered_at__isnull=True).update(
        answered_at=timezone.now()
    )
    return [a for a in alert_ids if not DetailRequest.objects.filter(alert_id=a, answered_at__isnull=True).exists()]


def of_alert(alert_id: int) -> list[DetailRequest]:
    """An alert's per-parameter requests."""
    return list(DetailRequest.objects.filter(alert_id=alert_id))
