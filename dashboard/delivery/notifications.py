"""Notification bookkeeping: one `Notification` per alert revision per active destination, sent once.

`Notification(alert, webhook, revision)` is unique and a sent one is never sent again, so a
retried or redelivered task does not notify twice. How a notification travels is the webhook's
transport (`transports.py`); this module counts attempts and records the outcome.

Nothing relies on a queued task surviving: a pending row is due at `next_attempt_at`, and the
beat sweep (`due`) re-queues every due one, so a send lost between commit and queue, a killed
worker or a receiver down for hours only delays delivery. Each attempt pushes `next_attempt_at`
out by a backoff that doubles up to BACKOFF_MAX (hours); after MAX_ATTEMPTS the row is `failed`
and the alert shows it (`delivery_states`).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from dashboard.delivery import transports
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection.models import Alert

LAST_ERROR_MAX_CHARS = 2000
BACKOFF_FIRST = timedelta(seconds=10)
BACKOFF_MAX = timedelta(hours=6)
MAX_ATTEMPTS = 16  # 10 s doubling to 6 h: about 35 hours of a receiver's outage before `failed`
QUEUE_LEASE = timedelta(seconds=60)  # a queued send not yet run is queued again after this (workers down)


def queue(alert: Alert, muted: bool = False) -> list[int]:
    """Notification rows for every active destination of the alert's project (existing ones reused).

    A muted (silenced or inhibited) revision notifies nobody, except that a resolve still reaches
    the destinations that were told the alert fired: a PagerDuty incident or an Alertmanager alert
    must not stay open because someone silenced it meanwhile."""
    if muted and alert.state != Alert.State.RESOLVED:
        return []
    hooks = Webhook.objects.filter(project_id=alert.run.project_id, active=True)
    if muted:
        hooks = hooks.filter(notification__alert=alert, notification__state="sent").distinct()
    ids = []
    for hook in hooks:
        note, _ = Notification.objects.get_or_create(alert=alert, webhook=hook, revision=alert.revision)
        if note.state == "pending":
            ids.append(note.id)
    return ids


def backoff(attempts: int) -> timedelta:
    """Wait after the `attempts`-th failed attempt: BACKOFF_FIRST doubling, at most BACKOFF_MAX."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(attempts - 1, 20))


def due(now: datetime | None = None, limit: int = 200) -> list[int]:
    """Pending notifications whose time has come, leased for QUEUE_LEASE so that a sweep every 2 s
    queues each once while the workers are down instead of piling up copies."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(Notification.objects.select_for_update(skip_locked=True)
                   .filter(state="pending", next_attempt_at__lte=now).order_by("next_attempt_at")
                   .values_list("id", flat=True)[:limit])
        Notification.objects.filter(id__in=ids).update(next_attempt_at=now + QUEUE_LEASE)
    return ids


def send(notification_id: int, now: datetime | None = None) -> bool:
    """One attempt; True when delivered (or already delivered). A failure is recorded with the next
    attempt's time (or `failed` after MAX_ATTEMPTS) and returns False: the sweep retries it."""
    now = now or timezone.now()
    note = _claim(notification_id, now)
    if note is None:
        return True
    try:
        receipt = transports.for_webhook(note.webhook).notify(note.alert, idempotency_key(note), previous_receipt(note))
    except transports.TransportError as exc:
        gave_up = note.attempts >= MAX_ATTEMPTS
        Notification.objects.filter(id=note.id).update(last_error=str(exc)[:LAST_ERROR_MAX_CHARS],
                                                       state="failed" if gave_up else "pending")
        return False
    Notification.objects.filter(id=note.id).update(state="sent", sent_at=now, last_error="", receipt=receipt)
    return True


def previous_receipt(note: Notification) -> transports.Receipt:
    """What the destination was last sent for this alert (an earlier revision's receipt), or {}."""
    return (Notification.objects.filter(alert_id=note.alert_id, webhook_id=note.webhook_id, state="sent",
                                        revision__lt=note.revision)
            .order_by("-revision").values_list("receipt", flat=True).first()) or {}


def idempotency_key(note: Notification) -> str:
    """Names the alert revision, so a receiver can drop a duplicate of a retry that did arrive."""
    return f"lockstep-{note.alert_id}-{note.revision}"


def _claim(notification_id: int, now: datetime) -> Notification | None:
    """The notification with this attempt counted and the next one scheduled (under a row lock,
    so a worker that dies mid-send is retried after the backoff); None unless it is pending."""
    with transaction.atomic():
        note = (Notification.objects.select_for_update(of=("self",)).select_related("alert__run__project", "webhook")
                .filter(id=notification_id).first())
        if note is None or note.state != "pending":
            return None
        note.attempts += 1
        note.next_attempt_at = now + backoff(note.attempts)
        note.save(update_fields=["attempts", "next_attempt_at"])
    return note


def delivery_states(alert_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per alert, how many of its webhook notifications are pending, sent and failed (one query)."""
    rows = (Notification.objects.filter(alert_id__in=alert_ids).values("alert_id")
            .annotate(pending=Count("id", filter=Q(state="pending")), sent=Count("id", filter=Q(state="sent")),
                      failed=Count("id", filter=Q(state="failed"))))
    return {r["alert_id"]: {k: r[k] for k in ("pending", "sent", "failed")} for r in rows}
