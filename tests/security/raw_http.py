"""Reading a server's answer off a raw socket, for drills that write requests byte by byte."""

from __future__ import annotations

import re
import socket


def answer(conn: socket.socket) -> tuple[int, bytes]:
    """The status and the whole answer (its head, then Content-Length bytes of body); closes `conn`."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < content_length(got):
        chunk = conn.recv(65536)
        if not chunk:
            break
        got += chunk
    conn.close()
    return int(got.split(b" ", 2)[1]), got


def content_length(head: bytes) -> int:
    found = re.search(rb"content-length: (\d+)", head.partition(b"\r\n\r\n")[0], re.I)
    return int(found.group(1)) if found else 0
