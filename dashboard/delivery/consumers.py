"""Websockets: a run's live feed (`ws/runs/<key>/`) and all visible runs (`ws/alerts/`).

Only aggregates (alerts, incidents, progress) go through here, never raw per-rank events: channels_redis
drops messages past a group's capacity. Access is checked again before messages are passed on
(every alert and incident; progress at most every RECHECK_S): a member removed from the project, or a session
that logged out or expired, is closed (4403) instead of going on receiving.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model

from dashboard.delivery.notify import project_group, run_group
from dashboard.tenancy import access
from dashboard.tenancy.auth import user_project_ids

if TYPE_CHECKING:
    from django.contrib.auth.models import User

RECHECK_S = 2.0


class _Feed(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]
    allowed: frozenset[int] = frozenset()  # projects whose messages this socket may pass on
    checked_at: float = 0.0

    async def connect(self) -> None:
        user = self.scope.get("user")
        groups = await self.groups_for(user) if user is not None and user.is_authenticated else None
        if groups is None:
            await self.close(code=4403)
            return
        self.groups_joined = groups
        self.allowed = await self.projects_allowed()
        self.checked_at = time.monotonic()
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def lockstep_message(self, event: dict[str, Any]) -> None:
        is_alert = event["message"].get("type") in ("alert", "incident")
        if is_alert or time.monotonic() - self.checked_at >= RECHECK_S:
            self.allowed = await self.projects_allowed()
            self.checked_at = time.monotonic()
        if event.get("project") not in self.allowed:
            if not self.allowed:
                await self.close(code=4403)
            return
        await self.send_json(event["message"])

    @database_sync_to_async
    def projects_allowed(self) -> frozenset[int]:
        """The projects the socket's user may see now; empty once the session is gone or no longer theirs."""
        user = self.scope.get("user")
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        if user is None or not user.is_authenticated or not key:
            return frozenset()
        stored = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).load()
        if (
            str(stored.get(SESSION_KEY)) != str(user.pk)
            or not get_user_model().objects.filter(pk=user.pk, is_active=True).exists()
        ):
            return frozenset()
        return self.visible(user)

    def visible(self, user: User) -> frozenset[int]:
        return user_project_ids(user)

    async def groups_for(self, user: User) -> list[str] | None:
        raise NotImplementedError


class RunFeed(_Feed):
    @database_sync_to_async
    def groups_for(self, user: User) -> list[str] | None:
        run = access.visible_run(access.principal_for(user), self.scope["url_route"]["kwargs"]["key"])
        self.run_project = run.project_id if run is not None else None
        return [run_group(run.id)] if run is not None else None

    def visible(self, user: User) -> frozenset[int]:
        return user_project_ids(user) & {self.run_project}


class AlertFeed(_Feed):
    @database_sync_to_async
    def groups_for(self, user: User) -> list[str] | None:
        return [project_group(p) for p in sorted(user_project_ids(user))]


async def unknown_path(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    """Every websocket path no feed has: a 404 the client can read, naming the path (was: the router
    raised, a 500). Without uvicorn's denial-response extension, a plain refusal (403)."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close"})
        return
    content = json.dumps({"error": f"no websocket at {scope['path']}", "path": "path"}).encode()
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))],
        }
    )
    await send({"type": "websocket.http.response.body", "body": content})
