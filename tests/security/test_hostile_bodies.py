"""Slow and oversized bodies against a real uvicorn (issue 17, item 6): a request without a valid
token, or with a Content-Length past the limit, is answered from its headers, before any body;
a body that stalls is cut at LOCKSTEP_BODY_TIMEOUT; 200 stalled connections hold little memory
and the server keeps answering. The figures go to the README's reliability table."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import Stack, free_port, spawn, uvicorn

pytestmark = [pytest.mark.e2e]
BODY_TIMEOUT_S = 4
STALLED = 200


@pytest.fixture(scope="module")
def server(stack_env, tmp_path_factory):
    """A uvicorn of its own, with a short body timeout (the stack's is the 30 s default)."""
    port = free_port()
    env = {**stack_env, "LOCKSTEP_BODY_TIMEOUT": str(BODY_TIMEOUT_S)}
    proc = spawn(
        "uvicorn-hostile",
        uvicorn(port),
        env,
        tmp_path_factory.mktemp("hostile"),
    )
    running = Stack(f"http://127.0.0.1:{port}", env, proc, proc)
    try:
        running.wait_http()
        yield running
    finally:
        proc.stop()


def _open(stack: Stack, token: str | None, length: int, first: bytes = b"") -> socket.socket:
    """A POST whose headers (and `first` bytes of its body) are sent, and nothing more."""
    host, port = stack.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=15)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    conn.sendall(
        f"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n".encode()
        + first
    )
    return conn


def _status(conn: socket.socket) -> int:
    head = conn.recv(4096)
    conn.close()
    return int(head.split(b" ", 2)[1])


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_no_token_a_forged_one_or_a_huge_length_is_answered_before_the_body(server, live_db):
    _, token = project_with_token("hostile")
    started = time.monotonic()
    assert _status(_open(server, None, 8_000_000)) == 401
    assert _status(_open(server, "lst_forged", 8_000_000)) == 401
    assert _status(_open(server, token, 100 * 1024 * 1024)) == 413
    assert time.monotonic() - started < 3  # not one of them waited for a body


def test_a_stalled_body_is_cut_at_the_body_timeout(server, live_db):
    _, token = project_with_token("hostile")
    started = time.monotonic()
    assert _status(_open(server, token, 5000, b'{"v": 1, "run"')) == 408
    assert BODY_TIMEOUT_S - 0.5 <= time.monotonic() - started < BODY_TIMEOUT_S + 5


def test_200_stalled_connections_hold_little_memory_and_the_server_keeps_answering(server, live_db, record_property):
    _, token = project_with_token("hostile")
    pid = server.server.popen.pid
    before = _rss_kib(pid)
    stalled = [_open(server, token, 8_000_000, b"x" * 64 * 1024) for _ in range(STALLED)]
    time.sleep(1)
    held = _rss_kib(pid) - before
    answer = requests.post(
        f"{server.url}/api/v1/ingest",
        json=make_batch(run="hostile-ok"),
        timeout=10,
        headers={"Authorization": f"Bearer {token}"},
    )
    statuses = [_status(conn) for conn in stalled]
    record_property("stalled_rss_kib", held)
    print(
        f"\n{STALLED} stalled connections: +{held / 1024:.1f} MiB RSS; a normal batch meanwhile: {answer.status_code}"
    )
    assert answer.status_code == 200
    assert set(statuses) == {408}
    assert held < 64 * 1024  # KiB: each stalled body keeps at most what arrived (64 KiB here)
