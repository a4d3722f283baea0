"""Push alerts to websocket clients through the channel layer.

channels_redis binds its connection pools to the event loop that created them; Celery tasks
have no loop, so each push runs one coroutine on a fresh layer and closes its pools inside
that same coroutine (channels_redis #332: "Event loop is closed").
"""
from __future__ import annotations

import asyncio
import logging

from channels_redis.core import RedisChannelLayer
from django.conf import settings

log = logging.getLogger(__name__)


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def project_group(project_id: int) -> str:
    return f"project.{project_id}"


def alerts(fresh: list) -> None:
    if not fresh:
        return
    messages = []
    for alert in fresh:
        body = {"type": "lockstep.message", "message": {"type": "alert", "alert": alert.as_json()}}
        messages += [(run_group(alert.run_id), body), (project_group(alert.run.project_id), body)]
    try:
        asyncio.run(_send(messages))
    except Exception:  # delivery is best effort: the alert is stored and shown on the next page load
        log.exception("websocket push failed for %d alerts", len(fresh))


async def _send(messages: list[tuple[str, dict]]) -> None:
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    try:
        for group, body in messages:
            await layer.group_send(group, body)
    finally:
        await layer.close_pools()

