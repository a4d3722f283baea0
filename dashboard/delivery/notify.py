"""Deliver revisions: alerts to websockets (the pages' alert lists), incidents to websockets and to
every destination (only incidents page: Slack, JSON webhooks, Alertmanager, PagerDuty).

Delivery is an outbox twice over: an alert or incident whose `revision` is ahead of
`notified_revision` is pending, and the sweep re-queues pending ones, so a worker dying after commit
loses no notification. The push happens before the revision is marked (at least once; the page
replaces by id).

channels_redis binds its connection pools to the event loop that created them; Celery tasks
have no loop, so each push runs one coroutine on a fresh layer and closes its pools inside
that same coroutine (channels_redis #332: "Event loop is closed").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction
from django.db.models import F

from dashboard.delivery import mirror, notifications
from dashboard.detection import incidents, lifecycle, runs, silences
from dashboard.detection.models import Alert, Incident
from dashboard.tenancy.models import Run


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def project_group(project_id: int) -> str:
    return f"project.{project_id}"


def message(alert: Alert) -> dict[str, Any]:
    return {"type": "alert", "alert": {**alert.as_json(), **silences.mute_state(alert)}}


def incident_message(incident: Incident) -> dict[str, Any]:
    return {"type": "incident", "incident": incident.as_json()}


def push(alerts: list[Alert], changed_incidents: Sequence[Incident] = ()) -> None:
    """Send the alerts' and incidents' current state to their run's and project's websocket groups."""
    messages: list[tuple[str, dict[str, Any]]] = []
    items: list[tuple[Alert | Incident, dict[str, Any]]] = [
        *((a, message(a)) for a in alerts),
        *((i, incident_message(i)) for i in changed_incidents),
    ]
    for item, text in items:
        body = {"type": "lockstep.message", "message": text, "project": item.run.project_id}
        messages += [(run_group(item.run_id), body), (project_group(item.run.project_id), body)]
    if messages:
        asyncio.run(_send(messages))


def push_progress(run: Run, ranks: runs.RankRows, strip: list[dict[str, Any]] | None = None) -> None:
    """An aggregate per run (never raw per-rank events: groups have a capacity). `strip`: the run page's
    per-rank phases (`detection.runs.strip`, bounded), for the run's group only; a rank that ended or
    was lost is shown as such, not in the phase of its last sample (`ended_in_strip`), and a run with
    no rank running sends none. The pages read the run again when these counts move (run.js, runs.js)."""
    strip = ended_in_strip(strip or [], ranks.ended) if ranks.running else None
    message = {
        "type": "progress",
        "run": run.key,
        "last_step": ranks.last_step,
        "min_step": ranks.min_step,
        "ranks_reporting": ranks.reporting,
        "ranks_ended": ranks.reporting - ranks.running,
        "world_size": run.world_size,
    }
    body = {"type": "lockstep.message", "message": message, "project": run.project_id}
    run_body = {**body, "message": {**message, "strip": strip}} if strip else body
    asyncio.run(_send([(run_group(run.id), run_body), (project_group(run.project_id), body)]))


def deliver(alert_id: int) -> int | None:
    """Push a pending alert revision to websockets (alerts page no destination); the id of the alert's
    incident when that has a revision to deliver."""
    with transaction.atomic():
        alert = (
            Alert.objects.select_for_update(of=("self",)).select_related("run", "acked_by").filter(id=alert_id).first()
        )
        if alert is None:
            return None
        if alert.notified_revision < alert.revision:
            push([alert])
            lifecycle.mark_notified(alert)
    pending_incident = (
        alert.incident_id is not None
        and Incident.objects.filter(id=alert.incident_id, notified_revision__lt=F("revision")).exists()
    )
    return alert.incident_id if pending_incident else None


def deliver_incident(incident_id: int) -> tuple[list[int], list[int]]:
    """Push a pending incident revision to websockets, queue its notifications (unless muted) and the
    Alertmanager silences its ack or a Lockstep silence asks for. Returns (notification ids due now,
    silence rows to sync)."""
    with transaction.atomic():
        incident = (
            Incident.objects.select_for_update(of=("self",))
            .select_related("run__project", "root__run", "acked_by")
            .filter(id=incident_id)
            .first()
        )
        if incident is None or incident.notified_revision >= incident.revision:
            return [], []
        push([], [incident])
        notes = notifications.queue(incident, muted=muted(incident))
        rows = mirror.plan(incident)
        incidents.mark_notified(incident)
    return notes, rows


def muted(incident: Incident) -> bool:
    """A Lockstep silence that matches the incident's root mutes the incident."""
    return incident.root is not None and bool(silences.matching(incident.root))


def pending(limit: int = 500) -> list[int]:
    return list(Alert.objects.filter(notified_revision__lt=F("revision")).values_list("id", flat=True)[:limit])


def pending_incidents(limit: int = 500) -> list[int]:
    return list(Incident.objects.filter(notified_revision__lt=F("revision")).values_list("id", flat=True)[:limit])


def ended_in_strip(strip: list[dict[str, Any]], ended: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live rows, then the ranks no longer running (`runs.RankRows.ended`: failed ones first, their
    status a rank_end's or lost), up to `runs.STRIP_RANKS`. An ended rank is shown from its rank row, not
    from a progress sample: a sample outlives its rank by LOCKSTEP_SILENT_AFTER (a crashed rank must not
    read as still compiling), and one older than that is gone (the crashed rank must not vanish either)."""
    gone = {r["rank"] for r in ended}
    live = [row for row in strip if row["rank"] not in gone]
    shown = [
        {
            "rank": r["rank"],
            "phase": "ended",
            "ended": r["status"],
            "step": r["last_step"],
            "for_s": None,
            "since_step_s": None,
            "op": "",
            "where": "",
            "holding": False,
        }
        for r in ended
    ]
    return (live + shown)[: runs.STRIP_RANKS]


async def _send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    try:
        for group, body in messages:
            await layer.group_send(group, body)
    finally:
        await layer.close_pools()
