"""Django's test client, with the agents' endpoints served by the door (`ingest.door`) as in production.

The door runs on this thread: its event loop, and what it hands to threads (token lookups, blob
and flight-record uploads, the group commit's writer), which run here too, between steps of the
loop (Django gives code on a running loop a connection of its own), so a test's requests see its
own transaction, as Django's handler would have them see it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from django.http import HttpResponse
from django.test import Client

from ingest import door


class HereExecutor(Executor):
    """Keeps each job until `run_pending` runs it on the calling thread."""

    def __init__(self) -> None:
        self.pending: list[tuple[Future, Callable[..., Any], tuple, dict]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self.pending.append((future, fn, args, kwargs))
        return future

    def run_pending(self) -> None:
        while self.pending:
            future, fn, args, kwargs = self.pending.pop(0)
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001  (handed to the awaiting request, as a thread's would be)
                future.set_exception(exc)


async def _unreachable(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("DoorClient hands Django's paths to Django's test handler")


class DoorClient(Client):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.here = HereExecutor()
        self.door = door.Door(_unreachable, threads=self.here, writer=self.here)
        self.loop = asyncio.new_event_loop()

    def request(self, **request: Any) -> HttpResponse:
        environ = self._base_environ(**request)
        if environ["PATH_INFO"] not in door.ENDPOINTS:
            return super().request(**request)
        headers = [
            (name[5:].replace("_", "-").lower().encode(), str(value).encode("latin-1"))
            for name, value in environ.items()
            if name.startswith("HTTP_")
        ]
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers.append((name.replace("_", "-").lower().encode(), str(environ[name]).encode("latin-1")))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": environ["REQUEST_METHOD"],
            "scheme": environ["wsgi.url_scheme"],
            "path": environ["PATH_INFO"],
            "raw_path": environ["PATH_INFO"].encode(),
            "query_string": environ.get("QUERY_STRING", "").encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 5000),
            "server": (environ["SERVER_NAME"], int(environ["SERVER_PORT"])),
        }
        body = environ["wsgi.input"].read()
        status, answer_headers, content = self._call(scope, body)
        response = HttpResponse(content, status=status)
        for name, value in answer_headers:
            response[name.decode("latin-1")] = value.decode("latin-1")
        response.json = lambda **kwargs: json.loads(content, **kwargs)  # type: ignore[attr-defined]
        return response

    def _call(self, scope: dict[str, Any], body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        messages: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Future()  # the client never leaves
            raise AssertionError

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)

        task = self.loop.create_task(self.door(scope, receive, send))

        async def until_blocked() -> None:
            while not task.done() and not self.here.pending:
                await asyncio.sleep(0)

        while not task.done():
            self.loop.run_until_complete(until_blocked())
            self.here.run_pending()  # off the loop: on this thread's own connection
        task.result()
        self.door.committer.young.idle()  # this loop runs only within a request: its idle timer never fires
        start = messages[0]
        return start["status"], start["headers"], b"".join(m.get("body", b"") for m in messages[1:])

    def close(self) -> None:
        self.loop.close()
