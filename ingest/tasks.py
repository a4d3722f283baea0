"""Celery tasks of ingest (registered through CELERY_IMPORTS in settings): retention and bulk settling."""
from __future__ import annotations

from celery import shared_task

from dashboard.detection.tasks import SETTLERS
from ingest import retention

SETTLE_CHUNK = 32  # slots per message: one publish per chunk instead of per slot, chunks spread over workers


@shared_task(ignore_result=True)
def prune_raw() -> int:
    return len(retention.prune().partitions)


@shared_task(acks_late=True, ignore_result=True)
def settle_slots(kind: str, slot_ids: list[int]) -> int:
    """Settle several slots a batch completed; idempotent per slot, so a redelivery is safe."""
    return sum(len(SETTLERS[kind](slot_id)) for slot_id in slot_ids)
