"""Request bodies, on every HTTP route of the server: each route's limit (`ROUTE_LIMITS`, the one
table), the declared Content-Length checked against it from the headers, and the one reader that
takes a body within its limit and LOCKSTEP_BODY_TIMEOUT.

Two callers, one policy: the agents' door (`ingest.door`, mounted ahead of Django) and the edge
in front of Django's handler (`dashboard.web.edge`). The door refuses a request on its headers
(host, method, shedding, length, token, content type) before a byte of its body is read, so
reading is a step it takes between its own checks, not a middleware in front of it; and
`ingest` sits below `dashboard.web` in the import layers (.importlinter), so the edge can import
this module where the door could not import the edge. The table names Django's routes too:
they are routes of the same server, and a limit is plain data.

Why every body is bounded before anything uses it: a body is read before anyone knows who sent
it (the door checks the token from the headers, Django's handler reads the whole body before any
view runs), so a limit and a deadline are all that stand between one client and the process's
memory and connections.

Refusals, raised as `Refusal` and answered by each caller as `{"error": message}`: a
Content-Length that is not a size is a 400; one past the route's limit a 413 from the headers; a
body that grows past the limit a 413 once it does (the rest unread); one not received within
LOCKSTEP_BODY_TIMEOUT a 408. A client that goes away while its body is read: RequestAborted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted

from ingest.refusals import Refusal

Receive = Callable[[], Awaitable[dict[str, Any]]]

KIB = 1024
MAX_BODY = None  # the route takes LOCKSTEP_MAX_BODY (read when asked: the setting is the operator's)
DEADLINE_TICK_S = 0.1  # how often body reads are checked against LOCKSTEP_BODY_TIMEOUT (so at most this much late)

# route -> the largest body it takes, first match: an exact path, or a prefix ending in "*".
# Whatever it says, no route takes more than LOCKSTEP_MAX_BODY.
ROUTE_LIMITS: tuple[tuple[str, int | None], ...] = (
    ("/api/v1/ingest", MAX_BODY),  # the agents' endpoints (`ingest.door`): a batch, a relay's batches,
    ("/api/v1/ingest/bulk", MAX_BODY),  # graph texts, a Flight Recorder dump
    ("/api/v1/blobs", MAX_BODY),
    ("/api/v1/flight-recorder", MAX_BODY),
    ("/login/*", 4 * KIB),  # a user name, a password and a CSRF token
    ("/logout/*", 4 * KIB),
    ("/api/*", 64 * KIB),  # the actions' JSON: a silence's comment is the longest field (2,000 characters)
    ("/admin/*", 256 * KIB),  # a staff member's forms (a project's member list)
    ("*", 16 * KIB),  # pages' forms
)


def route_limit(path: str) -> int:
    """The body limit of `path`'s route (`ROUTE_LIMITS`), never above LOCKSTEP_MAX_BODY."""
    most: int = settings.LOCKSTEP_MAX_BODY
    limit = next(
        limit for route, limit in ROUTE_LIMITS if path == route or (route.endswith("*") and path.startswith(route[:-1]))
    )
    return most if limit is None else min(limit, most)


def declared(headers: Mapping[str, str], limit: int) -> int | None:
    """The declared Content-Length (None when absent), checked from the headers alone: a 400 when
    it is not a size (a sign, spaces, digits of other scripts), a 413 past `limit`."""
    value = headers.get("content-length")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise Refusal(400, "invalid Content-Length")
    if int(value) > limit:
        raise too_large(limit)
    return int(value)


def too_large(limit: int) -> Refusal:
    return Refusal(413, f"body exceeds {limit} bytes")


class BodyReader:
    """The body reads of one process, each cut once it outlasts LOCKSTEP_BODY_TIMEOUT, by one
    timer that ticks while reads are pending. Why not `asyncio.timeout` per request: it cost 11 us
    a request (a timer armed and disarmed each time), about 2% of a 2-step batch's server CPU, and
    an agent's body nearly always arrives with its headers, so the read never waits at all."""

    def __init__(self) -> None:
        self.reading: dict[
            asyncio.Task[Any], float
        ] = {}  # task -> its deadline; one past it is taken out, then cancelled
        self.ticking: asyncio.AbstractEventLoop | None = None  # the loop the timer ticks on, while it does

    async def read(self, receive: Receive, limit: int) -> bytes:
        """The whole body, or a `Refusal`: 413 once it grows past `limit`, 408 once
        LOCKSTEP_BODY_TIMEOUT has passed (up to DEADLINE_TICK_S late)."""
        task = asyncio.current_task()
        assert task is not None
        self.reading[task] = time.monotonic() + settings.LOCKSTEP_BODY_TIMEOUT
        loop = asyncio.get_running_loop()
        if self.ticking is not loop:  # no timer, or one left on a loop that has ended (tests run a loop per call)
            self.ticking = loop
            loop.call_later(DEADLINE_TICK_S, self._tick)
        try:
            return await _receive(receive, limit)
        except asyncio.CancelledError:
            if task not in self.reading and task.uncancel() == 0:  # our cancel, and nobody else's: a timeout
                raise Refusal(408, f"body not received within {settings.LOCKSTEP_BODY_TIMEOUT:g} s") from None
            raise
        finally:
            self.reading.pop(task, None)

    def _tick(self) -> None:
        now = time.monotonic()
        for task in [t for t, deadline in self.reading.items() if deadline <= now]:
            del self.reading[task]
            task.cancel()
        self.ticking = asyncio.get_running_loop() if self.reading else None
        if self.ticking:
            self.ticking.call_later(DEADLINE_TICK_S, self._tick)


async def _receive(receive: Receive, limit: int) -> bytes:
    """The body's messages joined; a 413 as soon as they add up past `limit`, the rest unread."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
