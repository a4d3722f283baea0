"""The header policy of `ingest.door`: which hosts it answers, and the headers every answer carries.

Django's middleware (SecurityMiddleware, XFrameOptionsMiddleware, the host check of CommonMiddleware)
serves the door's four endpoints no more; what it would do to their JSON answers is stated here
once, from the same settings, and tests/ingest/test_door.py holds it equal to what Django's chain
adds to a JSON answer of the read API:

- a Host (or, with USE_X_FORWARDED_HOST, X-Forwarded-Host) outside ALLOWED_HOSTS: 400, as Django
  answers DisallowedHost;
- X-Content-Type-Options (SECURE_CONTENT_TYPE_NOSNIFF), Referrer-Policy (SECURE_REFERRER_POLICY),
  Cross-Origin-Opener-Policy (SECURE_CROSS_ORIGIN_OPENER_POLICY), X-Frame-Options
  (X_FRAME_OPTIONS) on every answer;
- Strict-Transport-Security (SECURE_HSTS_SECONDS, with its subdomain and preload flags) on answers
  over HTTPS, as SecurityMiddleware decides it (SECURE_PROXY_SSL_HEADER behind a proxy).

Content-Security-Policy is a page's (dashboard.web.middleware.ContentSecurityPolicy sets it on
HTML only); no redirect to HTTPS either: an agent's POST cannot follow one.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

Headers = list[tuple[bytes, bytes]]
MAX_HOSTS = 64  # host verdicts remembered per process (a deployment has a few names; a scan, many)


class HeaderPolicy:
    """The settings read once, when the process starts (as Django loads its middleware)."""

    def __init__(self) -> None:
        fixed = {
            "x-content-type-options": "nosniff" if settings.SECURE_CONTENT_TYPE_NOSNIFF else None,
            "referrer-policy": _joined(settings.SECURE_REFERRER_POLICY),
            "cross-origin-opener-policy": settings.SECURE_CROSS_ORIGIN_OPENER_POLICY,
            "x-frame-options": settings.X_FRAME_OPTIONS.upper() if settings.X_FRAME_OPTIONS else None,
        }
        self.plain: Headers = [(k.encode(), v.encode("latin-1")) for k, v in fixed.items() if v]
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        self.secure: Headers = self.plain + (
            [(b"strict-transport-security", hsts.encode())] if settings.SECURE_HSTS_SECONDS else []
        )
        self.proxy_tls = settings.SECURE_PROXY_SSL_HEADER
        self.forwarded_host = settings.USE_X_FORWARDED_HOST
        self.forwarded_port = settings.USE_X_FORWARDED_PORT
        allowed = settings.ALLOWED_HOSTS
        self.allowed = allowed if allowed or not settings.DEBUG else [".localhost", "127.0.0.1", "[::1]"]
        self._hosts: dict[str, bool] = {}

    def headers(self, scope: MutableMapping[str, Any], headers: Mapping[str, str]) -> Headers:
        """The headers every answer to this request carries."""
        return self.secure if self.is_secure(scope, headers) else self.plain

    def is_secure(self, scope: MutableMapping[str, Any], headers: Mapping[str, str]) -> bool:
        """HTTPS as Django's request.is_secure() tells it: the trusted proxy's header, else the scheme."""
        if self.proxy_tls:
            name, secure_value = self.proxy_tls
            value = headers.get(name.removeprefix("HTTP_").replace("_", "-").lower())
            if value is not None:
                return value.split(",", 1)[0].strip() == secure_value
        return scope.get("scheme") == "https"

    def host_allowed(self, scope: MutableMapping[str, Any], headers: Mapping[str, str]) -> bool:
        """Whether Django's request.get_host() would accept this request's host."""
        host = self._raw_host(scope, headers)
        allowed = self._hosts.get(host)
        if allowed is None:
            domain, _ = split_domain_port(host)
            allowed = bool(domain) and validate_host(domain, self.allowed)
            if len(self._hosts) < MAX_HOSTS:
                self._hosts[host] = allowed
        return allowed

    def _raw_host(self, scope: MutableMapping[str, Any], headers: Mapping[str, str]) -> str:
        if self.forwarded_host and "x-forwarded-host" in headers:
            return headers["x-forwarded-host"]
        if "host" in headers:
            return headers["host"]
        name, port = scope.get("server") or ("unknown", "0")
        port = str(headers["x-forwarded-port"] if self.forwarded_port and "x-forwarded-port" in headers else port)
        return name if port == ("443" if self.is_secure(scope, headers) else "80") else f"{name}:{port}"


def _joined(value: str | list[str] | tuple[str, ...] | None) -> str | None:
    """SECURE_REFERRER_POLICY as SecurityMiddleware writes it: a list or a comma-separated string."""
    if not value:
        return None
    return ",".join(v.strip() for v in value.split(",")) if isinstance(value, str) else ",".join(value)
