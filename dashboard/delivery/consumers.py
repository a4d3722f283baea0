"""Websockets: a run's live feed (`ws/runs/<key>/`) and all visible runs (`ws/alerts/`).

Only aggregates (alerts, progress) go through here, never raw per-rank events: channels_redis
drops messages past a group's capacity.
"""
from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard.delivery.notify import project_group, run_group
from dashboard.tenancy import access
from dashboard.tenancy.auth import user_project_ids


class _Feed(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        groups = await self.groups_for(user) if user is not None and user.is_authenticated else None
        if groups is None:
            await self.close(code=4403)
            return
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def lockstep_message(self, event: dict) -> None:
        await self.send_json(event["message"])

    async def groups_for(self, user) -> list[str] | None:
        raise NotImplementedError


class RunFeed(_Feed):
    @database_sync_to_async
    def groups_for(self, user) -> list[str] | None:
        run = access.visible_run(access.principal_for(user), self.scope["url_route"]["kwargs"]["key"])
        return [run_group(run.id)] if run is not None else None


class AlertFeed(_Feed):
    @database_sync_to_async
    def groups_for(self, user) -> list[str] | None:
        return [project_group(p) for p in sorted(user_project_ids(user))]
