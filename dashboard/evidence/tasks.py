"""Celery tasks of evidence (registered through CELERY_IMPORTS in settings): retention, hourly (beat)."""

from __future__ import annotations

from celery import shared_task

from dashboard.evidence import retention


@shared_task(ignore_result=True)
def prune_raw() -> int:
    return len(retention.prune().partitions)
