"""Acks and silences reach Alertmanager: an incident acknowledged in Lockstep, or whose root a
Lockstep silence matches, gets an Alertmanager silence (`POST /api/v2/silences`, matchers
`project` and `incident`) at each of its project's Alertmanager destinations.

Lockstep decides what it wants (`wanted`: until when, or nothing) and `SinkSilence` rows are the
outbox: `plan` records a change as a pending row, `sync` makes Alertmanager agree (create or extend,
or expire it: on unack, on the incident's resolve, on a silence expired early), with the
notifications' backoff. A silence that runs out on its own needs no call: Alertmanager holds the
same `endsAt`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from dashboard.delivery import notifications, transports
from dashboard.delivery.models import SinkSilence, Webhook
from dashboard.delivery.sinks.alertmanager import Alertmanager
from dashboard.detection import silences
from dashboard.detection.models import Incident

ACK_HOLD = timedelta(days=7)  # an acknowledged incident's Alertmanager silence, unless unacked or resolved first
PLAN_LIMIT = 500  # incidents of a project looked at when one of its silences changes


def wanted(incident: Incident, now: datetime) -> tuple[datetime | None, str]:
    """Until when Alertmanager should silence the incident (None: not at all), and why."""
    if incident.state != Incident.State.FIRING:
        return None, ""
    ends: list[tuple[datetime, str]] = []
    if incident.acked_at is not None and incident.acked_by is not None:
        ends.append((incident.acked_at + ACK_HOLD, f"acknowledged in Lockstep by {incident.acked_by.get_username()}"))
    if incident.root is not None:
        ends += [(s.expires_at, f"Lockstep silence {s.id}: {s.comment}") for s in silences.matching(incident.root)]
    ends = [e for e in ends if e[0] > now]
    return max(ends, key=lambda e: e[0]) if ends else (None, "")


def plan(incident: Incident, now: datetime | None = None) -> list[int]:
    """Record what each Alertmanager destination of the incident's project should hold; ids of the
    rows that changed (to sync now). No row is made while nothing is wanted."""
    now = now or timezone.now()
    until, why = wanted(incident, now)
    hooks = Webhook.objects.filter(project_id=incident.run.project_id, active=True, kind=Alertmanager.kind)
    changed = []
    for hook in hooks:
        row = SinkSilence.objects.filter(incident=incident, webhook=hook).first()
        held = row.until if row is not None and row.until and row.until > now else None
        if held == until:
            continue
        if row is None and until is None:
            continue
        row = row or SinkSilence(incident=incident, webhook=hook)
        row.until, row.comment, row.state, row.attempts, row.next_attempt_at = until, why, "pending", 0, now
        row.save()
        changed.append(row.id)
    return changed


def plan_project(project_id: int) -> list[int]:
    """A Lockstep silence of the project was made or expired: re-plan its firing incidents."""
    if not Webhook.objects.filter(project_id=project_id, active=True, kind=Alertmanager.kind).exists():
        return []
    firing = (
        Incident.objects.filter(run__project_id=project_id, state=Incident.State.FIRING)
        .select_related("run", "root__run", "acked_by")
        .order_by("-id")[:PLAN_LIMIT]
    )
    return [row for incident in firing for row in plan(incident)]


def due(now: datetime | None = None, limit: int = 200) -> list[int]:
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            SinkSilence.objects.select_for_update(skip_locked=True)
            .filter(state="pending", next_attempt_at__lte=now)
            .values_list("id", flat=True)[:limit]
        )
        SinkSilence.objects.filter(id__in=ids).update(next_attempt_at=now + notifications.QUEUE_LEASE)
    return ids


def sync(row_id: int, now: datetime | None = None) -> bool:
    """One attempt to make Alertmanager hold what the row wants; False (retried later) on failure."""
    now = now or timezone.now()
    with transaction.atomic():
        row = (
            SinkSilence.objects.select_for_update(of=("self",))
            .select_related("incident__run__project", "webhook")
            .filter(id=row_id, state="pending")
            .first()
        )
        if row is None:
            return True
        row.attempts += 1
        row.next_attempt_at = now + notifications.backoff(row.attempts)
        row.save(update_fields=["attempts", "next_attempt_at"])
    sink = Alertmanager(row.webhook)
    try:
        if row.until is not None and row.until > now:
            row.silence_id = sink.silence(row.incident, row.until, row.silence_id, row.comment or "Lockstep")
        elif row.silence_id:
            if row.until is None:  # one that ran out needs no call: Alertmanager ended it at the same time
                sink.unsilence(row.silence_id)
            row.silence_id = ""
    except transports.TransportError as exc:
        failed = row.attempts >= notifications.MAX_ATTEMPTS
        SinkSilence.objects.filter(id=row.id).update(
            last_error=str(exc)[: notifications.LAST_ERROR_MAX_CHARS], state="failed" if failed else "pending"
        )
        return False
    SinkSilence.objects.filter(id=row.id).update(silence_id=row.silence_id)
    SinkSilence.objects.filter(id=row.id, state="pending", until=row.until).update(state="synced", last_error="")
    return True  # a row `plan` changed meanwhile stays pending: the next sync applies the change
