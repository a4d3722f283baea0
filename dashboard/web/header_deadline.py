"""uvicorn's HTTP protocol with a deadline on headers: a connection that has not delivered a
request's headers within LOCKSTEP_HEADER_TIMEOUT of opening (or of that request's first byte) is
closed. The server is started with it (`--http dashboard.web.header_deadline:HeaderDeadline`,
`dashboard.devstack.processes`).

Why: uvicorn (0.54) bounds the idle time between requests (--timeout-keep-alive) but not the
time a request takes to send its headers, and the application only sees a request once they are
complete, so neither the edge's body deadline nor anything else of ours could cut a client that
sends one header byte every few seconds: 2,000 such connections were held for 45 s and more.

One timer per connection, not per request: it fires every LOCKSTEP_HEADER_TIMEOUT at most and
re-arms while the connection keeps up, so a keep-alive agent's requests cost no timer each.
"""

from __future__ import annotations

import asyncio

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadline(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_timeout: float = settings.LOCKSTEP_HEADER_TIMEOUT
        self.headers_since: float | None = self.loop.time()  # None: no request's headers awaited
        self.header_timer: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout, self._check)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.headers_since = self.loop.time()
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout, self._check)

    def on_headers_complete(self) -> None:
        self.headers_since = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().connection_lost(exc)

    def _check(self) -> None:
        """Close the connection if its awaited headers are late; else look again when they could be."""
        self.header_timer = None
        if self.transport.is_closing() or self.headers_since is None:
            return
        late = self.loop.time() - self.headers_since
        if late >= self.header_timeout:
            self.transport.close()
            return
        self.header_timer = self.loop.call_later(self.header_timeout - late, self._check)
