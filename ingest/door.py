"""The agents' door: `POST /api/v1/ingest`, `/api/v1/ingest/bulk`, `/api/v1/blobs` and
`/api/v1/flight-recorder`, one ASGI application on the event loop, mounted by path ahead of
Django (dashboard/asgi.py); every other path goes on to Django's handler.

Why: at the agents' real cadence (a batch of 1 to 8 steps every 0.5 s per rank) the server's
cost is per request. Through Django's request handling a 2-step batch cost 1.3 ms of server CPU
on the 2-core machine, most of it in the request object, the middleware, a thread per request
waiting for its group commit and a Redis round trip of its own (docs/bench-ingest.md). Here a
request is parsed, checked and decoded on the loop, waits for its group as a future
(`groupcommit.LoopCommitter`: a few writer threads per process), and is answered from the loop.

Every request takes the same steps, whichever endpoint:

1. the header policy's host check (400) and the method (405; `ingest.headerpolicy`);
2. shedding: while the oldest batch waiting for its group is past SHED_AFTER_S, or the queue is
   full (the batches ahead would wait past it: `groupcommit.LoopCommitter.crowded`), a 503 +
   Retry-After at once, the body unread (`ingest.backpressure`);
3. the declared length (413; `ingest.bodies`, whose route table gives these endpoints
   LOCKSTEP_MAX_BODY), the token (401) and the content type (415), the body unread
   (`ingest.admission`; a token not in the cache is looked up on a thread);
4. a place among the bodies being read at once (`Reading`: past LOCKSTEP_DOOR_BODIES in all, or the
   project's LOCKSTEP_DOOR_BODIES_PER_PROJECT, a 503 + Retry-After at once, the body unread);
5. the body, within LOCKSTEP_BODY_TIMEOUT (408) and the limit (413) by `ingest.bodies.BodyReader`,
   the reader the edge in front of Django uses too, then inflated within LOCKSTEP_MAX_BODY (413);
6. batches are decoded (on a thread past DECODE_ON_LOOP_MAX) and written by the group committer;
   blobs and flight records are counted against the rate limit and stored on a thread.

Every answer is JSON with the policy's headers; a refusal is `{"error", "path"?}` with its status
(`admission.refusal`), 429 and 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import msgspec
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.db import connections

from agents import protocol
from dashboard.tenancy.models import Project
from ingest import admission, blobs, bodies, flight, groupcommit, metrics, shed, validation, writers
from ingest.headerpolicy import HeaderPolicy, Headers
from ingest.refusals import Refusal

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

ENDPOINTS = {  # path -> the endpoint's name in /metrics
    "/api/v1/ingest": "ingest",
    "/api/v1/ingest/bulk": "bulk",
    "/api/v1/blobs": "blobs",
    "/api/v1/flight-recorder": "flight_recorder",
}
DECODE_ON_LOOP_MAX = 256 * 1024  # larger bodies are decoded on a thread, so one relay's big batch never stalls the loop


class Door:
    """The HTTP application: the agents' endpoints here, every other path to `app` (Django's).
    `threads` runs what touches the database outside the group commit (token lookups that miss
    the cache, blob and flight-record uploads) and large decodes; `writer` is the group
    committer's thread (tests pass executors that run on the caller's thread)."""

    def __init__(self, app: ASGIApp, threads: Executor | None = None, writer: Executor | None = None) -> None:
        self.app = app
        self.threads = threads or ThreadPoolExecutor(
            settings.LOCKSTEP_INGEST_THREADS, thread_name_prefix="lockstep-door"
        )
        self.committer = groupcommit.LoopCommitter([writer] if writer else None)
        self.bodies = bodies.BodyReader()
        self.reading = Reading()
        self.policy = HeaderPolicy()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            ENDPOINTS.get(scope["path"].removeprefix(scope.get("root_path", ""))) if scope["type"] == "http" else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            status, content, extra = await self._answer(endpoint, scope, headers, receive)
        except RequestAborted:
            return
        if status != 200:
            metrics.REQUESTS.labels(endpoint, "rejected", str(status)).inc()
        metrics.SECONDS.labels(endpoint).observe(time.perf_counter() - started)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(content)),
                    *extra,
                    *self.policy.headers(scope, headers),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})

    async def _answer(
        self, endpoint: str, scope: Scope, headers: dict[str, str], receive: Receive
    ) -> tuple[int, bytes, Headers]:
        """(status, JSON body, headers of a refusal) for one request."""
        if not self.policy.host_allowed(scope, headers):
            return 400, msgspec.json.encode({"error": "invalid Host header"}), []
        if scope["method"] != "POST":
            return 405, msgspec.json.encode({"error": f"method {scope['method']} not allowed"}), [(b"allow", b"POST")]
        crowded = self.committer.crowded()
        if crowded:
            # this one would wait past its shedding point, into its agent's timeout: refused at once, its body unread
            metrics.SHED.labels(crowded).inc()
            self._shed(None)
            return _refused(Refusal(503, "server overloaded; retry later"))
        project: Project | None = None
        try:
            asked = time.monotonic()
            limit = bodies.route_limit(scope["path"].removeprefix(scope.get("root_path", "")))
            project = await self._admitted(headers, limit)
            looked_up = time.monotonic() - asked
            with self.reading.place(project):
                raw = await self.bodies.read(receive, limit)  # a slow body holds a connection, never a thread
            # the server's own wait (a token lookup's) counts as load; the upload does not
            arrived = time.monotonic() - looked_up
            if endpoint == "blobs":
                reply: msgspec.Struct = await self.off_loop(_blobs, project, raw, headers)
            elif endpoint == "flight_recorder":
                reply = await self.off_loop(_flight_record, project, raw, headers)
            else:
                bulk = endpoint == "bulk"
                answer = await self.committer.store(await self._job(project, raw, headers, bulk), arrived)
                if isinstance(answer, Exception):
                    raise answer
                reply = admission.reply_content(answer, bulk)
        except admission.REFUSED as exc:
            refused = _refused(exc)
            if refused[0] == 503:
                self._shed(project.id if project else None)
            return refused
        if endpoint in ("blobs", "flight_recorder"):
            metrics.REQUESTS.labels(endpoint, "accepted", "200").inc()  # batches are counted by `groupcommit`
        return 200, msgspec.json.encode(reply), []

    def _shed(self, project_id: int | None) -> None:
        """Its batches were turned away for load: its ranks' silence is the server's doing (`ingest.shed`),
        recorded on a door thread (Redis may be what is down)."""
        self.threads.submit(shed.refused, project_id)

    async def _admitted(self, headers: Mapping[str, str], limit: int) -> Project:
        """The request's project, from its headers alone: the declared length, then `admission.admit`."""
        bodies.declared(headers, limit)
        project = admission.admit(headers, query=False)
        if project is admission.UNDECIDED:
            project = await self.off_loop(admission.admit, headers)
        return cast(Project, project)

    async def _job(self, project: Project, raw: bytes, headers: Mapping[str, str], bulk: bool) -> writers.Job:
        """The request's validated batches: decoded on the loop, or on a thread when the body is large."""
        if len(raw) <= DECODE_ON_LOOP_MAX:
            return admission.job_of(project, admission.body_of(raw, headers), bulk)
        return await asyncio.get_running_loop().run_in_executor(
            self.threads, lambda: admission.job_of(project, admission.body_of(raw, headers), bulk)
        )

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """`work` on a door thread, its database connection tidied afterwards (`groupcommit.outside_request`)."""
        return await asyncio.get_running_loop().run_in_executor(self.threads, groupcommit.outside_request, work, *args)

    def shutdown(self) -> None:
        """Close every thread's database connections, then stop the threads (tests)."""
        self.committer.shutdown()
        if not isinstance(self.threads, ThreadPoolExecutor):
            return
        count = self.threads._max_workers
        barrier = threading.Barrier(count)

        def close() -> None:
            try:
                barrier.wait(5)  # one job per thread: each closes its own connections
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        for future in [self.threads.submit(close) for _ in range(count)]:
            future.result()
        self.threads.shutdown(wait=True)


