"""Celery tasks of delivery: push alert revisions (websockets, then webhooks), retry webhooks, and a
periodic sweep for revisions nobody delivered (a worker killed between commit and push) and for
the live progress of active runs.

Delivery subscribes to `detection.signals.alerts_changed`; the outbox state (`revision` against
`notified_revision`) is in PostgreSQL, so whatever a lost message misses, the sweep delivers.
"""
from __future__ import annotations

from celery import shared_task

from dashboard.delivery import notifications, notify
from dashboard.detection import runs


@shared_task(acks_late=True, ignore_result=True)
def deliver(alert_id: int) -> int:
    notes = notify.deliver(alert_id)
    for note_id in notes:
        send_webhook.delay(note_id)
    return len(notes)


@shared_task(acks_late=True, ignore_result=True)
def send_webhook(notification_id: int) -> None:
    """One attempt; a failed one is rescheduled in its row and re-queued by the sweep (`notifications.due`)."""
    notifications.send(notification_id)


@shared_task(ignore_result=True)
def sweep() -> int:
    """Every 2 s (beat): progress of active runs to their pages, pending alert revisions delivered,
    due webhook notifications sent (first attempts lost on the way, and retries)."""
    for run in runs.active_runs():
        notify.push_progress(run, runs.rank_rows(run), runs.strip(run))
    pending = notify.pending()
    for alert_id in pending:
        deliver.delay(alert_id)
    for note_id in notifications.due():
        send_webhook.delay(note_id)
    return len(pending)


def on_alerts_changed(sender, alert_ids: list[int], **kwargs) -> None:
    """detection.signals.alerts_changed."""
    for alert_id in alert_ids:
        deliver.delay(alert_id)
