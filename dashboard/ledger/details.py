"""Detail requests: the server wants one rank's per-parameter fingerprints of one step.

Detection asks (`ask`) when a gradient divergence needs its parameters named; ingest hands the
requests out inside a rank's next batch statement (`handout_cte`, so a resent batch rolls the
hand-out back); a rank's `detail` events answer them (`answered`). Only this module writes them.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from dashboard.ledger import flight
from dashboard.ledger.models import DetailRequest
from dashboard.ledger.slots import PARAM_PREFIX

DETAIL = DetailRequest._meta.db_table
ASK_AGAIN_AFTER_S = 60  # an unanswered request is handed out again (its reply may have been lost) ...
MAX_ASKS = 5  # ... this many times in all: a step that left the agent's ring is never answered
# A weights request ("fingerprint the weights after step S", a row of group PARAM_PREFIX + group) rides in
# the `asked` CTE as WEIGHTS_HANDOUT - S: below every real step and flight.HANDOUT_STEP.
WEIGHTS_HANDOUT = flight.HANDOUT_STEP - 1


def ask(run_id: int, ranks: set[int], step: int, group: str, alert_id: int) -> None:
    """Idempotent per (run, rank, step, group)."""
    _create(run_id, ranks, step, group, alert_id)


def ask_weights(run_id: int, ranks: set[int], step: int, group: str, alert_id: int) -> None:
    """Every rank of `ranks` is to fingerprint its weights after step `step`'s update (a `param`
    event, as every `LOCKSTEP_PARAM_EVERY` steps). Handed out once: the weight slot is the answer,
    and a rank already past that step cannot give one. Idempotent per (run, rank, step, group)."""
    _create(run_id, ranks, step, PARAM_PREFIX + group, alert_id)


def _create(run_id: int, ranks: set[int], step: int, group: str, alert_id: int) -> None:
    """One statement for every rank, its rows made by PostgreSQL from one array (a weights request
    asks them all: 100,000 ranks' rows built as model instances held the settle, and so its page,
    for 8.5 s); a request already there keeps its alert (`detail_once`)."""
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO {DETAIL} (run_id, rank, step, "group", alert_id, asks)
                SELECT %s, r, %s, %s, %s, 0 FROM unnest(%s::int[]) AS r ORDER BY r
                ON CONFLICT (run_id, rank, step, "group") DO NOTHING""",
            [run_id, step, group, alert_id, sorted(ranks)],
        )


def weights_steps(asked: list[int]) -> list[int]:
    """The steps of the weights requests among a rank's `asked` values."""
    return sorted(WEIGHTS_HANDOUT - code for code in asked if code <= WEIGHTS_HANDOUT)


def handout_cte() -> str:
    """CTE `asked`: the claim's ranks' (%(run)s, %(rank)s) requests not asked yet, or asked more than
    ASK_AGAIN_AFTER_S ago and still unanswered (the reply carrying them may have been lost), marked
    asked; returns (rank, step). Flight Recorder dump requests ride along as step `flight.HANDOUT_STEP`,
    weights requests as WEIGHTS_HANDOUT - step (answered by being handed out)."""
    weights = f"""starts_with("group", '{PARAM_PREFIX}')"""
    return f"""
            detail_asked AS (
              UPDATE {DETAIL} SET asked_at = now(), asks = asks + 1,
                answered_at = CASE WHEN {weights} THEN now() END
              WHERE run_id = %(run)s::bigint AND rank = ANY(%(rank)s::int[]) AND answered_at IS NULL
                AND (asked_at IS NULL OR (asked_at < now() - interval '{ASK_AGAIN_AFTER_S} seconds' AND asks < {MAX_ASKS}))
              RETURNING rank, CASE WHEN {weights} THEN {WEIGHTS_HANDOUT} - step ELSE step END AS step
            ),{flight.unasked_cte()},
            asked AS (SELECT rank, step FROM detail_asked UNION ALL SELECT rank, step FROM fr_asked)"""


def askers(run_id: int, rank: int, steps: set[int]) -> set[int]:
    """Ids of the alerts that asked this rank for any of these steps."""
    return set(_parameters().filter(run_id=run_id, rank=rank, step__in=steps).values_list("alert_id", flat=True))


def answered(run_id: int, rank: int, steps: set[int], alert_ids: set[int]) -> list[int]:
    """Record a rank's answers (in the caller's transaction); the alerts of `alert_ids` whose requests are now all answered."""
    assert transaction.get_connection().in_atomic_block
    _parameters().filter(run_id=run_id, rank=rank, step__in=steps, answered_at__isnull=True).update(
        answered_at=timezone.now()
    )
    return [a for a in alert_ids if not _parameters().filter(alert_id=a, answered_at__isnull=True).exists()]


def of_alert(alert_id: int) -> list[DetailRequest]:
    """An alert's per-parameter requests (not its weights requests)."""
    return list(_parameters().filter(alert_id=alert_id))


def _parameters() -> QuerySet[DetailRequest]:
    """Requests for per-parameter fingerprints, which `detail` events answer."""
    return DetailRequest.objects.exclude(group__startswith=PARAM_PREFIX)
