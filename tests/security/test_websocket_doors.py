"""Issue 51, items 7 and 10: who may open a run's live feed, through the websocket application
dashboard/asgi.py serves (`dashboard.delivery.routing.application`), in process. A NUL byte in the
run key is refused like an unknown run (was: a 500); the handshake's Origin must be the server's
own scheme, host and port (was: the host name alone, so a page on another port was let in)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from dashboard.delivery.routing import application
from dashboard.tenancy.models import Project, Run

pytestmark = pytest.mark.django_db(transaction=True)
HOST = "127.0.0.1:8000"  # the Host header of every handshake here


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    """What is checked here is the door (who may open a feed), not delivery: the consumer joins its
    groups on channels' in-memory layer. With Redis's layer in this process, one suite run of four hung
    in `asyncio.run`'s clean-up of the handshake's loop, cancelling the layer's blocking read; the
    websocket tests against the started stack (tests/e2e/test_websocket_access.py) keep Redis's."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def session(project: Project) -> str:
    """A logged-in member of `project`, which has the run `runA1`."""
    Run.objects.create(project=project, key="runA1", world_size=2)
    user = User.objects.create_user("ws-member")
    project.members.add(user)
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _connect(path: str, session: str, origin: str, scheme: str = "ws", **headers: str) -> tuple[bool, int | None]:
    """(accepted, the close code when refused)."""

    async def handshake() -> tuple[bool, int | None]:
        sent = {"host": HOST, "origin": origin, "cookie": f"sessionid={session}", **headers}
        ws = WebsocketCommunicator(application, path, headers=[(k.encode(), v.encode()) for k, v in sent.items()])
        ws.scope["scheme"] = scheme
        accepted, code = await ws.connect(timeout=10)
        if accepted:
            await ws.disconnect()
        return accepted, None if accepted else code

    return async_to_sync(handshake)()


# item 7 ------------------------------------------------------------------------------------------


def test_a_nul_byte_in_the_run_key_is_refused_like_an_unknown_run(session):
    unknown = _connect("/ws/runs/no-such-run/", session, f"http://{HOST}")
    assert unknown == (False, 4403)
    assert _connect("/ws/runs/run%00A1/", session, f"http://{HOST}") == unknown
    assert _connect("/ws/runs/runA1/", session, f"http://{HOST}") == (True, None)  # the run itself opens


# item 10 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # the same host, another port
        "http://localhost:8000",  # another host name (in ALLOWED_HOSTS), the same port
        "https://127.0.0.1:8000",  # another scheme
        "http://127.0.0.1",  # port 80
        "http://127.0.0.1:8000.evil.example",
        "null",
    ],
)
def test_a_websocket_from_another_origin_is_refused(session, origin):
    assert _connect("/ws/runs/runA1/", session, origin) == (False, 1000)
    assert _connect("/ws/runs/runA1/", session, f"http://{HOST}") == (True, None)


def test_the_origin_behind_a_tls_proxy_is_https(session, settings):
    """A TLS-terminating proxy talks plain ws to the server: the browser's origin is https, as the
    proxy's header (LOCKSTEP_PROXY_TLS_HEADER) says; an origin in CSRF_TRUSTED_ORIGINS is let in too."""
    assert _connect("/ws/runs/runA1/", session, f"https://{HOST}", scheme="wss") == (True, None)
    assert _connect("/ws/runs/runA1/", session, f"https://{HOST}", **{"x-forwarded-proto": "https"}) == (False, 1000)
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert _connect("/ws/runs/runA1/", session, f"https://{HOST}", **{"x-forwarded-proto": "https"}) == (True, None)
    assert _connect("/ws/runs/runA1/", session, f"http://{HOST}", **{"x-forwarded-proto": "https"}) == (False, 1000)
    settings.CSRF_TRUSTED_ORIGINS = ["https://lockstep.example.com"]
    assert _connect("/ws/runs/runA1/", session, "https://lockstep.example.com") == (True, None)
