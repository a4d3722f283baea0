"""Turn a raw request body into a validated `protocol.Batch`, or a 4xx with the failing path.

Everything here runs before anything is written, so a rejected batch changes nothing.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import msgspec

from agents import protocol


@dataclass
class Rejection(Exception):
    status: int
    error: str
    path: str | None = None


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _path_of(message: str) -> tuple[str, str | None]:
    """msgspec says 'Expected `int`, got `str` - at `$.events[3].step`'; split off the path."""
    match = _PATH.search(message)
    if not match:
        return message, None
    return message[: match.start()], match.group("path").lstrip(".") or None


def read_body(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding with a hard cap on the inflated size (no gzip bombs)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise Rejection(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise Rejection(400, f"invalid gzip body: {exc}") from None
    if len(body) > limit:
        raise Rejection(413, f"decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise Rejection(400, "truncated gzip body")
    return body


def decode(body: bytes) -> protocol.Batch:
    try:
        batch = protocol.decode_batch(body)
    except msgspec.ValidationError as exc:
        error, path = _path_of(str(exc))
        raise Rejection(400, error, path) from None
    except msgspec.DecodeError as exc:
        raise Rejection(400, f"malformed JSON: {exc}") from None
    if batch.rank >= batch.run.world_size:
        raise Rejection(400, f"rank {batch.rank} is outside world_size {batch.run.world_size}", "rank")
    return batch

