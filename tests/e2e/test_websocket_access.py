"""Websockets require a session, and only a member of the run's project may subscribe."""

from __future__ import annotations

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_websocket_needs_a_session_of_a_member(stack):
    project, token = project_with_token("ws")
    key = unique("ws-run")
    assert (
        requests.post(
            f"{stack.url}/api/v1/ingest",
            json=make_batch(run=key),
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        ).status_code
        == 200
    )
    ws_url = stack.url.replace("http", "ws") + f"/ws/runs/{key}/"
    origin = {"Origin": stack.url}
    with pytest.raises(InvalidStatus):
        connect(ws_url, additional_headers=origin, open_timeout=10)
    outsider = session_of(User.objects.create_user(unique("eve")))
    with pytest.raises(InvalidStatus):
        connect(ws_url, additional_headers={**origin, "Cookie": f"sessionid={outsider}"}, open_timeout=10)
    with pytest.raises(InvalidStatus):  # a page of another origin cannot ride the user's cookie
        connect(
            ws_url,
            additional_headers={"Origin": "http://evil.example", "Cookie": f"sessionid={outsider}"},
            open_timeout=10,
        )
    member = User.objects.create_user(unique("max"))
    project.members.add(member)
    with connect(
        ws_url, additional_headers={**origin, "Cookie": f"sessionid={session_of(member)}"}, open_timeout=10
    ) as ws:
        ws.ping().wait(5)
