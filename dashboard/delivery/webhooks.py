"""Slack-compatible webhooks: one POST per alert revision per webhook, retried with backoff.

`Notification(alert, webhook, revision)` is unique, and a sent one is never sent again, so a
retried or redelivered task does not notify twice.
"""
from __future__ import annotations

import json
import logging
import urllib.request

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard.delivery.models import Notification, Webhook

from dashboard.detection.models import Alert

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0


def queue(alert: Alert) -> list[int]:
    """Notification rows for every active webhook of the alert's project (existing ones reused)."""
    ids = []
    for hook in Webhook.objects.filter(project_id=alert.run.project_id, active=True):
        note, _ = Notification.objects.get_or_create(alert=alert, webhook=hook, revision=alert.revision)
        if note.state != "sent":
            ids.append(note.id)
    return ids


def payload(alert: Alert) -> dict:
    """Slack's incoming-webhook shape (`text` + `attachments`), plus the alert itself for other receivers."""
    state = "RESOLVED" if alert.state == Alert.State.RESOLVED else alert.severity.upper()
    url = f"{settings.LOCKSTEP_PUBLIC_URL}/runs/{alert.run.key}/" if settings.LOCKSTEP_PUBLIC_URL else ""
    return {
        "text": f"[{state}] {alert.kind} in run {alert.run.key}: {alert.message}",
        "attachments": [{
            "color": {"critical": "#c62828", "warning": "#ef8f00"}.get(alert.severity, "#2e7d32"),
            "title": f"{alert.kind} · {alert.run.key}",
            "title_link": url,
            "text": alert.message,
            "fields": [{"title": "ranks", "value": ", ".join(map(str, alert.ranks)) or "-", "short": True},
                       {"title": "step", "value": str(alert.step if alert.step is not None else "-"), "short": True}],
        }],
        "lockstep": {"revision": alert.revision, "alert": alert.as_json()},
    }


def send(notification_id: int) -> bool:
    """POST once; True when delivered (or already delivered), raises to let Celery retry."""
    with transaction.atomic():
        note = Notification.objects.select_for_update().select_related("alert__run", "webhook").get(id=notification_id)
        if note.state == "sent":
            return True
        note.attempts += 1
        note.save(update_fields=["attempts"])
    body = json.dumps(payload(note.alert)).encode()
    request = urllib.request.Request(note.webhook.url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Idempotency-Key": f"lockstep-{note.alert_id}-{note.revision}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except Exception as exc:
        Notification.objects.filter(id=note.id).update(last_error=str(exc)[:2000])
        raise
    Notification.objects.filter(id=note.id).update(state="sent", sent_at=timezone.now(), last_error="")
    return True
