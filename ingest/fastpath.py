"""The lean route: Django's synchronous handler for the routes `lean(...)` marks in dashboard/urls.py.

The agents' two endpoints (`lean(..., on_loop=...)`) go further, to `ingest.loop`, which serves
them on the event loop and hands this handler whatever it does not serve itself; the lean route
runs blob uploads, and the token lookups and large decodes of the loop path on its threads.

Why it exists: Django's ASGI handler starts a thread per request (`ThreadSensitiveContext`) and
crosses into it for every middleware method and for the view. At the agents' real cadence (a
batch of a few steps per request) that was most of an ingest process's CPU: `python
bench/ingest.py --steps-per-batch 8 --steps 96 --ranks-per-request 1` accepted 1.8k rank-steps/s
through Django's ASGI handler and 4.7k/s through a lean route (2026-12-01, 2-core machine). This
route runs Django's own request and middleware code rather than copies of it, with the chain of
settings.LEAN_MIDDLEWARE (host check and response headers): the session, auth, messages, CSRF and
static-file middlewares serve pages, and these views never use them.

What it reuses, so nothing of Django is copied: the route table (Django's URL resolver over
ROOT_URLCONF, dashboard/urls.py), the request (`ASGIRequest`, built by `ASGIHandler.create_request`),
settings.LEAN_MIDDLEWARE loaded by `BaseHandler.load_middleware` in synchronous mode (as under WSGI),
`BaseHandler.get_response` (resolving, middleware, the view, error pages, request logging) and
`ASGIHandler.send_response`. What differs from Django's ASGI handler:

- the synchronous chain runs on a small persistent thread pool: one thread hop per request;
- `request_started` and `request_finished` (database connection upkeep) fire on that pool thread,
  as under WSGI, so the response is closed there before it is sent: a lean view must answer in
  full (no streaming response);
- the body is kept up to LOCKSTEP_MAX_BODY + 1 bytes and the rest drained: the lean views refuse
  longer bodies (413), and Django would spool all of it to disk first;
- no task watches for a client disconnect while the view runs (a synchronous view cannot be
  cancelled anyway).

LOCKSTEP_INGEST_FASTPATH=0 serves the lean routes through Django's ASGI handler too (dashboard/asgi.py);
LOCKSTEP_INGEST_THREADS sizes the pool.
"""
from __future__ import annotations

import asyncio
import io
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, wraps
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponseBase
from django.test.utils import override_settings
from django.urls import Resolver404, URLResolver, get_resolver, set_script_prefix

from ingest import backpressure, groupcommit, views
from ingest.loop import LoopIngest, Receive, Scope, Send, read_body

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
View = Callable[..., HttpResponseBase]


def lean(view: View, on_loop: str | None = None) -> View:
    """Mark a route of dashboard/urls.py for the lean route: a synchronous view that answers in
    full and needs nothing per request from the async stack (the middleware chain still runs).
    `on_loop` ("ingest" or "bulk"): an agents' endpoint that `ingest.loop` serves on the event
    loop, with this view's checks and answers."""
    if iscoroutinefunction(view):
        raise TypeError(f"{view.__qualname__}: the lean route runs synchronous views only")

    @wraps(view)  # keeps the view's own marks, such as csrf_exempt
    def marked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return view(request, *args, **kwargs)

    marked.lean_route = True
    marked.on_loop = on_loop
    return marked


def is_lean(scope: Scope) -> bool:
    """Whether Django's resolver maps this request's path (less the script prefix, as ASGIRequest
    takes it) to a view marked `lean`."""
    return lean_route(scope) is not None


def lean_route(scope: Scope) -> View | None:
    """The marked view this request's path resolves to, or None. ROOT_URLCONF's resolver: a
    request's own urlconf is set by middleware, which has not run yet (and asking asgiref's
    task-local for it cost more than the rest of this lookup)."""
    return _lean_view(get_resolver(), scope["path"].removeprefix(get_script_prefix(scope)))


@lru_cache(maxsize=1024)
def _lean_view(resolver: URLResolver, path_info: str) -> View | None:
    """Remembered per resolver (a changed ROOT_URLCONF or cleared URL caches give a new one): the
    answer is asked for on the event loop before every request."""
    try:
        match = resolver.resolve(path_info)
    except Resolver404:
        return None
    return match.func if getattr(match.func, "lean_route", False) else None


class LeanHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware chain loaded synchronously and run on a thread pool."""

    def __init__(self, threads: int) -> None:
        BaseHandler.__init__(self)  # not ASGIHandler.__init__: it loads the chain in async mode
        with override_settings(MIDDLEWARE=settings.LEAN_MIDDLEWARE):  # load_middleware reads only settings.MIDDLEWARE
            self.load_middleware(is_async=False)
        self.threads = threads
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="lockstep-lean")
        self._waiting: dict[int, float] = {}  # arrivals waiting for a thread, oldest first (a thread or the loop takes one off)
        self._waiting_lock = threading.Lock()
        self._numbers = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._oldest_wait() > backpressure.SHED_AFTER_S:
            # the oldest waiting request is past its shedding point: this one would wait longer still,
            # into its agent's timeout; refused at once, its body unread (`ingest.backpressure`)
            await self.send_response(views.error(503, "server overloaded; retry later", retry_after=backpressure.retry_after()), send)
            return
        started = time.monotonic()
        try:
            refused = await self._refused(scope)
            looked_up = time.monotonic()
            if refused:  # the view answers without the body: a bad token costs no memory, no wait
                body = io.BytesIO()
            else:
                body = await asyncio.wait_for(read_body(receive), settings.LOCKSTEP_BODY_TIMEOUT)
        except RequestAborted:
            return
        except TimeoutError:  # a slow body holds a connection, never a pool thread
            await self.send_response(views.error(408, f"body not received within {settings.LOCKSTEP_BODY_TIMEOUT:g} s"), send)
            return
        # the server's own waits (a token lookup's, then the view's, for a pool thread) count as load; the upload does not
        scope[backpressure.ARRIVED] = time.monotonic() - (looked_up - started)
        number = next(self._numbers)
        with self._waiting_lock:
            self._waiting[number] = scope[backpressure.ARRIVED]
        try:
            response = await asyncio.get_running_loop().run_in_executor(self.executor, self._respond, scope, body, number)
        finally:
            self._started(number)  # a job cancelled before it started
        await self.send_response(response, send)

    def _oldest_wait(self) -> float:
        """Seconds the longest-waiting request has waited for a pool thread (0: none waits)."""
        with self._waiting_lock:
            oldest = next(iter(self._waiting.values()), None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def _started(self, number: int) -> None:
        with self._waiting_lock:
            self._waiting.pop(number, None)

    async def _refused(self, scope: Scope) -> bool:
        """`views.refused_before_body` from the headers: on the loop when the token is cached, else
        on a pool thread (one query; a database outage is left to the view's own 503)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refused = views.refused_before_body(headers, query=False)
        if refused is views.UNDECIDED:
            refused = await asyncio.get_running_loop().run_in_executor(self.executor, _refused_on_thread, headers)
        return refused

    def _respond(self, scope: Scope, body: io.BytesIO, number: int) -> HttpResponseBase:
        """On a pool thread, what WSGIHandler.__call__ does: the request signals around the chain, and
        the response closed (request_finished: this thread's connections go back) once rendered."""
        self._started(number)
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body)
        if request is None:
            body.close()
        else:
            response = self.get_response(request)
        response._handler_class = self.__class__  # the sender of request_finished, as Django's handlers set it
        response.close()
        return response

    def shutdown(self) -> None:
        """Close every pool thread's database connections, then stop the threads (tests)."""
        barrier = threading.Barrier(self.threads)

        def close() -> None:
            try:
                barrier.wait(5)  # one job per thread: each closes its own connections
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        for future in [self.executor.submit(close) for _ in range(self.threads)]:
            future.result()
        self.executor.shutdown(wait=True)


def _refused_on_thread(headers: dict[str, str]) -> bool:
    """`views.refused_before_body` on a thread; a database outage is left to the view's own 503."""
    try:
        return groupcommit.outside_request(views.refused_before_body, headers)
    except DatabaseError:
        return False


class LeanRoutes:
    """The HTTP application: the agents' endpoints go to `ingest.loop`, the other lean routes to a
    `LeanHandler`, all others to `app` (Django's ASGI handler)."""

    def __init__(self, app: ASGIApp, threads: int | None = None) -> None:
        self.app = app
        self.handler = LeanHandler(threads or settings.LOCKSTEP_INGEST_THREADS)
        self.loop = LoopIngest(self.handler, self.handler.executor)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        view = lean_route(scope) if scope["type"] == "http" else None
        if view is None:
            await self.app(scope, receive, send)
        elif view.on_loop:
            await self.loop(scope, receive, send, bulk=view.on_loop == "bulk")
        else:
            await self.handler(scope, receive, send)

    def shutdown(self) -> None:
        self.loop.shutdown()
        self.handler.shutdown()
