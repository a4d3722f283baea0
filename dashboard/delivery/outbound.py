"""Outbound HTTP to alert destinations, guarded: a destination URL is someone's input, and the server
that follows it sits inside a network.

A URL whose host is (or resolves to) a loopback, private, link-local, multicast or otherwise
non-public address is refused unless `LOCKSTEP_SINKS_ALLOW_PRIVATE` is set: when it is saved
(`check_url`, from `Webhook.clean`) and at every send, after DNS resolution, connecting to the very
address that was checked (a name that resolves elsewhere a second later cannot slip through).
Redirects are never followed (a 3xx is a failure naming its Location), answers are read up to
MAX_ANSWER_BYTES, and every request has a deadline. An egress proxy from the environment
(`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`) is used as urllib would; through one, a name that does
not resolve here is left to the proxy to resolve.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import time
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

TIMEOUT_S = 5.0  # per connect / read
DEADLINE_S = 10.0  # the whole answer
MAX_ANSWER_BYTES = 64 * 1024
ERROR_SNIPPET_CHARS = 300


class Refused(ValueError):
    """The URL is not one Lockstep may call."""


class SendError(Exception):
    """The destination did not take the request (network, timeout, status); the text says why, `status`
    is the HTTP status where one came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def check_url(url: str) -> None:
    """Refuse a URL Lockstep must not call: another scheme, no host, or a non-public address (the
    host's literal address, or every address its name resolves to)."""
    _addresses(_parts(url))


def request(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    """One request to a checked address; a non-2xx status, a redirect, a timeout or a network error
    is a `SendError`, a refused URL a `Refused`."""
    parts = _parts(url)
    host = parts.hostname or ""  # `_parts` refused a URL without one
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy(parts)
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if proxy is None:
        addresses = _addresses(parts)
        conn = conn_class(host, port, timeout=TIMEOUT_S)
        conn._create_connection = lambda _addr, *args, **kwargs: _connect(addresses, port, *args, **kwargs)  # type: ignore[attr-defined]
    else:
        try:
            _addresses(parts)
        except SendError:
            pass  # not resolvable here: the proxy resolves it
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(*proxy, timeout=TIMEOUT_S)
            conn.set_tunnel(host, port)
        else:
            conn = http.client.HTTPConnection(*proxy, timeout=TIMEOUT_S)
            path = f"http://{parts.netloc}{path}"
    try:
        conn.request(method, path, body=body, headers={"User-Agent": "Lockstep", **(headers or {})})
        response = conn.getresponse()
        answer = Answer(response.status, _read_bounded(response))
        location = response.getheader("Location", "")
    except (OSError, http.client.HTTPException) as exc:
        raise SendError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if 300 <= answer.status < 400:
        raise SendError(f"HTTP {answer.status}: redirect to {location[:200]!r} not followed", answer.status)
    if not 200 <= answer.status < 300:
        raise SendError(
            f"HTTP {answer.status}: {answer.body[:ERROR_SNIPPET_CHARS].decode(errors='replace')}", answer.status
        )
    return answer


def _connect(addresses: list[str], port: int, *args: Any, **kwargs: Any) -> socket.socket:
    """The first of the checked addresses that accepts (a name with an IPv6 and an IPv4 address)."""
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), *args, **kwargs)
        except OSError as exc:
            error = exc
    raise error or OSError("no address")


def _proxy(parts: SplitResult) -> tuple[str, int] | None:
    """The environment's proxy for this URL's scheme, unless NO_PROXY exempts its host."""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    found = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return (found.hostname, found.port or 80) if found.hostname else None


def _read_bounded(response: http.client.HTTPResponse) -> bytes:
    """At most MAX_ANSWER_BYTES, within DEADLINE_S: a receiver that streams forever is cut off."""
    deadline = time.monotonic() + DEADLINE_S
    chunks, size = [], 0
    while size < MAX_ANSWER_BYTES:
        if time.monotonic() > deadline:
            raise SendError(f"answer not read within {DEADLINE_S:.0f} s")
        chunk = response.read1(min(16384, MAX_ANSWER_BYTES - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _parts(url: str) -> SplitResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"{url[:100]!r} is not an http(s) URL with a host")
    try:
        _ = parts.port  # urlsplit checks the port only when asked
    except ValueError as exc:
        raise Refused(f"bad port in {url[:100]!r}") from exc
    return parts


def _addresses(parts: SplitResult) -> list[str]:
    """The host's addresses, every one public (or private ones allowed); a `SendError` when the name
    does not resolve."""
    host = parts.hostname or ""
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, parts.port or 80, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            raise SendError(f"cannot resolve {host!r}: {exc}") from exc
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    if not settings.LOCKSTEP_SINKS_ALLOW_PRIVATE:
        for address in addresses:
            if not _public(address):
                raise Refused(
                    f"{host} is a non-public address ({address}); set LOCKSTEP_SINKS_ALLOW_PRIVATE=1 "
                    "to allow destinations inside your network"
                )
    return [str(a) for a in addresses]


# IPv6 addresses that carry an IPv4 one, which a translator or relay on the way turns back into it, are
# judged by the IPv4 address inside: those whose last 32 bits are it (IPv4-mapped, IPv4-compatible of
# RFC 4291, SIIT's IPv4-translated of RFC 2765, NAT64's well-known prefix of RFC 6052) and 6to4
# (`sixtofour`). The local-use NAT64 prefix (RFC 8215) leads to the operator's own translators, so
# never outside. Teredo (2001::/32) is not global to begin with.
IPV4_IN_LAST_32_BITS = tuple(
    ipaddress.ip_network(prefix) for prefix in ("::ffff:0:0/96", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96")
)
LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        if address in LOCAL_NAT64:
            return False
        inside = any(address in prefix for prefix in IPV4_IN_LAST_32_BITS)
        address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if inside else address.sixtofour or address
    return address.is_global and not address.is_multicast
