"""Notification bookkeeping: one `Notification` per alert revision per active webhook, sent once.

`Notification(alert, webhook, revision)` is unique and a sent one is never sent again, so a
retried or redelivered task does not notify twice. How a notification travels is the webhook's
transport (`transports.py`); this module counts attempts and records the outcome.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from dashboard.delivery import transports
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection.models import Alert

LAST_ERROR_MAX_CHARS = 2000


def queue(alert: Alert) -> list[int]:
    """Notification rows for every active webhook of the alert's project (existing ones reused)."""
    ids = []
    for hook in Webhook.objects.filter(project_id=alert.run.project_id, active=True):
        note, _ = Notification.objects.get_or_create(alert=alert, webhook=hook, revision=alert.revision)
        if note.state != "sent":
            ids.append(note.id)
    return ids


def send(notification_id: int) -> bool:
    """Send once; True when delivered (or already delivered), raises `TransportError` to let Celery retry."""
    note = _claim(notification_id)
    if note is None:
        return True
    try:
        transports.for_webhook(note.webhook).notify(note.alert, idempotency_key(note))
    except transports.TransportError as exc:
        Notification.objects.filter(id=note.id).update(last_error=str(exc)[:LAST_ERROR_MAX_CHARS])
        raise
    Notification.objects.filter(id=note.id).update(state="sent", sent_at=timezone.now(), last_error="")
    return True


def idempotency_key(note: Notification) -> str:
    """Names the alert revision, so a receiver can drop a duplicate of a retry that did arrive."""
    return f"lockstep-{note.alert_id}-{note.revision}"


def _claim(notification_id: int) -> Notification | None:
    """The notification with this attempt counted (under a row lock); None when it was already sent."""
    with transaction.atomic():
        note = Notification.objects.select_for_update().select_related("alert__run", "webhook").get(id=notification_id)
        if note.state == "sent":
            return None
        note.attempts += 1
        note.save(update_fields=["attempts"])
    return note
