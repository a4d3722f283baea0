"""Celery tasks of ingest (registered through CELERY_IMPORTS in settings): retention."""
from __future__ import annotations

from celery import shared_task

from ingest import retention


@shared_task(ignore_result=True)
def prune_raw() -> int:
    return len(retention.prune().partitions)

