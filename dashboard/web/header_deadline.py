"""uvicorn's HTTP protocol with a deadline and a size bound on headers: a connection that has not
delivered a request's headers within LOCKSTEP_HEADER_TIMEOUT of opening (or of that request's
first byte) is closed, and one whose headers pass MAX_HEADER_BYTES is answered 431 and closed. The
server is started with it (`--http dashboard.web.header_deadline:HeaderDeadline`,
`dashboard.devstack.processes`).

Why: uvicorn (0.54) bounds the idle time between requests (--timeout-keep-alive) but not the
time a request takes to send its headers, and the application only sees a request once they are
complete, so neither the edge's body deadline nor anything else of ours could cut a client that
sends one header byte every few seconds: 2,000 such connections were held for 45 s and more. Nor
does its parser (httptools) bound a header's size: five connections sending one endless header
held 53 MiB after 1.5 s.

One timer per connection, not per request: it fires every LOCKSTEP_HEADER_TIMEOUT at most and
re-arms while the connection keeps up, so a keep-alive agent's requests cost no timer each.
"""

from __future__ import annotations

import asyncio

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024  # a request line and headers; proxies allow 8 to 32 KiB
_REFUSAL = b'{"error": "headers exceed %d bytes"}' % MAX_HEADER_BYTES
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
)


class HeaderDeadline(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_timeout: float = settings.LOCKSTEP_HEADER_TIMEOUT
        self.headers_since: float | None = self.loop.time()  # None: no request's headers awaited
        self.header_bytes = 0  # received while the awaited headers are still incomplete
        self.header_timer: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout, self._check)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.headers_since = self.loop.time()
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout, self._check)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.headers_since is None or self.transport.is_closing():
            return
        self.header_bytes += len(data)  # the headers are still incomplete: all of it was theirs
        if self.header_bytes > MAX_HEADER_BYTES:
            self.transport.write(TOO_LARGE)
            self.transport.close()

    def on_headers_complete(self) -> None:
        self.headers_since = None
        self.header_bytes = 0
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
