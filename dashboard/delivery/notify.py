"""Deliver alert revisions: websocket push through the channel layer, then webhooks.

Delivery is an outbox: an alert whose `revision` is ahead of `notified_revision` is pending,
and the sweep re-queues pending ones, so a worker dying after commit loses no notification.
The push happens before the revision is marked (at least once; the page replaces by id).

channels_redis binds its connection pools to the event loop that created them; Celery tasks
have no loop, so each push runs one coroutine on a fresh layer and closes its pools inside
that same coroutine (channels_redis #332: "Event loop is closed").
"""
from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction
from django.db.models import F

from dashboard.delivery import notifications
from dashboard.detection import lifecycle, silences
from dashboard.detection.models import Alert


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def project_group(project_id: int) -> str:
    return f"project.{project_id}"


def message(alert: Alert) -> dict:
    return {"type": "alert", "alert": {**alert.as_json(), **silences.mute_state(alert)}}


def push(alerts: list[Alert]) -> None:
    """Send the alerts' current state to their run's and project's websocket groups."""
    messages = []
    for alert in alerts:
        body = {"type": "lockstep.message", "message": message(alert), "project": alert.run.project_id}
        messages += [(run_group(alert.run_id), body), (project_group(alert.run.project_id), body)]
    if messages:
        asyncio.run(_send(messages))


def push_progress(run, ranks: list[dict], strip: list[dict] | None = None) -> None:
    """An aggregate per run (never raw per-rank events: groups have a capacity). `strip`: the run page's
    per-rank phases (`detection.runs.strip`, bounded), for the run's group only."""
    steps = [r["last_step"] for r in ranks if r["last_step"] is not None]
    message = {
        "type": "progress", "run": run.key, "last_step": max(steps, default=None), "min_step": min(steps, default=None),
        "ranks_reporting": len(ranks), "ranks_ended": sum(r["status"] != "running" for r in ranks),
        "world_size": run.world_size,
    }
    body = {"type": "lockstep.message", "message": message, "project": run.project_id}
    run_body = {**body, "message": {**message, "strip": strip}} if strip else body
    asyncio.run(_send([(run_group(run.id), run_body), (project_group(run.project_id), body)]))


def deliver(alert_id: int) -> list[int]:
    """Push a pending revision to websockets; queue webhooks unless muted. Returns notification ids."""
    with transaction.atomic():
        alert = Alert.objects.select_for_update(of=("self",)).select_related("run", "acked_by").filter(id=alert_id).first()
        if alert is None or alert.notified_revision >= alert.revision:
            return []
        push([alert])
        mute = silences.mute_state(alert)
        notes = notifications.queue(alert, muted=mute["silenced"] or mute["inhibited"])
        lifecycle.mark_notified(alert)
    return notes


def pending(limit: int = 500) -> list[int]:
    return list(Alert.objects.filter(notified_revision__lt=F("revision")).values_list("id", flat=True)[:limit])


async def _send(messages: list[tuple[str, dict]]) -> None:
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    try:
        for group, body in messages:
            await layer.group_send(group, body)
    finally:
        await layer.close_pools()
