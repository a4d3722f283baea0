"""A websocket's access is checked again while it is open (issue 17, item 8): a member removed
from the project, or a session that logged out, stops receiving alerts and is closed."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import transaction
from django.test import Client

from dashboard.delivery import notify
from dashboard.delivery.routing import websocket_urlpatterns
from dashboard.detection import lifecycle
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run

pytestmark = pytest.mark.django_db(transaction=True)
APP = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))


def _alert(run: Run, step: int):
    finding = Finding(
        "critical", (1,), f"rank 1 diverged at {step}", step=step, kind="grad_divergence", subject=f"grad:ddp:{step}"
    )
    with transaction.atomic():
        return lifecycle.record(run, finding)[0]


def _session_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def _open(path: str, session: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(APP, path, headers=[(b"cookie", f"sessionid={session}".encode())])
    connected, _ = await ws.connect(timeout=10)
    assert connected
    return ws


@pytest.mark.parametrize("path", ["/ws/alerts/", "/ws/runs/revoked/"])
@pytest.mark.parametrize("revoke", ["removed from the project", "logged out"])
def test_access_lost_while_connected_closes_the_socket(project, path, revoke):
    run = Run.objects.create(project=project, key="revoked", world_size=2)
    user = User.objects.create_user("rita")
    project.members.add(user)
    session = _session_of(user)

    async def scenario() -> dict:
        ws = await _open(path, session)
        await sync_to_async(notify.push)([await sync_to_async(_alert)(run, 0)])
        first = await ws.receive_json_from(timeout=10)
        if revoke == "removed from the project":
            await sync_to_async(project.members.remove)(user)
        else:
            await sync_to_async(Session.objects.filter(session_key=session).delete)()
        await sync_to_async(notify.push)([await sync_to_async(_alert)(run, 1)])
        then = [await ws.receive_output(timeout=10)]
        while then[-1]["type"] != "websocket.close":  # progress may pass within its RECHECK_S, never an alert
            then.append(await ws.receive_output(timeout=10))
        await ws.disconnect()
        return {"first": first, "then": then}

    seen = async_to_sync(scenario)()
    assert seen["first"]["alert"]["step"] == 0
    assert seen["then"][-1] == {"type": "websocket.close", "code": 4403}
    passed = [json.loads(m["text"])["type"] for m in seen["then"][:-1]]
    assert set(passed) <= {"progress"}, passed
