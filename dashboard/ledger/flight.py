"""Flight Recorder dump requests: the server wants ranks' Flight Recorder dumps (issue 15).

Detection asks (`ask`) when a `hang_forecast` alert is news; ingest hands the requests out inside a
rank's next batch statement (joined into `details.handout_cte`, so the claim stays one statement
and a resent batch rolls the hand-out back); the rank's upload answers it (`answered`). Only this
module writes them.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from dashboard.ledger.models import FlightRecorderRequest

FR = FlightRecorderRequest._meta.db_table
HANDOUT_STEP = -1  # how a dump request rides in the `asked` CTE's (rank, step) rows; no real step is negative


def ask(run_id: int, ranks: set[int], alert_id: int, revision: int) -> bool:
    """Idempotent per (alert, revision, rank); True when something new was asked."""
    made = [
        FlightRecorderRequest.objects.get_or_create(run_id=run_id, rank=r, alert_id=alert_id, revision=revision)[1]
        for r in sorted(ranks)
    ]
    return any(made)


def unasked_cte() -> str:
    """CTE `fr_asked`: the unasked dump requests of the claim's ranks (%(run)s, %(rank)s), marked asked; returns (rank, step)."""
    return f"""
            fr_asked AS (
              UPDATE {FR} SET asked_at = now()
              WHERE run_id = %(run)s::bigint AND rank = ANY(%(rank)s::int[]) AND asked_at IS NULL
              RETURNING rank, {HANDOUT_STEP}::bigint AS step
            )"""


def answered(run_id: int, rank: int) -> list[tuple[int, int]]:
    """Record a rank's dump (in the caller's transaction): (alert, revision) of the requests it answered,
    those handed out to it and not answered yet; none when nobody asked (the upload is refused). Locked,
    so two uploads never answer one request."""
    assert transaction.get_connection().in_atomic_block
    open_ = FlightRecorderRequest.objects.filter(
        run_id=run_id, rank=rank, asked_at__isnull=False, answered_at__isnull=True
    ).select_for_update()
    rows = list(open_.values_list("id", "alert_id", "revision"))
    FlightRecorderRequest.objects.filter(id__in=[row[0] for row in rows]).update(answered_at=timezone.now())
    return sorted({(alert, revision) for _, alert, revision in rows})


def requests(alert_id: int, revision: int) -> list[FlightRecorderRequest]:
    return list(FlightRecorderRequest.objects.filter(alert_id=alert_id, revision=revision).order_by("rank"))


def latest_round(alert_id: int) -> int | None:
    return (
        FlightRecorderRequest.objects.filter(alert_id=alert_id)
        .order_by("-revision")
        .values_list("revision", flat=True)
        .first()
    )
