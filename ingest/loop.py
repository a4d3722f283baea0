"""The agents' batches served on the event loop: `POST /api/v1/ingest` and `/api/v1/ingest/bulk`.

Why: at the agents' real cadence (a batch of 1 to 8 steps every 0.5 s per rank) the server's
cost is per request, and through Django's request handling (even the lean route's one thread hop,
`ingest.fastpath`) a 2-step batch cost 1.3 ms of server CPU on the 2-core machine, most of it
in the request object, the middleware, a thread per request waiting for its group commit and a
Redis round trip of its own (docs/bench-ingest.md). Here a request is parsed, checked and
decoded on the loop, waits for its group as a future (`groupcommit.LoopCommitter`: one writer
thread per process), and is answered from the loop.

What it reuses, so the answers stay Django's: the route table (views marked `lean(...,
on_loop=...)` in dashboard/urls.py), the views' own checks and answers (`views.admit`,
`body_of`, `job_of`, `refusal`, their JsonResponses for every refusal), the group commit, and
the lean middleware chain's response headers: for each scheme, host and path the chain
(settings.LEAN_MIDDLEWARE) is run once over the request with a stand-in view, and the headers it
adds are added to every answer. Where that chain would not answer 200 (a host outside
ALLOWED_HOSTS, an HTTPS redirect), for any method but POST, and for hosts past MAX_LEARNED,
the request goes to the lean route, which answers as Django does.
"""
from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor
from typing import Any

import msgspec
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponseBase, JsonResponse
from django.utils.module_loading import import_string

from dashboard.tenancy.models import Project
from ingest import backpressure, groupcommit, views, writers
from ingest.validation import Rejection

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_LEARNED = 64  # (scheme, host, path) combinations whose chain headers are kept; others take the lean route
DECODE_ON_LOOP_MAX = 256 * 1024  # larger bodies are decoded on a thread, so one relay's big batch never stalls the loop
DEADLINE_TICK_S = 0.1  # how often body reads are checked against LOCKSTEP_BODY_TIMEOUT (so at most this much late)


async def read_body(receive: Receive) -> io.BytesIO:
    """The body as Django's handler reads it, keeping LOCKSTEP_MAX_BODY + 1 bytes at most (enough
    to answer 413) and draining the rest."""
    keep = settings.LOCKSTEP_MAX_BODY + 1
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()
        chunk = message.get("body", b"")
        if size < keep and chunk:
            chunks.append(chunk[:keep - size])
            size += len(chunks[-1])
        if not message.get("more_body", False):
            return io.BytesIO(b"".join(chunks))


class BodyDeadlines:
    """The body reads of one process, each cancelled once it outlasts LOCKSTEP_BODY_TIMEOUT, by one
    timer that ticks while reads are pending. Why not `asyncio.timeout` per request: it cost 11 us
    a request (a timer armed and disarmed each time), about 2% of a 2-step batch's server CPU, and
    an agent's body nearly always arrives with its headers, so the read never waits at all."""

    def __init__(self) -> None:
        self.reading: dict[asyncio.Task, float] = {}  # task -> its deadline; a task past it is taken out, then cancelled
        self.ticking = False

    async def read(self, receive: Receive) -> io.BytesIO:
        """`read_body`, or TimeoutError once LOCKSTEP_BODY_TIMEOUT has passed (up to DEADLINE_TICK_S late)."""
        task = asyncio.current_task()
        self.reading[task] = time.monotonic() + settings.LOCKSTEP_BODY_TIMEOUT
        if not self.ticking:
            self.ticking = True
            asyncio.get_running_loop().call_later(DEADLINE_TICK_S, self._tick)
        try:
            return await read_body(receive)
        except asyncio.CancelledError:
            if task not in self.reading and task.uncancel() == 0:  # our cancel, and nobody else's: a timeout
                raise TimeoutError from None
            raise
        finally:
            self.reading.pop(task, None)

    def _tick(self) -> None:
        now = time.monotonic()
        for task in [t for t, deadline in self.reading.items() if deadline <= now]:
            del self.reading[task]
            task.cancel()
        self.ticking = bool(self.reading)
        if self.ticking:
            asyncio.get_running_loop().call_later(DEADLINE_TICK_S, self._tick)


