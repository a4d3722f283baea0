"""The body limit and the body deadline of every route Django's ASGI handler serves (pages, login,
admin, the read API), at the edge, before Django sees the request.

Why: Django's handler reads a whole body (to a temporary file past 2.5 MB) before any view or
middleware runs, with no deadline, so a bad token or a missing login was refused only after any
size of upload, however slow. Here the agents' limit and deadline (LOCKSTEP_MAX_BODY,
LOCKSTEP_BODY_TIMEOUT, which `ingest.door` applies to the agents' endpoints) hold
for every route: a declared Content-Length past the limit is a 413 from the headers, a body that
grows past it a 413 once it does, and one not received in time a 408. A body within both is
handed on in memory, as Django would have read it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TooLarge(Exception):
    pass


class Disconnected(Exception):
    pass


class BodyEdge:
    """ASGI middleware around Django's handler (dashboard/asgi.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = settings.LOCKSTEP_MAX_BODY
        declared = _declared(scope)
        if declared == -1:
            await _answer(send, 400, "invalid Content-Length")
            return
        if declared is not None and declared > limit:
            await _answer(send, 413, f"body exceeds {limit} bytes")
            return
        try:
            body = await asyncio.wait_for(_read(receive, limit), settings.LOCKSTEP_BODY_TIMEOUT)
        except TooLarge:
            await _answer(send, 413, f"body exceeds {limit} bytes")
            return
        except TimeoutError:
            await _answer(send, 408, f"body not received within {settings.LOCKSTEP_BODY_TIMEOUT:g} s")
            return
        except Disconnected:
            return
        await self.app(scope, _replay(body, receive), send)


def _declared(scope: Scope) -> int | None:
    """The Content-Length header as a size; None when absent (chunked), -1 when it is not a size."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return None


async def _read(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the client's own messages (Django listens for a disconnect)."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _answer(send: Send, status: int, message: str) -> None:
    """A short answer the client can read (the rest of its body is discarded by the server)."""
    content = f'{{"error": "{message}"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))],
        }
    )
    await send({"type": "http.response.body", "body": content})
