"""Notification bookkeeping: one `Notification` per incident revision per active destination, sent once.

`Notification(incident, webhook, revision)` is unique and a sent one is never sent again, so a
retried or redelivered task does not notify twice. How a notification travels is the webhook's
sink (`sinks/`); this module decides when, counts attempts and records the outcome.

Nothing relies on a queued task surviving: a pending row is due at `next_attempt_at`, and the
beat sweep (`due`) re-queues every due one, so a send lost between commit and queue, a killed
worker or a receiver down for hours only delays delivery. Each attempt pushes `next_attempt_at`
out by a backoff that doubles up to BACKOFF_MAX (hours); after MAX_ATTEMPTS the row is `failed`
and the incident's alerts show it (`delivery_states`).

Rate limit: a revision that changes what a page is (opened, resolved, escalated, re-rooted, acked or
unacked, the root's ranks) goes at once; one that only changes counts, messages or consequences
waits until MINOR_INTERVAL after the last send to that destination. A newer revision supersedes a
pending older one (the latest state wins) and is due no later than the one it replaced.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from dashboard.delivery import sinks, transports
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection.models import Alert, Incident

LAST_ERROR_MAX_CHARS = 2000
BACKOFF_FIRST = timedelta(seconds=10)
BACKOFF_MAX = timedelta(hours=6)
MAX_ATTEMPTS = 16  # 10 s doubling to 6 h: about 35 hours of a receiver's outage before `failed`
QUEUE_LEASE = timedelta(seconds=60)  # a queued send not yet run is queued again after this (workers down)
MINOR_INTERVAL = timedelta(seconds=60)  # at most one count/message-only re-send per incident and destination


def page_key(incident: Incident) -> dict[str, Any]:
    """What makes a revision a new page rather than an update of counts or messages."""
    root = transports.root_of(incident)
    return {
        "state": incident.state,
        "severity": incident.severity,
        "root": incident.root_id,
        "acked": incident.acked_by_id is not None,
        "ranks": sorted(root.ranks),
    }


def queue(incident: Incident, muted: bool = False, now: datetime | None = None) -> list[int]:
    """Notification rows of this revision for the incident's project's active destinations (existing
    ones reused); ids of those due now.

    A resolve goes to the destinations told the incident fired (a page nobody saw needs no close),
    silenced or not: a PagerDuty incident or an Alertmanager alert must not stay open because someone
    silenced it in Lockstep meanwhile. Other revisions of a muted (silenced) incident go only to the
    told destinations that hold an open object for it (Alertmanager, PagerDuty: an ack or growth)."""
    now = now or timezone.now()
    hooks = Webhook.objects.filter(project_id=incident.run.project_id, active=True)
    if muted or incident.state != Incident.State.FIRING:
        hooks = hooks.filter(notification__incident=incident, notification__state="sent").distinct()
    if muted and incident.state == Incident.State.FIRING:
        hooks = hooks.filter(kind__in=sinks.kinds(stateful=True))
    key = page_key(incident)
    ids = []
    for hook in hooks:
        note = _row(incident, hook, key, now)
        if note is not None and note.next_attempt_at <= now:
            ids.append(note.id)
    return ids


def _row(incident: Incident, hook: Webhook, key: dict[str, Any], now: datetime) -> Notification | None:
    """This revision's row, due at once for a new page, else MINOR_INTERVAL after the last send;
    never later than the pending rows it supersedes."""
    note, created = Notification.objects.get_or_create(incident=incident, webhook=hook, revision=incident.revision)
    if not created:
        return note if note.state == "pending" else None
    older = Notification.objects.filter(incident=incident, webhook=hook, state="pending", revision__lt=note.revision)
    replaced = list(older.values_list("next_attempt_at", flat=True))
    older.update(state="superseded")
    last = (
        Notification.objects.filter(incident=incident, webhook=hook, state="sent")
        .order_by("-revision")
        .values("receipt", "sent_at")
        .first()
    )
    due = now
    if last and last["receipt"].get("page") == key and last["sent_at"]:
        due = max(now, last["sent_at"] + MINOR_INTERVAL)
    note.next_attempt_at = min([due, *replaced])
    note.save(update_fields=["next_attempt_at"])
    return note


def backoff(attempts: int) -> timedelta:
    """Wait after the `attempts`-th failed attempt: BACKOFF_FIRST doubling, at most BACKOFF_MAX."""
    doubled: timedelta = BACKOFF_FIRST * 2 ** min(attempts - 1, 20)
    return min(BACKOFF_MAX, doubled)


def due(now: datetime | None = None, limit: int = 200) -> list[int]:
    """Pending notifications whose time has come, leased for QUEUE_LEASE so that a sweep every 2 s
    queues each once while the workers are down instead of piling up copies."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(state="pending", next_attempt_at__lte=now)
            .order_by("next_attempt_at")
            .values_list("id", flat=True)[:limit]
        )
        Notification.objects.filter(id__in=ids).update(next_attempt_at=now + QUEUE_LEASE)
    return ids


