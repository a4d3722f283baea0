"""Slow and oversized bodies against a real uvicorn (issue 17, item 6): a request without a valid
token, or with a Content-Length past the limit, is answered from its headers, before any body;
a body that stalls is cut at LOCKSTEP_BODY_TIMEOUT; 200 stalled connections hold little memory
and the server keeps answering. Issue 51, item 4: the agents' door reads at most
LOCKSTEP_DOOR_BODIES bodies at once, LOCKSTEP_DOOR_BODIES_PER_PROJECT of one project; the rest are
refused at once. The figures go to the README's reliability table."""

from __future__ import annotations

import json
import re
import select
import socket
import time

import pytest
import requests

from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.security import raw_http
from tests.stack import Stack, free_port, spawn, uvicorn

pytestmark = [pytest.mark.e2e]
BODY_TIMEOUT_S = 4
STALLED = 200
DOOR_BODIES = 8
PER_PROJECT = 4


@pytest.fixture(scope="module")
def server(stack_env, tmp_path_factory):
    """A uvicorn of its own, with a short body timeout (the stack's is the 30 s default)."""
    port = free_port()
    env = {
        **stack_env,
        "LOCKSTEP_BODY_TIMEOUT": str(BODY_TIMEOUT_S),
        "LOCKSTEP_DOOR_BODIES": str(DOOR_BODIES),
        "LOCKSTEP_DOOR_BODIES_PER_PROJECT": str(PER_PROJECT),
        "LOCKSTEP_RETRY_AFTER": "1",
    }
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
    _, other = project_with_token("hostile-other")
    pid = server.server.popen.pid
    before = _rss_kib(pid)
    stalled = [_open(server, token, 8_000_000, b"x" * 64 * 1024) for _ in range(STALLED)]
    time.sleep(1)
    held = _rss_kib(pid) - before
    answer = requests.post(
        f"{server.url}/api/v1/ingest",
        json=make_batch(run="hostile-ok"),
        timeout=10,
        headers={"Authorization": f"Bearer {other}"},
    )
    statuses = [_status(conn) for conn in stalled]
    record_property("stalled_rss_kib", held)
    print(
        f"\n{STALLED} stalled connections: +{held / 1024:.1f} MiB RSS; a normal batch meanwhile: {answer.status_code}"
    )
    assert answer.status_code == 200  # another project's: the stalled ones take only their project's share
    assert statuses.count(408) == PER_PROJECT and statuses.count(503) == STALLED - PER_PROJECT
    assert held < 64 * 1024  # KiB: each stalled body keeps at most what arrived (64 KiB here)


def _answered(conn: socket.socket) -> bool:
    return bool(select.select([conn], [], [], 0)[0])


def test_the_door_reads_few_bodies_at_once_in_all_and_per_project(server, live_db):
    """100 connections of one token declare 8 MiB each (was: every one read, the server from 126
    to 829 MiB until the body deadline): PER_PROJECT are read, the others refused at once with
    503 + Retry-After and a JSON error; a second project gets its own share; past DOOR_BODIES in
    all a third project is refused too; once the stalled ones are cut (408), a batch goes in."""
    tokens = [project_with_token(f"door-bodies-{i}")[1] for i in range(3)]
    pid = server.server.popen.pid
    before = _rss_kib(pid)
    started = time.monotonic()
    first = [_open(server, tokens[0], 8_000_000) for _ in range(100)]
    time.sleep(0.5)  # every one admitted or refused
    read = [conn for conn in first if not _answered(conn)]
    refused = [raw_http.answer(conn) for conn in first if _answered(conn)]
    assert len(read) == PER_PROJECT and len(refused) == 100 - PER_PROJECT
    for conn in read:
        conn.sendall(b"x" * 7 * 1024 * 1024)  # the bodies the server does read, nearly whole
    second = [_open(server, tokens[1], 8_000_000) for _ in range(DOOR_BODIES - PER_PROJECT)]
    time.sleep(0.5)
    assert not any(_answered(conn) for conn in second)  # its own share, though the first project's is full
    status, third = raw_http.answer(_open(server, tokens[2], 5000))
    held = _rss_kib(pid) - before
    print(f"\n100 stalled 8 MiB bodies of one token: {len(read)} read, server RSS +{held / 1024:.1f} MiB")
    assert time.monotonic() - started < BODY_TIMEOUT_S  # refused at once, never at the body deadline
    for code, answer in refused:
        assert code == 503 and re.search(rb"retry-after: 1\r\n", answer, re.I)
        assert "request bodies being read at once" in json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert status == 503 and b"request bodies being read at once" in third  # past DOOR_BODIES in all
    assert held < (PER_PROJECT * 7 + 32) * 1024  # KiB: what the bounded bodies hold, not 100 of them
    assert {_status(conn) for conn in read + second} == {408}  # each cut at the body deadline, its place freed
    answer = requests.post(
        f"{server.url}/api/v1/ingest",
        json=make_batch(run="door-bodies"),
        timeout=10,
        headers={"Authorization": f"Bearer {tokens[0]}"},
    )
    assert answer.status_code == 200
