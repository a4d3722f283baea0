"""A lean ASGI route for `POST /api/v1/ingest` (and `/bulk`): the same view code, without Django's request machinery.

Under Django's ASGI handler every ingest batch crossed the whole middleware stack (sessions,
auth, CSRF, messages: none applies to a bearer-token API that the view exempts anyway), several
async<->sync thread hops, and a new thread per request. At hundreds of batches per second per
process that was most of the server's CPU (py-spy, bench/ingest.py). Here the body is read on
the event loop, and `views.handle_ingest` (token, rate limit, 415/413 checks, validation,
writers: the code the Django view runs) runs on a small persistent thread pool; the answer
carries the same status, JSON body and headers the Django view gives.

Only exactly `POST /api/v1/ingest` or `POST /api/v1/ingest/bulk` with a Host that ALLOWED_HOSTS admits takes this route;
everything else (other methods, other paths, a bad Host) goes to Django unchanged.
Set LOCKSTEP_INGEST_FASTPATH=0 to send ingest through Django as well; LOCKSTEP_INGEST_THREADS sets
the thread pool (default: LOCKSTEP_DB_POOL, else 4). An unexpected exception (a bug) is a 500 from
uvicorn here rather than Django's 500 page.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core import signals
from django.http.request import split_domain_port, validate_host
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.http import parse_header_parameters

PATHS = {"/api/v1/ingest": "handle_ingest", "/api/v1/ingest/bulk": "handle_bulk"}  # path -> view in ingest.views


class Headers(dict):
    """Request headers as Django's `request.headers` answers them: case-insensitive, repeats joined by ','."""

    def get(self, key, default=None):
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key):
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key):
        return dict.__contains__(self, key.lower())


class LeanRequest:
    """What the ingest view reads of a request: headers, content type, the body, whether it is HTTPS."""

    __slots__ = ("headers", "content_type", "_body", "_pos", "_secure")

    def __init__(self, headers: Headers, body: bytes, secure: bool):
        self.headers = headers
        self.content_type = parse_header_parameters(headers.get("content-type", ""))[0]
        self._body = body
        self._pos = 0
        self._secure = secure

    def read(self, size: int = -1) -> bytes:
        end = len(self._body) if size is None or size < 0 else self._pos + size
        data = self._body[self._pos:end]
        self._pos += len(data)
        return data

    def is_secure(self) -> bool:
        return self._secure


def _headers(scope) -> Headers:
    """As Django's ASGIRequest builds META: names with '_' are dropped (spoofing), repeats joined."""
    headers = Headers()
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin1").lower()
        if "_" in name:
            continue
        value = raw_value.decode("latin1")
        headers[name] = headers[name] + "," + value if name in headers else value
    return headers


def _allowed_hosts() -> list[str]:
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        return [".localhost", "127.0.0.1", "[::1]"]
    return allowed


class IngestRoute:
    """ASGI middleware: serve `POST /api/v1/ingest` here, pass everything else to `app` (Django)."""

    def __init__(self, app, threads: int | None = None):
        self.app = app
        # as many threads as the process may hold connections (LOCKSTEP_DB_POOL), else 4 persistent ones
        pool = int(os.environ.get("LOCKSTEP_DB_POOL", "0"))
        self.threads = threads or int(os.environ.get("LOCKSTEP_INGEST_THREADS", "0")) or pool or 4
        self.enabled = os.environ.get("LOCKSTEP_INGEST_FASTPATH", "1").lower() not in {"0", "false", "no", "off"}
        self._executor: ThreadPoolExecutor | None = None
        self._post = None  # response post-processing, built on first use (settings are loaded by then)

    def _takes(self, scope, headers: Headers) -> bool:
        if not (self.enabled and scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in PATHS):
            return False
        if settings.USE_X_FORWARDED_HOST and "x-forwarded-host" in headers:
            return False  # Django's get_host() rules for proxies: let Django decide
        host = headers.get("host")
        if not host:
            return False
        domain, _ = split_domain_port(host)
        return bool(domain) and validate_host(domain, _allowed_hosts())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") not in PATHS or scope.get("method") != "POST" or not self.enabled:
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        if not self._takes(scope, headers):
            return await self.app(scope, receive, send)
        body = await self._read_body(receive)
        if body is None:  # client went away
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="lockstep-ingest")
        request = LeanRequest(headers, body, scope.get("scheme") == "https")
        status, out_headers, content = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._respond, scope, request)
        await send({"type": "http.response.start", "status": status, "headers": out_headers})
        await send({"type": "http.response.body", "body": content})

    def shutdown(self) -> None:
        """Close every pool thread's database connection, then stop the threads (tests; process exit)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        from django.db import connections

        barrier = threading.Barrier(self.threads)

        def close() -> None:
            try:
                barrier.wait(5)  # one job per thread: each closes its own connections
            except threading.BrokenBarrierError:
                pass
            connections.close_all()

        for future in [executor.submit(close) for _ in range(self.threads)]:
            future.result()
        executor.shutdown(wait=True)

    @staticmethod
    async def _read_body(receive) -> bytes | None:
        """The whole body, as Django reads it first; past LOCKSTEP_MAX_BODY + 1 bytes the rest is drained, not kept."""
        keep = settings.LOCKSTEP_MAX_BODY + 1
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if size < keep and chunk:
                chunks.append(chunk[:keep - size])
                size += len(chunks[-1])
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _respond(self, scope, request: LeanRequest):
        """On a pool thread: Django's request signals (connection reuse/close), the view, its response headers."""
        from ingest import views

        signals.request_started.send(sender=self.__class__, scope=scope)
        try:
            response = getattr(views, PATHS[scope["path"]])(request)
            if self._post is None:
                security = SecurityMiddleware(lambda r: None)
                frames = XFrameOptionsMiddleware(lambda r: None)
                self._post = (security.process_response, frames.process_response)
            for process in self._post:
                response = process(request, response)
            content = response.content
            if not response.has_header("Content-Length"):
                response["Content-Length"] = str(len(content))
            headers = [(k.encode("latin1"), v.encode("latin1")) for k, v in response.items()]
            return response.status_code, headers, content
        finally:
            signals.request_finished.send(sender=self.__class__)