def send(notification_id: int, now: datetime | None = None) -> bool:
    """One attempt; True when delivered (or already delivered). A failure is recorded
    with the next attempt's time (or `failed` after MAX_ATTEMPTS) and returns False: the sweep retries it."""
    now = now or timezone.now()
    note = _claim(notification_id, now)
    if note is None:
        return True
    incident = note.incident
    try:
        receipt = sinks.for_webhook(note.webhook).notify(incident, idempotency_key(note), previous_receipt(note))
    except transports.TransportError as exc:
        gave_up = note.attempts >= MAX_ATTEMPTS
        Notification.objects.filter(id=note.id).update(
            last_error=str(exc)[:LAST_ERROR_MAX_CHARS], state="failed" if gave_up else "pending"
        )
        return False
    _sent(note, incident, {**receipt, "page": page_key(incident)}, now)
    return True


def _sent(note: Notification, incident: Incident, receipt: dict[str, Any], now: datetime) -> None:
    """Record a send; the latest firing revision Alertmanager holds is the one refreshed."""
    refresh = None
    every = sinks.SINKS[note.webhook.kind].refresh
    if every is not None and incident.state == Incident.State.FIRING:
        refresh = now + every
        Notification.objects.filter(incident_id=note.incident_id, webhook_id=note.webhook_id).exclude(
            id=note.id
        ).update(refresh_at=None)
    Notification.objects.filter(id=note.id).update(
        state="sent", sent_at=now, last_error="", receipt=receipt, refresh_at=refresh
    )


def refresh_due(now: datetime | None = None, limit: int = 200) -> list[int]:
    """Sent Alertmanager notifications of firing incidents due to be sent again (their short `endsAt`),
    leased like `due`."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(refresh_at__lte=now)
            .order_by("refresh_at")
            .values_list("id", flat=True)[:limit]
        )
        Notification.objects.filter(id__in=ids).update(refresh_at=now + QUEUE_LEASE)
    return ids


def refresh(notification_id: int, now: datetime | None = None) -> bool:
    """Send a firing incident's current state to the Alertmanager that holds it, so its `endsAt` moves
    on (and its count annotation is fresh); a failure is tried again after the lease."""
    now = now or timezone.now()
    note = (
        Notification.objects.select_related("incident__run__project", "incident__root", "incident__acked_by", "webhook")
        .filter(id=notification_id, state="sent")
        .first()
    )
    if note is None or note.incident.state != Incident.State.FIRING or not note.webhook.active:
        Notification.objects.filter(id=notification_id).update(refresh_at=None)
        return False
    try:
        receipt = sinks.for_webhook(note.webhook).notify(note.incident, idempotency_key(note), note.receipt)
    except transports.TransportError as exc:
        Notification.objects.filter(id=note.id).update(last_error=str(exc)[:LAST_ERROR_MAX_CHARS])
        return False
    Notification.objects.filter(id=note.id, refresh_at__isnull=False).update(
        receipt={**note.receipt, **receipt}, refresh_at=now + (sinks.SINKS[note.webhook.kind].refresh or QUEUE_LEASE)
    )
    return True


def previous_receipt(note: Notification) -> transports.Receipt:
    """What the destination was last sent for this incident (an earlier revision's receipt), or {}."""
    return (
        Notification.objects.filter(
            incident_id=note.incident_id, webhook_id=note.webhook_id, state="sent", revision__lt=note.revision
        )
        .order_by("-revision")
        .values_list("receipt", flat=True)
        .first()
    ) or {}


def idempotency_key(note: Notification) -> str:
    """Names the incident revision, so a receiver can drop a duplicate of a retry that did arrive."""
    return f"lockstep-incident-{note.incident_id}-{note.revision}"


def _claim(notification_id: int, now: datetime) -> Notification | None:
    """The notification with this attempt counted and the next one scheduled (under a row lock,
    so a worker that dies mid-send is retried after the backoff); None unless it is pending."""
    with transaction.atomic():
        note = (
            Notification.objects.select_for_update(of=("self",))
            .select_related("incident__run__project", "incident__root", "incident__acked_by", "webhook")
            .filter(id=notification_id)
            .first()
        )
        if note is None or note.state != "pending":
            return None
        note.attempts += 1
        note.next_attempt_at = now + backoff(note.attempts)
        note.save(update_fields=["attempts", "next_attempt_at"])
    return note


def delivery_states(alert_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per alert, how many notifications of its incident are pending, sent and failed (two queries)."""
    incident_of = dict(Alert.objects.filter(id__in=alert_ids, incident__isnull=False).values_list("id", "incident_id"))
    rows = (
        Notification.objects.filter(incident_id__in=set(incident_of.values()))
        .values("incident_id")
        .annotate(
            pending=Count("id", filter=Q(state="pending")),
            sent=Count("id", filter=Q(state="sent")),
            failed=Count("id", filter=Q(state="failed")),
        )
    )
    by_incident = {r["incident_id"]: {k: r[k] for k in ("pending", "sent", "failed")} for r in rows}
    return {alert_id: by_incident[i] for alert_id, i in incident_of.items() if i in by_incident}
