"""The websocket handshake's Origin check, in front of every feed (`routing.application`).

A browser sends the user's session cookie with a websocket any page opens, and the feeds take that
cookie; so the page must be the server's own: the Origin's scheme, host and port are the server's
(`scheme://Host`, a Host in ALLOWED_HOSTS), as Django's CSRF check compares them for a form, or the
origin is one of CSRF_TRUSTED_ORIGINS. Channels' AllowedHostsOriginValidator compared the host name
only, so a page on another port of the same host (anyone's development server at
http://localhost:9999) opened a logged-in user's feeds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

deny = WebsocketDenier.as_asgi()


class SameOrigin:
    """ASGI middleware for websockets: a handshake from another origin is closed before `app` sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if same_origin(scope):
            await self.app(scope, receive, send)
        else:
            await deny(scope, receive, send)


def same_origin(scope: Scope) -> bool:
    headers = {name: value.decode("latin-1") for name, value in scope.get("headers", [])}
    host = headers.get(b"host", "").lower()
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    origin = headers.get(b"origin")
    return origin == f"{_scheme(scope, headers)}://{host}" or origin in settings.CSRF_TRUSTED_ORIGINS


def _scheme(scope: Scope, headers: dict[bytes, str]) -> str:
    """The scheme the browser used: https for wss, or what a TLS-terminating proxy's header says
    (SECURE_PROXY_SSL_HEADER, Django's rule for requests: the proxy speaks plain ws to the server)."""
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure = settings.SECURE_PROXY_SSL_HEADER
        value = headers.get(meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode())
        if value is not None:
            return "https" if value.split(",", 1)[0].strip() == secure else "http"
    return "https" if scope.get("scheme") == "wss" else "http"
