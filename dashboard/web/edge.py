"""Every route Django's ASGI handler serves (pages, login, admin, the read API) gets its body at the
edge, before Django sees the request; and the client's address.

Why: Django's handler reads a whole body (to a temporary file past 2.5 MB) before any view or
middleware runs, with no deadline, so a bad token or a missing login was refused only after any
size of upload, however slow. Here the body is read by `ingest.bodies`, the reader the agents'
door uses too (it lives in `ingest`, below this package in the import layers, so both can import
it): the route's limit from its one table, a declared Content-Length past it a 413 from the
headers, a body that grows past it a 413, one not received in LOCKSTEP_BODY_TIMEOUT a 408. A body
within both is handed on in memory, as Django would have read it. Every such body is read before
Django knows who sent it, so at most LOCKSTEP_EDGE_BODIES are read at once per process; past them
a 503 + Retry-After at once (150 stalled 8 MiB logins had cost 1.2 GB).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestAborted

from ingest import bodies
from ingest.refusals import Refusal

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyEdge:
    """ASGI middleware around Django's handler (dashboard/asgi.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.reading = 0  # bodies being read now (one event loop per process: no lock needed)
        self.bodies = bodies.BodyReader()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
        limit = bodies.route_limit(scope["path"].removeprefix(scope.get("root_path", "")))
        try:
            declared = bodies.declared(headers, limit)
        except Refusal as refusal:
            await _answer(send, refusal.status, refusal.message)
            return
        if declared == 0 or (declared is None and "transfer-encoding" not in headers):
            await self.app(scope, receive, send)  # no body: nothing held, no slot taken
            return
        if self.reading >= settings.LOCKSTEP_EDGE_BODIES:
            await _answer(send, 503, "too many request bodies at once; retry later", settings.LOCKSTEP_RETRY_AFTER)
            return
        self.reading += 1
        try:
            body = await self.bodies.read(receive, limit)
        except Refusal as refusal:
            await _answer(send, refusal.status, refusal.message)
            return
        except RequestAborted:
            return
        finally:
            self.reading -= 1
        await self.app(scope, _replay(body, receive), send)


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


async def _answer(send: Send, status: int, message: str, retry_after: int | None = None) -> None:
    """A short answer the client can read (the rest of its body is discarded by the server)."""
    content = f'{{"error": "{message}"}}'.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    if retry_after is not None:
        headers.append((b"retry-after", b"%d" % retry_after))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ClientAddress:
    """ASGI middleware around the whole application (dashboard/asgi.py): the client's address is the
    socket's peer, unless that peer is one of LOCKSTEP_TRUSTED_PROXIES; then it is the right-most
    X-Forwarded-For entry that is not a trusted proxy (each proxy appends the address it saw, so
    only entries right of that one were written by proxies we trust; anything left of it is the
    client's own say). Why: the login throttle counts per address, and a header anyone can set
    would let a client pick a fresh address each try, or lock out someone else's. The server runs
    with uvicorn's own proxy headers off (`dashboard.devstack.processes`), so the peer is the socket's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.trusted = trusted_networks(settings.LOCKSTEP_TRUSTED_PROXIES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.trusted and scope["type"] in ("http", "websocket") and scope.get("client"):
            address = client_address(scope["client"][0], _forwarded_for(scope), self.trusted)
            if address != scope["client"][0]:
                scope = {**scope, "client": (address, 0)}
        await self.app(scope, receive, send)


def trusted_networks(entries: list[str]) -> list[Network]:
    try:
        return [ipaddress.ip_network(entry, strict=False) for entry in entries]
    except ValueError as exc:
        raise ImproperlyConfigured(f"LOCKSTEP_TRUSTED_PROXIES: {exc}") from None


def client_address(peer: str, forwarded_for: list[str], trusted: list[Network]) -> str:
    """`peer`, or when it is trusted the right-most untrusted X-Forwarded-For entry (the left-most
    when every entry is trusted; the last trusted hop when that entry is not an address)."""
    address = peer
    for entry in [peer, *reversed(forwarded_for)]:
        try:
            ip = ipaddress.ip_address(entry)
        except ValueError:
            return address
        address = str(ip)
        if not any(ip in network for network in trusted):
            return address
    return address


def _forwarded_for(scope: Scope) -> list[str]:
    """Every X-Forwarded-For entry, in order, over all the header's lines."""
    values = [value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"x-forwarded-for"]
    return [entry.strip() for entry in ",".join(values).split(",") if entry.strip()]