class Reading:
    """The bodies this process reads at once, in all and per project. Why: each may hold up to
    LOCKSTEP_MAX_BODY until LOCKSTEP_BODY_TIMEOUT, and a token is all it takes to send one (100
    stalled 8 MiB bodies of one token took a process from 126 to 829 MiB, freed only at the
    deadline). Past LOCKSTEP_DOOR_BODIES, or the project's LOCKSTEP_DOOR_BODIES_PER_PROJECT (so one
    project cannot take them all), a 503 + Retry-After at once, the body unread: the agent keeps
    the batch and resends it. One event loop per process: no lock needed."""

    def __init__(self) -> None:
        self.total = 0
        self.of: Counter[int] = Counter()  # project id -> its bodies being read

    @contextmanager
    def place(self, project: Project) -> Iterator[None]:
        """Hold one place while the body is read, or a 503 when none is free."""
        if self.of[project.id] >= settings.LOCKSTEP_DOOR_BODIES_PER_PROJECT:
            raise _too_many(f"project {project.name} has {self.of[project.id]} request bodies being read")
        if self.total >= settings.LOCKSTEP_DOOR_BODIES:
            raise _too_many(f"{self.total} request bodies being read")
        self.total += 1
        self.of[project.id] += 1
        try:
            yield
        finally:
            self.total -= 1
            self.of[project.id] -= 1
            if not self.of[project.id]:
                del self.of[project.id]


def _too_many(what: str) -> Refusal:
    return Refusal(503, f"{what} at once; retry later", retry_after=settings.LOCKSTEP_RETRY_AFTER)


def _blobs(project: Project, raw: bytes, headers: Mapping[str, str]) -> protocol.BlobReply:
    """On a door thread: an upload of graph texts the server asked for (`ingest.blobs`)."""
    admission.limit(project, 1)
    checked = blobs.verify(validation.decode_blobs(admission.body_of(raw, headers)))
    return blobs.store(checked, project.id)


def _flight_record(project: Project, raw: bytes, headers: Mapping[str, str]) -> protocol.FlightRecordReply:
    """On a door thread: a rank's Flight Recorder dump (`ingest.flight`)."""
    admission.limit(project, 1)
    return flight.store(project, admission.body_of(raw, headers))


def _refused(exc: Exception) -> tuple[int, bytes, Headers]:
    status, body, retry_after = admission.refusal(exc)
    extra = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else []
    return status, msgspec.json.encode(body), extra