class LoopIngest:
    """The agents' endpoints; `lean` (the lean route's handler) answers what this does not serve,
    and its thread pool runs token lookups that miss the cache."""

    def __init__(self, lean: Callable[[Scope, Receive, Send], Awaitable[None]], threads: Executor) -> None:
        self.lean = lean
        self.threads = threads
        self.committer = groupcommit.LoopCommitter()
        self.deadlines = BodyDeadlines()
        self._chain_headers: dict[tuple, Headers | None] = {}
        self._chain_reads = _headers_the_chain_reads()  # from the settings at start, as Django loads the chain

    async def __call__(self, scope: Scope, receive: Receive, send: Send, bulk: bool) -> None:
        chain = self._chain_for(scope) if scope["method"] == "POST" else None
        if chain is None:
            await self.lean(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            status, content, extra = await self._answer(scope, receive, bulk)
        except RequestAborted:
            return
        views.counted("bulk" if bulk else "ingest", status, started)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content)),
                                *extra, *chain]})
        await send({"type": "http.response.body", "body": content})

    async def _answer(self, scope: Scope, receive: Receive, bulk: bool) -> tuple[int, bytes, Headers]:
        """(status, JSON body, headers of a refusal) for one request."""
        if self.committer.oldest_wait() > backpressure.SHED_AFTER_S or self.committer.full():
            # this one would wait past its shedding point, into its agent's timeout: refused at once, its body unread
            return _refused(Rejection(503, "server overloaded; retry later"))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            asked = time.monotonic()
            project = views.admit(headers, query=False)
            if project is views.UNDECIDED:
                project = await asyncio.get_running_loop().run_in_executor(self.threads, groupcommit.outside_request, views.admit, headers)
            looked_up = time.monotonic() - asked
            try:
                raw = await self.deadlines.read(receive)
            except TimeoutError:  # a slow body holds a connection, never a thread
                raise Rejection(408, f"body not received within {settings.LOCKSTEP_BODY_TIMEOUT:g} s") from None
            arrived = time.monotonic() - looked_up  # the server's own wait (a token lookup's) counts as load; the upload does not
            job = await self._job(project, raw.getvalue(), headers, bulk)
            answer = await self.committer.store(job, arrived)
        except views.REFUSED as exc:
            return _refused(exc)
        if isinstance(answer, views.REFUSED):
            return _refused(answer)
        if isinstance(answer, Exception):
            raise answer
        return 200, msgspec.json.encode(views.reply_content(answer, bulk)), []

    async def _job(self, project: Project, raw: bytes, headers: dict[str, str], bulk: bool) -> writers.Job:
        """The request's validated batches: decoded on the loop, or on a thread when the body is large."""
        if len(raw) <= DECODE_ON_LOOP_MAX:
            return views.job_of(project, views.body_of(raw, headers), bulk)
        return await asyncio.get_running_loop().run_in_executor(
            self.threads, lambda: views.job_of(project, views.body_of(raw, headers), bulk))

    def _chain_for(self, scope: Scope) -> Headers | None:
        """The headers the lean middleware chain adds to this request's answer, learned once per
        scheme, host and path; None where the chain would answer otherwise, or past MAX_LEARNED."""
        key = (scope.get("scheme"), scope.get("root_path", ""), scope["path"], scope.get("server"),
               *(v for k, v in scope.get("headers", ()) if k in self._chain_reads))
        if key not in self._chain_headers:
            if len(self._chain_headers) >= MAX_LEARNED:
                return None
            self._chain_headers[key] = _learn(scope)
        return self._chain_headers[key]

    def shutdown(self) -> None:
        self.committer.shutdown()


def _headers_the_chain_reads() -> set[bytes]:
    """Request headers the lean chain's answer may depend on: Django's host check (and the proxy
    headers the settings trust), HTTPS detection, CommonMiddleware's user-agent check."""
    read = {b"host"}
    if settings.USE_X_FORWARDED_HOST:
        read.add(b"x-forwarded-host")
    if settings.USE_X_FORWARDED_PORT:
        read.add(b"x-forwarded-port")
    if settings.SECURE_PROXY_SSL_HEADER:
        read.add(settings.SECURE_PROXY_SSL_HEADER[0].removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1"))
    if settings.DISALLOWED_USER_AGENTS:
        read.add(b"user-agent")
    return read


def _learn(scope: Scope) -> Headers | None:
    """Run settings.LEAN_MIDDLEWARE over this request with a view that answers an empty JSON object:
    the headers the chain adds to a 200, or None when it answers anything else itself."""
    handler = convert_exception_to_response(lambda request: JsonResponse({}))
    for path in reversed(settings.LEAN_MIDDLEWARE):
        handler = convert_exception_to_response(import_string(path)(handler))
    response: HttpResponseBase = handler(ASGIRequest(dict(scope, method="POST"), io.BytesIO()))
    if response.status_code != 200:
        return None
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()
            if k.lower() not in ("content-type", "content-length")]


def _refused(exc: Exception) -> tuple[int, bytes, Headers]:
    response = views.refusal(exc)
    extra = [(b"retry-after", response["Retry-After"].encode())] if response.has_header("Retry-After") else []
    return response.status_code, response.content, extra
